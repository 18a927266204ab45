"""Adds an int8 variant to a model folder: ONNX Runtime dynamic quantization of the graphs' weight
matrices (the projections, the FFN and the vocabulary projection), recorded in the manifest beside fp32.
The graphs' inputs and outputs are unchanged, so the server runs either variant the same way.

The variant also gets the step graph for one row (format 6, `decoder_step_single`): its products are
MatMulNBits nodes over 8-bit weights (or 4-bit: SINGLE_ROW_BLOCKS) quantized in blocks along K, whose one-row
kernel reads them faster than DynamicQuantizeMatMul's (a greedy step at batch 1: the default model's graph 233 ->
179 us at 8 bits, the paper-size model's 4.7 -> 3.0 ms); from a few rows up it is slower, so the server runs it
for one row, or up to four on a decoder whose weights stream from memory (service/translator.py, single_row_rows).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from model_export import graph_io
from model_export.export import add_variant, fp32_copy, variant_files, variant_graphs

# With shared embeddings both int8 graphs quantize the same table the same way: it is written once, as ONNX
# external data of both, and the server keeps one copy in memory (service.runtime.shared_initializers).
EMBEDDING_TABLES = {
    "encoder": "src_embed.lut_quantized",
    "decoder_step": "tgt_embed.lut_quantized",
    "decoder_step_ragged": "tgt_embed.lut_quantized",
    "decoder_step_single": "tgt_embed.lut_quantized",
}
SHARED_EMBEDDINGS_FILE = "embeddings.int8.bin"
SINGLE_ROW_FILE = "decoder_step_single.int8.onnx"
# The one-row graph's weights: bits -> the K-block of its scales. 8 bits in blocks of 128 by default (ONNX
# Runtime's usual block; on the AMD EPYC 32 was 10 % slower, 256 no faster). 4 bits in blocks of 32 (`quantize
# --single-row-bits 4`, the shipped default model's since 2026-12-01): its test set one sentence at a time (int8
# greedy, one thread, AMX Xeon) 8 bits BLEU / chrF 39.46 / 59.09 at 1,936 tok/s, 4 bits in blocks of 32 39.50 /
# 59.15 at 2,216-2,264, of 64 39.08 / 58.88 at 2,399, of 128 39.24 / 58.86 at 2,498 (fp32 39.5 / 59.2); its 19
# products alone at one row 289 -> 196 us. On the tiny test model 4 bits are too coarse (greedy's first tokens
# matched fp32's in 2 of 8 sentences, against 5+ at 8 bits), hence not the default for every folder.
SINGLE_ROW_BLOCKS = {8: 128, 4: 32}


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


def blockwise(weight: np.ndarray, block: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(K, N) float weights -> MatMulNBits' form: uint8 codes of `bits` (8 or 4) bits around the operator's default
    zero point (2^(bits-1), none stored), (N, K / block, block) for 8 bits and two codes a byte, the first in the
    low nibble, (N, K / block, block / 2) for 4; K padded with zeros to whole blocks. Scales (N * K / block,)
    float32, one per column and block, each the block's largest magnitude over 2^(bits-1) - 1 (127, 7)."""
    k, n = weight.shape
    blocks, top = -(-k // block), 2 ** (bits - 1) - 1
    padded = np.zeros((blocks * block, n), np.float32)  # (K', N)
    padded[:k] = weight
    by_block = padded.T.reshape(n, blocks, block)  # (N, K' / block, block)
    scales = np.abs(by_block).max(axis=-1) / top  # (N, K' / block)
    scales[scales == 0] = 1.0  # an all-zero block: any scale gives zeros
    codes = (np.clip(np.round(by_block / scales[..., None]), -top, top) + top + 1).astype(np.uint8)  # (N, K'/b, b)
    if bits == 4:
        codes = codes[..., 0::2] | (codes[..., 1::2] << 4)  # (N, K' / block, block / 2)
    return codes, scales.astype(np.float32).reshape(-1)


def to_single_row_products(model: onnx.ModelProto, block: int, bits: int) -> None:
    """Every MatMul by a constant (K, N) weight becomes a MatMulNBits node over its blocks of `bits`-bit codes
    (`blockwise`), taking the bias Add that follows it (a constant (N,)) as its own bias input."""
    graph = model.graph
    constants = {t.name: t for t in graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    nodes, taken, replaced = [], set(), set()
    for node in graph.node:
        if id(node) in taken:
            continue
        if node.op_type != "MatMul" or node.input[1] not in constants:
            nodes.append(node)
            continue
        weight = numpy_helper.to_array(constants[node.input[1]]).astype(np.float32)  # (K, N)
        codes, scales = blockwise(weight, block, bits)
        name = node.input[1]
        graph.initializer.extend(
            [numpy_helper.from_array(codes, f"{name}.q{bits}"), numpy_helper.from_array(scales, f"{name}.s{bits}")]
        )
        inputs, outputs = [node.input[0], f"{name}.q{bits}", f"{name}.s{bits}"], list(node.output)
        after = readers.get(node.output[0], [])
        if len(after) == 1 and after[0].op_type == "Add":
            bias = [i for i in after[0].input if i != node.output[0]]
            if len(bias) == 1 and bias[0] in constants and tuple(constants[bias[0]].dims) == (weight.shape[1],):
                inputs += ["", "", bias[0]]  # no zero points (the default), no g_idx
                outputs = list(after[0].output)
                taken.add(id(after[0]))
        nodes.append(
            helper.make_node(
                "MatMulNBits", inputs, outputs, name=f"{node.name or node.output[0]}.nbits",
                domain=graph_io.CONTRIB_DOMAIN, K=weight.shape[0], N=weight.shape[1], bits=bits, block_size=block,
                accuracy_level=4,  # int8 activations, as DynamicQuantizeMatMul's
            )
        )
        replaced.add(name)
    del graph.node[:]
    graph.node.extend(nodes)
    kept = [t for t in graph.initializer if t.name not in replaced]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if not any(o.domain == graph_io.CONTRIB_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(graph_io.CONTRIB_DOMAIN, 1))


def single_row_graph(source: Path, target: Path, per_channel: bool, embeddings: bool, bits: int = 8) -> None:
    """The fp32 step graph -> the int8 step graph for one row: its embedding table quantized as in the other int8
    graphs (so that they share it), its products MatMulNBits (to_single_row_products)."""
    if embeddings:
        quantize_dynamic(
            model_input=source, model_output=target, weight_type=QuantType.QInt8, per_channel=per_channel,
            op_types_to_quantize=["Gather"], extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        source = target
    model = onnx.load(source)
    to_single_row_products(model, SINGLE_ROW_BLOCKS[bits], bits)
    onnx.save(model, target)


def add_int8_variant(
    folder_path: Path,
    per_channel: bool = True,
    make_default: bool = False,
    embeddings: bool = True,
    single_row_bits: int = 8,
) -> dict:
    """Quantizes the fp32 graphs into *.int8.onnx files, adds the step graph for one row (format 6; its weights
    `single_row_bits` bits: SINGLE_ROW_BLOCKS), and adds variant 'int8' to the manifest."""
    folder, manifest, variant = fp32_copy(folder_path, "int8", "quantize")
    step = folder.file(variant["decoder_step"]["file"])  # fp32
    for graph in variant_graphs(variant):
        name = int8_name(variant[graph]["file"])
        quantize_graph(folder.file(variant[graph]["file"]), folder_path / name, per_channel, embeddings)
        variant[graph]["file"] = name
    single_row_graph(step, folder_path / SINGLE_ROW_FILE, per_channel, embeddings, single_row_bits)
    variant["decoder_step_single"] = {**variant["decoder_step"], "file": SINGLE_ROW_FILE}  # the same inputs, outputs
    manifest["format_version"] = max(manifest["format_version"], graph_io.FORMAT_VERSION)  # a reader of format 6 on
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
