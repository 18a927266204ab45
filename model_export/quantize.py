"""Adds an int8 variant to a model folder: ONNX Runtime dynamic quantization of the graphs' weight
matrices (the projections, the FFN and the vocabulary projection), recorded in the manifest beside fp32.
The graphs' inputs and outputs are unchanged, so the server runs either variant the same way.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from model_export.export import add_variant, fp32_copy, variant_files, variant_graphs

# With shared embeddings both int8 graphs quantize the same table the same way: it is written once, as ONNX
# external data of both, and the server keeps one copy in memory (service.runtime.shared_initializers).
EMBEDDING_TABLES = {
    "encoder": "src_embed.lut_quantized",
    "decoder_step": "tgt_embed.lut_quantized",
    "decoder_step_ragged": "tgt_embed.lut_quantized",
}
SHARED_EMBEDDINGS_FILE = "embeddings.int8.bin"


def int8_name(file_name: str) -> str:
    return file_name.removesuffix(".onnx") + ".int8.onnx"


def quantize_graph(source: Path, target: Path, per_channel: bool, embeddings: bool) -> None:
    """int8 weights for every MatMul with a constant weight (and the embedding tables if asked)."""
    quantize_dynamic(
        model_input=source, model_output=target, weight_type=QuantType.QInt8, per_channel=per_channel,
        op_types_to_quantize=["MatMul", "Gather"] if embeddings else ["MatMul"],
        extra_options={
            "MatMulConstBOnly": True,  # attention's activation x activation products stay fp32
            # ONNX shape inference stops at the contrib GroupQueryAttention: what follows it is float32
            "DefaultTensorType": onnx.TensorProto.FLOAT,
        },
    )


def add_int8_variant(
    folder_path: Path, per_channel: bool = True, make_default: bool = False, embeddings: bool = True
) -> dict:
    """Quantizes the fp32 graphs into *.int8.onnx files and adds variant 'int8' to the manifest."""
    folder, manifest, variant = fp32_copy(folder_path, "int8", "quantize")
    for graph in variant_graphs(variant):
        name = int8_name(variant[graph]["file"])
        quantize_graph(folder.file(variant[graph]["file"]), folder_path / name, per_channel, embeddings)
        variant[graph]["file"] = name
    shared = share_embedding_table(folder_path, variant) if embeddings else []  # when the two tables are one
    variant["shared_initializers"] = shared
    written = variant_files(variant) + [i["file"] for i in shared]
    return add_variant(folder_path, manifest, variant, written, make_default)


def share_embedding_table(folder: Path, variant: dict) -> list[dict]:
    """Moves the int8 embedding table out of the graphs (the encoder and the step graphs) into one raw file that
    they all reference as external data. Returns the manifest's shared_initializers entry, or nothing when the
    source and target tables differ."""
    graphs = [graph for graph in variant_graphs(variant) if graph in EMBEDDING_TABLES]
    models = {graph: onnx.load(folder / variant[graph]["file"]) for graph in graphs}
    tensors = {
        graph: next((t for t in models[graph].graph.initializer if t.name == EMBEDDING_TABLES[graph]), None)
        for graph in graphs
    }
    if any(t is None for t in tensors.values()):
        return []
    tables = {graph: numpy_helper.to_array(t) for graph, t in tensors.items()}
    table = tables["encoder"]
    if any(not np.array_equal(table, other) for other in tables.values()) or table.dtype.name not in ("uint8", "int8"):
        return []
    (folder / SHARED_EMBEDDINGS_FILE).write_bytes(np.ascontiguousarray(table).tobytes())
    for graph, tensor in tensors.items():
        tensor.ClearField("raw_data")
        tensor.data_location = onnx.TensorProto.EXTERNAL
        del tensor.external_data[:]
        for key, value in (("location", SHARED_EMBEDDINGS_FILE), ("offset", "0"), ("length", str(table.nbytes))):
            tensor.external_data.add(key=key, value=value)
        onnx.save(models[graph], folder / variant[graph]["file"])
    names = {graph: EMBEDDING_TABLES[graph] for graph in graphs}
    return [{"file": SHARED_EMBEDDINGS_FILE, "dtype": table.dtype.name, "shape": list(table.shape), "names": names}]
