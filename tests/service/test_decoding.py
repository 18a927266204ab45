"""Greedy and beam search against brute force over a tiny vocabulary and a fake next-token model."""

import itertools

import numpy as np
import pytest

from service.engine.batches import (
    TokenRules,
    advance_all,
    advance_each,
    advance_greedy,
    candidates_needed,
    decode_batches,
    last_tokens,
    log_softmax_needed,
    longest_first,
    place,
)
from service.engine.decoding import BeamSearch, GreedySearch, SearchOptions, candidates, new_search, stay_in_parent_rows
from tests.fakes import EOS as FAKE_EOS
from tests.fakes import PAD as FAKE_PAD
from tests.fakes import START as FAKE_START
from tests.fakes import FakeRuntime, top_k

VOCAB, EOS, START = 5, 0, 4
TOP = VOCAB - 1  # every allowed token is a candidate: searches see what a full distribution would give


def next_log_probs(prefix: tuple[int, ...]) -> np.ndarray:
    """A fixed random distribution per prefix (the fake model); START is never generated."""
    rng = np.random.default_rng(hash(prefix) % (2**32))
    logits = rng.normal(scale=2.0, size=VOCAB)
    logits[START] = -np.inf
    return logits - np.logaddexp.reduce(logits)


def run(search: GreedySearch | BeamSearch) -> None:
    prefixes: list[tuple[int, ...]] = [()]
    while not search.done:
        log_probs = np.stack([next_log_probs(p) for p in prefixes])  # (rows, V)
        parents = search.advance(*top_k(log_probs, TOP, banned=(START,)))
        if isinstance(search, BeamSearch):
            prefixes = [tuple(int(t) for t in seq) for seq in search.sequences] if not search.done else []
        else:
            prefixes = [tuple(search.tokens)] * len(parents)


def brute_force(max_len: int, length_penalty: float) -> list[tuple[float, tuple[int, ...]]]:
    """Every complete hypothesis (ends in EOS, or reaches max_len), scored, best first."""
    found = []
    for length in range(1, max_len + 1):
        for seq in itertools.product(range(VOCAB), repeat=length):
            if START in seq or EOS in seq[:-1] or (seq[-1] != EOS and length < max_len):
                continue
            log_prob = sum(next_log_probs(seq[:i])[seq[i]] for i in range(length))
            found.append((log_prob / length**length_penalty, seq))
    return sorted(found, reverse=True)


def test_greedy_follows_the_argmax() -> None:
    search = GreedySearch(START, EOS, SearchOptions(max_new_tokens=6))
    run(search)
    expected: list[int] = []
    while len(expected) < 6 and (not expected or expected[-1] != EOS):
        expected.append(int(next_log_probs(tuple(expected)).argmax()))
    assert list(search.results()[0].tokens) == expected


@pytest.mark.parametrize("max_len", [3, 4])
def test_wide_beam_equals_exhaustive_search(max_len: int) -> None:
    """Without length normalisation, a beam as wide as the space finds the exact n best."""
    options = SearchOptions(beam_size=VOCAB**max_len, max_new_tokens=max_len, length_penalty=0.0, n_best=5)
    search = BeamSearch(START, EOS, options)
    run(search)
    expected = brute_force(max_len, 0.0)[:5]
    got = [(h.score, h.tokens) for h in search.results()]
    assert [seq for _, seq in got] == [seq for _, seq in expected]
    assert [s for s, _ in got] == pytest.approx([s for s, _ in expected])


@pytest.mark.parametrize("length_penalty", [0.0, 1.0, 2.0])
def test_beam_returns_sorted_valid_hypotheses(length_penalty: float) -> None:
    options = SearchOptions(beam_size=3, max_new_tokens=6, length_penalty=length_penalty, n_best=3)
    search = BeamSearch(START, EOS, options)
    run(search)
    results = search.results()
    assert len(results) == 3
    assert [h.score for h in results] == sorted((h.score for h in results), reverse=True)
    all_scores = dict((seq, s) for s, seq in brute_force(6, length_penalty))
    for h in results:
        assert h.score == pytest.approx(all_scores[h.tokens])  # scored as brute force scores it
        assert h.score == pytest.approx(h.log_prob / len(h.tokens) ** length_penalty)


def test_beam_is_at_least_as_good_as_greedy() -> None:
    greedy, beam = new_search(START, EOS, SearchOptions()), new_search(START, EOS, SearchOptions(beam_size=4))
    run(greedy)
    run(beam)
    assert beam.results()[0].score >= greedy.results()[0].score - 1e-12


@pytest.mark.parametrize("beam_size", [1, 3])
def test_min_new_tokens_forbids_an_early_eos(beam_size: int) -> None:
    options = SearchOptions(beam_size=beam_size, max_new_tokens=7, min_new_tokens=7)
    search = new_search(START, EOS, options)
    run(search)
    assert all(len(h.tokens) == 7 and EOS not in h.tokens for h in search.results())


def test_new_beams_stay_in_their_parents_rows_where_they_can() -> None:
    assert stay_in_parent_rows([0, 0, 1, 2]) == [0, 2, 3, 1]  # one row copied, not three
    assert stay_in_parent_rows([3, 2, 1, 0]) == [3, 2, 1, 0]  # nothing copied
    assert stay_in_parent_rows([1, 1, 1, 1]) == [1, 0, 2, 3]
    search = BeamSearch(start_id=0, eos_id=1, options=SearchOptions(beam_size=4))
    search.sequences, search.scores, search.ranked = [(5,), (6,), (7,), (8,)], [0.0] * 4, [0, 1, 2, 3]
    log_probs = np.full((4, 9), -9.0)  # (rows, K) best first per row; ids 10 + row * 10 + rank
    log_probs[0, :2], log_probs[1, 0], log_probs[2, 0] = [-0.1, -0.2], -0.3, -0.4
    ids = 10 + 10 * np.arange(4)[:, None] + np.arange(9)[None, :]
    parents = search.advance(np.sort(log_probs, axis=1)[:, ::-1], ids)
    assert parents.tolist() == [0, 1, 2, 0]  # rows 0-2 continue in place; the second child of row 0 takes row 3
    assert search.sequences == [(5, 10), (6, 20), (7, 30), (5, 11)]
    assert search.ranked == [0, 3, 1, 2]  # best first: -0.1 (row 0), -0.2 (row 3), -0.3, -0.4


def test_greedy_rows_advance_at_once_as_one_at_a_time() -> None:
    """`advance_all`'s path for greedy rows (one conversion, `place` in array operations) against the general
    one, search by search: same tokens, scores, finished searches and cache rows, through EOS bans and finishes."""
    rng = np.random.default_rng(3)
    options = [SearchOptions(max_new_tokens=int(n), min_new_tokens=int(m) % 5) for n, m in rng.integers(1, 16, (12, 2))]
    fast, slow = ([GreedySearch(START, EOS, o) for o in options] for _ in range(2))
    calm = 0  # steps in which no search finished
    while fast:
        assert last_tokens(fast).tolist() == np.concatenate([s.last_tokens() for s in slow]).tolist()
        log_probs = np.log(rng.dirichlet(np.ones(VOCAB), len(fast)))  # (B, V)
        log_probs[rng.random(len(fast)) < 0.05, EOS] = 0.0  # EOS best in some rows
        candidates = top_k(log_probs, TOP, banned=(START,))
        order, rows = advance_greedy(fast, *candidates)
        order_each, rows_each = advance_each(slow, *candidates)
        if rows is None:  # every row stays
            assert order == list(range(len(fast))) and rows_each.tolist() == order
        else:
            assert (order, rows.tolist()) == (order_each, rows_each.tolist())
        assert [(s.tokens, s.log_prob, s.done) for s in fast] == [(s.tokens, s.log_prob, s.done) for s in slow]
        calm += len(order) == len(fast)
        fast, slow = [fast[i] for i in order], [slow[i] for i in order]
    assert calm > 0
    mixed = [[new_search(START, EOS, SearchOptions(beam_size=b)) for b in (1, 2, 1)] for _ in range(2)]
    for _ in range(3):  # a beam search among them: all take the general path
        candidates = top_k(np.log(rng.dirichlet(np.ones(VOCAB), sum(s.rows for s in mixed[0]))), TOP, banned=(START,))
        (order, rows), (order2, rows2) = advance_all(mixed[0], *candidates), advance_each(mixed[1], *candidates)
        assert order == order2 and rows.tolist() == rows2.tolist()
        mixed = [[m[i] for i in order] for m in mixed]


@pytest.mark.parametrize("beam_size", [1, 3])
def test_one_search_advances_as_place_would_place_its_rows(beam_size: int) -> None:
    """`advance_each` of a single search (an interactive request decoded alone) skips `place`: its block is every
    row. The order and rows are what `place` gives, step after step, until the search finishes."""
    rng = np.random.default_rng(beam_size)
    options = SearchOptions(beam_size=beam_size, max_new_tokens=6, min_new_tokens=2)
    alone, placed = new_search(START, EOS, options), new_search(START, EOS, options)
    while not alone.done:
        rows = alone.rows
        candidates = top_k(np.log(rng.dirichlet(np.ones(VOCAB), rows)), TOP, banned=(START,))
        order, kept = advance_each([alone], *candidates)
        expected = place([placed.advance(*candidates)], [0, rows])
        assert (order, kept.tolist()) == (expected[0], expected[1].tolist())
        assert alone.results() == placed.results() and alone.done == placed.done
    assert order == [] and alone.results()


def test_each_search_asks_the_step_for_the_candidates_it_takes() -> None:
    """Greedy takes a row's best two (the second for an EOS not allowed yet); beam k the best 2k of all its rows,
    and one more for an EOS not allowed yet. A step gives a batch what its neediest search takes."""
    assert [candidates(SearchOptions(beam_size=k)) for k in (1, 2, 4, 8)] == [2, 5, 9, 17]
    greedy = [new_search(START, EOS, SearchOptions()) for _ in range(3)]
    assert candidates_needed(greedy) == 2
    assert candidates_needed([*greedy, new_search(START, EOS, SearchOptions(beam_size=3))]) == 7


def test_a_step_normalises_only_for_searches_that_read_log_probs() -> None:
    """Beams rank by their candidates' log-probs, a greedy search sums them only when scored: a step of greedy rows
    that asked no scores may skip the log-softmax, one with any other search may not. A greedy search not scored
    reports NaN, whatever its steps gave it."""
    unscored = [new_search(START, EOS, SearchOptions(scored=False)) for _ in range(3)]
    assert not log_softmax_needed(unscored)
    assert log_softmax_needed([*unscored, new_search(START, EOS, SearchOptions())])
    assert log_softmax_needed([*unscored, new_search(START, EOS, SearchOptions(beam_size=2, scored=False))])
    run(unscored[0])
    hypothesis = unscored[0].results()[0]
    assert np.isnan(hypothesis.log_prob) and np.isnan(hypothesis.score) and hypothesis.tokens


def test_streams_take_the_costliest_batches_first_and_give_every_batch_its_own_results_in_order() -> None:
    """Rows times the longest source orders the batches, the costliest first (ties in their order); two streams
    give the results one stream gives, batch by batch in the batches' order."""
    rng = np.random.default_rng(3)
    lengths = [3, 3, 4, 9, 9, 12, 2]  # the longest source of each batch
    batches = [[list(rng.integers(3, 12, n)) for n in (length, 2)] for length in lengths]  # (2 rows each)
    batches.append([list(rng.integers(3, 12, 5))] * 5)  # 5 rows of 5: the costliest
    assert longest_first(batches) == [7, 5, 3, 4, 2, 0, 1, 6]
    assert longest_first([]) == []
    rules = TokenRules(FAKE_START, FAKE_EOS, FAKE_PAD)
    options = [[SearchOptions(beam, 12)] * len(b) for b, beam in zip(batches, [1, 2] * 4, strict=True)]
    one = list(decode_batches(FakeRuntime(), batches, options, rules, streams=1))
    two = list(decode_batches(FakeRuntime(), batches, options, rules, streams=2))
    assert [[h[0].tokens for h in results] for results in two] == [[h[0].tokens for h in results] for results in one]


def test_when_a_batch_fails_in_a_stream_its_error_is_raised_and_the_batches_not_begun_never_are() -> None:
    runtime = FakeRuntime()
    runtime.fail_next_encode = True  # the first batch to start: the costliest
    runtime.encode_seconds = 0.05  # the other stream's 11 batches take 0.55 s: the failure stops it well before
    batches = [[[5, 6, 7, 8, 9][: 5 - i]] * 2 for i in range(4)] * 3  # (12 batches, the costliest first)
    options = [[SearchOptions(1, 4)] * len(b) for b in batches]
    rules = TokenRules(FAKE_START, FAKE_EOS, FAKE_PAD)
    with pytest.raises(RuntimeError, match="injected encoder failure"):
        list(decode_batches(runtime, batches, options, rules, streams=2))
    assert len(runtime.encoder_calls) < len(batches) - 1  # (the failed call is not counted)
