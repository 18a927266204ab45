"""Token ids in, hypotheses out: a model folder's graphs run by ONNX Runtime (the runtime and its KV cache) under
greedy or beam search. These names are the engine's public entry, for what decodes outside the server (model_export's
verification and evaluation, the benchmarks); the server's scheduler uses the same ones."""

from service.engine.batches import TokenRules, decode_batch, decode_batches, ends
from service.engine.decoding import (
    BEAM_SIZE_LIMIT,
    MAX_OUTPUT_RATIO,
    MAX_OUTPUT_TOKENS,
    Hypothesis,
    SearchOptions,
    output_cap,
)
from service.engine.guards import GuardLimits, degenerate
from service.engine.kv_cache import DecoderCache
from service.engine.runtime import OnnxRuntime, SessionSettings
from service.engine.shortlist import Shortlist, check_arrays, load_shortlist

__all__ = [
    "BEAM_SIZE_LIMIT",
    "MAX_OUTPUT_RATIO",
    "MAX_OUTPUT_TOKENS",
    "DecoderCache",
    "GuardLimits",
    "Hypothesis",
    "OnnxRuntime",
    "SearchOptions",
    "SessionSettings",
    "Shortlist",
    "TokenRules",
    "check_arrays",
    "decode_batch",
    "decode_batches",
    "degenerate",
    "ends",
    "load_shortlist",
    "output_cap",
]
