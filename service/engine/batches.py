"""The decoding loop over token ids: encoder once per sentence, then one step per token for all rows.

`decode_batch` runs a fixed set of sentences to completion (the static mode and the reference loop
over the graphs); `decode_batches` runs many such batches, in streams (the offline evaluation and the
benchmarks). It sees token ids only: text lives in the tokenizer and the HTTP layer.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from service.engine.decoding import (
    GreedySearch,
    Hypothesis,
    Search,
    SearchOptions,
    candidates,
    needs_log_probs,
    new_search,
)
from service.engine.runtime import Runtime


@dataclass(frozen=True)
class TokenRules:
    """The special ids of a model: where decoding starts, where it ends, how sources are padded. (Pad and the
    decoder start are never generated: the step graph leaves them out of its top-K candidates.)"""

    decoder_start_id: int
    eos_id: int
    pad_id: int


def ends(hypothesis: Hypothesis, rules: TokenRules) -> bool:
    """Whether the model ended this translation (its EOS), not the length cap."""
    return hypothesis.tokens[-1:] == (rules.eos_id,)


def source_mask(sources: list[list[int]]) -> np.ndarray:
    """(b, S) bool: each id list's positions of the right-padded batch (`pad_batch`) that are real."""
    lengths = np.array([len(s) for s in sources])  # (b,)
    return np.arange(lengths.max()) < lengths[:, None]  # (b, S)


def pad_batch(sources: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad id lists into src_ids (b, S) int64 and src_mask (b, S) bool."""
    src_mask = source_mask(sources)  # (b, S)
    src_ids = np.full(src_mask.shape, pad_id, dtype=np.int64)  # (b, S)
    for row, ids in enumerate(sources):
        src_ids[row, : len(ids)] = ids
    return src_ids, src_mask


def greedy_rows(searches: list[Search]) -> bool:
    """Whether every search is a running greedy one: one row each, row i search i's."""
    return all(type(s) is GreedySearch and not s.done for s in searches)


def last_tokens(searches: list[Search]) -> np.ndarray:
    """(B,) every row's latest token, the searches' rows in order."""
    if greedy_rows(searches):
        return np.array([s.last_token for s in searches], dtype=np.int64)  # (B,) one row each
    if len(searches) == 1:
        return searches[0].last_tokens()  # (B,) one sentence's beams
    return np.concatenate([s.last_tokens() for s in searches])  # (B,)


def candidates_needed(searches: list[Search]) -> int:
    """The most candidates per row any of the searches takes from the next step (what `Runtime.step` returns)."""
    if greedy_rows(searches):
        return candidates(searches[0].options)  # (all greedy: the common case of a continuous batch, checked fast)
    return max(candidates(s.options) for s in searches)


def log_softmax_needed(searches: list[Search]) -> bool:
    """Whether the next step must normalise its distribution: some search reads its candidates' log-probabilities
    (`needs_log_probs`). Greedy rows whose requests asked for no scores let it skip the log-softmax."""
    return any(needs_log_probs(s.options) for s in searches)


def advance_all(
    searches: list[Search], top_log_probs: np.ndarray, top_ids: np.ndarray
) -> tuple[list[int], np.ndarray | None]:
    """Give each search its slice of rows' candidates. Returns the order of the searches still running (indexes
    into `searches`) and the cache rows to keep for them, in that order (see `place`); None when every row stays
    where it is (greedy rows, none finished: DecoderCache.select has nothing to do)."""
    if greedy_rows(searches):
        return advance_greedy(searches, top_log_probs, top_ids)
    return advance_each(searches, top_log_probs, top_ids)


def advance_each(
    searches: list[Search], top_log_probs: np.ndarray, top_ids: np.ndarray
) -> tuple[list[int], np.ndarray]:
    """`advance_all` one search at a time, any kinds of search, rows in blocks of any size."""
    if len(searches) == 1:  # one sentence (an interactive beam request): its block is every row, `place` has no gap
        keep = searches[0].advance(top_log_probs, top_ids)  # (k,) its rows' parents, empty once it finished
        return ([0] if keep.size else []), keep
    keeps, offsets, offset = [], [], 0
    for search in searches:
        rows = search.rows
        offsets.append(offset)
        keeps.append(search.advance(top_log_probs[offset : offset + rows], top_ids[offset : offset + rows]) + offset)
        offset += rows
    return place(keeps, offsets + [offset])


def advance_greedy(
    searches: list[GreedySearch], top_log_probs: np.ndarray, top_ids: np.ndarray
) -> tuple[list[int], np.ndarray | None]:
    """`advance_all` for greedy searches only (row i is search i's): every row's two best candidates converted to
    Python numbers at once, and `place` for blocks of one row, in array operations (a third of the time of the
    general path at 30 rows)."""
    ids, log_probs = top_ids[:, :2].tolist(), top_log_probs[:, :2].tolist()  # (B, 2) each
    finished = [s.take(i, p) for s, i, p in zip(searches, ids, log_probs, strict=True)]  # (B,)
    if not any(finished):
        return list(range(len(searches))), None  # every row stays: no array to build, nor for select to check
    done = np.array(finished, dtype=np.bool_)  # (B,)
    live = np.flatnonzero(~done)  # (B',) the searches that run on
    rows = np.arange(live.size)  # (B',) rows below the new count stay where they are ...
    rows[np.flatnonzero(done[: live.size])] = live[live >= live.size]  # ... the last live rows fill finished ones
    return rows.tolist(), rows


def place(keeps: list[np.ndarray], bounds: list[int]) -> tuple[list[int], np.ndarray]:
    """Where each running search's rows go next step. keeps[i]: search i's rows to keep (this step's indexes,
    empty once it finished); its rows this step were bounds[i] to bounds[i + 1]. A search whose block keeps
    its size and lies below the new row count stays where it is; the others fill the gaps first-fit. So a
    sentence that finishes costs the copy of the rows that fill its place, not of every row after it (the cache
    moves rows in place). Falls back to the searches' own order when the gaps do not fit."""
    live = [i for i, keep in enumerate(keeps) if keep.size]
    total = sum(keeps[i].size for i in live)
    stays = [i for i in live if keeps[i].size == bounds[i + 1] - bounds[i] and bounds[i + 1] <= total]
    starts, gaps, cursor = {i: bounds[i] for i in stays}, [], 0
    for i in stays + [None]:  # stays are in row order
        begin = total if i is None else bounds[i]
        if begin > cursor:
            gaps.append([cursor, begin])
        cursor = total if i is None else bounds[i + 1]
    for i in (i for i in live if i not in starts):
        gap = next((g for g in gaps if g[1] - g[0] >= keeps[i].size), None)
        if gap is None:
            starts = {i: n for n, i in enumerate(live)}  # the searches' own order
            break
        starts[i], gap[0] = gap[0], gap[0] + keeps[i].size
    order = sorted(live, key=starts.__getitem__)
    return order, np.concatenate([keeps[i] for i in order]) if order else np.zeros(0, np.int64)


def decode_batch(
    runtime: Runtime, sources: list[list[int]], options: list[SearchOptions], rules: TokenRules
) -> list[list[Hypothesis]]:
    """Static batching: encode every source once, step until every search is done."""
    src_ids, src_mask = pad_batch(sources, rules.pad_id)
    memory = runtime.encode(src_ids, src_mask)  # keys and values (L, b, H, S, Dh)
    cache = runtime.new_cache()
    cache.add(memory.keys, memory.values, src_mask, owned=True, candidates=memory.candidates)  # the memory's arrays
    cache.most_steps = max(o.max_new_tokens for o in options)  # its time axis grows no further
    del memory  # the cache holds it (or its own copy)
    searches = [new_search(rules.decoder_start_id, rules.eos_id, o) for o in options]
    live = list(searches)
    while live:
        input_ids = last_tokens(live)  # (B,)
        out = runtime.step(input_ids, cache, candidates=candidates_needed(live), log_softmax=log_softmax_needed(live))
        order, rows = advance_all(live, out.top_log_probs, out.top_ids)
        cache.select(rows)
        live = [live[i] for i in order]
    return [s.results() for s in searches]


def decode_batches(
    runtime: Runtime,
    batches: list[list[list[int]]],
    options: list[list[SearchOptions]],
    rules: TokenRules,
    streams: int = 1,
) -> Iterator[list[list[Hypothesis]]]:
    """Each batch's results, in order; with `streams` > 1, that many batches decode at once on threads of their
    own (ONNX Runtime releases the GIL while a graph runs; give the sessions cores / streams threads), the
    costliest first (`longest_first`). One stream runs on the calling thread: a pool's thread would get a malloc
    arena of its own (more resident memory)."""
    if streams == 1:
        yield from (decode_batch(runtime, b, o, rules) for b, o in zip(batches, options, strict=True))
        return
    with ThreadPoolExecutor(streams) as pool:
        started = {i: pool.submit(decode_batch, runtime, batches[i], options[i], rules) for i in longest_first(batches)}
        try:
            yield from (started[i].result() for i in range(len(batches)))
        finally:  # a batch failed, or the caller stopped early: the batches not begun never will be
            for future in started.values():
                future.cancel()


def longest_first(batches: list[list[list[int]]]) -> list[int]:
    """The batches' indices, the costliest first: rows times the longest source (a batch steps about as long as
    its longest output). Streams that take them in this order finish together; in the order of a length-sorted
    list, one stream would step alone through the longest batch at the end while the others idle (the default
    model's test set in batches of 16 on two streams: 1.05-1.07x the throughput, 4 runs)."""
    return sorted(range(len(batches)), key=lambda i: -len(batches[i]) * max(map(len, batches[i]), default=0))
