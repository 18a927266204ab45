"""Writes a model folder from a checkpoint: the two ONNX graphs, the tokenizer files and manifest.json.

The manifest is the only contract with the server: config, special ids, languages, tokenizer,
every graph input and output (from `graph_io`), file checksums and provenance.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import onnx
import torch

from model_export import graph_io
from model_export.checkpoint import Checkpoint
from model_export.errors import ExportError
from model_export.onnx_graphs import build_decoder_step, build_encoder
from service.model_folder import FORMAT, GRAPHS, MANIFEST, ModelFolder, load_model_folder, sha256_of

ENCODER_FILE, DECODER_FILE, RAGGED_FILE = "encoder.onnx", "decoder_step.onnx", "decoder_step_ragged.onnx"


def graph_entry(file: str, inputs: list[graph_io.TensorSpec], outputs: list[graph_io.TensorSpec]) -> dict:
    return {"file": file, "inputs": [s.to_dict() for s in inputs], "outputs": [s.to_dict() for s in outputs]}


def variant_entry(checkpoint: Checkpoint, precision: str, encoder_file: str, decoder_file: str, ragged: str) -> dict:
    cfg = checkpoint.config
    inputs = graph_io.decoder_inputs(cfg)
    return {
        "precision": precision,
        "encoder": graph_entry(encoder_file, graph_io.encoder_inputs(cfg), graph_io.encoder_outputs(cfg)),
        "decoder_step": graph_entry(decoder_file, inputs, graph_io.decoder_outputs(cfg)),
        "decoder_step_ragged": graph_entry(ragged, inputs, graph_io.decoder_ragged_outputs(cfg)),
    }


def variant_graphs(variant: dict) -> list[str]:
    """The graphs a variant (as the manifest's JSON) has: the encoder, the step graph, and the optional ones it has."""
    return [graph for graph in GRAPHS if variant.get(graph)]


def variant_files(variant: dict) -> list[str]:
    """The graph files of a variant (as the manifest's JSON), the shared initializers' files excluded."""
    return [variant[graph]["file"] for graph in variant_graphs(variant)]


def file_entries(folder: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    return {name: {"sha256": sha256_of(folder / name), "bytes": (folder / name).stat().st_size} for name in names}


def build_manifest(checkpoint: Checkpoint, folder: Path, name: str, version: str, variants: dict) -> dict:
    cfg, tok = checkpoint.config, checkpoint.tokenizer
    files = sorted(set(tok.files) | {file for v in variants.values() for file in variant_files(v)})
    return {
        "format": FORMAT,
        "format_version": graph_io.FORMAT_VERSION,
        "name": name,
        "version": version,
        "source_language": checkpoint.source_language,
        "target_languages": checkpoint.target_languages,
        "config": cfg.to_dict(),
        "special_ids": {"pad": cfg.pad_id, "decoder_start": cfg.decoder_start_id, "eos": cfg.eos_id, "unk": cfg.unk_id},
        "tokenizer": {
            "kind": "sentencepiece",
            "source_model": tok.source_model,
            "target_model": tok.target_model,
            "vocabulary": tok.vocabulary,
            "append_eos": tok.append_eos,
            "target_tokens": tok.target_tokens,
        },
        "opset": graph_io.OPSET,
        "variants": variants,
        "default_variant": "int8" if "int8" in variants else "fp32",
        "files": file_entries(folder, files),
        "provenance": {
            **checkpoint.provenance,
            "exported_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "exporter": {"torch": torch.__version__, "onnx": onnx.__version__, "graphs": graph_io.GRAPHS_REVISION},
        },
    }


def write_manifest(folder: Path, manifest: dict) -> None:
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def fp32_copy(folder_path: Path, precision: str, verb: str) -> tuple[ModelFolder, dict, dict]:
    """What a derived variant (int8, fp16) starts from: the loaded folder, its manifest as JSON, and a copy of its
    fp32 variant named `precision`, whose graphs the caller converts."""
    folder = load_model_folder(folder_path)
    if "fp32" not in folder.manifest.variants:
        raise ExportError(f"{folder_path}: no fp32 variant to {verb}")
    manifest = json.loads((folder_path / MANIFEST).read_text(encoding="utf-8"))
    variant = json.loads(folder.manifest.variants["fp32"].model_dump_json())
    variant["precision"] = precision
    return folder, manifest, variant


def add_variant(folder_path: Path, manifest: dict, variant: dict, written: list[str], make_default: bool) -> dict:
    """Records a derived variant and its new files in the manifest, writes it, and checks the folder still loads."""
    manifest["variants"][variant["precision"]] = variant
    manifest["files"].update(file_entries(folder_path, written))
    if make_default:
        manifest["default_variant"] = variant["precision"]
    write_manifest(folder_path, manifest)
    load_model_folder(folder_path)  # the folder must still load
    return manifest


def export_folder(checkpoint: Checkpoint, folder: Path, name: str, version: str) -> Path:
    """Checkpoint -> folder with encoder.onnx, decoder_step.onnx, decoder_step_ragged.onnx, tokenizer files and
    manifest.json (fp32)."""
    if folder.exists() and not folder.is_dir():
        raise ExportError(f"{folder} exists and is not a folder")
    folder.mkdir(parents=True, exist_ok=True)
    model = checkpoint.build_model()
    with torch.no_grad():
        onnx.save(build_encoder(model), folder / ENCODER_FILE)
        onnx.save(build_decoder_step(model), folder / DECODER_FILE)
        onnx.save(build_decoder_step(model, ragged=True), folder / RAGGED_FILE)
    for file_name, content in checkpoint.tokenizer.files.items():
        (folder / file_name).write_bytes(content)
    variants = {"fp32": variant_entry(checkpoint, "fp32", ENCODER_FILE, DECODER_FILE, RAGGED_FILE)}
    write_manifest(folder, build_manifest(checkpoint, folder, name, version, variants))
    return folder
