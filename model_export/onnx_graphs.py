"""Builds the encoder and step-decoder ONNX graphs node by node from a PyTorch `Transformer`'s weights.

The graphs are written directly (no tracing), so their structure is chosen, not inherited: fused
Q/K/V projections, 1/sqrt(d_k) folded into W_Q, and a step decoder that writes its cache in place.
The contract itself (names, shapes, dtypes) lives in `graph_io`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from model_export import graph_io
from model_export.config import TransformerConfig
from model_export.graph_io import TensorSpec
from model_export.model import DecoderLayer, EncoderLayer, MultiHeadAttention, Transformer

MASKED = float(np.finfo(np.float32).min)  # added to the score of a key that must not be attended
DTYPES = {
    "float32": TensorProto.FLOAT, "int64": TensorProto.INT64, "int32": TensorProto.INT32, "bool": TensorProto.BOOL
}


def names_read(nodes: list[onnx.NodeProto]) -> set[str]:
    """Every tensor name the nodes read, those of their subgraphs (an If's branches) included."""
    read: set[str] = set()
    for each in nodes:
        read.update(each.input)
        for attribute in each.attribute:
            for subgraph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
                read |= names_read(list(subgraph.node))
    return read


def drop_unread_initializers(graph: onnx.GraphProto) -> None:
    """The initializers no node reads leave the graph (ONNX Runtime would warn of each at every start)."""
    read = names_read(list(graph.node))
    kept = [t for t in graph.initializer if t.name in read]
    del graph.initializer[:]
    graph.initializer.extend(kept)


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy()


class GraphBuilder:
    """A thin recorder of ONNX nodes and initializers with generated, readable value names."""

    def __init__(self, prefix: str = "") -> None:
        """`prefix`: of every generated name (nodes added to a graph that has its own generated names)."""
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0
        self._prefix = prefix

    def _fresh(self, hint: str) -> str:
        self._count += 1
        return f"{self._prefix}{hint}_{self._count}"

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.array(value, order="C"), name))
        return name

    def ints(self, values: Sequence[int]) -> str:
        return self.const(self._fresh("ints"), np.asarray(values, dtype=np.int64))

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs: object) -> str:
        output = out or self._fresh(op_type.lower())
        self.nodes.append(helper.make_node(op_type, list(inputs), [output], **attrs))
        return output

    def ops_named(self, op_type: str, *inputs: str, outs: list[str], **attrs: object) -> None:
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, **attrs))

    def ops(self, op_type: str, *inputs: str, n_out: int, **attrs: object) -> list[str]:
        outputs = [self._fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outputs, **attrs))
        return outputs

    def model(self, name: str, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, name, [_value_info(s) for s in inputs], [_value_info(s) for s in outputs], self.initializers
        )
        opsets = [helper.make_opsetid("", graph_io.OPSET), helper.make_opsetid(graph_io.CONTRIB_DOMAIN, 1)]
        model = helper.make_model(graph, opset_imports=opsets)
        model.ir_version = 8  # readable by onnxruntime >= 1.14
        model.producer_name = "model_export"
        return model

    # -- the model's building blocks -------------------------------------------------------------

    def linear(self, x: str, weight: torch.Tensor, bias: torch.Tensor | None, name: str) -> str:
        """x @ W^T + b, with W^T stored once at export time: (..., in) -> (..., out)."""
        y = self.op("MatMul", x, self.const(f"{name}.weight_t", _np(weight).T))
        return y if bias is None else self.op("Add", y, self.const(f"{name}.bias", _np(bias)))

    def layer_norm(self, x: str, norm: torch.nn.LayerNorm, name: str) -> str:
        scale, bias = self.const(f"{name}.weight", _np(norm.weight)), self.const(f"{name}.bias", _np(norm.bias))
        return self.op("LayerNormalization", x, scale, bias, axis=-1, epsilon=norm.eps)  # (..., D)

    def activation(self, x: str, kind: str) -> str:
        if kind == "relu":
            return self.op("Relu", x)
        if kind == "swish":
            return self.op("Mul", x, self.op("Sigmoid", x))
        half = self.const(self._fresh("half"), np.float32(0.5))
        one = self.const(self._fresh("one"), np.float32(1.0))
        erf = self.op("Erf", self.op("Mul", x, self.const(self._fresh("rsqrt2"), np.float32(1 / math.sqrt(2)))))
        return self.op("Mul", self.op("Mul", x, half), self.op("Add", erf, one))  # exact (erf) GELU

    def feed_forward(self, x: str, layer: EncoderLayer | DecoderLayer, kind: str, name: str) -> str:
        ff = layer.feed_forward
        hidden = self.activation(self.linear(x, ff.w_1.weight, ff.w_1.bias, f"{name}.w_1"), kind)  # (..., d_ff)
        return self.linear(hidden, ff.w_2.weight, ff.w_2.bias, f"{name}.w_2")  # (..., D)

    def sublayer(self, x: str, norm: torch.nn.LayerNorm, pre_norm: bool, name: str, body) -> str:  # noqa: ANN001
        """Residual + norm around `body`: post-norm LN(x + f(x)) or pre-norm x + f(LN(x))."""
        if pre_norm:
            return self.op("Add", x, body(self.layer_norm(x, norm, f"{name}.norm")))
        return self.layer_norm(self.op("Add", x, body(x)), norm, f"{name}.norm")

    def packed_projection(self, x: str, attn: MultiHeadAttention, name: str, parts: str) -> str:
        """One MatMul for several of Q, K, V ('qkv' or 'kv'), packed on the last axis: (..., D) -> (..., n*D).
        Q comes pre-scaled by 1/sqrt(d_k)."""
        scale = 1.0 / math.sqrt(attn.head_dim)
        mods = {"q": attn.w_q, "k": attn.w_k, "v": attn.w_v}
        weights = [_np(mods[p].weight) * (scale if p == "q" else 1.0) for p in parts]
        w = self.const(f"{name}.w_{parts}_t", np.concatenate(weights, axis=0).T)  # (D, n*D)
        y = self.op("MatMul", x, w)  # (..., n*D)
        if attn.w_q.bias is not None:
            biases = [_np(mods[p].bias) * (scale if p == "q" else 1.0) for p in parts]
            y = self.op("Add", y, self.const(f"{name}.b_{parts}", np.concatenate(biases)))
        return y

    def fused_qkv(self, x: str, attn: MultiHeadAttention, name: str, parts: str) -> list[str]:
        """packed_projection split into its parts: (..., D) each."""
        y = self.packed_projection(x, attn, name, parts)  # (..., n*D)
        d = attn.n_heads * attn.head_dim
        return self.ops("Split", y, self.ints([d] * len(parts)), n_out=len(parts), axis=-1)


def _value_info(spec: TensorSpec) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(spec.name, DTYPES[spec.dtype], list(spec.shape))


def _heads(g: GraphBuilder, x: str, cfg: TransformerConfig, perm: list[int]) -> str:
    """(B, T, D) -> (B, T, H, Dh) -> transposed by `perm`."""
    split = g.op("Reshape", x, g.ints([0, 0, cfg.n_heads, cfg.head_dim]))  # (B, T, H, Dh)
    return g.op("Transpose", split, perm=perm)


def attention_bias(g: GraphBuilder, mask: str) -> str:
    """A (B, T) bool mask -> the (B, 1, 1, T) additive bias of the scores: 0 where attended, MASKED elsewhere.
    An Add with it costs less than a Where per layer (ONNX Runtime's broadcasting Where is slow)."""
    zero, masked = g.const(g._fresh("zero"), np.float32(0.0)), g.const(g._fresh("masked"), np.float32(MASKED))
    return g.op("Where", g.op("Unsqueeze", mask, g.ints([1, 2])), zero, masked)  # (B, 1, 1, T)


def source_ones(g: GraphBuilder) -> str:
    """A (S, 1) column of ones over the source axis of src_mask (B, S): the right side of masked_attention's sums."""
    length = g.op("Shape", "src_mask", start=1, end=2)  # (1,) = [S]
    shape = g.op("Concat", length, g.ints([1]), axis=0)  # (2,) = [S, 1]
    return g.op("Expand", g.const(g._fresh("one"), np.float32(1.0)), shape, out="source_ones")  # (S, 1)


def masked_attention(g: GraphBuilder, q: str, k: str, v: str, bias: str, ones: str) -> str:
    """softmax(Q K^T + bias) V over (..., S) keys, for queries (..., T, Dh) and keys and values (..., S, Dh), Q
    pre-scaled by 1/sqrt(d_k), bias 0 or MASKED per key: (..., T, Dh). Its exponentials are summed, and weigh the
    values, by matrix products whose reduction over S runs in key order, where a masked key adds nothing, so a
    query's result does not depend on how many padded keys follow its own (batch invariance; ONNX Runtime's
    Softmax sums in an order that depends on S). One dot product over Dh per score."""
    scores = g.op("Add", g.op("FusedMatMul", q, k, domain=graph_io.CONTRIB_DOMAIN, transB=1, alpha=1.0), bias)
    # scores: (..., T, S), masked keys at about MASKED
    top = g.op("ReduceMax", scores, axes=[-1], keepdims=1)  # (..., T, 1)
    weights = g.op("Exp", g.op("Sub", scores, top))  # (..., T, S) unnormalised, masked keys ~0
    total = g.op("MatMul", weights, ones)  # (..., T, 1)
    return g.op("Div", g.op("MatMul", weights, v), total)  # (..., T, Dh)


def _encoder_self_attention(
    g: GraphBuilder, x: str, attn: MultiHeadAttention, mask4: str, ones: str, cfg, name: str
) -> str:
    q, k, v = g.fused_qkv(x, attn, name, "qkv")  # (B, S, D) each
    q = _heads(g, q, cfg, [0, 2, 1, 3])  # (B, H, S, Dh)
    k = _heads(g, k, cfg, [0, 2, 1, 3])  # (B, H, S, Dh)
    v = _heads(g, v, cfg, [0, 2, 1, 3])  # (B, H, S, Dh)
    context = masked_attention(g, q, k, v, mask4, ones)  # (B, H, S, Dh)
    merged = g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]), g.ints([0, 0, cfg.d_model]))  # (B, S, D)
    return g.linear(merged, attn.w_o.weight, attn.w_o.bias, f"{name}.w_o")  # (B, S, D)


def build_encoder(model: Transformer) -> onnx.ModelProto:
    """src_ids (B, S), src_mask (B, S) -> cross_key_i, cross_value_i (B, H, S, Dh)."""
    cfg, g = model.cfg, GraphBuilder()
    pre_norm = cfg.norm_position == "pre"
    src_len = g.op("Squeeze", g.op("Slice", g.op("Shape", "src_ids"), g.ints([1]), g.ints([2])), g.ints([0]))
    zero, one = g.const("zero", np.int64(0)), g.const("one", np.int64(1))
    positions = g.op("Range", zero, src_len, one)  # (S,)
    table = g.const("positions.table", _np(model.positions.table))  # (P, D)
    embedded = g.op("Gather", g.const("src_embed.lut", _np(model.src_embed.lut.weight)), "src_ids")  # (B, S, D)
    scaled = g.op("Mul", embedded, g.const("src_embed.scale", np.float32(model.src_embed.scale)))
    x = g.op("Add", scaled, g.op("Gather", table, positions))  # (B, S, D)
    mask4 = attention_bias(g, "src_mask")  # (B, 1, 1, S) 0 or MASKED
    ones = source_ones(g)  # (S, 1)
    for i, layer in enumerate(model.encoder.layers):
        name = f"encoder.{i}"
        x = g.sublayer(
            x, layer.sublayer[0].norm, pre_norm, f"{name}.0",
            lambda y, layer=layer, name=name: _encoder_self_attention(g, y, layer.self_attn, mask4, ones, cfg, name),
        )  # (B, S, D)
        x = g.sublayer(
            x, layer.sublayer[1].norm, pre_norm, f"{name}.1",
            lambda y, layer=layer, name=name: g.feed_forward(y, layer, cfg.activation, name),
        )  # (B, S, D)
    memory = g.layer_norm(x, model.encoder.norm, "encoder.norm") if pre_norm else x  # (B, S, D)
    for i, layer in enumerate(model.decoder.layers):
        k, v = g.fused_qkv(memory, layer.cross_attn, f"decoder.{i}.cross", "kv")  # (B, S, D) each
        g.op("Identity", _heads(g, k, cfg, [0, 2, 1, 3]), out=f"cross_key_{i}")  # (B, H, S, Dh)
        g.op("Identity", _heads(g, v, cfg, [0, 2, 1, 3]), out=f"cross_value_{i}")  # (B, H, S, Dh)
    return g.model("encoder", graph_io.encoder_inputs(cfg), graph_io.encoder_outputs(cfg))


def _step_self_attention(g: GraphBuilder, y: str, attn: MultiHeadAttention, i: int, cfg) -> str:
    """GroupQueryAttention over each row's own cached steps and itself, fed Q, K and V packed in one tensor; it
    writes the row's new key and value into the cache at slot `positions` (present_key_i/present_value_i: the same
    buffers when bound so)."""
    name = f"decoder.{i}.self"
    packed = g.op("Unsqueeze", g.packed_projection(y, attn, name, "qkv"), g.ints([1]))  # (B, 1, 3D)
    context = g._fresh("self_context")
    g.ops_named(
        "GroupQueryAttention", packed, "", "", f"self_key_{i}", f"self_value_{i}", "seqlens_k",
        "total_sequence_length", outs=[context, f"present_key_{i}", f"present_value_{i}"],
        domain=graph_io.CONTRIB_DOMAIN, num_heads=cfg.n_heads, kv_num_heads=cfg.n_heads,
        scale=1.0,  # Q comes pre-scaled by 1/sqrt(d_k)
    )  # (B, 1, D); the caches (B, H, T, Dh) with this step at slot positions[b]
    merged = g.op("Squeeze", context, g.ints([1]))  # (B, D)
    return g.linear(merged, attn.w_o.weight, attn.w_o.bias, f"{name}.w_o")  # (B, D)


def _step_cross_attention(g: GraphBuilder, y: str, attn: MultiHeadAttention, i: int, cfg, ragged: bool) -> str:
    """Each sentence's rows attend together over its one copy of the source: the queries are gathered into
    (N, G, D) blocks, attend over the cached (N, H, S, Dh) keys and values (_padded_cross_attention), and the
    results are gathered back into row order. `ragged` (one row per sentence, G = 1): GroupQueryAttention over each
    sentence's own source length instead (see _ragged_cross_attention)."""
    name = f"decoder.{i}.cross"
    scale = 1.0 / math.sqrt(attn.head_dim)
    bias = None if attn.w_q.bias is None else attn.w_q.bias * scale
    q = g.linear(y, attn.w_q.weight * scale, bias, f"{name}.w_q")  # (B, D)
    grouped = g.op("Gather", q, "sentence_rows", axis=0)  # (N, G, D)
    attend = _ragged_cross_attention if ragged else _padded_cross_attention
    context = attend(g, grouped, i, cfg)  # (N, G, D); G = 1 when ragged
    slots = g.op("Reshape", context, g.ints([-1, cfg.d_model]))  # (N * G, D)
    merged = g.op("Gather", slots, "row_slots", axis=0)  # (B, D)
    return g.linear(merged, attn.w_o.weight, attn.w_o.bias, f"{name}.w_o")  # (B, D)


def _padded_cross_attention(g: GraphBuilder, grouped: str, i: int, cfg) -> str:
    """(N, G, D) queries over the cached (N, H, S, Dh) keys and values of their sentence, the padded source positions
    masked by `source_bias`, as the encoder's self-attention (masked_attention), so a row's numbers depend neither
    on how wide the batch's widest source is nor on how many rows share the step (batch invariance; ONNX Runtime's
    CPU MultiHeadAttention changes them with the padding). The queries are given twice: ONNX Runtime multiplies a
    single query row (a greedy sentence, G = 1) by another kernel, whose sums depend on S, and two or more rows
    alike whatever their number."""
    q = g.op("Transpose", g.op("Reshape", grouped, g.ints([0, 0, cfg.n_heads, cfg.head_dim])), perm=[0, 2, 1, 3])
    # q: (N, H, G, Dh)
    twice = g.op("Concat", q, q, axis=2)  # (N, H, 2G, Dh)
    both = masked_attention(g, twice, f"cross_key_{i}", f"cross_value_{i}", "source_bias", "source_ones")
    context, _ = g.ops("Split", both, n_out=2, axis=2)  # (N, H, G, Dh) each, the same
    return g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]), g.ints([0, 0, cfg.d_model]))  # (N, G, D)


def _source_lengths(g: GraphBuilder, cfg) -> None:
    """What the ragged cross-attention needs, once per step: `source_last_rows` (N x H,), where each sentence's last
    source position lies, head by head, in a cross-attention cache seen as (N x H x S, Dh) rows, and
    GroupQueryAttention's `source_seqlens_k` (N,) and `source_total` () (int32). Sources are left-aligned (the cache
    keeps them so), src_mask True on their tokens; every layer's cache has the same source axis S."""
    h = cfg.n_heads
    lengths = g.op("ReduceSum", g.op("Cast", "src_mask", to=TensorProto.INT64), g.ints([1]), keepdims=0)  # (N,)
    one = g.const("source.one", np.int64(1))
    last = g.op("Sub", lengths, one)  # (N,)
    g.op("Cast", last, to=TensorProto.INT32, out="source_seqlens_k")  # (N,) the positions before the last
    g.op("Cast", g.op("ReduceMax", lengths, keepdims=0), to=TensorProto.INT32, out="source_total")  # ()
    sentences = g.op("Squeeze", g.op("Shape", "src_mask", start=0, end=1))  # () N
    heads = g.op("Mul", sentences, g.const("source.heads", np.int64(h)))  # () N x H
    blocks = g.op("Range", g.const("source.zero", np.int64(0)), heads, one)  # (N x H,) n x H + h
    width = g.op("Shape", "cross_key_0", start=2, end=3)  # (1,) S
    each = g.op("Reshape", g.op("Expand", g.op("Reshape", last, g.ints([-1, 1])), g.ints([1, h])), g.ints([-1]))
    g.op("Add", g.op("Mul", blocks, width), each, out="source_last_rows")  # (N x H,) block start + last position


def _ragged_cross_attention(g: GraphBuilder, grouped: str, i: int, cfg) -> str:
    """One query per sentence (N, 1, D) over its own source positions only. GroupQueryAttention reads a batch
    entry's first seqlens_k + 1 cached positions and nothing past them; it is given the cached keys and values as
    its past (bound in place: present_cross_key_i is cross_key_i's memory) and the sentence's last source position
    as the step's new key and value, which it writes back, unchanged, where it came from. MultiHeadAttention
    attends over the widest live source for every sentence: at 32 clients of real text, 52 positions a step
    where sentences have 16."""
    h, dh = cfg.n_heads, cfg.head_dim
    new = []
    for role in ("key", "value"):  # a Gather of rows: GatherElements over (N, H, 1, Dh) and a Transpose cost more
        rows = g.op("Reshape", f"cross_{role}_{i}", g.ints([-1, dh]))  # (N x H x S, Dh), a view
        last = g.op("Gather", rows, "source_last_rows", axis=0)  # (N x H, Dh)
        new.append(g.op("Reshape", last, g.ints([-1, 1, h * dh])))  # (N, 1, D)
    context = g._fresh("cross_context")
    g.ops_named(
        "GroupQueryAttention", grouped, new[0], new[1], f"cross_key_{i}", f"cross_value_{i}", "source_seqlens_k",
        "source_total", outs=[context, f"present_cross_key_{i}", f"present_cross_value_{i}"],
        domain=graph_io.CONTRIB_DOMAIN, num_heads=h, kv_num_heads=h, scale=1.0,  # Q comes pre-scaled
    )  # (N, 1, D); the cross caches as they were
    return context


def _branch(name: str, nodes: list[onnx.NodeProto], outputs: list[tuple[str, int]]) -> onnx.GraphProto:
    """A subgraph of an If: its nodes read the outer graph's values; its outputs typed, their shapes left open."""
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(n, t, None) for n, t in outputs])


def vocabulary_chunks(vocab: int) -> int | None:
    """The chunk length of the two-stage top-K (`_top_k`): the divisor of `vocab` nearest 128 among 8..512 that
    leaves at least 8 chunks, or None (a vocabulary without one, a prime size say, takes one TopK over all of it).
    Alone on one thread (AMX Xeon), beam 4's k 9 over 64 x 59,514: 109-token chunks 0.8 ms, 273 1.2, 546 1.4,
    1,417 2.4, against 2.0 ms for one TopK."""
    lengths = [n for n in range(8, 513) if vocab % n == 0 and vocab // n >= 8]
    return min(lengths, key=lambda n: (abs(n - 128), n)) if lengths else None


def _top_k(g: GraphBuilder, logits: str, vocab: int, ids: str) -> str:
    """Each row's `top_k` best logits and their ids, best first, ties to the lower id as TopK breaks them, in two
    exact stages: each chunk's maximum, the `top_k` chunks with the best maxima (every one of the row's `top_k`
    best lies in one of them), then TopK over those chunks' logits only. ONNX Runtime's TopK reads its whole input
    at a cost that grows with k; ReduceMax reads it once at memory speed (graphs revision 4). Returns the top logits;
    the ids are written to `ids`."""
    length = vocabulary_chunks(vocab)
    if length is None:
        top = g._fresh("top_logits")
        g.ops_named("TopK", logits, "top_k", outs=[top, ids], axis=-1)  # (B, top_k) each
        return top
    chunks = vocab // length
    length_const = g.ints([length])
    chunked = g.op("Reshape", logits, g.ints([0, chunks, length]))  # (B, C, L)
    maxima = g.op("ReduceMax", chunked, axes=[2], keepdims=0)  # (B, C)
    k = g.op("Min", "top_k", g.ints([chunks]))  # (1,) a wider k than the chunks takes them all
    _, best = g.ops("TopK", maxima, k, n_out=2, axis=-1, sorted=0)  # (B, k) chunk numbers
    ordered, _ = g.ops("TopK", best, k, n_out=2, axis=-1, largest=0)  # (B, k) sorted chunk numbers, for the ties
    picked = g.op("GatherND", chunked, g.op("Unsqueeze", ordered, g.ints([2])), batch_dims=1)  # (B, k, L)
    top, place = g.ops("TopK", g.op("Flatten", picked, axis=1), "top_k", n_out=2, axis=-1)  # (B, top_k) each
    chunk = g.op("GatherElements", ordered, g.op("Div", place, length_const), axis=1)  # (B, top_k)
    g.op("Add", g.op("Mul", chunk, length_const), g.op("Mod", place, length_const), out=ids)  # (B, top_k) token ids
    return top


def distribution(g: GraphBuilder, logits: str, vocab: int, ids: str = "top_ids") -> None:
    """The step's outputs from its logits (B, V): `ids` (`top_ids`), the places of each row's `top_k` best tokens
    along V, best first (the banned ids among them; `_top_k`, over the logits, whose order is the log-probs'), and
    `log_probs` with their
    `top_log_probs` only when the `log_softmax` input is True (format 8): otherwise `top_log_probs` are the logits
    and log_probs is (B, 0). A greedy row needs only its best token unless its request asked for a score; the
    log-softmax writes all B x V values (at (32, 59514) ~0.75 ms, the If ~1.5 us; ONNX Runtime's ReduceLogSumExp
    is 5x slower than LogSoftmax)."""
    top_logits = _top_k(g, logits, vocab, ids)  # (B, top_k) each
    kinds = [TensorProto.FLOAT, TensorProto.FLOAT]
    normalised = _branch(
        "normalised",
        [
            helper.make_node("LogSoftmax", [logits], ["normalised_log_probs"], axis=-1),  # (B, V)
            helper.make_node("GatherElements", ["normalised_log_probs", ids], ["normalised_top"], axis=1),  # (B, K)
        ],
        list(zip(["normalised_log_probs", "normalised_top"], kinds, strict=True)),
    )
    zero, one = g.ints([0]), g.ints([1])
    raw = _branch(
        "raw",
        [
            helper.make_node("Slice", [logits, zero, zero, one], ["raw_log_probs"]),  # (B, 0)
            helper.make_node("Identity", [top_logits], ["raw_top"]),  # (B, top_k) logits
        ],
        list(zip(["raw_log_probs", "raw_top"], kinds, strict=True)),
    )
    g.ops_named("If", "log_softmax", outs=["log_probs", "top_log_probs"], then_branch=normalised, else_branch=raw)


def build_decoder_step(model: Transformer, ragged: bool = False) -> onnx.ModelProto:
    """One token per row with the KV cache -> log_probs (B, V), its top K, the cache with this step in it.
    `ragged`: the graph for steps whose sentences have one row each (greedy), whose cross-attention reads each
    sentence's own source length (graph_io.decoder_ragged_outputs)."""
    cfg, g = model.cfg, GraphBuilder()
    pre_norm = cfg.norm_position == "pre"
    if ragged:
        _source_lengths(g, cfg)
    else:
        g.op("Identity", attention_bias(g, "src_mask"), out="source_bias")  # (N, 1, 1, S) 0 or MASKED
        source_ones(g)  # (S, 1)
    embedded = g.op("Gather", g.const("tgt_embed.lut", _np(model.tgt_embed.lut.weight)), "input_ids")  # (B, D)
    scaled = g.op("Mul", embedded, g.const("tgt_embed.scale", np.float32(model.tgt_embed.scale)))
    x = g.op("Add", scaled, g.op("Gather", g.const("positions.table", _np(model.positions.table)), "positions"))
    for i, layer in enumerate(model.decoder.layers):
        name = f"decoder.{i}"
        x = g.sublayer(
            x, layer.sublayer[0].norm, pre_norm, f"{name}.0",
            lambda y, layer=layer, i=i: _step_self_attention(g, y, layer.self_attn, i, cfg),
        )  # (B, D)
        x = g.sublayer(
            x, layer.sublayer[1].norm, pre_norm, f"{name}.1",
            lambda y, layer=layer, i=i: _step_cross_attention(g, y, layer.cross_attn, i, cfg, ragged),
        )  # (B, D)
        x = g.sublayer(
            x, layer.sublayer[2].norm, pre_norm, f"{name}.2",
            lambda y, layer=layer, name=name: g.feed_forward(y, layer, cfg.activation, name),
        )  # (B, D)
    if pre_norm:
        x = g.layer_norm(x, model.decoder.norm, "decoder.norm")  # (B, D)
    generator = model.generator
    logits = g.linear(x, generator.proj.weight, generator.logits_bias, "generator")  # (B, V)
    distribution(g, logits, cfg.tgt_vocab_size)
    if ragged:
        return g.model("decoder_step_ragged", graph_io.decoder_inputs(cfg), graph_io.decoder_ragged_outputs(cfg))
    return g.model("decoder_step", graph_io.decoder_inputs(cfg), graph_io.decoder_outputs(cfg))
