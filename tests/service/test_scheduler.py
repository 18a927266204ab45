"""The scheduler with a fake runtime: joining and leaving, budgets, a full queue, deadlines,
cancellation, a failing batch, static mode; and a sentence's output never depends on its batch."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import replace

import numpy as np
import pytest

from service.engine.batches import TokenRules, decode_batch, place
from service.engine.decoding import SearchOptions
from service.engine.kv_cache import DecoderCache
from service.engine.runtime import Memory
from service.errors import DeadlineExceeded, InferenceError, Overloaded
from service.metrics import Metrics
from service.scheduling.encoder import EncoderThread
from service.scheduling.jobs import BatchLimits, SentenceJob, Ticket
from service.scheduling.scheduler import EARLY_QUEUE, Scheduler, Streams, new_scheduler
from tests.fakes import EOS, PAD, START, FakeRuntime, PatientRuntime

RULES = TokenRules(decoder_start_id=START, eos_id=EOS, pad_id=PAD)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def sources(n: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [list(rng.integers(3, 12, size=int(rng.integers(1, 9)))) + [EOS] for _ in range(n)]


def make(limits: BatchLimits | None = None) -> tuple[Scheduler, FakeRuntime, Clock]:
    runtime, clock = FakeRuntime(), Clock()
    return Scheduler(runtime, RULES, limits or BatchLimits(), Metrics(), "fake", clock=clock), runtime, clock


def submit(
    scheduler: Scheduler | Streams, srcs: list[list[int]], options: SearchOptions, deadline: float = 1e9
) -> Ticket:
    done: list[Ticket] = []
    ticket = Ticket(len(srcs), deadline, done.append)
    scheduler.submit([SentenceJob(s, options, ticket, i) for i, s in enumerate(srcs)])
    return ticket


def drain(scheduler: Scheduler, limit: int = 1000) -> None:
    for _ in range(limit):
        if scheduler.idle:
            return
        scheduler.run_once()
    raise AssertionError("scheduler did not drain")


def alone(src: list[int], options: SearchOptions) -> list:
    return decode_batch(FakeRuntime(), [src], [options], RULES)[0]


GREEDY, BEAM = SearchOptions(max_new_tokens=12), SearchOptions(beam_size=3, max_new_tokens=12, n_best=3)


def test_sentences_joining_a_running_batch_get_their_solo_results() -> None:
    scheduler, runtime, _ = make()
    srcs = sources(12)
    tickets = []
    for i, src in enumerate(srcs):  # a newcomer every iteration, mixing greedy and beam
        tickets.append(submit(scheduler, [src], BEAM if i % 3 == 0 else GREEDY))
        scheduler.run_once()
    drain(scheduler)
    assert max(runtime.step_rows) > 4  # they really shared steps
    for i, (src, ticket) in enumerate(zip(srcs, tickets, strict=True)):
        assert ticket.finished and ticket.error is None
        assert ticket.results[0] == alone(src, BEAM if i % 3 == 0 else GREEDY)


def test_row_limit_and_token_budget_bound_every_step() -> None:
    scheduler, runtime, _ = make(BatchLimits(max_rows=5, max_tokens=10_000))
    ticket = submit(scheduler, sources(9, seed=1), GREEDY)
    beams = submit(scheduler, sources(3, seed=2), BEAM)
    drain(scheduler)
    assert max(runtime.step_rows) <= 5 and ticket.finished and beams.finished
    scheduler, runtime, _ = make(BatchLimits(max_tokens=60))  # each sentence reserves source length + 12
    ticket = submit(scheduler, sources(8, seed=3), GREEDY)
    while not scheduler.idle:
        scheduler.run_once()
        assert sum(r.job.reserved_tokens for r in scheduler.active) <= 60
    assert max(runtime.step_rows) in (2, 3, 4) and ticket.finished


def test_encoder_runs_once_per_sentence_in_length_buckets() -> None:
    scheduler, runtime, _ = make()
    srcs = [[5] * 2 + [EOS], [6] * 3 + [EOS], [7] * 40 + [EOS], [8] * 45 + [EOS]]
    submit(scheduler, srcs, BEAM)
    drain(scheduler)
    assert sorted(runtime.encoder_calls) == [2, 2]  # short ones together, long ones together; never again


def test_full_queue_refuses_at_once() -> None:
    scheduler, _, _ = make(BatchLimits(max_queue=4))
    submit(scheduler, sources(3), GREEDY)
    with pytest.raises(Overloaded, match="the queue is full \\(3 of 4 sentences waiting\\)"):
        submit(scheduler, sources(2), GREEDY)
    assert len(scheduler.waiting) == 3  # all or nothing


def test_deadline_fails_the_request_and_drops_its_rows() -> None:
    scheduler, runtime, clock = make()
    late = submit(scheduler, sources(2, seed=4), SearchOptions(max_new_tokens=50), deadline=5.0)
    other = submit(scheduler, sources(2, seed=5), GREEDY)
    scheduler.run_once()
    clock.now = 6.0
    scheduler.run_once()
    assert isinstance(late.error, DeadlineExceeded)
    assert all(r.job.ticket is not late for r in scheduler.active)
    assert scheduler.cache.rows == sum(r.search.rows for r in scheduler.active)
    drain(scheduler)
    assert other.error is None and other.results == [alone(s, GREEDY) for s in sources(2, seed=5)]


def test_cancelled_request_stops_its_rows() -> None:
    scheduler, runtime, _ = make()
    gone = submit(scheduler, sources(4, seed=6), SearchOptions(beam_size=3, max_new_tokens=40))
    scheduler.run_once()
    gone.cancelled = True
    steps_before = runtime.steps
    scheduler.run_once()
    assert scheduler.idle and runtime.steps == steps_before  # nothing left to run
    assert scheduler.metrics.cancelled.labels("fake")._value.get() == 1


def test_a_failing_step_fails_only_its_batch() -> None:
    scheduler, runtime, _ = make()
    first = submit(scheduler, sources(3, seed=7), GREEDY)
    scheduler.run_once()
    runtime.fail_next_step = True
    scheduler.run_once()
    assert isinstance(first.error, InferenceError)
    after = submit(scheduler, sources(2, seed=8), GREEDY)
    drain(scheduler)
    assert after.error is None and after.results == [alone(s, GREEDY) for s in sources(2, seed=8)]


def test_a_failing_encoder_pass_fails_only_its_sentences() -> None:
    scheduler, runtime, _ = make()
    runtime.fail_next_encode = True
    broken = submit(scheduler, sources(1, seed=9), GREEDY)
    scheduler.run_once()
    fine = submit(scheduler, sources(1, seed=10), GREEDY)
    drain(scheduler)
    assert isinstance(broken.error, InferenceError) and fine.error is None


def test_static_mode_runs_each_batch_to_completion() -> None:
    scheduler, runtime, _ = make(BatchLimits(static=True))
    first = submit(scheduler, sources(3, seed=11), GREEDY)
    scheduler.run_once()
    second = submit(scheduler, sources(3, seed=12), GREEDY)
    while not first.finished:
        scheduler.run_once()
        assert not any(r.job.ticket is second for r in scheduler.active)
    drain(scheduler)
    assert second.results == [alone(s, GREEDY) for s in sources(3, seed=12)]


def test_fits_rejects_sentences_that_can_never_run() -> None:
    scheduler, _, _ = make(BatchLimits(max_rows=4, max_tokens=100))
    assert scheduler.fits(SearchOptions(beam_size=4, max_new_tokens=10), 10)
    assert not scheduler.fits(SearchOptions(beam_size=5, max_new_tokens=10), 10)
    assert not scheduler.fits(SearchOptions(beam_size=2, max_new_tokens=50), 10)


def rows(*values: int) -> np.ndarray:
    return np.array(values, np.int64)


def test_a_finished_sentence_is_replaced_by_the_last_one_not_by_shifting_all() -> None:
    order, kept = place([rows(0), rows(), rows(2), rows(3), rows(4)], [0, 1, 2, 3, 4, 5])
    assert order == [0, 4, 2, 3] and kept.tolist() == [0, 4, 2, 3]  # one row moves, into the hole
    order, kept = place([rows(1, 0, 2, 3), rows(), rows(9, 8, 10, 11)], [0, 4, 8, 12])  # beams of 4
    assert order == [0, 2] and kept.tolist() == [1, 0, 2, 3, 9, 8, 10, 11]


def test_blocks_that_grow_or_do_not_fit_keep_the_searches_order() -> None:
    order, kept = place([rows(0, 0, 0, 0), rows(1), rows(2, 2, 2, 2)], [0, 1, 2, 3])  # first beam steps
    assert order == [0, 1, 2] and kept.tolist() == [0, 0, 0, 0, 1, 2, 2, 2, 2]
    order, kept = place([rows(), rows(), rows()], [0, 1, 2, 3])
    assert order == [] and kept.size == 0


def stage_seconds(scheduler: Scheduler, metric: str) -> tuple[float, float]:
    """(count, sum) of one of the scheduler's per-sentence histograms."""
    registry = scheduler.metrics.registry
    labels = {"model": "fake"}
    return registry.get_sample_value(f"{metric}_count", labels), registry.get_sample_value(f"{metric}_sum", labels)


def test_each_sentence_reports_its_wait_to_join_and_its_time_in_the_batch() -> None:
    scheduler, _, clock = make()
    first = submit(scheduler, sources(1, seed=4), LONG)  # queued at 0
    clock.now = 2.0
    scheduler.run_once()  # admitted, encoded and joined at 2 (no encoder thread), then its first step
    second = submit(scheduler, sources(1, seed=5), GREEDY)  # queued at 2, joins at the next iteration
    for step in range(1, 29):
        clock.now = 2.0 + step  # each later iteration (a step) one second on
        scheduler.run_once()
    clock.now = 31.0
    drain(scheduler)  # the first's 30th and last step
    assert first.finished and second.finished
    assert stage_seconds(scheduler, "mt_queue_wait_seconds") == (2, 2.0 + 1.0)
    assert stage_seconds(scheduler, "mt_join_wait_seconds") == (2, 0.0)  # passes between steps: no wait
    second_steps = len(second.results[0][0].tokens)
    assert stage_seconds(scheduler, "mt_decoding_seconds") == (2, 29.0 + second_steps - 1)  # first step to last


class GatedRuntime(FakeRuntime):
    """A fake whose encoder passes wait for a gate, and which records the thread each pass ran on."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.encoder_threads: list[str] = []

    def encode(self, src_ids: np.ndarray, src_mask: np.ndarray) -> Memory:
        self.encoder_threads.append(threading.current_thread().name)
        assert self.gate.wait(timeout=10)
        return super().encode(src_ids, src_mask)


def overlapping(max_rows: int = 64) -> tuple[Scheduler, GatedRuntime]:
    runtime = GatedRuntime()
    limits = BatchLimits(max_rows=max_rows, overlap_encoder=True)
    return Scheduler(runtime, RULES, limits, Metrics(), "fake", clock=Clock()), runtime


LONG = SearchOptions(max_new_tokens=30, min_new_tokens=30)


def test_decoder_steps_go_on_while_newcomers_are_encoded_on_their_own_thread() -> None:
    scheduler, runtime = overlapping(max_rows=2)
    first = submit(scheduler, sources(1, seed=13), LONG)
    scheduler.run_once()  # nothing running yet: the worker waits for the pass, then steps
    assert runtime.steps == 1 and len(scheduler.active) == 1
    runtime.gate.clear()
    second = submit(scheduler, sources(1, seed=14), GREEDY)
    third = submit(scheduler, sources(1, seed=15), GREEDY)
    for _ in range(3):
        scheduler.run_once()
    assert runtime.steps == 4 and [r.job.ticket for r in scheduler.active] == [first]  # stepping, not waiting
    assert [e.jobs[0].ticket for e in scheduler.encoding] == [second]  # in flight, counted against the rows:
    assert [j.ticket for j in scheduler.waiting] == [third]  # the third waits for room
    runtime.gate.set()
    drain(scheduler)
    for ticket, seed, options in ((first, 13, LONG), (second, 14, GREEDY), (third, 15, GREEDY)):
        assert ticket.error is None and ticket.results == [alone(s, options) for s in sources(1, seed=seed)]
    worker, *beside = runtime.encoder_threads  # the first pass while no row ran: on the worker's own thread
    assert worker == threading.current_thread().name and beside
    assert all(name.startswith("encoder-fake") for name in beside)  # the newcomers' beside running rows
    assert stage_seconds(scheduler, "mt_join_wait_seconds")[0] == 3  # observed on the passes' thread's side too


def test_an_idle_worker_encodes_a_lone_bucket_itself_and_hands_several_to_the_encoder_thread() -> None:
    """Nothing running and nothing in flight: handing one bucket's pass to the encoder thread would only make the
    worker wait for it (the default model at one client: 0.93x the speed), so the worker runs it; buckets that the
    thread can merge still go there. Newcomers queued beside running rows are encoded early, on the thread."""
    scheduler, runtime = overlapping()
    lone = submit(scheduler, [[3, 4, 5, EOS], [6, 7, 8, EOS]], GREEDY)  # one bucket, queued to an idle worker
    assert runtime.encoder_calls == []  # no early pass
    drain(scheduler)
    assert runtime.encoder_threads == [threading.current_thread().name] and runtime.encoder_calls == [2]
    assert lone.results == [alone([3, 4, 5, EOS], GREEDY), alone([6, 7, 8, EOS], GREEDY)]
    runtime.encoder_threads.clear()
    apart = submit(scheduler, [[3, 4, EOS], [3] * 12 + [EOS]], GREEDY)  # two buckets: lengths 3 and 13
    drain(scheduler)
    assert len(runtime.encoder_threads) >= 1 and all(n.startswith("encoder-fake") for n in runtime.encoder_threads)
    assert apart.results == [alone([3, 4, EOS], GREEDY), alone([3] * 12 + [EOS], GREEDY)]


def _queue_behind_a_held_pass(scheduler: Scheduler, runtime: GatedRuntime) -> list[tuple[Ticket, list[list[int]]]]:
    """A long sentence stepping; then a pass held at the gate on the encoder thread, and two more requests' buckets
    (of similar lengths) queued behind it, each handed over in an iteration of its own."""
    scheduler.run_once()  # the long one: encoded (the gate is open), joined, its first step
    runtime.gate.clear()
    held = [[5, 6, 7, EOS]]
    requests = [(submit(scheduler, held, GREEDY), held)]
    scheduler.run_once()  # the held pass starts on the encoder thread and waits at the gate
    deadline = time.monotonic() + 10
    while len(runtime.encoder_threads) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    for srcs in ([[3, 9, 4, EOS], [8, 3, 5, 6, EOS]], [[7, 7, 4, EOS]]):  # two buckets, one iteration each
        requests.append((submit(scheduler, srcs, GREEDY), srcs))
        scheduler.run_once()
    assert runtime.encoder_calls == [1]  # the held pass has not returned: the two buckets wait in its queue
    return requests


def test_buckets_queued_behind_an_encoder_pass_are_merged_into_one_pass_with_their_solo_results() -> None:
    scheduler, runtime = overlapping()
    first = submit(scheduler, [[3, 4, 5, 6, EOS]], LONG)
    requests = _queue_behind_a_held_pass(scheduler, runtime)
    runtime.gate.set()
    drain(scheduler)
    assert runtime.encoder_calls == [1, 1, 3]  # the long one, the held one, the two queued buckets in one pass
    assert first.results == [alone([3, 4, 5, 6, EOS], LONG)]
    for ticket, srcs in requests:
        assert ticket.error is None and ticket.results == [alone(src, GREEDY) for src in srcs]


def test_a_failure_in_the_encoder_threads_own_bookkeeping_fails_its_buckets_and_the_thread_serves_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scheduler, runtime = overlapping()
    merged, calls = EncoderThread._merged, []

    def failing_once(thread: EncoderThread, taken: list) -> list:
        calls.append(len(taken))
        if len(calls) == 1:
            raise RuntimeError("injected failure merging the queue")
        return merged(thread, taken)

    monkeypatch.setattr(EncoderThread, "_merged", failing_once)
    first = submit(scheduler, [[3, 4, 5, 6, EOS]], LONG)
    scheduler.run_once()  # encoded by the idle worker itself, then stepping: newcomers' passes go to the thread
    failed = submit(scheduler, [[3, 4, 5, EOS]], GREEDY)
    [job] = scheduler.waiting
    deadline = time.monotonic() + 10
    while not job.early.memory.done() and time.monotonic() < deadline:  # its early pass, failed by the thread
        time.sleep(0.001)
    for _ in range(10):
        scheduler.run_once()  # (the worker waits for nothing: `first` steps on)
        if failed.error is not None:
            break
    assert isinstance(failed.error, InferenceError) and scheduler.active
    after = submit(scheduler, [[4, 4, 4, EOS]], GREEDY)
    drain(scheduler)
    assert after.error is None and after.results == [alone([4, 4, 4, EOS], GREEDY)]
    assert first.error is None and calls == [1, 1]


def test_the_encoder_thread_merges_buckets_of_similar_length_up_to_a_size_and_keeps_their_queue_order() -> None:
    thread = EncoderThread(FakeRuntime().encode, PAD, 1.5, "encoder-test")
    lengths = [[30], [4, 5], [5], [31, 40], [6], *[[4] * 7] * 2]  # each a bucket's source lengths, in queue order
    taken = [([[3] * n for n in bucket], Future()) for bucket in lengths]
    passes = [[[len(s) for s in sources] for sources, _ in group] for group in thread._merged(taken)]
    # taken shortest first: the short ones (4-6 tokens) merge up to 16 sentences, the rest in a pass of their own,
    # the long ones (30-40) apart; the passes run in the order of their first bucket in the queue
    assert passes == [[[30], [31, 40]], [[4, 5], [4] * 7, [4] * 7], [[5], [6]]]


def test_a_merged_encoder_pass_that_fails_fails_each_of_its_buckets_and_the_worker_serves_on() -> None:
    class FailingMerges(GatedRuntime):
        def encode(self, src_ids: np.ndarray, src_mask: np.ndarray) -> Memory:
            memory = super().encode(src_ids, src_mask)
            if len(src_ids) == 3:
                raise RuntimeError("injected failure of the merged pass")
            return memory

    runtime = FailingMerges()
    scheduler = Scheduler(runtime, RULES, BatchLimits(overlap_encoder=True), Metrics(), "fake", clock=Clock())
    first = submit(scheduler, [[3, 4, 5, 6, EOS]], LONG)
    (held, held_srcs), *merged = _queue_behind_a_held_pass(scheduler, runtime)
    runtime.gate.set()
    drain(scheduler)
    assert runtime.encoder_calls == [1, 1, 3]
    assert all(isinstance(ticket.error, InferenceError) for ticket, _ in merged)
    assert first.error is None and held.error is None and held.results == [alone(held_srcs[0], GREEDY)]
    after = submit(scheduler, [[4, 4, 4, EOS]], GREEDY)
    drain(scheduler)
    assert after.error is None and after.results == [alone([4, 4, 4, EOS], GREEDY)]


def _encoded_by_the_thread(runtime: GatedRuntime, sentences: int) -> None:
    deadline = time.monotonic() + 10
    while sum(runtime.encoder_calls) < sentences and time.monotonic() < deadline:
        time.sleep(0.001)


def test_a_short_queues_newcomers_are_encoded_as_they_are_queued_and_the_worker_takes_those_passes() -> None:
    scheduler, runtime = overlapping()
    first = submit(scheduler, [[3, 4, 5, 6, EOS]], LONG)
    scheduler.run_once()  # encoded by the idle worker, then stepping
    ticket = submit(scheduler, [[3, 4, 5, EOS], [6, 7, 8, 9, EOS]], GREEDY)  # one bucket, beside a running row
    _encoded_by_the_thread(runtime, 1 + 2)
    assert runtime.encoder_calls == [1, 2] and scheduler.encoding == []  # before the worker's next iteration
    drain(scheduler)
    assert runtime.encoder_calls == [1, 2]  # admitted whole: its early pass was taken, not run again
    assert first.error is None
    assert ticket.results == [alone([3, 4, 5, EOS], GREEDY), alone([6, 7, 8, 9, EOS], GREEDY)]
    assert all(job.early is None for job in scheduler.waiting)


def test_a_bucket_admitted_in_parts_is_encoded_again_and_a_long_queue_waits_for_admission() -> None:
    scheduler, runtime = overlapping(max_rows=1)
    submit(scheduler, [[3, 4, 5, 6, EOS]], LONG)
    scheduler.run_once()  # its one row taken: the next wait, their early passes beside it
    ticket = submit(scheduler, [[3, 4, 5, EOS], [6, 7, 8, 9, EOS]], GREEDY)  # one bucket, one row at a time
    _encoded_by_the_thread(runtime, 1 + 2)
    drain(scheduler)
    assert runtime.encoder_calls == [1, 2, 1, 1]  # the early pass unused: each sentence encoded as it was admitted
    assert ticket.results == [alone([3, 4, 5, EOS], GREEDY), alone([6, 7, 8, 9, EOS], GREEDY)]
    assert scheduler.metrics.input_tokens.labels("fake")._value.get() == 5 + 4 + 5  # each sentence's tokens once
    submit(scheduler, [[3, 4, 5, 6, EOS]], LONG)
    scheduler.run_once()
    runtime.encoder_calls.clear()
    tickets = [submit(scheduler, [[3 + i, 4, 5, EOS]], GREEDY) for i in range(EARLY_QUEUE + 2)]
    _encoded_by_the_thread(runtime, EARLY_QUEUE)
    time.sleep(0.05)
    assert sum(runtime.encoder_calls) == EARLY_QUEUE  # the ones past a short queue wait to be admitted
    drain(scheduler)
    assert all(t.results == [alone([3 + i, 4, 5, EOS], GREEDY)] for i, t in enumerate(tickets))


def _stepping_with_a_held_pass(max_rows: int) -> tuple[Scheduler, GatedRuntime, Ticket, Ticket]:
    """A long sentence stepping (so the worker never waits for a pass), then a request whose early pass the encoder
    thread has started and holds at the closed gate: what is queued next waits in the thread's queue."""
    scheduler, runtime = overlapping(max_rows)
    first = submit(scheduler, [[3, 4, 5, 6, EOS]], LONG)
    scheduler.run_once()  # encoded (the gate is open), joined, stepping
    runtime.gate.clear()
    held = submit(scheduler, [[5, 6, 7, EOS]], GREEDY)  # a short queue: its early pass starts at once
    deadline = time.monotonic() + 10
    while len(runtime.encoder_threads) < 2 and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(runtime.encoder_threads) == 2 and runtime.encoder_calls == [1]
    return scheduler, runtime, first, held


def test_an_early_pass_whose_bucket_is_admitted_in_parts_is_cancelled_before_it_runs() -> None:
    scheduler, runtime, first, held = _stepping_with_a_held_pass(max_rows=3)
    srcs = [[3, 9, 4, EOS], [8, 3, 5, 6, EOS]]
    split = submit(scheduler, srcs, GREEDY)  # one bucket: its early pass queued behind the held one
    scheduler.run_once()  # admits the held one and the bucket's first sentence (3 rows): the bucket is split
    assert [len(e.jobs) for e in scheduler.encoding] == [1, 1] and len(scheduler.waiting) == 1
    runtime.gate.set()
    drain(scheduler)
    # the long one, the held one, the bucket's first sentence alone (its bucket's early pass, cancelled, is not
    # merged into that pass), then its second sentence (merged with the first's pass when the worker admits it
    # before the encoder thread reaches that pass: [1, 1, 2], a race either way is right); before, the unused early
    # pass ran: [1, 1, 3, 1]
    assert runtime.encoder_calls in ([1, 1, 1, 1], [1, 1, 2])
    assert split.results == [alone(s, GREEDY) for s in srcs]
    assert first.error is None and held.results == [alone([5, 6, 7, EOS], GREEDY)]


def test_a_cancelled_requests_early_pass_is_skipped_when_it_has_not_started() -> None:
    scheduler, runtime, first, held = _stepping_with_a_held_pass(max_rows=64)
    gone = submit(scheduler, [[3, 9, 4, EOS], [8, 3, 5, 6, EOS]], GREEDY)  # queued behind the held pass
    kept = submit(scheduler, [[7, 7, 4, EOS]], GREEDY)
    scheduler.cancel(gone)
    scheduler.run_once()  # the queue's scan drops the cancelled request; the others are admitted
    runtime.gate.set()
    drain(scheduler)
    # the long one, the held one, the one kept; the cancelled one's pass skipped (before: [1, 1, 3], merged)
    assert runtime.encoder_calls == [1, 1, 1]
    assert held.results == [alone([5, 6, 7, EOS], GREEDY)] and kept.results == [alone([7, 7, 4, EOS], GREEDY)]
    assert first.error is None and gone.results == [None, None]
    assert scheduler.metrics.cancelled.labels("fake")._value.get() == 1


def test_greedy_newcomers_take_finished_rows_places_and_get_their_solo_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    runtime = PatientRuntime()
    scheduler = runtime.scheduler = Scheduler(
        runtime, RULES, BatchLimits(overlap_encoder=True), Metrics(), "fake", clock=Clock()
    )
    refills, refill = [], DecoderCache.refill
    monkeypatch.setattr(
        DecoderCache,
        "refill",
        lambda cache, rows, room: refills.append((cache.rows, len(rows), room)) or refill(cache, rows, room),
    )
    srcs, tickets = sources(40, seed=21), []
    for i, src in enumerate(srcs):  # one or two newcomers an iteration while others finish
        tickets.append(submit(scheduler, [src], GREEDY))
        if i % 3 == 0:
            continue
        scheduler.run_once()
    drain(scheduler)
    for src, ticket in zip(srcs, tickets, strict=True):
        assert ticket.error is None and ticket.results == [alone(src, GREEDY)]
    assert any(room for _, _, room in refills)  # newcomers joined in finished rows' places ...
    assert any(room and kept + room == before for before, kept, room in refills)  # ... as many as finished


@pytest.mark.parametrize("overlap", [False, True])  # newcomers join before a step (add) or after one (refill)
def test_a_failing_join_fails_its_batch_and_its_newcomers_and_the_worker_serves_on(
    overlap: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache's bookkeeping failing as sentences join (a bug) fails the batch and the joining sentences with
    500s, none left waiting, and the worker serves the next requests as if nothing had happened."""
    runtime = PatientRuntime()
    scheduler = runtime.scheduler = Scheduler(
        runtime, RULES, BatchLimits(overlap_encoder=overlap), Metrics(), "fake", clock=Clock()
    )
    tickets = [submit(scheduler, [src], GREEDY) for src in sources(6, seed=31)]
    scheduler.run_once()  # the first six run a step
    add, calls = DecoderCache.add, []

    def failing_add(cache: DecoderCache, *args: np.ndarray, **kwargs: bool) -> np.ndarray:
        calls.append(cache.rows)
        if len(calls) == 1:
            raise RuntimeError("injected bookkeeping failure")
        return add(cache, *args, **kwargs)

    monkeypatch.setattr(DecoderCache, "add", failing_add)
    joining = submit(scheduler, sources(2, seed=32), GREEDY)
    for _ in range(40):
        if joining.finished:
            break
        scheduler.run_once()
    assert calls and isinstance(joining.error, InferenceError)
    failed = [t for t in tickets if t.error is not None]
    assert failed and all(isinstance(t.error, InferenceError) for t in failed)  # the batch it would have joined
    after = submit(scheduler, sources(3, seed=33), GREEDY)
    drain(scheduler)
    assert all(t.finished for t in tickets) and after.error is None
    assert after.results == [alone(s, GREEDY) for s in sources(3, seed=33)]


def test_an_overlapped_encoder_failure_fails_only_its_sentences() -> None:
    scheduler, runtime = overlapping()
    running = submit(scheduler, sources(1, seed=16), LONG)
    scheduler.run_once()
    runtime.fail_next_encode = True
    broken = submit(scheduler, sources(1, seed=17), GREEDY)
    drain(scheduler)
    assert isinstance(broken.error, InferenceError) and running.error is None
    assert running.results == [alone(s, LONG) for s in sources(1, seed=16)]


def test_stopping_fails_sentences_whose_pass_is_in_flight() -> None:
    scheduler, runtime = overlapping()
    running = submit(scheduler, sources(1, seed=18), LONG)
    scheduler.run_once()
    runtime.gate.clear()
    admitted = submit(scheduler, sources(1, seed=19), GREEDY)
    scheduler.run_once()
    assert scheduler.encoding and not scheduler.idle
    threading.Timer(0.2, runtime.gate.set).start()  # the pass ends while the scheduler stops
    scheduler.stop(timeout=0.05)
    for ticket in (running, admitted):
        assert isinstance(ticket.error, Overloaded) and "stopped" in str(ticket.error)


def test_steps_of_greedy_rows_that_ask_no_scores_skip_the_log_softmax() -> None:
    """Continuous batching asks each step to normalise only while a row reads log-probs: a scored greedy sentence or
    a beam. The unscored sentences translate as they would alone, their scores NaN."""
    scheduler, runtime, _ = make()
    unscored = replace(GREEDY, scored=False)
    first = submit(scheduler, sources(3, seed=30), unscored)
    scheduler.run_once()
    scheduler.run_once()
    assert runtime.log_softmax and not any(runtime.log_softmax)
    asked = len(runtime.log_softmax)
    beam = submit(scheduler, sources(1, seed=31), BEAM)
    drain(scheduler)
    assert any(runtime.log_softmax[asked:])  # while the beam ran
    for ticket, seed, options in ((first, 30, unscored), (beam, 31, BEAM)):
        expected = [alone(s, options) for s in sources(len(ticket.results), seed)]
        assert [[h.tokens for h in r] for r in ticket.results] == [[h.tokens for h in r] for r in expected]
    assert all(np.isnan(r[0].score) for r in first.results) and np.isfinite(beam.results[0][0].score)


def recording_capacity(runtime: FakeRuntime) -> list[tuple[int | None, int]]:
    """Each step's cache ceiling (most_steps) and time axis (capacity), as the runtime stepped it."""
    seen: list[tuple[int | None, int]] = []
    step = runtime.step

    def recording(input_ids: np.ndarray, cache: DecoderCache, **kwargs: object) -> object:
        out = step(input_ids, cache, **kwargs)  # type: ignore[arg-type]
        seen.append((cache.most_steps, cache.capacity))
        return out

    runtime.step = recording  # type: ignore[method-assign]
    return seen


def test_the_caches_time_axis_grows_no_further_than_its_live_searches_can_write() -> None:
    """A step's ceiling is the most steps a live sentence may take: grown by a quarter at 33 slots, the time axis would
    hold 48 where sentences of at most 40 tokens write 40; continuous batching and static batches alike."""
    forced = [SearchOptions(max_new_tokens=n, min_new_tokens=n) for n in (40, 20)]
    scheduler, runtime, _ = make()
    seen = recording_capacity(runtime)
    tickets = [submit(scheduler, sources(1, seed=40 + i), options) for i, options in enumerate(forced)]
    drain(scheduler)
    assert [len(t.results[0][0].tokens) for t in tickets] == [40, 20]
    assert [most for most, _ in seen] == [40] * 40  # the longer one joined first and ran throughout
    assert max(capacity for _, capacity in seen) == 40
    runtime = FakeRuntime()
    seen = recording_capacity(runtime)
    results = decode_batch(runtime, sources(2, seed=42), forced, RULES)
    assert [len(r[0].tokens) for r in results] == [40, 20] and {most for most, _ in seen} == {40}
    assert [capacity for _, capacity in seen] == [16] * 16 + [32] * 16 + [40] * 8


def streams(count: int = 2, limits: BatchLimits | None = None) -> tuple[Streams, FakeRuntime]:
    runtime = FakeRuntime()
    group = new_scheduler(runtime, RULES, limits or BatchLimits(), Metrics(), "fake", count, clock=Clock())
    assert isinstance(group, Streams)
    return group, runtime


def test_streams_take_newcomers_from_one_queue_in_even_shares() -> None:
    group, runtime = streams()
    first, second = group.members
    burst = submit(group, sources(7, seed=20), GREEDY)
    first.run_once()
    assert len(first.active) == 4 and len(first.waiting) == 3  # its share of 7: the other stream holds none
    second.run_once()
    assert len(second.active) == 3 and not first.waiting
    while len(first.active) == 4:  # a sentence of the first finishes
        first.run_once()
    late = submit(group, sources(2, seed=21), GREEDY)
    second.run_once()  # holds 3 (if none finished) against the first's fewer: not its share
    first.run_once()
    assert not first.waiting and len(first.active) + len(second.active) >= 5
    while not group.idle:
        first.run_once()
        second.run_once()
    for ticket, seed in ((burst, 20), (late, 21)):
        assert ticket.error is None and ticket.results == [alone(s, GREEDY) for s in sources(len(ticket.results), seed)]
    assert first.cache is not second.cache and max(runtime.step_rows) <= 5  # own batches (loads seen a step late)


def test_streams_on_their_threads_give_every_sentence_its_solo_result() -> None:
    group, runtime = streams(limits=BatchLimits(max_rows=6))
    group.start()
    try:
        tickets = [submit(group, [src], BEAM if i % 4 == 0 else GREEDY) for i, src in enumerate(sources(40, 22))]
        deadline = time.monotonic() + 20
        while not all(t.finished for t in tickets) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        group.stop(timeout=1.0)
    for i, (src, ticket) in enumerate(zip(sources(40, 22), tickets, strict=True)):
        assert ticket.error is None and ticket.results[0] == alone(src, BEAM if i % 4 == 0 else GREEDY)
    assert group.alive and max(runtime.step_rows) <= 6


def test_stopped_streams_fail_what_is_left_once_and_refuse_more() -> None:
    group, _ = streams(limits=BatchLimits(max_rows=1))
    running = submit(group, sources(1, seed=23), LONG)
    queued = submit(group, sources(3, seed=24), GREEDY)
    failures: list[Ticket] = []
    queued.on_done = failures.append
    group.members[0].run_once()
    group.stop(timeout=0.0)
    assert isinstance(running.error, Overloaded) and isinstance(queued.error, Overloaded)
    assert failures == [queued]  # failed by one stream, not again by the other
    with pytest.raises(Overloaded, match="shutting down"):
        submit(group, sources(1), GREEDY)


def test_a_ticket_whose_sentences_finish_on_two_threads_at_once_is_done_once() -> None:
    done: list[Ticket] = []
    tickets = [Ticket(2, 1e9, done.append) for _ in range(300)]
    start = threading.Barrier(2)

    def deliver(index: int) -> None:
        start.wait()
        for ticket in tickets:
            ticket.deliver(index, [])
            ticket.fail(Overloaded("late"))  # after its own delivery: a no-op, or the failure that finishes it

    threads = [threading.Thread(target=deliver, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(done) == len(tickets) and len({id(t) for t in done}) == len(tickets)


def test_a_request_split_between_streams_is_counted_once_when_it_expires_or_is_cancelled() -> None:
    group, _ = streams()
    first, second = group.members
    long = SearchOptions(max_new_tokens=50, min_new_tokens=50)
    late = submit(group, sources(2, seed=25), long, deadline=5.0)
    first.run_once()  # one sentence each: an even share
    second.run_once()
    gone = submit(group, sources(2, seed=26), long)
    first.run_once()
    second.run_once()
    assert {id(r.job.ticket) for r in first.active} == {id(r.job.ticket) for r in second.active}  # split
    first.clock.now = 6.0
    gone.cancelled = True
    first._drop_expired()  # both streams see the deadline pass before either fails the request (their threads
    second._drop_expired()  # interleave so), then each fails what it saw
    first._expire()
    second._expire()
    assert isinstance(late.error, DeadlineExceeded) and gone.finished and group.idle
    metrics = first.metrics
    assert metrics.deadline_expired.labels("fake")._value.get() == 1
    assert metrics.cancelled.labels("fake")._value.get() == 1
