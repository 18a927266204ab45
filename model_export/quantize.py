"""Adds an int8 variant to a model folder: ONNX Runtime dynamic quantization of the graphs' weight
matrices (the projections, the FFN and the vocabulary projection), recorded in the manifest beside fp32.
The graphs' inputs and outputs are unchanged, so the server runs either variant the same way.

The variant also gets the step graph for one row (format 6, `decoder_step_single`): its products are
MatMulNBits nodes over 8-bit weights (or 4-bit: SINGLE_ROW_BLOCKS) quantized in blocks along K, whose one-row
kernel reads them faster than DynamicQuantizeMatMul's (a greedy step at batch 1: the default model's graph 233 ->
179 us at 8 bits, the paper-size model's 4.7 -> 3.0 ms); from a few rows up it is slower, so the server runs it
for one row, or up to four on a decoder whose weights stream from memory (translation/translator.py, single_row_rows).
And the step graph for static batches (format 10, `decoder_step_dense`): the int8 step graph with its
self-attention over the whole time axis of a cache as long as its rows (to_dense_self_attention), which the
runtime opens beside the step graph, for steps of 8 rows or more, where every batch runs to completion (the static
mode, the offline evaluation, bench.engine).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper
from onnxruntime.quantization import QuantType, quantize_dynamic

from model_export import graph_io
from model_export.errors import ExportError
from model_export.export import add_variant, fp32_copy, variant_files, variant_graphs
from model_export.onnx_graphs import names_read

# With shared embeddings both int8 graphs quantize the same table the same way: it is written once, as ONNX
# external data of both, and the server keeps one copy in memory (service.engine.runtime.shared_initializers).
EMBEDDING_TABLES = {
    "encoder": "src_embed.lut_quantized",
    "decoder_step": "tgt_embed.lut_quantized",
    "decoder_step_ragged": "tgt_embed.lut_quantized",
    "decoder_step_single": "tgt_embed.lut_quantized",
    "decoder_step_dense": "tgt_embed.lut_quantized",
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
# The products' weights in [-64, 64], not [-127, 127]: on a CPU without VNNI (AVX2 alone, or AVX-512 without VNNI)
# ONNX Runtime's int8 products (VPMADDUBSW) add two (unsigned activation x signed weight) products in 16 bits, which
# saturate past 32,767: 255 x 127 x 2 can pass it, 255 x 64 x 2 cannot; where VNNI runs, 7-bit weights give the same
# integers. On an AVX2-only AMD EPYC (Zen 3), 8 bits against 7: a tiny model's int8 log-probs 4.6 from fp32's against
# under `verify`'s int8 tolerance of 1; the default model's encoder output over 256 test sentences 4.4 against 2.7 %
# from fp32's (keys, RMS), at most 0.92 against 0.33; its test set's greedy BLEU 39.3-39.5 against 39.5-39.6 (fp32
# 39.5); all-positive activations times +-1 weights 2.4 against 0.05 % off. The one-row graph's MatMulNBits (int8
# activations, symmetric) and the embedding tables (gathered, not multiplied) keep 8 bits.
REDUCED_RANGE = True
WEIGHT_BITS = 7 if REDUCED_RANGE else 8  # the manifest's `weight_bits` (format 11), which the server checks
WEIGHT_TOP = 64 if REDUCED_RANGE else 127  # the products' weight codes lie in [-WEIGHT_TOP, WEIGHT_TOP]
# Each activation row's codes: 128 + round(x / scale), scale = the row's largest magnitude / ROW_TOP, so in [1, 255];
# a row of zeros (ROW_TINY keeps its scale positive) gives codes of 128.
ROW_TOP = 127.0
ROW_TINY = 1e-30
DENSE_FILE = "decoder_step_dense.int8.onnx"


def replace_nodes(model: onnx.ModelProto, nodes: list[onnx.NodeProto], removed: set[str]) -> None:
    """The graph's nodes become `nodes`; the initializers in `removed` that none of them reads leave the file; the
    contrib domain of the new products is declared."""
    graph = model.graph
    del graph.node[:]
    graph.node.extend(nodes)
    unread = removed - names_read(nodes)
    kept = [t for t in graph.initializer if t.name not in unread]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    if not any(o.domain == graph_io.CONTRIB_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(graph_io.CONTRIB_DOMAIN, 1))


def int8_name(file_name: str) -> str:
    return file_name.removesuffix(".onnx") + ".int8.onnx"


ACTIVATION_SCALES = ("per-row", "per-tensor")  # the manifest's `activation_scales` (format 12)


def quantize_graph(
    source: Path, target: Path, per_channel: bool, embeddings: bool, activation_rank: int, scales: str = "per-row"
) -> None:
    """int8 weights for every MatMul with a constant weight, the products' in 7 bits (REDUCED_RANGE), their
    activations quantized row by row (to_per_row_products), and the embedding tables if asked. `scales`
    "per-tensor": ONNX Runtime's dynamic quantization instead, one scale for each activation tensor (every row of
    the batch), faster by the passes over the activations that it fuses, and not batch-invariant."""
    if scales == "per-tensor":
        quantize_dynamic(
            model_input=source, model_output=target, weight_type=QuantType.QInt8, per_channel=per_channel,
            op_types_to_quantize=["MatMul", "Gather"] if embeddings else ["MatMul"], reduce_range=REDUCED_RANGE,
            extra_options={"MatMulConstBOnly": True, "DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        return
    if embeddings:
        quantize_dynamic(
            model_input=source, model_output=target, weight_type=QuantType.QInt8, per_channel=per_channel,
            op_types_to_quantize=["Gather"],
            # ONNX shape inference stops at the contrib GroupQueryAttention: what follows it is float32
            extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
        )
        source = target
    model = onnx.load(source)
    to_per_row_products(model, activation_rank, per_channel)
    if activation_rank == 2:
        defer_logit_scale(model)
    onnx.save(model, target)


def defer_logit_scale(model: onnx.ModelProto) -> bool:
    """The output projection's per-row scale, applied where it is needed rather than over all B x V logits: a row's
    scale is positive, so its tokens' order is that of its unscaled logits, which the top-K reads (the product's
    a_scale a constant 1: ONNX Runtime's MatMulIntegerToFloat then applies the weights' scales inside the product,
    where a scale per row costs it one more pass over its output); the row's top-K values are scaled after it (B x
    K), and the log-softmax branch scales the whole row first. Each value is the same product of the same two
    numbers as before, so the outputs are unchanged but for ties that the scaling itself makes. Only for a step
    graph whose product feeds the distribution alone (no bias Add between them; `onnx_graphs.distribution`).
    Returns whether it rewrote the graph."""
    graph = model.graph
    products = [n for n in graph.node if n.op_type == "MatMulIntegerToFloat" and n.input[1] == "generator.weight_t.i8"]
    choices = [n for n in graph.node if n.op_type == "If" and list(n.output) == ["log_probs", "top_log_probs"]]
    if len(products) != 1 or len(choices) != 1:
        return False
    (product,), (choice,) = products, choices
    logits, scale = product.output[0], product.input[2]  # (B, V), (B, 1)
    branches = {a.name: a.g for a in choice.attribute}
    softmax = [n for n in branches["then_branch"].node if n.op_type == "LogSoftmax" and n.input[0] == logits]
    raw_top = [n for n in branches["else_branch"].node if n.op_type == "Identity"]
    if len(softmax) != 1 or len(raw_top) != 1:  # (a logits bias: the log-softmax reads the Add's output instead)
        return False
    unscaled = f"{logits}.unscaled"
    graph.initializer.append(numpy_helper.from_array(np.array(1.0, np.float32), "row.one"))
    product.input[2], product.output[0] = "row.one", unscaled  # (B, V) each row's logits over its scale
    for each in list(graph.node) + list(branches["else_branch"].node):  # (the raw branch slices it for its shape)
        each.input[:] = [unscaled if name == logits else name for name in each.input]
    raw_top[0].op_type = "Mul"  # (B, top_k) the top logits, each row's times its scale
    raw_top[0].input.append(scale)
    branch = branches["then_branch"]
    rows = [helper.make_node("Mul", [unscaled, scale], [logits])] + list(branch.node)  # (B, V) the logits
    del branch.node[:]
    branch.node.extend(rows)
    return True


def product_weights(weight: np.ndarray, per_channel: bool) -> tuple[np.ndarray, np.ndarray]:
    """(K, N) float weights -> symmetric int8 codes in [-WEIGHT_TOP, WEIGHT_TOP] (K, N) and their scales, (N,) one per
    column (per_channel) or () one for the matrix."""
    top = np.abs(weight).max(axis=0) if per_channel else np.abs(weight).max()  # (N,) or ()
    scales = np.where(top > 0, top / WEIGHT_TOP, 1.0).astype(np.float32)  # an all-zero column: any scale gives zeros
    codes = np.clip(np.round(weight / scales), -WEIGHT_TOP, WEIGHT_TOP).astype(np.int8)  # (K, N)
    return codes, scales


def to_per_row_products(model: onnx.ModelProto, rank: int, per_channel: bool = True) -> int:
    """Every MatMul by a constant (K, N) weight becomes a MatMulIntegerToFloat whose activations are quantized row
    by row: each row of K values gets its own scale (its largest magnitude over ROW_TOP) and uint8 codes around
    the fixed zero point 128, so a row's codes, its integer products (exact) and its result depend on that row
    alone, whatever shares its batch (batch invariance; DynamicQuantizeMatMul's one scale spans every row). An
    activation read by several products is quantized once. `rank`: the activations' rank, 2 ((B, K): the step
    graphs) or 3 ((B, S, K): the encoder, whose rows are flattened for the quantization and its products' results
    shaped back). Returns how many products it replaced."""
    graph = model.graph
    constants = {t.name: t for t in graph.initializer}
    node = helper.make_node
    fixed = {
        "row.top_inverse": np.array(1.0 / ROW_TOP, np.float32), "row.tiny": np.array(ROW_TINY, np.float32),
        "row.zero_point": np.array(128, np.uint8), "row.flat": np.array([-1], np.int64),
    }
    if rank == 3:
        fixed |= {"row.lead_end": np.array([rank - 1], np.int64), "row.lead_start": np.array([0], np.int64)}
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in fixed.items())
    quantized: dict[str, tuple[str, str, str | None]] = {}  # activation -> its codes, row scales, leading shape

    def quantizer(x: str, k: int) -> tuple[list[onnx.NodeProto], tuple[str, str, str | None]]:
        p, lead = f"row.{x}", None
        nodes = []
        rows = x
        if rank == 3:
            nodes += [
                node("Reshape", [x, f"row.k{k}"], [f"{p}.rows"]),  # (B x S, K)
                node("Shape", [x], [f"{p}.shape"]),  # (3,)
                node("Slice", [f"{p}.shape", "row.lead_start", "row.lead_end"], [f"{p}.lead"]),  # (2,) = [B, S]
            ]
            rows, lead = f"{p}.rows", f"{p}.lead"
        nodes += [
            node("Abs", [rows], [f"{p}.abs"]),  # (M, K)
            node("ReduceMax", [f"{p}.abs"], [f"{p}.top"], axes=[1], keepdims=1),  # (M, 1)
            node("Mul", [f"{p}.top", "row.top_inverse"], [f"{p}.scale_0"]),  # (M, 1)
            node("Max", [f"{p}.scale_0", "row.tiny"], [f"{p}.scale"]),  # (M, 1) a row of zeros: codes of 128
            node("Reshape", [f"{p}.scale", "row.flat"], [f"{p}.scales"]),  # (M,)
        ]
        if not quantized:  # the first: every product of a graph reads the same M rows, which share these
            nodes += [
                node("Shape", [f"{p}.scales"], ["row.rows_1"]),  # (1,) = [M]
                node("Expand", ["row.zero_point", "row.rows_1"], ["row.zero_points"]),  # (M,) all 128
            ]
        nodes.append(
            node("QuantizeLinear", [rows, f"{p}.scales", "row.zero_points"], [f"{p}.codes"], axis=0)
        )  # (M, K) uint8
        return nodes, (f"{p}.codes", f"{p}.scale", lead)

    readers: dict[str, list[onnx.NodeProto]] = {}
    for each in graph.node:
        for name in each.input:
            readers.setdefault(name, []).append(each)
    nodes, replaced, widths, dropped, zero_biases = [], set(), set(), set(), set()
    for old in graph.node:
        if id(old) in dropped:
            continue
        if old.op_type != "MatMul" or old.input[1] not in constants:
            nodes.append(old)
            continue
        weight = numpy_helper.to_array(constants[old.input[1]]).astype(np.float32)  # (K, N)
        k, n = weight.shape
        x = old.input[0]
        if x not in quantized:
            added, quantized[x] = quantizer(x, k)
            nodes += added
            if rank == 3:
                widths.add(k)
        codes, row_scales, lead = quantized[x]
        w = old.input[1]
        w_codes, w_scales = product_weights(weight, per_channel)
        graph.initializer.extend(
            [numpy_helper.from_array(w_codes, f"{w}.i8"), numpy_helper.from_array(w_scales, f"{w}.i8_scale")]
        )
        # the bias Add stays a node of its own (ONNX Runtime 1.31's MatMulIntegerToFloat drops its bias input when
        # a_scale has a value per row), unless the bias is all zeros (a Marian model's final_logits_bias): x + 0 = x
        inputs, output = [codes, f"{w}.i8", row_scales, f"{w}.i8_scale", "row.zero_point"], old.output[0]
        after = readers.get(output, [])
        if len(after) == 1 and after[0].op_type == "Add" and after[0].input[0] == output:
            bias = constants.get(after[0].input[1])
            if bias is not None and tuple(bias.dims) == (n,) and not numpy_helper.to_array(bias).any():
                output = after[0].output[0]
                dropped.add(id(after[0]))
                zero_biases.add(after[0].input[1])  # left out of the file unless another node reads it
        product = output if lead is None else f"row.{output}.flat"
        nodes.append(
            node(
                "MatMulIntegerToFloat", inputs, [product], name=f"{old.name or output}.row",
                domain=graph_io.CONTRIB_DOMAIN,
            )
        )  # (M, N)
        if lead is not None:
            graph.initializer.append(numpy_helper.from_array(np.array([n], np.int64), f"row.{output}.n"))
            nodes += [
                node("Concat", [lead, f"row.{output}.n"], [f"row.{output}.shape"], axis=0),  # (3,) = [B, S, N]
                node("Reshape", [product, f"row.{output}.shape"], [output]),  # (B, S, N)
            ]
        replaced.add(w)
    graph.initializer.extend(numpy_helper.from_array(np.array([-1, k], np.int64), f"row.k{k}") for k in widths)
    replace_nodes(model, nodes, replaced | zero_biases)
    return len(replaced)


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
    replace_nodes(model, nodes, replaced)


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


def to_dense_self_attention(model: onnx.ModelProto) -> int:
    """Every self-attention GroupQueryAttention node (the one reading self_key_i) becomes a ScatterND per cache, which
    writes the row's new key and value at slot `seqlens_k` (= positions), and a MultiHeadAttention over the whole
    time axis, the slots past each row's own masked (format 10, `decoder_step_dense`). The same inputs, outputs and
    results; bound in place (present_key_i on self_key_i's memory), the ScatterND copies nothing (ONNX Runtime's
    kernel copies its input only into other memory). For static batches, whose rows all have the same length and
    whose cache's time axis is the rows' own (a dense cache: service/engine/kv_cache.py): ONNX Runtime's CPU
    GroupQueryAttention spends ~2.4 us on each (row, head) of 29 cached steps, its MultiHeadAttention half that (the
    paper-size model at 16 rows: 298 against 171 us a layer, at 64 rows 1,303 against 683). Over a reserved or
    ragged time axis it would read every slot: the server's continuous batches keep GroupQueryAttention. Returns how
    many nodes it replaced."""
    graph = model.graph
    attention = [n for n in graph.node if n.op_type == "GroupQueryAttention" and n.input[3].startswith("self_key_")]
    if not attention:
        return 0
    heads = next(a.i for a in attention[0].attribute if a.name == "num_heads")
    cache = next(i for i in graph.input if i.name == attention[0].input[3])  # (B, H, T, Dh)
    head_dim = cache.type.tensor_type.shape.dim[3].dim_value
    constants = {
        "dense.zero": np.array(0, np.int64), "dense.one": np.array(1, np.int64),
        "dense.axis_0": np.array([0], np.int64), "dense.axis_1": np.array([1], np.int64),
        "dense.axes_12": np.array([1, 2], np.int64),
        "dense.time_axis": np.array([2], np.int64), "dense.heads_1": np.array([heads, 1], np.int64),
        "dense.head_ids": np.arange(heads, dtype=np.int64).reshape(1, heads, 1),  # (1, H, 1)
        "dense.row_shape": np.array([-1, heads, head_dim], np.int64),
        "dense.qkv_parts": np.array([heads * head_dim] * 3, np.int64),
    }
    graph.initializer.extend(numpy_helper.from_array(value, name) for name, value in constants.items())
    node = helper.make_node
    shared = [  # once per step: where each row writes, and which slots it attends
        node("Shape", ["seqlens_k"], ["dense.rows_1"]),  # (1,) = [B]
        node("Squeeze", ["dense.rows_1", "dense.axis_0"], ["dense.rows"]),  # ()
        node("Cast", ["seqlens_k"], ["dense.slot"], to=onnx.TensorProto.INT64),  # (B,) each row's new slot
        node("Range", ["dense.zero", "dense.rows", "dense.one"], ["dense.row_ids"]),  # (B,)
        node("Concat", ["dense.rows_1", "dense.heads_1"], ["dense.index_shape"], axis=0),  # (3,) = [B, H, 1]
        node("Unsqueeze", ["dense.row_ids", "dense.axes_12"], ["dense.row_col"]),  # (B, 1, 1)
        node("Unsqueeze", ["dense.slot", "dense.axes_12"], ["dense.slot_col"]),  # (B, 1, 1)
        node("Expand", ["dense.row_col", "dense.index_shape"], ["dense.index_row"]),  # (B, H, 1)
        node("Expand", ["dense.head_ids", "dense.index_shape"], ["dense.index_head"]),  # (B, H, 1)
        node("Expand", ["dense.slot_col", "dense.index_shape"], ["dense.index_slot"]),  # (B, H, 1)
        node(
            "Concat", ["dense.index_row", "dense.index_head", "dense.index_slot"], ["dense.index"], axis=-1
        ),  # (B, H, 3): (row, head, slot) of each new key and value
        node("Shape", [cache.name], ["dense.cache_shape"]),  # (4,)
        node("Gather", ["dense.cache_shape", "dense.time_axis"], ["dense.slots_1"], axis=0),  # (1,) = [T]
        node("Squeeze", ["dense.slots_1", "dense.axis_0"], ["dense.slots"]),  # ()
        node("Range", ["dense.zero", "dense.slots", "dense.one"], ["dense.slot_ids"]),  # (T,)
        node("Unsqueeze", ["dense.slot_ids", "dense.axis_0"], ["dense.slot_row"]),  # (1, T)
        node("Unsqueeze", ["dense.slot", "dense.axis_1"], ["dense.last_col"]),  # (B, 1)
        node("LessOrEqual", ["dense.slot_row", "dense.last_col"], ["dense.attended"]),  # (B, T) its slots and the new
        node("Cast", ["dense.attended"], ["dense.key_mask"], to=onnx.TensorProto.INT32),  # (B, T) 1 where attended
    ]
    nodes, replaced = [], {id(n) for n in attention}
    for old in graph.node:
        if id(old) not in replaced:
            nodes.append(old)
            continue
        packed, past_key, past_value = old.input[0], old.input[3], old.input[4]  # (B, 1, 3D), (B, H, T, Dh) twice
        context, present_key, present_value = old.output
        p = f"dense.{past_key}"
        nodes += [
            node("Split", [packed, "dense.qkv_parts"], [f"{p}.q", f"{p}.k", f"{p}.v"], axis=-1),  # (B, 1, D) each
            node("Reshape", [f"{p}.k", "dense.row_shape"], [f"{p}.k_heads"]),  # (B, H, Dh)
            node("Reshape", [f"{p}.v", "dense.row_shape"], [f"{p}.v_heads"]),  # (B, H, Dh)
            node("ScatterND", [past_key, "dense.index", f"{p}.k_heads"], [present_key]),  # (B, H, T, Dh) in place
            node("ScatterND", [past_value, "dense.index", f"{p}.v_heads"], [present_value]),  # (B, H, T, Dh)
            node(
                "MultiHeadAttention", [f"{p}.q", present_key, present_value, "", "dense.key_mask"], [context],
                domain=graph_io.CONTRIB_DOMAIN, num_heads=heads, scale=1.0,  # Q comes pre-scaled by 1/sqrt(d_k)
            ),  # (B, 1, D)
        ]
    del graph.node[:]
    graph.node.extend(shared + nodes)
    return len(attention)


def dense_step_graph(source: Path, target: Path) -> None:
    """The int8 step graph -> the int8 step graph for static batches (to_dense_self_attention)."""
    model = onnx.load(source)
    if not to_dense_self_attention(model):
        raise ValueError(f"{source}: no self-attention GroupQueryAttention node to rewrite")
    onnx.save(model, target)


def add_int8_variant(
    folder_path: Path,
    per_channel: bool = True,
    make_default: bool = False,
    embeddings: bool = True,
    single_row_bits: int = 8,
    activation_scales: str = "per-row",
) -> dict:
    """Quantizes the fp32 graphs into *.int8.onnx files, adds the step graph for one row (format 6; its weights
    `single_row_bits` bits: SINGLE_ROW_BLOCKS) and the one for static batches (format 10, to_dense_self_attention),
    and adds variant 'int8' to the manifest."""
    folder, manifest, variant = fp32_copy(folder_path, "int8", "quantize")
    if manifest.get("shortlist") and activation_scales != "per-row":
        raise ExportError(
            f"{folder_path} has a vocabulary shortlist, whose int8 step graph needs per-row activation scales: "
            "quantize with --activation-scales per-row, or into a copy of the folder without its shortlist"
        )
    step = folder.file(variant["decoder_step"]["file"])  # fp32
    for graph in variant_graphs(variant):
        name = int8_name(variant[graph]["file"])
        rank = 3 if graph == "encoder" else 2  # (B, S, D) activations in the encoder, (B, D) in the step graphs
        quantize_graph(
            folder.file(variant[graph]["file"]), folder_path / name, per_channel, embeddings, rank, activation_scales
        )
        variant[graph]["file"] = name
    single_row_graph(step, folder_path / SINGLE_ROW_FILE, per_channel, embeddings, single_row_bits)
    variant["decoder_step_single"] = {**variant["decoder_step"], "file": SINGLE_ROW_FILE}  # the same inputs, outputs
    dense_step_graph(folder_path / variant["decoder_step"]["file"], folder_path / DENSE_FILE)
    variant["decoder_step_dense"] = {**variant["decoder_step"], "file": DENSE_FILE}  # format 10; the same contract
    # format 12: per-row activation scales (to_per_row_products); the step graph's cross-attention is the fp32 one's,
    # so the variant is batch-invariant when the fp32 variant is (an fp32 variant from before format 12 is not)
    variant["batch_invariant"] = bool(variant.get("batch_invariant")) and activation_scales == "per-row"
    variant["activation_scales"] = activation_scales
    variant["weight_bits"] = WEIGHT_BITS  # a server on a CPU without VNNI warns of 8
    manifest["format_version"] = max(manifest["format_version"], graph_io.FORMAT_VERSION)  # a reader of format 6 on
    shared = share_embedding_table(folder_path, variant) if embeddings else []  # when the two tables are one
    variant["shared_initializers"] = shared
    written = variant_files(variant) + [i["file"] for i in shared]
    if manifest.get("shortlist"):  # a folder with a shortlist: the new step graph's shortlist step graph too
        from model_export.shortlist import add_variant_step  # imported here: shortlist_step reads this module's ROW_TOP

        candidates, pad_id = manifest["shortlist"]["candidates"], folder.manifest.config.pad_id
        written += add_variant_step(folder_path, variant, candidates, pad_id)
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
