import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from service.engine import kv_cache
from service.engine.kv_cache import MIN_CAPACITY, DecoderCache, fitted_capacity, group_rows, resized

ROOT = Path(__file__).resolve().parents[2]


def memory(rows: int, src_len: int, fill: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    keys = np.full((2, rows, 3, src_len, 4), fill, np.float32)  # (L, b, H, S, Dh)
    values = np.full((2, rows, 3, src_len, 4), fill, np.float32)  # (L, b, H, S, Dh)
    return keys, values, np.ones((rows, src_len), np.bool_)


def stacked(layers: list[np.ndarray]) -> np.ndarray:
    return np.stack(layers)  # (L, B, ...) a copy, to read


def step(rows: int, fill: float) -> np.ndarray:
    return np.full((2, rows, 3, 4), fill, np.float32)  # (L, B, H, Dh)


def append(cache: DecoderCache, keys: np.ndarray, values: np.ndarray) -> None:
    """What a step does to the cache: room for it, then (as the step graph does) each row's new key and value
    (L, B, H, Dh) written at the row's slot `lengths`, then counted."""
    cache.make_room()
    rows = np.arange(cache.rows)  # (B,)
    for layers, new in ((cache.self_keys, keys), (cache.self_values, values)):
        for layer, new_layer in zip(layers, new, strict=True):  # (B, H, T, Dh), (B, H, Dh)
            layer[rows, :, cache.lengths] = new_layer
    cache.advance()


def test_rows_join_with_longer_sources_and_append_in_their_own_slots() -> None:
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    cache.add(*memory(2, 5, 1.0))
    append(cache, step(2, 10.0), step(2, 20.0))
    cache.add(*memory(1, 8, 2.0))  # a longer source joins: the old rows are padded and masked
    assert cache.src_mask.tolist()[0] == [True] * 5 + [False] * 3
    append(cache, step(3, 11.0), step(3, 21.0))
    assert cache.lengths.tolist() == [2, 2, 1]
    assert stacked(cache.self_keys)[0, 0, 0, :2, 0].tolist() == [10.0, 11.0]
    assert stacked(cache.self_keys)[0, 2, 0, :1, 0].tolist() == [11.0]  # the newcomer's step 0 is in slot 0
    assert stacked(cache.cross_keys)[1, 0, 2, :, 0].tolist() == [1.0] * 5 + [0.0] * 3  # padded source, masked
    assert stacked(cache.self_values)[1, 2, 2, 0].tolist() == [21.0] * 4


def shares(layers: list[np.ndarray], memory: np.ndarray) -> list[bool]:
    return [np.shares_memory(layer, memory) for layer in layers]


def test_a_fresh_cache_takes_an_owned_memory_as_its_buffers_and_copies_any_other() -> None:
    """`owned` (the encoder's memory, handed over): a cache that would make its cross buffers anew takes the
    memory's layers as they are, and steps, joins and leaves as a cache that copied them. A memory not handed over,
    a slice of a wider source axis, or a cache with room for the newcomers (a server's): copied."""
    keys, values, mask = memory(3, 5, 1.0)
    keys[:, 1], values[:, 2] = 7.0, 9.0  # (L, b, H, S, Dh) rows told apart
    taker, copier = (DecoderCache(n_layers=2, n_heads=3, head_dim=4) for _ in range(2))
    taker.add(keys, values, mask, owned=True)
    copier.add(keys.copy(), values.copy(), mask)
    assert shares(taker.cross_keys, keys) == [True, True] and shares(taker.cross_values, values) == [True, True]
    assert all(layer.flags["C_CONTIGUOUS"] for layer in (*taker.cross_keys, *taker.cross_values))
    for cache in (taker, copier):
        append(cache, step(3, 10.0), step(3, 20.0))
        cache.add(*memory(1, 8, 2.0), owned=True)  # a wider newcomer: the taken buffers give way to wider ones
        cache.select(np.array([0, 3, 2]))  # the second sentence leaves, the newcomer takes its place
        append(cache, step(3, 11.0), step(3, 21.0))
    for mine, theirs in zip(
        (taker.self_keys, taker.self_values, taker.cross_keys, taker.cross_values),
        (copier.self_keys, copier.self_values, copier.cross_keys, copier.cross_values),
        strict=True,
    ):
        np.testing.assert_array_equal(stacked(mine), stacked(theirs))
    assert taker.src_mask.tolist() == copier.src_mask.tolist() and taker.lengths.tolist() == [2, 1, 2]
    assert stacked(taker.cross_values)[0, 2, 0, :, 0].tolist() == [9.0] * 5 + [0.0] * 3  # the third, padded

    unowned = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    unowned.add(keys, values, mask)
    sliced = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    sliced.add(keys[:, :, :, :4], values[:, :, :, :4], mask[:, :4], owned=True)  # layers not contiguous
    assert not any(shares(unowned.cross_keys, keys) + shares(sliced.cross_keys, keys))
    np.testing.assert_array_equal(stacked(sliced.cross_keys), keys[:, :, :, :4])

    roomy = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    roomy.add(*memory(3, 8, 1.0), owned=True)
    roomy.select(np.zeros(0, np.int64))  # every sentence leaves: its buffers keep room for 3
    narrow_keys, narrow_values, narrow_mask = memory(2, 5, 3.0)
    roomy.add(narrow_keys, narrow_values, narrow_mask, owned=True)
    assert not any(shares(roomy.cross_keys, narrow_keys)) and roomy.sentences == 2
    roomy.select(np.zeros(0, np.int64))
    wide_keys, wide_values, wide_mask = memory(4, 3, 4.0)  # more than its room
    roomy.add(wide_keys, wide_values, wide_mask, owned=True)
    assert all(shares(roomy.cross_keys, wide_keys)) and roomy.src_mask.shape == (4, 3) and roomy.src_mask.all()
    append(roomy, step(4, 1.0), step(4, 1.0))
    assert roomy.lengths.tolist() == [1] * 4


def test_select_reorders_and_drops_and_capacity_grows() -> None:
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    cache.add(*memory(3, 2, 0.0))
    for t in range(MIN_CAPACITY + 1):
        append(cache, step(3, float(t)), step(3, float(t)))
    assert cache.capacity >= MIN_CAPACITY + 1 and cache.lengths.tolist() == [MIN_CAPACITY + 1] * 3
    for layer in cache.self_keys:
        layer[2] = -1.0
    before = stacked(cache.self_keys).copy()
    cache.select(None)  # every row stays (greedy rows, none finished)
    assert cache.rows == 3 and np.array_equal(stacked(cache.self_keys), before, equal_nan=True)
    cache.select(np.array([2, 2, 0]))
    assert cache.rows == 3
    filled = MIN_CAPACITY + 1  # slots past what any row wrote are not copied: nothing reads them
    keys = stacked(cache.self_keys)  # (L, B, H, T, Dh)
    assert (keys[:, :2, :, :filled] == -1.0).all() and keys[0, 2, 0, 3, 0] == 3.0
    assert cache.lengths.tolist() == [filled] * 3
    cache.select(np.array([2]))
    assert cache.rows == 1 and cache.lengths.shape == (1,) and stacked(cache.cross_keys).shape[1] == 1


def test_beams_share_their_sentence_source_and_reorder_without_copying_it() -> None:
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    cache.add(*memory(2, 3, 1.0))
    cache.select(np.array([0, 0, 0, 1, 1, 1]))  # two sentences, three beams each: still two sources
    assert stacked(cache.cross_keys).shape[1] == 2 and cache.src_mask.shape == (2, 3)
    for layer in cache.cross_keys:
        layer[:, 0, 0, 0] = [10.0, 11.0]  # a probe per sentence, to see any copy
    buffer = cache.cross_keys
    append(cache, step(6, 1.0), step(6, 1.0))
    cache.select(np.array([2, 0, 0, 5, 3, 4]))  # parents within each sentence
    assert cache.sentence.tolist() == [0, 0, 0, 1, 1, 1] and np.shares_memory(cache.cross_keys[0], buffer[0])
    assert cache.sentence_rows.tolist() == [[0, 1, 2], [3, 4, 5]] and cache.row_slots.tolist() == [0, 1, 2, 3, 4, 5]
    cache.select(np.array([3, 4]))  # the first sentence left: the second's source takes its place
    assert stacked(cache.cross_keys)[:, :, 0, 0, 0].tolist() == [[11.0]] * 2 and cache.sentence.tolist() == [0, 0]
    assert cache.sentence_rows.tolist() == [[0, 1]] and cache.row_slots.tolist() == [0, 1]


def test_rows_group_by_sentence_in_any_order_and_number() -> None:
    rows, slots = group_rows(np.array([1, 1, 0, 2, 2, 2, 0]), 3)
    assert rows.tolist() == [[2, 6, 2], [0, 1, 0], [3, 4, 5]]  # fewer rows: the first repeated
    assert slots.tolist() == [3, 4, 0, 6, 7, 8, 1]
    assert (rows.ravel()[slots] == np.arange(7)).all()  # every row finds itself back
    rows, slots = group_rows(np.arange(4), 4)  # greedy: one row per sentence
    assert rows.tolist() == [[0], [1], [2], [3]] and slots.tolist() == [0, 1, 2, 3]
    rows, slots = group_rows(np.array([2, 0, 3, 1]), 4)  # greedy rows that moved into other sentences' places
    assert rows.tolist() == [[1], [3], [0], [2]] and slots.tolist() == [2, 0, 3, 1]
    rows, slots = group_rows(np.zeros(0, np.int64), 0)
    assert rows.shape == (0, 1) and slots.shape == (0,)


def test_leaving_sentences_are_replaced_by_the_last_live_ones() -> None:
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    for fill in (1.0, 2.0, 3.0, 4.0, 5.0):
        cache.add(*memory(1, 2 + int(fill), fill))  # five sentences, sources 3 to 7 long
    cache.select(np.array([4, 4, 2, 0]))  # sentences 1 and 3 leave; 4 (two beams) moves into 1's place
    assert cache.sentences == 3 and cache.sentence.tolist() == [1, 1, 2, 0]
    assert stacked(cache.cross_keys)[0, :, 0, 0, 0].tolist() == [1.0, 5.0, 3.0]
    assert cache.src_mask.sum(axis=1).tolist() == [3, 7, 5]  # each mask moved with its source
    assert cache.sentence_rows.tolist() == [[3, 3], [0, 1], [2, 2]]


def test_a_row_that_takes_another_ones_place_copies_only_what_that_one_wrote() -> None:
    """A continuous batch moves a late, short sentence into a finished long one's place at nearly every step: it
    copies that sentence's own slots and source positions, not the longest row's or source's."""
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    cache.add(*memory(2, 9, 1.0))  # two long sentences
    for _ in range(20):
        append(cache, step(2, 1.0), step(2, 1.0))
    cache.add(*memory(1, 3, 2.0))  # a short one joins late
    append(cache, step(3, 2.0), step(3, 2.0))
    for buffer in (cache.self_keys, cache.cross_keys):
        for layer in buffer:
            layer[0] = -7.0  # what the first long sentence's row and source leave behind
    cache.select(np.array([2, 1]))  # the first long one finished: the short one takes its row and source place
    assert cache.lengths.tolist() == [1, 21] and cache.src_mask.sum(axis=1).tolist() == [3, 9]
    assert (stacked(cache.self_keys)[:, 0, :, :1] == 2.0).all()  # its one step
    assert (stacked(cache.self_keys)[:, 0, :, 1:21] == -7.0).all()  # not the long row's 21 slots
    assert (stacked(cache.cross_keys)[:, 0, :, :3] == 2.0).all()  # its 3 source positions
    assert (stacked(cache.cross_keys)[:, 0, :, 3:] == -7.0).all()  # not the 9 of the longest source


def test_buffers_stay_contiguous_for_the_graphs() -> None:
    """A non-contiguous input is copied by ONNX Runtime at every step: every buffer must stay C-contiguous."""
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    cache.add(*memory(3, 4, 1.0))
    cache.select(np.array([2, 2, 0, 1]))
    append(cache, step(4, 1.0), step(4, 1.0))
    cache.select(np.array([3, 1]))
    for buffer in (cache.self_keys, cache.self_values, cache.cross_keys, cache.cross_values):
        assert all(layer.flags["C_CONTIGUOUS"] for layer in buffer)  # the graph gets one (B, ...) view per layer
    assert cache.lengths.flags["C_CONTIGUOUS"] and cache.src_mask.flags["C_CONTIGUOUS"]


def test_in_place_reorder_reads_every_parent_before_writing() -> None:
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    cache.add(*memory(4, 2, 1.0))
    for t in range(3):
        append(cache, step(4, float(t)), step(4, float(t)))
    for layer in cache.self_keys:
        layer[:, :, 0, 0] = np.arange(4, dtype=np.float32)[:, None]  # each row's mark
    buffer = cache.self_keys
    cache.select(np.array([1, 0, 2, 3]))  # a swap: two rows move
    assert np.shares_memory(cache.self_keys[0], buffer[0])
    assert stacked(cache.self_keys)[0, :, 0, 0, 0].tolist() == [1.0, 0.0, 2.0, 3.0]
    cache.select(np.array([2, 0, 0, 3]))  # a chain through a row that is itself overwritten
    assert stacked(cache.self_keys)[0, :, 0, 0, 0].tolist() == [2.0, 1.0, 1.0, 3.0]
    cache.select(np.array([3, 2, 1, 0]))  # everything moves, still in place
    assert np.shares_memory(cache.self_keys[0], buffer[0])
    assert stacked(cache.self_keys)[0, :, 0, 0, 0].tolist() == [3.0, 1.0, 1.0, 2.0]
    cache.select(np.array([3, 1]))  # rows leave: a view of the first two rows of the same memory
    assert np.shares_memory(cache.self_keys[0], buffer[0])
    assert stacked(cache.self_keys)[1, :, 0, 0, 0].tolist() == [2.0, 1.0]
    assert stacked(cache.cross_keys).shape[1] == 2 and cache.src_mask.shape == (2, 2)


def test_a_finished_sentence_hands_its_rows_to_another_sentence_with_its_source() -> None:
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    cache.add(*memory(1, 2, 1.0))
    cache.add(*memory(1, 2, 2.0))
    cache.select(np.array([0, 0, 1, 1]))  # two beams each
    append(cache, step(4, 5.0), step(4, 5.0))
    cache.select(np.array([2, 3]))  # the first sentence finished: the second's beams move up, with their source
    assert cache.sentence.tolist() == [0, 0] and cache.sentences == 1
    assert (stacked(cache.cross_keys) == 2.0).all() and (stacked(cache.cross_values) == 2.0).all()


def test_rows_join_and_branch_in_place_while_there_is_room() -> None:
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    cache.add(*memory(4, 3, 1.0))
    append(cache, step(4, 7.0), step(4, 7.0))
    cache.select(np.array([0, 1]))  # two sentences finish: their rows become free room
    buffer = cache.self_keys
    cache.add(*memory(2, 2, 2.0))  # newcomers take the free rows: nothing live is copied
    assert np.shares_memory(cache.self_keys[0], buffer[0]) and cache.rows == 4
    assert stacked(cache.self_keys)[0, :2, 0, 0, 0].tolist() == [7.0, 7.0] and cache.lengths.tolist() == [1, 1, 0, 0]
    assert cache.lengths[2:].tolist() == [0, 0]  # the newcomers attend to none of the old rows' steps
    assert stacked(cache.cross_keys)[0, 2, 0, :2, 0].tolist() == [2.0, 2.0]  # their shorter source; what follows is
    assert cache.src_mask[2].tolist() == [True, True, False]  # an old row's, masked (never zeroed: it costs)
    cache.select(np.array([0, 0, 0, 1, 2, 3]))  # beams branch past the room: the buffers grow, contents kept
    assert cache.rows == 6 and stacked(cache.self_keys)[0, :4, 0, 0, 0].tolist() == [7.0, 7.0, 7.0, 7.0]
    assert stacked(cache.cross_keys)[0, :, 0, 0, 0].tolist() == [1.0, 1.0, 2.0, 2.0]  # one source per sentence
    assert cache.sentence.tolist() == [0, 0, 0, 1, 2, 3]


def test_time_and_source_axes_shrink_once_the_rows_that_needed_them_leave() -> None:
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    cache.add(*memory(1, 20, 1.0))  # a long sentence
    for t in range(70):
        append(cache, step(1, float(t)), step(1, float(t)))
    cache.add(*memory(2, 3, 2.0))  # two short ones join it
    for t in range(2):
        append(cache, step(3, 100.0 + t), step(3, 100.0 + t))
    assert cache.capacity == 96 and cache.src_mask.shape[1] == 20  # 16, 32, 48, 64, then 65 and a quarter
    cache.select(np.array([1, 2]))  # the long one finished
    assert cache.capacity == MIN_CAPACITY and cache.lengths.tolist() == [2, 2]
    assert cache.src_mask.shape == (2, 3) and stacked(cache.cross_keys).shape == (2, 2, 3, 3, 4)
    assert stacked(cache.self_keys)[1, :, 2, :2, 0].tolist() == [[100.0, 101.0]] * 2  # what the live rows wrote, kept
    assert (stacked(cache.cross_keys) == 2.0).all()
    for layer in (*cache.self_keys, *cache.cross_values):
        assert layer.flags["C_CONTIGUOUS"]
    append(cache, step(2, 7.0), step(2, 7.0))
    assert stacked(cache.self_values)[0, 1, 0, :3, 0].tolist() == [100.0, 101.0, 7.0]
    assert cache.lengths.tolist() == [3, 3]


def test_axes_keep_their_size_when_shrinking_would_not_halve_them() -> None:
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    cache.add(*memory(1, 9, 1.0))
    cache.add(*memory(1, 7, 1.0))
    for _ in range(MIN_CAPACITY + 1):  # capacity 32: 18 slots and a quarter more fit in no less
        append(cache, step(2, 1.0), step(2, 1.0))
    buffer = cache.self_keys
    cache.select(np.array([1]))  # the 9-token source left, the 7-token one stays: more than half
    assert cache.capacity == 2 * MIN_CAPACITY and np.shares_memory(cache.self_keys[0], buffer[0])
    assert cache.src_mask.shape == (1, 9)


def test_the_time_axis_keeps_its_room_until_a_quarter_of_it_would_do() -> None:
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    cache.add(*memory(1, 4, 1.0))
    for _ in range(3 * MIN_CAPACITY):  # capacity 48 (one sentence 48 steps long) and then 64
        append(cache, step(1, 1.0), step(1, 1.0))
    cache.add(*memory(1, 4, 2.0))
    append(cache, step(2, 2.0), step(2, 2.0))
    buffer = cache.self_keys
    cache.select(np.array([1]))  # the long one left: 16 slots would do, a quarter of 64
    assert cache.capacity == MIN_CAPACITY and cache.lengths.tolist() == [1]
    for _ in range(2 * MIN_CAPACITY + 8):  # 41 steps: capacity 48
        append(cache, step(1, 3.0), step(1, 3.0))
    cache.add(*memory(1, 4, 4.0))
    append(cache, step(2, 4.0), step(2, 4.0))
    buffer = cache.self_keys
    cache.select(np.array([1]))  # the long one left: 16 slots would do, a third of 48: kept
    assert cache.capacity == 3 * MIN_CAPACITY and cache.lengths.tolist() == [1]
    assert np.shares_memory(cache.self_keys[0], buffer[0])


def test_capacity_grows_by_a_quarter_in_whole_blocks_up_to_the_searches_ceiling() -> None:
    assert [fitted_capacity(n) for n in (1, 16, 17, 33, 65, 129, 200)] == [16, 32, 32, 48, 96, 176, 256]
    assert [fitted_capacity(n, most=40) for n in (1, 17, 33, 40, 41)] == [16, 32, 40, 40, 41]  # never below n
    seen = {}
    for most in (None, 90, 40):
        cache = DecoderCache(n_layers=1, n_heads=1, head_dim=2)
        cache.most_steps = most
        source = np.zeros((1, 1, 1, 3, 2), np.float32)  # (L, b, H, S, Dh)
        cache.add(source, source, np.ones((1, 3), np.bool_))
        seen[most] = []
        for t in range(most or 100):  # a search of `most` steps
            append(cache, np.full((1, 1, 1, 2), t, np.float32), np.zeros((1, 1, 1, 2), np.float32))
            seen[most].append(cache.capacity)
        assert stacked(cache.self_keys)[0, 0, 0, : t + 1, 0].tolist() == list(range(t + 1))  # every growth kept them
    assert sorted(set(seen[None])) == [16, 32, 48, 64, 96, 128]
    assert sorted(set(seen[90])) == [16, 32, 48, 64, 90] and sorted(set(seen[40])) == [16, 32, 40]


def test_a_float16_cache_keeps_its_dtype_through_joins_reorders_and_growth() -> None:
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4, dtype="float16")
    cache.add(*memory(2, 5, 1.0))
    for t in range(MIN_CAPACITY + 1):  # the time axis grows once
        append(cache, step(2, float(t)), step(2, float(t)))
    cache.add(*memory(1, 8, 2.0))  # a longer source: the cross buffers widen
    cache.select(np.array([1, 1, 2]))
    for layers in (cache.self_keys, cache.self_values, cache.cross_keys, cache.cross_values):
        assert {layer.dtype for layer in layers} == {np.dtype(np.float16)}
    assert stacked(cache.self_keys)[0, 0, 0, :3, 0].tolist() == [0.0, 1.0, 2.0] and not cache.on_gpu


def test_keeping_every_row_in_place_changes_nothing_and_keeps_the_groups() -> None:
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    cache.add(*memory(3, 5, 1.0))
    append(cache, step(3, 10.0), step(3, 20.0))
    groups, buffers = (cache.sentence_rows, cache.row_slots), [layer.ctypes.data for layer in cache.self_keys]
    before = stacked(cache.self_keys)
    cache.select(np.arange(3))  # greedy rows, none finished
    assert cache.sentence_rows is groups[0] and cache.row_slots is groups[1]  # not recomputed
    assert [layer.ctypes.data for layer in cache.self_keys] == buffers  # the same buffers
    assert np.array_equal(stacked(cache.self_keys), before, equal_nan=True)  # unwritten slots hold anything
    cache.select(np.array([0, 2]))  # a row leaves: the groups follow
    assert cache.sentence_rows.tolist() == [[0], [1]] and cache.lengths.tolist() == [1, 1]


def test_a_binding_is_kept_while_the_arrays_a_step_is_given_stay_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """A runtime keeps its binding of the cache's arrays in `bound` until the cache drops it: while it holds, every
    array it binds must be the same object with the same rows (counting a step and reordering beams in place), and
    it must be dropped before a buffer is replaced, so that it does not keep the old buffer alive."""
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    cache.add(*memory(2, 5, 1.0))
    cache.select(np.array([0, 0, 0, 1, 1, 1]))  # two sentences of three beams
    append(cache, step(6, 10.0), step(6, 20.0))

    def bound() -> list:
        arrays = [cache.lengths, cache.src_mask, cache.sentence_rows, cache.row_slots]
        buffers = [
            layer
            for name in ("self_keys", "self_values", "cross_keys", "cross_values")
            for layer in getattr(cache, name)
        ]
        return [(a.ctypes.data, a.shape) for a in arrays + buffers]

    cache.bound, before, lengths = "binding", bound(), cache.lengths
    cache.advance()
    cache.select(np.arange(6))  # every row in place
    cache.select(np.array([1, 1, 0, 3, 5, 4]))  # beams change parents within their sentences
    assert cache.bound == "binding" and bound() == before and cache.lengths is lengths
    assert cache.lengths.tolist() == [2] * 6 and cache.sentence_rows.tolist() == [[0, 1, 2], [3, 4, 5]]
    for change in (
        lambda: cache.select(np.array([0, 1, 2, 3, 4])),  # a row leaves
        lambda: cache.select(np.array([0, 1, 2, 3, 4, 4])),  # a row joins its sentence
        lambda: cache.add(*memory(1, 5, 3.0)),  # a sentence joins
    ):
        cache.bound = "binding"
        change()
        assert cache.bound is None
    cache.bound, seen = "binding", []  # the time axis grows: the binding goes before the first layer is replaced
    monkeypatch.setattr(kv_cache, "resized", lambda *a, **k: (seen.append(cache.bound), resized(*a, **k))[1])
    for _ in range(MIN_CAPACITY):
        append(cache, step(cache.rows, 1.0), step(cache.rows, 1.0))
    assert seen and set(seen) == {None}


@pytest.mark.parametrize("seed", range(6))
def test_reorders_of_any_pattern_equal_a_gather_of_the_rows(seed: int) -> None:
    """Whether the moved rows are copied slice by slice (a few, no row both read and written) or through a
    temporary (a swap, a chain, many rows), every row ends up with its parent's written slots."""
    rng = np.random.default_rng(seed)
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    cache.add(*memory(6, 2, 1.0))
    for t in range(3):
        append(cache, rng.standard_normal((2, 6, 3, 4)).astype(np.float32), step(6, float(t)))
    patterns = (rng.integers(0, 6, 6), np.array([0, 1, 5, 3, 4, 5]), rng.permutation(6), np.array([4, 5, 2, 2]))
    for rows in patterns + (np.array([3, 3, 3, 3, 3, 3]),):  # the last: 5 rows take row 3, past kv_cache.SLICED_ROWS
        expected = stacked(cache.self_keys)[:, rows, :, :3]  # (L, B', H, 3, Dh) the parents' written slots
        cache.select(rows)
        assert np.array_equal(stacked(cache.self_keys)[:, :, :, :3], expected)


@pytest.mark.parametrize("seed", range(4))
def test_beams_following_parents_in_their_sentences_end_as_the_general_path_does(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A beam step's selection (every new beam from a row of its own sentence; a parent keeps its row, as
    `stay_in_parent_rows` places them) of up to FEW_ROWS rows runs on Python lists (`_follow_parents`). It ends as
    the general path does (FEW_ROWS 0) and as a gather of the rows would: the parents' written slots, the same
    lengths, sentences and groups, and the binding kept. A swap within a sentence (a row both read and written)
    takes the general path."""
    from service.engine.decoding import stay_in_parent_rows

    rng = np.random.default_rng(seed)
    caches = [DecoderCache(n_layers=2, n_heads=3, head_dim=4) for _ in range(2)]
    fast = []
    follow = DecoderCache._follow_parents
    monkeypatch.setattr(DecoderCache, "_follow_parents", lambda c, rows: fast.append(follow(c, rows)) or fast[-1])
    for cache in caches:
        cache.add(*memory(3, 4, 1.0))
        append(cache, step(3, 0.5), step(3, 0.5))
        cache.select(np.repeat(np.arange(3), 3))  # 3 beams a sentence, rows 3s .. 3s + 2
    for t in range(6):
        keys = rng.standard_normal((2, 9, 3, 4)).astype(np.float32)  # (L, B, H, Dh)
        for cache in caches:
            append(cache, keys, keys + 1)
        parents = rng.integers(0, 3, (3, 3))  # each sentence's new beams' parents, within the sentence
        rows = np.concatenate([3 * s + parents[s][stay_in_parent_rows(parents[s].tolist())] for s in range(3)])
        if t == 4:
            rows = np.array([1, 0, 2, 3, 4, 5, 6, 7, 8])  # a swap: rows 0 and 1 both read and written
        expected = stacked(caches[0].self_keys)[:, rows, :, : t + 2]  # (L, B, H, written, Dh) a gather
        for cache, few in zip(caches, (kv_cache.FEW_ROWS, 0), strict=True):
            monkeypatch.setattr(kv_cache, "FEW_ROWS", few)
            cache.bound, fast[:] = "binding", []
            cache.select(rows)
            assert np.array_equal(stacked(cache.self_keys)[:, :, :, : t + 2], expected)
            assert cache.bound == "binding" and cache.lengths.tolist() == [t + 2] * 9
            if few:
                assert fast == [t != 4]  # the swap falls back to the general path
        assert caches[0].make_room() == t + 2  # (the longest row's steps)
        assert np.array_equal(*(stacked(c.self_values)[:, :, :, : t + 2] for c in caches))
        assert np.array_equal(*(stacked(c.cross_keys) for c in caches))
        assert caches[0].sentence_rows.tolist() == caches[1].sentence_rows.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]


@pytest.mark.parametrize("seed", range(4))
def test_greedy_rows_compact_as_the_general_path_does(seed: int) -> None:
    """Rows that are each their own sentence, in order (greedy rows), compact through `_compact` when finished
    ones' places are taken by rows from past the new end; the same joins, steps and selections through the general
    path (the cache told its rows are not in order) leave the same rows, sources, masks and groups."""
    rng = np.random.default_rng(seed)
    fast, general = DecoderCache(n_layers=2, n_heads=3, head_dim=4), DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    compacted = 0
    for _ in range(40):
        if fast.rows < 12:
            b, width = int(rng.integers(1, 4)), int(rng.integers(1, 9))
            keys = rng.standard_normal((2, b, 3, width, 4)).astype(np.float32)  # (L, b, H, S', Dh)
            mask = np.arange(width) < rng.integers(1, width + 1, (b, 1))  # (b, S') right-padded
            for cache in (fast, general):
                cache.add(keys, -keys, mask)
        new = rng.standard_normal((2, fast.rows, 3, 4)).astype(np.float32)  # (L, B, H, Dh)
        for cache in (fast, general):
            append(cache, new, -new)
        done = rng.random(fast.rows) < 0.25  # (B,) the rows that finished at this step
        live = np.flatnonzero(~done)
        rows = np.arange(live.size)  # what advance_greedy hands the cache: the last live rows fill finished ones
        rows[np.flatnonzero(done[: live.size])] = live[live >= live.size]
        general._in_order = False
        compacted += fast._in_order
        for cache in (fast, general):
            cache.select(rows)
        assert fast._in_order
        for name in ("lengths", "sentence", "src_mask", "sentence_rows", "row_slots"):
            assert np.array_equal(getattr(fast, name), getattr(general, name)), name
        for row, length in enumerate(fast.lengths):
            assert np.array_equal(
                stacked(fast.self_keys)[:, row, :, :length], stacked(general.self_keys)[:, row, :, :length]
            )
        for sentence, used in enumerate(fast.src_mask.sum(axis=1)):
            for name in ("cross_keys", "cross_values"):
                assert np.array_equal(
                    stacked(getattr(fast, name))[:, sentence, :, :used],
                    stacked(getattr(general, name))[:, sentence, :, :used],
                )
    assert compacted == 40


def greedy_cache(rows: int, src_len: int = 3, bound_copies: bool = False) -> DecoderCache:
    """`rows` greedy rows (each its own sentence, in order), sentence i's source filled with i + 1, one step each."""
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4, bound_copies=bound_copies)
    for i in range(rows):
        cache.add(*memory(1, src_len, float(i + 1)))
    append(cache, step(rows, 1.0), step(rows, 1.0))
    return cache


def test_newcomers_take_finished_rows_places_and_the_binding_holds_when_as_many_join() -> None:
    cache = greedy_cache(4)
    cache.bound, lengths, src_mask = "binding", cache.lengths, cache.src_mask
    layout = cache.refill(np.array([0, 2, 3]), room=1)  # row 1 finished; one newcomer is ready
    assert layout.tolist() == [0, -1, 2, 3] and not cache.in_order  # a place left open until add fills it
    with pytest.raises(RuntimeError, match="not filled"):
        cache.make_room()  # a step now would run a row without a source
    rows = cache.add(*memory(1, 2, 9.0))
    assert rows.tolist() == [1] and cache.in_order
    assert cache.bound == "binding" and cache.lengths is lengths and cache.src_mask is src_mask  # all in place
    assert cache.lengths.tolist() == [1, 0, 1, 1] and cache.src_mask.sum(axis=1).tolist() == [3, 2, 3, 3]
    assert stacked(cache.cross_keys)[0, :, 0, 0, 0].tolist() == [1.0, 9.0, 3.0, 4.0]  # no other source moved
    assert cache.sentence.tolist() == [0, 1, 2, 3] and cache.sentence_rows.ravel().tolist() == [0, 1, 2, 3]


def test_refill_moves_rows_from_the_end_only_into_places_no_newcomer_takes() -> None:
    cache = greedy_cache(6)
    layout = cache.refill(np.array([0, 2, 4, 5]), room=1)  # rows 1 and 3 finished, one newcomer: 4 + 1 rows
    assert layout.tolist() == [0, 5, 2, -1, 4]  # row 5 (past the new end) takes row 1's place, the newcomer row 3's
    cache.add(*memory(1, 2, 9.0))
    assert stacked(cache.cross_keys)[0, :, 0, 0, 0].tolist() == [1.0, 6.0, 3.0, 9.0, 5.0]
    assert cache.lengths.tolist() == [1, 1, 1, 0, 1] and cache.src_mask.sum(axis=1).tolist() == [3, 3, 3, 2, 3]
    layout = cache.refill(np.array([0, 1, 2, 3, 4]), room=3)  # none finished, three join: at the end
    assert layout.tolist() == [0, 1, 2, 3, 4, -1, -1, -1]
    assert cache.add(*memory(2, 3, 7.0)).tolist() == [5, 6] and cache.add(*memory(1, 4, 8.0)).tolist() == [7]
    assert cache.in_order and cache.rows == cache.sentences == 8 and cache.lengths.tolist() == [1, 1, 1, 0, 1, 0, 0, 0]
    assert stacked(cache.cross_keys)[0, 5:, 0, 0, 0].tolist() == [7.0, 7.0, 8.0]


def test_a_wider_newcomer_or_a_binding_of_copies_is_bound_anew() -> None:
    for bound_copies, src_len in ((False, 6), (True, 2)):
        cache = greedy_cache(3, bound_copies=bound_copies)
        cache.bound = "binding"
        cache.refill(np.array([0, 2]), room=1)
        cache.add(*memory(1, src_len, 9.0))
        assert cache.bound is None  # wider: a new mask; copies (CUDA): the binding holds the old mask and source
        assert cache.src_mask.shape[1] == max(3, src_len) and cache.src_mask[1].sum() == src_len


def test_refill_refuses_what_is_not_one_row_each_in_order() -> None:
    cache = greedy_cache(3)
    with pytest.raises(ValueError, match="at most once"):
        cache.refill(np.array([0, 0, 1]), room=0)  # a beam's first step repeats its row
    cache.refill(np.array([0, 1]), room=1)
    with pytest.raises(ValueError, match="in order"):
        cache.refill(np.array([0, 1, 2]), room=0)  # the open place is not filled yet
    with pytest.raises(RuntimeError, match="before the places"):
        cache.select(np.array([1, 0, 2]))


def test_rows_left_one_each_by_beams_are_put_back_in_order() -> None:
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    for fill in (1.0, 2.0, 3.0):
        cache.add(*memory(1, 2 + int(fill), fill))
    cache.select(np.array([0, 0, 1, 2]))  # sentence 0 branches into two beams: not in order
    assert not cache.in_order
    cache.select(np.array([3, 2]))  # its beams leave; the last two rows swap places
    assert cache.in_order and cache.sentence.tolist() == [0, 1]
    assert stacked(cache.cross_keys)[0, :, 0, 0, 0].tolist() == [3.0, 2.0]  # each row's own source at its place
    assert cache.src_mask.sum(axis=1).tolist() == [5, 4]


@pytest.mark.parametrize("seed", range(4))
def test_refilling_greedy_rows_keeps_every_sentence_as_selecting_then_joining_does(seed: int) -> None:
    """Steps of greedy rows where some finish and newcomers join: through refill (newcomers into finished rows'
    places) and through select then add (the last rows into those places, newcomers at the end), every live
    sentence ends up with the same steps, source and mask, at whichever row."""
    rng = np.random.default_rng(seed)
    caches = {"refill": DecoderCache(2, 3, 4), "select": DecoderCache(2, 3, 4)}
    tags = {name: [] for name in caches}  # per cache, each row's sentence (its source's fill)
    ids = iter(range(1, 10_000))
    for _ in range(30):
        new = rng.standard_normal((2, caches["refill"].rows, 3, 4)).astype(np.float32)  # (L, B, H, Dh)
        for name, cache in caches.items():  # the same step for the same sentence, wherever its row is
            order = np.argsort(np.argsort(tags[name])) if tags[name] else np.zeros(0, np.int64)
            append(cache, new[:, order], -new[:, order])
        done = {tag for tag in tags["refill"] if rng.random() < 0.3}
        joining = [(next(ids), int(rng.integers(1, 8))) for _ in range(int(rng.integers(0, 4)))]
        for name, cache in caches.items():
            rows = np.array([i for i, tag in enumerate(tags[name]) if tag not in done], np.int64)
            if name == "refill":
                layout = cache.refill(rows, room=len(joining)) if cache.rows else np.full(len(joining), -1)
                if not cache.rows:
                    tags[name] = []
                else:
                    tags[name] = [tags[name][row] if row >= 0 else None for row in layout.tolist()]
            else:
                cache.select(rows)
                tags[name] = [tags[name][row] for row in rows.tolist()]
            for tag, width in joining:
                keys = np.full((2, 1, 3, width, 4), float(tag), np.float32)
                places = cache.add(keys, -keys, np.ones((1, width), np.bool_))
                for place in places.tolist():
                    if place < len(tags[name]):
                        tags[name][place] = tag
                    else:
                        tags[name].append(tag)
        assert sorted(tags["refill"]) == sorted(tags["select"]) and caches["refill"].in_order
        where = {name: {tag: row for row, tag in enumerate(tags[name])} for name in caches}
        for tag in tags["refill"]:
            a, b = (where[name][tag] for name in ("refill", "select"))
            one, other = caches["refill"], caches["select"]
            assert one.lengths[a] == other.lengths[b]  # the source axes may differ in width (shrunk at other steps)
            assert np.flatnonzero(one.src_mask[a]).tolist() == np.flatnonzero(other.src_mask[b]).tolist()
            length, width = int(one.lengths[a]), int(one.src_mask[a].sum())
            assert np.array_equal(stacked(one.self_keys)[:, a, :, :length], stacked(other.self_keys)[:, b, :, :length])
            assert np.array_equal(
                stacked(one.cross_values)[:, a, :, :width], stacked(other.cross_values)[:, b, :, :width]
            )


def agree_through_random_ops(caches: list[DecoderCache], seed: int = 7, ops: int = 160) -> None:
    """The same random joins, steps and selections (rows finishing, beams repeating rows) on every cache: after each,
    every row's written slots, source and sentence agree with the first cache's."""
    rng = np.random.default_rng(seed)
    fill = 0.0
    for op in range(ops):
        roll = rng.random()
        if not caches[0].rows or roll < 0.15:  # sentences join
            keys, values, mask = memory(int(rng.integers(1, 4)), int(rng.integers(2, 9)), fill)
            for cache in caches:
                cache.add(keys, values, mask)
        elif roll < 0.3:  # rows finish, or beams repeat and reorder rows
            rows = np.sort(rng.choice(caches[0].rows, int(rng.integers(1, caches[0].rows + 2)), replace=True))
            for cache in caches:
                cache.select(rows)
        else:
            new = fill + np.arange(caches[0].rows, dtype=np.float32)[None, :, None, None]  # (1, B, 1, 1) per row
            for cache in caches:
                append(cache, step(cache.rows, 0.0) + new, step(cache.rows, 1.0) + new)
        fill += 100.0
        first = caches[0]
        for other in caches[1:]:
            assert first.lengths.tolist() == other.lengths.tolist()
            assert first.sentence.tolist() == other.sentence.tolist()
            assert np.array_equal(first.src_mask, other.src_mask)
            assert np.array_equal(stacked(first.cross_keys), stacked(other.cross_keys))
            for row, length in enumerate(first.lengths.tolist()):
                for name in ("self_keys", "self_values"):
                    written = [np.stack([layer[row, :, :length] for layer in getattr(c, name)]) for c in (first, other)]
                    assert np.array_equal(*written), (op, row, name)


def test_a_reserved_cache_keeps_every_row_as_a_growing_one_does_through_joins_beams_and_leaves() -> None:
    """A cache that grows its time axis and one that reserves it, through the same random operations."""
    grown, reserved = caches = [DecoderCache(n_layers=2, n_heads=3, head_dim=4, reserve=r) for r in (None, 96)]
    agree_through_random_ops(caches)
    assert reserved.capacity == 96 and max(grown.lengths) > MIN_CAPACITY  # the growing one grew, the other never


REFUSED = """
import logging, resource, sys
import numpy as np
from service.engine import kv_cache
from service.engine.kv_cache import DecoderCache
from tests.service.test_kv_cache import agree_through_random_ops

logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
with open("/proc/self/status") as status:
    size = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmSize:"))
resource.setrlimit(resource.RLIMIT_AS, (size + (300 << 20), resource.getrlimit(resource.RLIMIT_AS)[1]))
slots = 1 << 18  # a row's keys of one layer: 3 heads x 256 Ki slots x 4 x 4 bytes, 12 MiB of address space
caches = [DecoderCache(n_layers=2, n_heads=3, head_dim=4, reserve=r) for r in (None, slots)]
agree_through_random_ops(caches)
grown, refused = caches
later = DecoderCache(n_layers=2, n_heads=3, head_dim=4, reserve=slots)
print(refused.reserved, refused.capacity == grown.capacity, later.reserved, len(kv_cache._refused))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="limits the address space to what /proc says")
def test_a_cache_refused_its_reserved_address_space_grows_instead_and_keeps_every_row(tmp_path: Path) -> None:
    """Under a limit of the process's address space (`ulimit -v`: 300 MiB more than it uses), a cache that reserves
    256 Ki slots a row (48 MiB of keys and values) is refused when its rows grow past ~6, after their first steps and
    part way through a buffer's layers; it grows instead, row for row as a growing cache does through the same random
    operations, logs it once, and caches made after it do not ask again."""
    run = subprocess.run(
        [sys.executable, "-c", REFUSED], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "True", "False", "1"]
    warnings = [line for line in run.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "Cannot allocate memory" in warnings[0] and "ulimit -v" in warnings[0], run.stderr


def resident(array: np.ndarray) -> tuple[int, int]:
    """`array`'s resident bytes (its pages present, from /proc/self/pagemap), and the bytes in transparent huge pages
    of the memory mappings that hold it (from /proc/self/smaps)."""
    start, page = array.__array_interface__["data"][0], mmap.PAGESIZE
    first, last = start // page, (start + array.nbytes - 1) // page
    with open("/proc/self/pagemap", "rb") as pagemap:
        pagemap.seek(first * 8)
        entries = np.frombuffer(pagemap.read((last - first + 1) * 8), np.uint64)  # (pages,) bit 63: present
    huge, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            head = line.split()[0]
            if not head.endswith(":"):  # a mapping's first line: start-end perms offset device inode path
                low, high = (int(x, 16) for x in head.split("-"))
                inside = low < start + array.nbytes and start < high
            elif inside and head == "AnonHugePages:":
                huge += int(line.split()[1]) * 1024  # kB
    return int((entries >> np.uint64(63)).sum()) * page, huge


@pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="reads the mapping's resident memory from /proc")
def test_a_reserved_time_axis_is_address_space_until_rows_write_it_and_goes_back_when_they_leave(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """2,048 slots reserved for 4 rows of 2 heads (4 MB a layer's keys): 10 steps make a page of each (row, head)
    resident, no huge pages, and no step copies a row into a longer buffer. A 600-step row that leaves gives its pages
    back; what the rows that stay wrote stays."""
    monkeypatch.undo()  # the buffers' unwritten slots as they come (tests/conftest.py would fill them with NaN)
    cache = DecoderCache(n_layers=1, n_heads=2, head_dim=64, reserve=2048)
    source = np.ones((1, 1, 2, 5, 64), np.float32)  # (L, b, H, S, Dh)
    cache.add(source, source, np.ones((1, 5), np.bool_))
    for t in range(600):
        append(cache, np.full((1, 1, 2, 64), t, np.float32), np.full((1, 1, 2, 64), t, np.float32))
    three = np.ones((1, 3, 2, 5, 64), np.float32)
    cache.add(three, three, np.ones((3, 5), np.bool_))
    buffer = cache.self_keys[0]
    for t in range(10):
        append(cache, np.full((1, 4, 2, 64), 1000 + t, np.float32), np.zeros((1, 4, 2, 64), np.float32))
    assert cache.capacity == 2048 and np.shares_memory(cache.self_keys[0], buffer)
    before, huge = resident(cache.self_keys[0])
    assert huge == 0 and before <= 2 * (610 * 64 * 4 + 6 * 4096)  # 2 heads of the long row's 610 slots, a page more
    cache.select(np.array([1, 2, 3]))  # the long row finished: 16 slots would do, a quarter of 611 written
    assert cache.lengths.tolist() == [10, 10, 10]
    after, huge = resident(cache.self_keys[0])
    assert after <= 6 * 4096 < before // 10  # a page for each (row, head) that stays
    assert (cache.self_keys[0][:3, :, :10, 0] == np.arange(1000, 1010)).all()  # what they wrote, kept
    assert (buffer[0, :, 16:610] == 0).all()  # the long row's slots past 16, given back, read as zeros


def test_a_small_reserved_buffer_comes_from_the_allocator_and_a_large_one_is_address_space() -> None:
    """A few rows' reserved buffers are the allocator's memory, reused from sentence to sentence without system calls
    or page faults; from LAZY_BYTES up (where numpy would ask for huge pages), private anonymous memory."""

    source = np.ones((1, 1, 2, 5, 64), np.float32)  # (L, b, H, S, Dh)
    small, large = (DecoderCache(n_layers=1, n_heads=2, head_dim=64, reserve=reserve) for reserve in (2048, 8192))
    for cache in (small, large):  # one row: 2 heads x 2,048 slots x 64 x 4 bytes = 1 MB; of 8,192 slots, 4 MB
        cache.add(source, source, np.ones((1, 5), np.bool_))
        append(cache, np.ones((1, 1, 2, 64), np.float32), np.ones((1, 1, 2, 64), np.float32))
    assert small.self_keys[0].nbytes < kv_cache.LAZY_BYTES <= large.self_keys[0].nbytes
    assert kv_cache.mapping(small.self_keys[0]) is None and kv_cache.mapping(large.self_keys[0]) is not None
    assert small.capacity == 2048 and large.capacity == 8192


class DeviceMemory:
    """numpy standing in for CuPy: a cache given it takes itself to be in GPU memory (`on_gpu`, `stacked`), and each
    host array it sends there (`asarray`) is counted."""

    zeros, empty = staticmethod(np.zeros), staticmethod(np.empty)

    def __init__(self) -> None:
        self.sent: list[tuple[int, ...]] = []

    def asarray(self, array: np.ndarray) -> np.ndarray:
        self.sent.append(np.shape(array))
        return np.array(array)  # a copy, as a transfer to the GPU is


def test_a_stacked_cache_keeps_every_row_as_a_cache_of_layers_does_through_joins_beams_and_leaves() -> None:
    """Layers as views of one array per buffer (a GPU cache's layout) against arrays of their own, through the
    same random operations; the views stay contiguous and the stacks' own, through every resize."""
    caches = [DecoderCache(n_layers=2, n_heads=3, head_dim=4, stacked=s) for s in (False, True)]
    layered, stacked_cache = caches
    agree_through_random_ops(caches)
    assert not layered.stacked and stacked_cache.stacked and not stacked_cache.reserved
    assert max(layered.lengths) > MIN_CAPACITY  # the time axis grew
    for name in ("self_keys", "self_values", "cross_keys", "cross_values"):
        stack = stacked_cache._stacks[name]  # (L, R, H, T, Dh)
        for i, live in enumerate(getattr(stacked_cache, name)):  # (B or N, H, T or S, Dh) each
            assert live.flags.c_contiguous and np.shares_memory(live, stack[i])


@pytest.mark.parametrize("seed", [0, 2, 3])  # whose random operations leave a sentence of several rows
def test_a_cache_in_gpu_memory_stacks_its_layers_and_sends_a_reorders_rows_once(seed: int) -> None:
    """In GPU memory (numpy standing in for CuPy) the cache is stacked; a reorder of beams sends its rows to the GPU
    once for both self-attention buffers (it was once per buffer, parents and targets apart: 4 copies of ~80 us a
    beam step on an H200's host) and gives every row its parent's slots, as the host cache does."""
    device = DeviceMemory()
    gpu = DecoderCache(n_layers=2, n_heads=3, head_dim=4, xp=device)  # type: ignore[arg-type]
    host = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    assert gpu.on_gpu and gpu.stacked and not host.stacked
    agree_through_random_ops([host, gpu], seed=seed, ops=60)
    sentence = host.sentence  # (B,)
    last = {s: row for row, s in enumerate(sentence.tolist())}
    beams = np.array([last[s] for s in sentence.tolist()])  # (B,) every beam follows its sentence's last one
    moved = np.flatnonzero(beams != np.arange(host.rows))
    device.sent.clear()
    for cache in (host, gpu):
        cache.select(beams)
    assert moved.size and device.sent == [(2, moved.size)]
    for row, length in enumerate(host.lengths.tolist()):
        for name in ("self_keys", "self_values"):
            written = [np.stack([layer[row, :, :length] for layer in getattr(c, name)]) for c in (host, gpu)]
            assert np.array_equal(*written), (row, name)


def prefix_value(uid: int, tokens: tuple[int, ...]) -> float:
    """What a step graph writes at a slot: a function of the sentence and of the input tokens up to that slot."""
    return float(hash((uid, *tokens)) % 100_003)


@pytest.mark.parametrize("seed", range(4))
def test_beams_that_share_a_prefix_copy_only_what_follows_it(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """A row's keys and values at a slot depend on its sentence and its input tokens up to that slot. Through random
    joins, steps (tokens from a small alphabet, so beams share prefixes), beams taking their siblings' rows and
    sentences leaving, every row holds at every slot it wrote what its own prefix computed, while the reorders copy
    fewer slots than whole rows would."""
    monkeypatch.setattr(kv_cache, "SHARE_BYTES", 0)  # look for shared slots at any size
    copied, whole = [], []
    groups = kv_cache.start_groups

    def counted(targets: np.ndarray, parents: np.ndarray, starts: np.ndarray, width: int) -> list:
        copied.append(int((width - starts).sum()))
        whole.append(targets.size * width)
        return groups(targets, parents, starts, width)

    monkeypatch.setattr(kv_cache, "start_groups", counted)
    rng = np.random.default_rng(seed)
    cache = DecoderCache(n_layers=2, n_heads=3, head_dim=4)
    rows: list[tuple[int, tuple[int, ...]]] = []  # each row's sentence and inputs so far
    uid = 0
    for _ in range(120):
        roll = rng.random()
        if not rows or roll < 0.1:  # a sentence joins with one row
            keys, values, mask = memory(1, int(rng.integers(2, 6)), 0.0)
            cache.add(keys, values, mask)
            rows.append((uid, ()))
            uid += 1
        elif roll < 0.5:  # beams: rows repeat, reorder within their sentences, or leave with their sentence
            sentences = sorted({u for u, _ in rows})
            leaving = set(rng.choice(sentences, int(rng.random() < 0.2), replace=False).tolist())
            new = []
            for u in sentences:
                if u in leaving and len(sentences) > 1:
                    continue
                mine = [r for r, (v, _) in enumerate(rows) if v == u]
                new += rng.choice(mine, int(rng.integers(1, 5)), replace=True).tolist()  # any order
            cache.select(np.array(new))
            rows = [rows[r] for r in new]
        else:  # a step: each row's input token written at its slot
            tokens = rng.integers(2, 4, len(rows))  # (B,)
            cache.make_room()
            for row, ((u, seen), token) in enumerate(zip(rows, tokens.tolist(), strict=True)):
                for layers in (cache.self_keys, cache.self_values):
                    for layer in layers:
                        layer[row, :, cache.lengths[row]] = prefix_value(u, (*seen, token))
                rows[row] = (u, (*seen, token))
            cache.advance(tokens)
        for row, (u, seen) in enumerate(rows):
            assert cache.lengths[row] == len(seen)
            assert not seen or cache._tokens[row, : len(seen)].tolist() == list(seen)  # the record follows the row
            expected = [prefix_value(u, seen[: slot + 1]) for slot in range(len(seen))]
            for layers in (cache.self_keys, cache.self_values):
                for layer in layers:
                    assert (layer[row, :, : len(seen)] == np.array(expected)[None, :, None]).all(), (row, seen)
    assert sum(whole) and sum(copied) < sum(whole)  # some rows kept slots they shared
