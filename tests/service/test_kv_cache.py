import numpy as np
import pytest

from service import kv_cache
from service.kv_cache import MIN_CAPACITY, DecoderCache, fitted_capacity, group_rows, resized


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


def test_capacity_grows_by_a_quarter_in_whole_blocks() -> None:
    assert [fitted_capacity(n) for n in (1, 16, 17, 33, 65, 129, 200)] == [16, 32, 32, 48, 96, 176, 256]
    cache = DecoderCache(n_layers=1, n_heads=1, head_dim=2)
    cache.add(np.zeros((1, 1, 1, 3, 2), np.float32), np.zeros((1, 1, 1, 3, 2), np.float32), np.ones((1, 3), np.bool_))
    seen = []
    for t in range(100):
        append(cache, np.full((1, 1, 1, 2), t, np.float32), np.zeros((1, 1, 1, 2), np.float32))
        seen.append(cache.capacity)
    assert sorted(set(seen)) == [16, 32, 48, 64, 96, 128]
    assert stacked(cache.self_keys)[0, 0, 0, :100, 0].tolist() == list(range(100))  # every growth kept them


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
