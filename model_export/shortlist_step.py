"""Rewrites a variant's step graph (fp32 or int8) into its shortlist step graph: the output projection scores each
row's own candidates, its sentence's `candidate_ids` (N, C), not the whole vocabulary. The float16 variant's is the
fp32 one's converted as its other graphs are (half.to_half).

Each sentence's rows of the output weight matrix are gathered, (N, C, D), and multiplied with its rows' hidden
states, grouped as the cross-attention groups them (`sentence_rows`): a row's numbers depend on its own hidden state
and candidates alone, never on its batch's. int8: the integer products are exact (MatMulInteger over int8 codes,
the hidden state quantized row by row as `quantize.to_per_row_products` does); fp32: the hidden states are given
twice, so that ONNX Runtime multiplies two or more columns whatever the group's size, as in the cross-attention.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from model_export.half import to_half
from model_export.onnx_graphs import MASKED, GraphBuilder, distribution, drop_unread_initializers, names_read
from model_export.quantize import ROW_TINY, ROW_TOP

GENERATORS = {"MatMul": "generator.weight_t", "MatMulIntegerToFloat": "generator.weight_t.i8"}
BIAS = "generator.bias"
CANDIDATES = "candidate_ids"  # (N, C) int64 input: each sentence's candidates, pad where it has fewer
POSITIONS = "shortlist.top_positions"  # (B, top_k) each row's best candidates' places along C


def generator_node(graph: onnx.GraphProto) -> onnx.NodeProto:
    """The output projection: the product by the generator's weight (fp32 MatMul, int8 MatMulIntegerToFloat)."""
    found = [n for n in graph.node if n.op_type in GENERATORS and n.input[1] == GENERATORS[n.op_type]]
    if len(found) != 1:
        raise ValueError(f"the step graph has {len(found)} output projections (generator.weight_t), not one")
    return found[0]


def cut_distribution(graph: onnx.GraphProto) -> tuple[str, str, str | None]:
    """Removes the output projection and every node after it (the top-K, the log-softmax). Returns the hidden
    state's name (B, D), the product's op type, and its weight scale's name (int8) or None."""
    product = generator_node(graph)
    hidden, kind = product.input[0], product.op_type
    if kind == "MatMulIntegerToFloat":  # its input is the hidden state's row codes: the state itself is quantized
        hidden = next(n.input[0] for n in graph.node if hidden in n.output and n.op_type == "QuantizeLinear")
    dead, kept = set(product.output), [n for n in graph.node if n is not product]
    while True:  # to a fixed point: an If that reads the logits in its branches may come first (quantize sorts so)
        after = [node for node in kept if not names_read([node]) & dead]
        dead |= {name for node in kept if names_read([node]) & dead for name in node.output}
        if len(after) == len(kept):
            break
        kept = after
    del graph.node[:]
    graph.node.extend(kept)
    return hidden, kind, product.input[3] if kind == "MatMulIntegerToFloat" else None


def prune(graph: onnx.GraphProto) -> None:
    """Nodes whose outputs nothing reads, and initializers nothing reads, leave the graph."""
    outputs = {o.name for o in graph.output}
    while True:
        read = outputs | names_read(list(graph.node))
        kept = [node for node in graph.node if read & set(node.output)]
        if len(kept) == len(graph.node):
            break
        del graph.node[:]
        graph.node.extend(kept)
    drop_unread_initializers(graph)


def _fp32_scores(g: GraphBuilder, hidden: str, weight: np.ndarray) -> str:
    """(N, C, G) each sentence's candidates' logits for its rows, from the (D, V) weight."""
    table = g.const("shortlist.weight", np.ascontiguousarray(weight.T))  # (V, D)
    rows = g.op("Gather", table, CANDIDATES, axis=0)  # (N, C, D)
    grouped = g.op("Gather", hidden, "sentence_rows", axis=0)  # (N, G, D)
    twice = g.op("Transpose", g.op("Concat", grouped, grouped, axis=1), perm=[0, 2, 1])  # (N, D, 2G)
    scores = g.op("MatMul", rows, twice)  # (N, C, 2G)
    first, _ = g.ops("Split", scores, n_out=2, axis=2)  # (N, C, G) each, the same
    return first


def _int8_scores(g: GraphBuilder, hidden: str, codes: np.ndarray, scales: np.ndarray) -> str:
    """(N, C, G) as _fp32_scores, from the int8 (D, V) codes and their (V,) scales: the hidden state quantized
    row by row (its largest magnitude over ROW_TOP), int8 products summed exactly in int32."""
    table = g.const("shortlist.weight.i8", np.ascontiguousarray(codes.T))  # (V, D) int8
    top = g.op("ReduceMax", g.op("Abs", hidden), axes=[1], keepdims=1)  # (B, 1)
    scale = g.op("Max", g.op("Mul", top, g.const("shortlist.top_inverse", np.float32(1.0 / ROW_TOP))),
                 g.const("shortlist.tiny", np.float32(ROW_TINY)))  # (B, 1)
    flat = g.op("Reshape", scale, g.ints([-1]))  # (B,)
    zeros = g.op("Expand", g.const("shortlist.zero", np.int8(0)), g.op("Shape", flat))  # (B,) int8
    quantized = g.op("QuantizeLinear", hidden, flat, zeros, axis=0)  # (B, D) int8, each row its own scale
    grouped = g.op("Transpose", g.op("Gather", quantized, "sentence_rows", axis=0), perm=[0, 2, 1])  # (N, D, G)
    rows = g.op("Gather", table, CANDIDATES, axis=0)  # (N, C, D) int8
    sums = g.op("Cast", g.op("MatMulInteger", rows, grouped), to=TensorProto.FLOAT)  # (N, C, G)
    column = g.op("Unsqueeze", g.op("Gather", g.const("shortlist.weight.scale", scales), CANDIDATES), g.ints([2]))
    # column: (N, C, 1) each candidate's weight scale
    row = g.op("Unsqueeze", g.op("Gather", flat, "sentence_rows", axis=0), g.ints([1]))  # (N, 1, G)
    return g.op("Mul", sums, g.op("Mul", column, row))  # (N, C, G)


def add_shortlist_head(model: onnx.ModelProto, candidates: int, pad_id: int) -> None:
    """The step graph's output projection and distribution replaced, in place (see the module docstring): input
    `candidate_ids` (N, C); `log_probs` (B, C) over each row's candidates, `top_log_probs` and `top_ids` (B, top_k),
    the ids the vocabulary's. A sentence's pad ids after its first are padding: their logits are MASKED."""
    graph = model.graph
    constants = {t.name: t for t in graph.initializer}
    hidden, kind, scale_name = cut_distribution(graph)
    g = GraphBuilder(prefix="shortlist.")
    weight = numpy_helper.to_array(constants[GENERATORS[kind]])  # (D, V)
    if scale_name is None:
        scores = _fp32_scores(g, hidden, weight.astype(np.float32))
    else:
        scores = _int8_scores(g, hidden, weight, numpy_helper.to_array(constants[scale_name]).astype(np.float32))
    is_pad = g.op("Equal", CANDIDATES, g.const("shortlist.pad", np.int64(pad_id)))  # (N, C)
    seen = g.op("CumSum", g.op("Cast", is_pad, to=TensorProto.INT64), g.const("shortlist.axis", np.int64(1)))
    # seen: (N, C) the pad ids up to each place; the first is the set's own, the others fill it to C
    padding = g.op("And", is_pad, g.op("Greater", seen, g.const("shortlist.one", np.int64(1))))  # (N, C)
    masked = g.op("Where", padding, g.const("shortlist.masked", np.float32(MASKED)),
                  g.const("shortlist.kept", np.float32(0.0)))  # (N, C)
    if BIAS in constants:
        masked = g.op("Add", masked, g.op("Gather", BIAS, CANDIDATES))  # (N, C) the logits' bias
    shifted = g.op("Add", scores, g.op("Unsqueeze", masked, g.ints([2])))  # (N, C, G)
    per_slot = g.op("Reshape", g.op("Transpose", shifted, perm=[0, 2, 1]), g.ints([-1, candidates]))  # (N x G, C)
    logits = g.op("Gather", per_slot, "row_slots", axis=0)  # (B, C)
    group = g.op("Shape", "sentence_rows", start=1, end=2)  # (1,) = [G]
    sentence = g.op("Div", "row_slots", g.op("Squeeze", group, g.ints([0])))  # (B,) each row's sentence
    row_candidates = g.op("Gather", CANDIDATES, sentence, axis=0)  # (B, C)
    distribution(g, logits, candidates, ids=POSITIONS)  # log_probs (B, C), top_log_probs (B, top_k), positions
    g.op("GatherElements", row_candidates, POSITIONS, axis=1, out="top_ids")  # (B, top_k) vocabulary ids
    graph.node.extend(g.nodes)
    graph.initializer.extend(g.initializers)
    graph.input.append(helper.make_tensor_value_info(CANDIDATES, TensorProto.INT64, ["sentences", candidates]))
    for output in graph.output:
        if output.name == "log_probs":
            output.type.tensor_type.shape.dim[1].dim_value = candidates
    prune(graph)


def shortlist_step_graph(source: Path, target: Path, candidates: int, pad_id: int) -> None:
    """A step graph file -> its shortlist step graph file beside it; constants held as external data (a shared
    embedding table) stay where they are."""
    model = onnx.load(source, load_external_data=False)
    add_shortlist_head(model, candidates, pad_id)
    onnx.save(model, target)


def half_shortlist_step_graph(
    fp32_step: Path, target: Path, candidates: int, pad_id: int, keep_float32: set[str]
) -> None:
    """The float16 variant's shortlist step graph from the fp32 variant's step graph file: its shortlist head added,
    then every float weight, input and output in float16 but the outputs named in `keep_float32` (the
    log-probabilities, as in the float16 step graph)."""
    model = onnx.load(fp32_step)
    add_shortlist_head(model, candidates, pad_id)
    onnx.save(to_half(model, keep_float32), target)
