"""Adds an int8 variant to a model folder: ONNX Runtime dynamic quantization of the graphs' weight
matrices (the projections, the FFN and the vocabulary projection), recorded in the manifest beside fp32.
The graphs' inputs and outputs are unchanged, so the server runs either variant the same way.
"""

from __future__ import annotations

import json
from pathlib import Path

from onnxruntime.quantization import QuantType, quantize_dynamic

from model_export.errors import ExportError
from model_export.export import file_entries, write_manifest
from service.model_folder import MANIFEST, load_model_folder


def int8_name(file_name: str) -> str:
    return file_name.removesuffix(".onnx") + ".int8.onnx"


def quantize_graph(source: Path, target: Path, per_channel: bool, embeddings: bool) -> None:
    """int8 weights for every MatMul with a constant weight (and the embedding tables if asked)."""
    quantize_dynamic(
        model_input=source, model_output=target, weight_type=QuantType.QInt8, per_channel=per_channel,
        op_types_to_quantize=["MatMul", "Gather"] if embeddings else ["MatMul"],
        extra_options={"MatMulConstBOnly": True},  # attention's activation x activation products stay fp32
    )


def add_int8_variant(
    folder_path: Path, per_channel: bool = True, make_default: bool = False, embeddings: bool = True
) -> dict:
    """Quantizes the fp32 graphs into *.int8.onnx files and adds variant 'int8' to the manifest."""
    folder = load_model_folder(folder_path)
    if "fp32" not in folder.manifest.variants:
        raise ExportError(f"{folder_path}: no fp32 variant to quantize")
    fp32 = folder.manifest.variants["fp32"]
    manifest = json.loads((folder_path / MANIFEST).read_text(encoding="utf-8"))
    variant = json.loads(fp32.model_dump_json())
    variant["precision"] = "int8"
    for graph in ("encoder", "decoder_step"):
        name = int8_name(variant[graph]["file"])
        quantize_graph(folder.file(variant[graph]["file"]), folder_path / name, per_channel, embeddings)
        variant[graph]["file"] = name
    manifest["variants"]["int8"] = variant
    manifest["files"].update(file_entries(folder_path, [variant["encoder"]["file"], variant["decoder_step"]["file"]]))
    if make_default:
        manifest["default_variant"] = "int8"
    write_manifest(folder_path, manifest)
    load_model_folder(folder_path)  # the folder must still load
    return manifest
