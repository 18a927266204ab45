"""The graph contract: every input and output of the encoder and step-decoder graphs, in one place.

The ONNX builder declares its graphs from these specs and the manifest records them, so the
server reads names, roles, shapes and dtypes from the model folder and hard-codes none of them.

Encoder (once per sentence):
    src_ids      (batch, src_len)              int64  source token ids, right-padded with pad_id
    src_mask     (batch, src_len)              bool   True on real tokens
 -> cross_key_i  (batch, n_heads, src_len, head_dim)  float32  per decoder layer i
    cross_value_i (batch, n_heads, src_len, head_dim) float32

Step decoder (once per generated token; rows may be at different steps):
    input_ids    (batch,)                      int64  the previous token of each row
    positions    (batch,)                      int64  that token's position in its row's target = how many
                                                      earlier steps the row has cached
    self_key_i   (batch, n_heads, cache_len, head_dim)  float32  earlier steps' keys, slot t = step t
    self_value_i (batch, n_heads, cache_len, head_dim)  float32  (cache_len > every row's position)
    cross_key_i  (sentences, n_heads, src_len, head_dim)  float32  as the encoder gave them: one per sentence,
    cross_value_i (sentences, n_heads, src_len, head_dim) float32  shared by its rows (beams)
    src_mask     (sentences, src_len)          bool
    sentence_rows (sentences, group)           int64  each sentence's rows (indexes into batch); group is the
                                                      most rows a sentence has, and a sentence with fewer
                                                      repeats one of its rows
    row_slots    (batch,)                      int64  each row's place in the flattened sentence_rows
    top_k        (1,)                          int64  how many candidates per row to return, the banned ids
                                                      among them (format 4; format 3 graphs always return 19)
    log_softmax  ()                            bool   whether the step normalises its distribution (format 8):
                                                      False skips the log-softmax over the vocabulary, for
                                                      greedy rows whose scores nobody reads
 -> log_probs    (batch, tgt_vocab)            float32  log-softmax of the next token ((batch, 0) without it)
    top_log_probs (batch, top_k)               float32  each row's top_k best log-probs, best first (without the
                                                        log-softmax: the logits, in the same order),
    top_ids      (batch, top_k)                int64    and their token ids (the banned ids, pad and the decoder
                                                        start, among them: the runtime drops them)
    present_key_i (batch, n_heads, cache_len, head_dim)  float32  self_key_i with this step's key at each
    present_value_i (batch, n_heads, cache_len, head_dim) float32  row's slot `positions`, and its value

Self-attention is ONNX Runtime's contrib GroupQueryAttention: each row attends over its own `positions` cached
slots and itself (no mask, no padded slots read), and writes its new key and value at slot `positions`. Bound
to the same memory as self_key_i / self_value_i (IO binding), present_key_i / present_value_i are the cache
itself, updated in place: no step copies the cache or returns its new entries for the caller to append. Unbound,
they are a copy of the cache with the new entries in it. Keys and values share one layout, (.., time,
head_dim), the one GroupQueryAttention reads.

Cross-attention gathers each sentence's rows' queries into one (sentences, n_heads, group, head_dim) block and
attends with all of them at once over the sentence's one copy of the source keys/values; `row_slots` gathers the
results back into row order. Beam search thus holds and reads each source once per sentence, not once per beam
(format 1 took the keys/values per row).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from model_export.config import TransformerConfig
from service.model import FORMAT_VERSION  # noqa: F401 - the one the server reads is the one written

OPSET = 17
CONTRIB_DOMAIN = "com.microsoft"  # ONNX Runtime's contrib operators (attention kernels), version 1
# How the graphs are built within one format (same inputs and outputs): recorded in the manifest's provenance, so
# that a benchmark can tell a folder exported before a change of structure. 2: cross-attention as one
# MultiHeadAttention node. 3: the ragged step graph takes each sentence's last source position with a Gather of
# rows (GatherElements and a Transpose before). 4: the step's top-K in two exact stages over vocabulary chunks
# (onnx_graphs._top_k), its log-probs gathered from the log-softmax: beam 4's 64 rows of 59,514, 5.9 -> 3.1 ms
# alone. 5 (format 12): the step graph's cross-attention in plain operators over the padded source
# (onnx_graphs._padded_cross_attention), whose numbers for a row do not depend on its batch.
GRAPHS_REVISION = 5
# The step graph also returns each row's best next tokens, as many as its `top_k` input asks for: the runtime asks
# for what the step's searches need (greedy 2, beam k 2k + 1: 2k candidates, plus one when EOS is not allowed yet)
# plus pad and the decoder start, which it drops (cheaper than masking the whole distribution in the graph).
# ONNX Runtime's TopK over (128, 59514) takes 2.7 ms where numpy's argpartition takes 33 ms, and its cost grows
# with K: at 28 rows of 8,000, 134 us for K = 4 against 238 us for the 19 a format 3 graph always returned.
# Format 8: the log-softmax runs only when the step's `log_softmax` input says so (an If node; the top-K reads the
# logits, whose order is the log-probs', and since revision 4 at every step). Greedy rows need only their best
# token, unless the request asked for scores; CTranslate2's greedy search skips it likewise when no scores are
# asked. ONNX Runtime's LogSoftmax over (32, 59514) takes ~0.75 ms of the ~1.45 ms it and TopK take; the If ~1.5 us.


@dataclass(frozen=True)
class TensorSpec:
    name: str
    role: str
    dtype: str  # numpy dtype name: "int64", "bool", "float32"
    shape: tuple[str | int, ...]  # str: a symbolic (dynamic) axis; int: fixed by the config
    layer: int | None = None  # the decoder layer a per-layer tensor belongs to

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["shape"] = list(self.shape)
        if self.layer is None:
            del data["layer"]
        return data


def _cross_specs(cfg: TransformerConfig, batch: str) -> list[TensorSpec]:
    h, dh = cfg.n_heads, cfg.head_dim
    specs = []
    for i in range(cfg.n_decoder_layers):
        specs.append(TensorSpec(f"cross_key_{i}", "cross_key", "float32", (batch, h, "src_len", dh), i))
        specs.append(TensorSpec(f"cross_value_{i}", "cross_value", "float32", (batch, h, "src_len", dh), i))
    return specs


def encoder_inputs(cfg: TransformerConfig) -> list[TensorSpec]:
    return [
        TensorSpec("src_ids", "src_ids", "int64", ("batch", "src_len")),
        TensorSpec("src_mask", "src_mask", "bool", ("batch", "src_len")),
    ]


def encoder_outputs(cfg: TransformerConfig) -> list[TensorSpec]:
    return _cross_specs(cfg, "batch")


def decoder_inputs(cfg: TransformerConfig) -> list[TensorSpec]:
    h, dh = cfg.n_heads, cfg.head_dim
    specs = [
        TensorSpec("input_ids", "input_ids", "int64", ("batch",)),
        TensorSpec("positions", "positions", "int64", ("batch",)),
        # GroupQueryAttention's, from the runtime (format 7; computed from `positions` in the graph before, where
        # on CUDA the float16 step wrote every row at slot 0, as for a prompt's first step: docs/performance.md
        # "GPU"): each row's cached steps, and the longest row with this step (which ONNX Runtime's CUDA kernel
        # reads in host memory)
        TensorSpec("seqlens_k", "seqlens_k", "int32", ("batch",)),
        TensorSpec("total_sequence_length", "total_sequence_length", "int32", ()),
    ]
    for i in range(cfg.n_decoder_layers):
        specs.append(TensorSpec(f"self_key_{i}", "self_key", "float32", ("batch", h, "cache_len", dh), i))
        specs.append(TensorSpec(f"self_value_{i}", "self_value", "float32", ("batch", h, "cache_len", dh), i))
    specs += _cross_specs(cfg, "sentences")
    specs.append(TensorSpec("src_mask", "src_mask", "bool", ("sentences", "src_len")))
    specs.append(TensorSpec("sentence_rows", "sentence_rows", "int64", ("sentences", "group")))
    specs.append(TensorSpec("row_slots", "row_slots", "int64", ("batch",)))
    specs.append(TensorSpec("top_k", "top_k", "int64", (1,)))
    specs.append(TensorSpec("log_softmax", "log_softmax", "bool", ()))
    return specs


def decoder_outputs(cfg: TransformerConfig) -> list[TensorSpec]:
    h, dh = cfg.n_heads, cfg.head_dim
    specs = [
        TensorSpec("log_probs", "log_probs", "float32", ("batch", cfg.tgt_vocab_size)),
        TensorSpec("top_log_probs", "top_log_probs", "float32", ("batch", "top_k")),
        TensorSpec("top_ids", "top_ids", "int64", ("batch", "top_k")),
    ]
    for i in range(cfg.n_decoder_layers):
        specs.append(TensorSpec(f"present_key_{i}", "present_key", "float32", ("batch", h, "cache_len", dh), i))
        specs.append(TensorSpec(f"present_value_{i}", "present_value", "float32", ("batch", h, "cache_len", dh), i))
    return specs


def decoder_ragged_outputs(cfg: TransformerConfig) -> list[TensorSpec]:
    """The ragged step graph's (format 5: the step for batches whose sentences have one row each): the step graph's
    outputs and, per layer, the cross-attention caches, which its GroupQueryAttention takes as its past and hands
    back unchanged (bound to the inputs' memory, they are the inputs)."""
    h, dh = cfg.n_heads, cfg.head_dim
    specs = decoder_outputs(cfg)
    for i in range(cfg.n_decoder_layers):
        for role in ("key", "value"):
            shape = ("sentences", h, "src_len", dh)
            specs.append(TensorSpec(f"present_cross_{role}_{i}", f"present_cross_{role}", "float32", shape, i))
    return specs
