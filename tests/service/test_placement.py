"""MT_PIN_CORES: the plan (which layouts get cores of their own), and threads really running where it says: a
stream's worker thread on its core, its encoder thread and everything else on the cores left."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from service.engine.batches import TokenRules
from service.engine.decoding import SearchOptions
from service.engine.runtime import Memory
from service.metrics import Metrics
from service.scheduling.jobs import BatchLimits, SentenceJob, Ticket
from service.scheduling.placement import Cores, allowed_cores, claim, plan, release, run_as_batch
from service.scheduling.scheduler import new_scheduler
from tests.fakes import EOS, PAD, START, FakeRuntime

TWO = frozenset({0, 1})


def test_one_single_threaded_stream_on_two_cores_gets_the_last_core() -> None:
    assert plan([(1, 1)], TWO, 2) == [Cores((1,), frozenset({0}))]


def test_streams_of_several_models_get_a_core_each_and_share_the_rest() -> None:
    cores = frozenset({2, 3, 5, 7, 8})  # a cpuset: not 0..n-1
    assert plan([(2, 1), (1, 1)], cores, 5) == [Cores((5, 7), frozenset({2, 3})), Cores((8,), frozenset({2, 3}))]


def test_cores_another_server_claimed_are_left_to_it() -> None:
    four = frozenset(range(4))
    assert plan([(1, 1)], four, 4, taken=frozenset({3})) == [Cores((2,), frozenset({0, 1}))]
    assert plan([(1, 1)], TWO, 2, taken=frozenset({1})) is None  # one core left: none for the other threads


def test_a_claimed_core_is_refused_to_others_until_released(tmp_path: Path) -> None:
    assert claim([7, 6], tmp_path) == frozenset()
    try:
        # another claimant (a lock on another open file is another process's, for flock)
        assert claim([7, 5], tmp_path) == {7}
        assert claim([5], tmp_path) == frozenset()  # a refusal claimed nothing: 5 was still free
        release([5])
    finally:
        release([7, 6])
    assert claim([7], tmp_path) == frozenset()
    release([7])


@pytest.mark.parametrize(
    ("layouts", "allowed", "usable", "why"),
    [
        ([(2, 1)], TWO, 2, "as many streams as cores: nothing left for HTTP and the encoder"),
        ([(1, 2)], frozenset(range(4)), 4, "a stream of two intra-op threads: ONNX Runtime places its pool"),
        ([(1, 1), (1, 2)], frozenset(range(8)), 8, "one multi-threaded stream among single-threaded ones"),
        ([(1, 1)], frozenset(range(16)), 1, "a CPU quota of one core, on a 16-core machine"),
        ([(1, 1)], frozenset(range(16)), 4, "a quota of 4 cores on 16: shared with other containers"),
        ([(1, 1)], frozenset({0}), 1, "one core"),
    ],
)
def test_nothing_is_pinned_where_the_streams_would_not_leave_a_core(
    layouts: list[tuple[int, int]], allowed: frozenset[int], usable: int, why: str
) -> None:
    assert plan(layouts, allowed, usable) is None, why


class WhereRuntime(FakeRuntime):
    """Notes the cores of the threads that run its encoder passes and steps."""

    def __init__(self) -> None:
        super().__init__()
        self.where: dict[str, set[frozenset[int]]] = {"encode": set(), "step": set()}
        self.threads: set[str] = set()

    def encode(self, src_ids: np.ndarray, src_mask: np.ndarray) -> Memory:
        self.where["encode"].add(frozenset(os.sched_getaffinity(0)))
        return super().encode(src_ids, src_mask)

    def step(self, input_ids, cache, full=False, candidates=2, log_softmax=True):  # type: ignore[no-untyped-def]
        self.where["step"].add(frozenset(os.sched_getaffinity(0)))
        self.threads.add(threading.current_thread().name)
        return super().step(input_ids, cache, full, candidates, log_softmax)


@pytest.mark.skipif(len(allowed_cores()) < 3, reason="two streams and the rest need 3 cores to pin")
def test_each_stream_steps_on_its_own_core_and_encodes_on_the_others() -> None:
    cores = plan([(2, 1)], allowed_cores(), len(allowed_cores()))
    assert cores is not None
    _run_pinned(2, cores[0])


@pytest.mark.skipif(len(allowed_cores()) < 2, reason="pinning needs 2 cores")
def test_a_stream_steps_on_its_own_core_and_encodes_on_the_others() -> None:
    cores = plan([(1, 1)], allowed_cores(), len(allowed_cores()))
    assert cores is not None
    _run_pinned(1, cores[0])


def _run_pinned(count: int, cores: Cores) -> None:
    runtime = _run(count, cores)
    streams = {frozenset({core}) for core in cores.streams[:count]}
    assert runtime.where["step"] == streams
    if count > 1:
        assert len(runtime.threads) == count  # both streams stepped, each on its own core
    assert cores.others in runtime.where["encode"]  # passes beside running rows: encoder threads, on the other cores
    assert runtime.where["encode"] <= streams | {cores.others}  # and an idle stream's lone pass, on its own


def _run(count: int, cores: Cores) -> WhereRuntime:
    """24 sentences through `count` streams placed on `cores`; every one translated."""
    runtime = WhereRuntime()
    limits = BatchLimits(overlap_encoder=True)
    scheduler = new_scheduler(runtime, TokenRules(START, EOS, PAD), limits, Metrics(), "fake", count, cores=cores)
    before = os.sched_getaffinity(0)
    scheduler.start()
    try:
        rng, started = np.random.default_rng(0), time.monotonic()
        done: list[Ticket] = []
        tickets = []
        for i in range(24):
            ticket = Ticket(1, 1e18, done.append)
            src = [*rng.integers(3, 12, size=5).tolist(), EOS]
            length = 400 if i == 0 else 20  # the first runs long, so that the others encode beside its rows
            options = SearchOptions(max_new_tokens=length, min_new_tokens=length)
            scheduler.submit([SentenceJob(src, options, ticket, 0)])
            tickets.append(ticket)
            while i == 0 and not runtime.where["step"] and time.monotonic() < started + 20:
                time.sleep(0.001)  # on a loaded machine: until it runs
            time.sleep(0.002)
        deadline = time.monotonic() + 20
        while len(done) < len(tickets) and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        scheduler.stop(timeout=1.0)
    assert len(done) == len(tickets) and all(t.error is None for t in tickets)
    assert os.sched_getaffinity(0) == before  # the caller's thread is left as it was
    return runtime


@pytest.mark.skipif(len(allowed_cores()) < 2, reason="pinning needs 2 cores")
def test_a_refused_pin_is_a_warning_and_the_stream_still_serves(caplog: pytest.LogCaptureFixture) -> None:
    """A core that is no longer the process's (a cpuset changed after the plan): sched_setaffinity fails with
    EINVAL. The worker and the encoder thread run unpinned; nothing breaks (an initializer that raised would
    have broken the encoder pool)."""
    missing = max(allowed_cores()) + 1000
    cores = Cores((missing,), frozenset({missing}))
    with caplog.at_level("WARNING", logger="service.scheduling.placement"):
        runtime = _run(1, cores)
    assert runtime.where["step"] == runtime.where["encode"] == {allowed_cores()}
    assert "could not pin a thread" in caplog.text


def test_a_claims_folder_that_cannot_be_used_is_a_warning_naming_the_setting(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The core counts as taken (safe), and the log says why: not another server, MT_PIN_CLAIMS_DIR."""
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    assert claim([0], not_a_folder) == frozenset({0})
    [record] = [r for r in caplog.records if "cannot claim a core" in r.getMessage()]
    assert record.levelname == "WARNING" and "check MT_PIN_CLAIMS_DIR" in record.getMessage()


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
def test_run_as_batch_sets_the_calling_thread_and_the_threads_it_starts() -> None:
    """On its own thread (the policy dies with it): SCHED_BATCH for it and for a thread it starts afterwards; the
    caller's thread keeps its policy."""
    seen: dict[str, int] = {}

    def batch() -> None:
        seen["applied"] = run_as_batch()
        seen["itself"] = os.sched_getscheduler(0)
        child = threading.Thread(target=lambda: seen.update(child=os.sched_getscheduler(0)))
        child.start()
        child.join()

    before = os.sched_getscheduler(0)
    thread = threading.Thread(target=batch)
    thread.start()
    thread.join()
    assert seen == {"applied": True, "itself": os.SCHED_BATCH, "child": os.SCHED_BATCH}
    assert os.sched_getscheduler(0) == before


def test_a_refused_batch_policy_is_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "SCHED_BATCH", 3, raising=False)
    monkeypatch.setattr(os, "sched_setscheduler", refuse, raising=False)
    assert run_as_batch() is False
    assert "could not run the engine's threads under SCHED_BATCH" in caplog.text
