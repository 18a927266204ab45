"""The decoding loop over token ids: encoder once per sentence, then one step per token for all rows.

`decode_batch` runs a fixed set of sentences to completion (the static mode and the reference loop
over the graphs). It sees token ids only: text lives in the tokenizer and the HTTP layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from service.decoding import Hypothesis, Search, SearchOptions, new_search
from service.kv_cache import DecoderCache
from service.runtime import Runtime


@dataclass(frozen=True)
class TokenRules:
    """The special ids of a model: where decoding starts, where it ends, how sources are padded. (Pad and the
    decoder start are never generated: the step graph leaves them out of its top-K candidates.)"""

    decoder_start_id: int
    eos_id: int
    pad_id: int


def pad_batch(sources: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad id lists into src_ids (b, S) int64 and src_mask (b, S) bool."""
    width = max(len(s) for s in sources)
    src_ids = np.full((len(sources), width), pad_id, dtype=np.int64)  # (b, S)
    src_mask = np.zeros((len(sources), width), dtype=np.bool_)  # (b, S)
    for row, ids in enumerate(sources):
        src_ids[row, : len(ids)] = ids
        src_mask[row, : len(ids)] = True
    return src_ids, src_mask


def advance_all(searches: list[Search], top_log_probs: np.ndarray, top_ids: np.ndarray) -> np.ndarray:
    """Give each search its slice of rows' candidates; returns the cache rows to keep, in the new row order."""
    keep, offset = [], 0
    for search in searches:
        rows = search.rows
        end = offset + rows
        keep.append(search.advance(top_log_probs[offset:end], top_ids[offset:end]) + offset)
        offset = end
    return np.concatenate(keep) if keep else np.zeros(0, np.int64)


def decode_batch(
    runtime: Runtime, sources: list[list[int]], options: list[SearchOptions], rules: TokenRules
) -> list[list[Hypothesis]]:
    """Static batching: encode every source once, step until every search is done."""
    src_ids, src_mask = pad_batch(sources, rules.pad_id)
    memory = runtime.encode(src_ids, src_mask)  # keys and values (L, b, H, S, Dh)
    cache = DecoderCache(runtime.n_layers, runtime.n_heads, runtime.head_dim)
    cache.add(memory.keys, memory.values, src_mask)
    del memory  # the cache holds its own copy
    searches = [new_search(rules.decoder_start_id, rules.eos_id, o) for o in options]
    live = list(searches)
    while live:
        input_ids = np.concatenate([s.last_tokens() for s in live])  # (B,)
        out = runtime.step(input_ids, cache)
        cache.append(out.step_keys, out.step_values)
        cache.select(advance_all(live, out.top_log_probs, out.top_ids))
        live = [s for s in live if not s.done]
    return [s.results() for s in searches]
