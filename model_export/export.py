"""Writes a model folder from a checkpoint: the two ONNX graphs, the tokenizer files and manifest.json.

The manifest is the only contract with the server: config, special ids, languages, tokenizer,
every graph input and output (from `graph_io`), file checksums and provenance. Every folder the offline commands
write is staged here (`staged_folder`): built beside --out and renamed into place, never over a user's files.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import onnx
import sentencepiece as spm
import torch

from model_export import graph_io
from model_export.checkpoint import Checkpoint, TokenizerFiles
from model_export.errors import ExportError
from model_export.onnx_graphs import build_decoder_step, build_encoder
from service.model import FORMAT, GRAPHS, MANIFEST, ModelFolder, ModelFolderError, load_model_folder, sha256_of

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
        "batch_invariant": True,  # format 12: onnx_graphs' step graph attends over the padded source in plain operators
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
            "rare_letters": tok.rare_letters,
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
    """Written beside and renamed into place: a failure midway leaves the manifest as it was."""
    staged = folder / f".{MANIFEST}.tmp"
    staged.write_text(json.dumps(manifest, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    staged.replace(folder / MANIFEST)


def fp32_copy(folder_path: Path, precision: str, verb: str) -> tuple[ModelFolder, dict, dict]:
    """What a derived variant (int8, fp16) starts from: the loaded folder, its manifest as JSON, and a copy of its
    fp32 variant named `precision`, whose graphs the caller converts."""
    folder = load_model_folder(folder_path)
    if "fp32" not in folder.manifest.variants:
        raise ExportError(f"{folder_path}: no fp32 variant to {verb}")
    manifest = json.loads((folder_path / MANIFEST).read_text(encoding="utf-8"))
    variant = json.loads(folder.manifest.variants["fp32"].model_dump_json())
    variant["precision"] = precision
    variant.pop("decoder_step_shortlist", None)  # `shortlist` writes each variant's from that variant's step graph
    for file in variant_files(variant):
        check_graph(folder.file(file))
    return folder, manifest, variant


def check_graph(path: Path) -> None:
    """ExportError, one line, when path is not a valid ONNX graph (a checksum matches whatever file it was made
    from): the converters would end in a protobuf or shape-inference traceback."""
    try:
        onnx.checker.check_model(str(path))
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        reason = (str(error).strip().splitlines() or ["unreadable"])[0].replace(f" from file: {path}", "")
        raise ExportError(f"{path}: not a valid ONNX graph ({reason}); re-export the model folder") from None


def add_variant(folder_path: Path, manifest: dict, variant: dict, written: list[str], make_default: bool) -> dict:
    """Records a derived variant and its new files in the manifest, writes it, and checks the folder still loads.
    A file the variant's last version had and this one has not (`quantize --fp32-embeddings` after `quantize`: the
    shared int8 table) leaves the manifest and the folder: listed, it tied the folder's loading to a file that
    nothing reads."""
    manifest["variants"][variant["precision"]] = variant
    manifest["files"].update(file_entries(folder_path, written))
    if make_default:
        manifest["default_variant"] = variant["precision"]
    write_manifest(folder_path, manifest)
    stale = sorted(set(manifest["files"]) - set(load_model_folder(folder_path).manifest.referenced_files()))
    for name in stale:
        del manifest["files"][name]
        (folder_path / name).unlink(missing_ok=True)
    if stale:
        write_manifest(folder_path, manifest)
    load_model_folder(folder_path)  # the folder must still load
    return manifest


# -- the output folder: checked before any work, written beside it, renamed into place ---------------------------


def check_new_folder(out: Path) -> None:
    """--out must be new or an empty folder: nothing a user keeps there is ever replaced or deleted."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a folder; pass a new folder as --out")
    if out.is_dir() and any(out.iterdir()):
        raise ExportError(f"{out} is not empty; pass a new or empty folder as --out (nothing in it is replaced)")


def _remove_empty(folders: list[Path]) -> None:
    """The parent folders this run created, deepest first, where still empty."""
    for folder in folders:
        try:
            folder.rmdir()
        except OSError:
            break


@contextmanager
def staged_folder(out: Path) -> Iterator[Path]:
    """A path (not yet created) beside `out` to write into, renamed to `out` when the block ends; on any failure
    it is removed with what this run created, so that --out never holds a half-written folder."""
    check_new_folder(out)
    created = [p for p in [out.parent, *out.parent.parents] if not p.exists()]
    out.parent.mkdir(parents=True, exist_ok=True)
    holder = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        yield holder / out.name
        # rename(2) replaces an empty folder and refuses a non-empty one: a folder filled meanwhile stays as it is
        (holder / out.name).replace(out)
    except BaseException:
        shutil.rmtree(holder, ignore_errors=True)
        _remove_empty(created)
        raise
    holder.rmdir()


# -- the tokenizer: plain file names, SentencePiece models, ids within the model's vocabulary ---------------------


def check_file_name(name: str, where: str) -> None:
    """A tokenizer file name must be a plain file name: one like ../x or /etc/x would be written outside the
    folder (the server refuses such names when it loads a folder), and a graph's or the manifest's name would
    be overwritten."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or Path(name).name != name:
        raise ExportError(f"{where}: tokenizer file name {name!r} is not a plain file name (like spm.model)")
    if name in (MANIFEST, ENCODER_FILE, DECODER_FILE, RAGGED_FILE):
        raise ExportError(f"{where}: tokenizer file name {name!r} is a name the model folder uses for its own file")


def sentencepiece_of(tok: TokenizerFiles, name: str, where: str) -> spm.SentencePieceProcessor:
    if name not in tok.files:
        raise ExportError(f"{where}: tokenizer file {name!r} is named but not among its files ({sorted(tok.files)})")
    try:
        return spm.SentencePieceProcessor(model_proto=tok.files[name])
    except Exception:  # noqa: BLE001 - sentencepiece raises RuntimeError or its own errors alike
        raise ExportError(f"{where}: tokenizer file {name!r} is not a SentencePiece model") from None


def vocabulary_ids(tok: TokenizerFiles, name: str, where: str) -> list[int]:
    if name not in tok.files:
        raise ExportError(f"{where}: vocabulary {name!r} is named but not among the tokenizer files")
    try:
        vocab = json.loads(tok.files[name].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExportError(f"{where}: vocabulary {name!r} is not valid JSON ({error})") from None
    if not isinstance(vocab, dict) or not all(type(v) is int and v >= 0 for v in vocab.values()):
        raise ExportError(f"{where}: vocabulary {name!r} must be a JSON object mapping each piece to an id >= 0")
    return list(vocab.values())


def check_tokenizer(checkpoint: Checkpoint, where: str = "checkpoint") -> None:
    """Both SentencePiece models must load, and every source id the tokenizer gives must be a row of the encoder's
    embeddings: an id past the end passes export and fails the first request with an ONNX Runtime Gather error.
    Without a vocabulary the source model's ids are the model's ids, so its pieces must not outnumber
    src_vocab_size; with a Marian vocabulary (vocab.json) both models' pieces map through it, so its ids must fit.
    The target side needs no such rule: the decoder only reads ids the model itself produced (< tgt_vocab_size),
    and a target model with more pieces than those ids merely has pieces the model never outputs."""
    tok, cfg = checkpoint.tokenizer, checkpoint.config
    for name in tok.files:
        check_file_name(name, where)
    source = sentencepiece_of(tok, tok.source_model, where)
    sentencepiece_of(tok, tok.target_model, where)
    if tok.vocabulary is not None:
        largest = max(vocabulary_ids(tok, tok.vocabulary, where), default=-1)
        if largest >= cfg.src_vocab_size:
            raise ExportError(
                f"{where}: vocabulary {tok.vocabulary!r} has id {largest}, outside the model's {cfg.src_vocab_size} "
                "source ids"
            )
    elif source.get_piece_size() > cfg.src_vocab_size:
        raise ExportError(
            f"{where}: tokenizer {tok.source_model!r} has {source.get_piece_size()} pieces, more than the model's "
            f"{cfg.src_vocab_size} source ids; export with the tokenizer the model was trained with"
        )


# -- the export ------------------------------------------------------------------------------------------------------


def export_folder(checkpoint: Checkpoint, folder: Path, name: str, version: str) -> Path:
    """Checkpoint -> folder with encoder.onnx, decoder_step.onnx, decoder_step_ragged.onnx, tokenizer files and
    manifest.json (fp32). The folder is loaded as the server loads it before it is renamed into place. The
    commands check the tokenizer's models and ids first (`check_tokenizer`); tests build mismatched folders here."""
    check_new_folder(folder)
    for file_name in checkpoint.tokenizer.files:  # written as folder / file_name below
        check_file_name(file_name, "checkpoint")
    model = checkpoint.build_model()
    with staged_folder(folder) as staged:
        staged.mkdir()
        with torch.no_grad():
            onnx.save(build_encoder(model), staged / ENCODER_FILE)
            onnx.save(build_decoder_step(model), staged / DECODER_FILE)
            onnx.save(build_decoder_step(model, ragged=True), staged / RAGGED_FILE)
        for file_name, content in checkpoint.tokenizer.files.items():
            (staged / file_name).write_bytes(content)
        variants = {"fp32": variant_entry(checkpoint, "fp32", ENCODER_FILE, DECODER_FILE, RAGGED_FILE)}
        write_manifest(staged, build_manifest(checkpoint, staged, name, version, variants))
        try:
            load_model_folder(staged)  # never report success for a folder the server refuses
        except ModelFolderError as error:
            message = str(error).replace(str(staged), str(folder))
            raise ExportError(f"the written folder would not load in the server: {message}") from None
    return folder
