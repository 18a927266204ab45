"""Continuous (iteration-level) batching in a worker thread: sentences of many requests share one
decoder batch; newcomers join between steps, finished sentences leave at once, expired or abandoned
ones are dropped. A static mode runs each batch to completion instead.

Newcomers' encoder passes run between steps or, with `overlap_encoder`, on a thread of their own while
the decoder keeps stepping; their sentences join the batch at the first step after their pass. On a small
model at 32 clients the passes took a third of the worker's time when they ran between steps. With one stream
and a short queue, a newcomer's pass starts as it is queued rather than when the worker admits it, up to a step
later (`_encode_early`).

With several decoding streams (`Streams`), each stream is a Scheduler of its own (its batch, cache, thread
and encoder thread) and all take newcomers from one queue, each up to its even share of the rows; they share the
model's sessions, the cores split between their steps (CTranslate2's inter_threads). On 2 cores the paper-size
model's steps, one thread each, gave more than one stream on both threads: a step's Python, small operators and
the threads' hand-offs leave a second thread idle, another stream's step fills it.

Sees token ids and search options only: text lives in the tokenizer and the HTTP layer. It decides
which rows run each step; the Runtime runs the graphs.
"""

from __future__ import annotations

import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from service.engine.batches import (
    TokenRules,
    advance_all,
    candidates_needed,
    decode_batch,
    ends,
    greedy_rows,
    last_tokens,
    log_softmax_needed,
    pad_batch,
    source_mask,
)
from service.engine.decoding import Search, SearchOptions, new_search
from service.engine.runtime import Memory, Runtime
from service.errors import DeadlineExceeded, InferenceError, Overloaded
from service.metrics import Metrics
from service.scheduling.encoder import EncoderThread, mergeable
from service.scheduling.jobs import BatchLimits, Encoding, SentenceJob, Ticket, fits
from service.scheduling.placement import Cores, pin_thread

log = logging.getLogger(__name__)
WAITING_SCAN_SECONDS = 0.05  # how often queued sentences are checked for deadlines and cancellation


EARLY_QUEUE = 8  # sentences queued at most (these included) for a submission's encoder passes to start at once


@dataclass
class Waiting:
    """The sentences not yet admitted, shared by a model's streams, with the rows each stream holds (its running
    and encoding sentences' beams, as of its last admission) so that each takes newcomers up to an even share."""

    jobs: deque[SentenceJob] = field(default_factory=deque)
    lock: threading.Condition = field(default_factory=threading.Condition)
    closing: bool = False
    rows: dict[int, int] = field(default_factory=dict)  # stream -> rows held

    def keep(self, alive: Callable[[SentenceJob], bool]) -> None:
        """Drop the jobs `alive` rejects, in place (the deque is shared), and their early passes; call with the
        lock held."""
        kept = []
        for job in self.jobs:
            if alive(job):
                kept.append(job)
            else:
                job.drop_early()
        self.jobs.clear()
        self.jobs.extend(kept)


@dataclass
class Running:
    """A sentence in the decoder batch; its rows are contiguous in the cache, in `active` order."""

    job: SentenceJob
    search: Search


class Scheduler:
    def __init__(
        self,
        runtime: Runtime,
        rules: TokenRules,
        limits: BatchLimits,
        metrics: Metrics,
        model: str,
        clock: Callable[[], float] = time.monotonic,
        shared: Waiting | None = None,
        stream: int = 0,
        cores: Cores | None = None,
    ) -> None:
        self.runtime, self.rules, self.limits, self.metrics, self.model = runtime, rules, limits, metrics, model
        self.clock = clock
        self.shared = shared or Waiting()  # the queue, its lock, and the streams' loads
        self.stream, self.cores = stream, cores  # cores: this stream's own, and its encoder thread's (placement)
        self.shared.rows[stream] = 0
        self.encoding: list[Encoding] = []  # admitted: their encoder passes, in flight or done
        self.active: list[Running] = []
        overlap = limits.overlap_encoder and not limits.static
        self._encoder = (
            EncoderThread(
                self._encoder_pass,
                rules.pad_id,
                limits.encoder_bucket_ratio,
                f"encoder-{model}",
                cores.others if cores else None,
            )
            if overlap
            else None
        )
        self.cache = runtime.new_cache()
        self._lock = self.shared.lock
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._last_scan = -WAITING_SCAN_SECONDS
        self._expired: dict[int, Ticket] = {}  # id -> ticket past its deadline, failed once the queue let it go

    @property
    def waiting(self) -> deque[SentenceJob]:
        return self.shared.jobs

    # -- the HTTP side ---------------------------------------------------------------------------

    def submit(self, jobs: list[SentenceJob]) -> None:
        """Queue a request's sentences, all or none; Overloaded at once when the queue is full."""
        with self._lock:
            if self.shared.closing:
                raise Overloaded("the server is shutting down; retry on another instance", "shutting_down")
            if len(self.waiting) + len(jobs) > self.limits.max_queue:
                waiting, limit = len(self.waiting), self.limits.max_queue
                raise Overloaded(f"the queue is full ({waiting} of {limit} sentences waiting); retry later")
            now = self.clock()
            for job in jobs:
                job.enqueued_at = now
            self.waiting.extend(jobs)
            early = self._encoder is not None and len(self.shared.rows) == 1 and len(self.waiting) <= EARLY_QUEUE
            if early and self._stepping:  # beside running rows only: an idle worker encodes on its thread (_encode)
                self._encode_early(jobs)
            self.metrics.queue_depth.labels(self.model).set(len(self.waiting))
            self._lock.notify_all()  # every idle stream wakes, and takes up to its share

    @property
    def _stepping(self) -> bool:
        """Whether rows step on after this moment: a sentence delivered by the step just run is done, its row not
        yet gone (a request submitted as the answer arrives, in-process, finds the batch so)."""
        return any(not running.search.done for running in self.active)

    def _encode_early(self, jobs: list[SentenceJob]) -> None:
        """(Under the lock, as the jobs are queued.) Start their encoder passes now, one per length bucket, rather
        than when the worker admits them, up to a step later: with one decoding stream and a short queue they will be
        admitted at its next iteration, whose newcomers then find their passes done or nearly. The worker takes an
        early pass when it admits the whole of its bucket at once; else (a request's sentences split by the row or
        token limits) it encodes them again as they are admitted, and cancels the early pass, which the encoder
        thread then skips unless it has started it."""
        for bucket in self._buckets(jobs):
            encoding = self._encoding(bucket)
            for job in bucket:
                job.early = encoding

    def fits(self, options: SearchOptions, src_len: int) -> bool:
        return fits(self.limits, options, src_len)

    def cancel(self, ticket: Ticket) -> None:
        """The client went away: the worker drops the ticket's rows at its next step."""
        ticket.cancelled = True

    @property
    def queued(self) -> int:
        """Sentences waiting to be admitted."""
        return len(self.waiting)

    @property
    def providers(self) -> list[str]:
        return list(getattr(self.runtime, "providers", []))

    @property
    def alive(self) -> bool:
        """False once the worker thread has ended without being stopped."""
        return self._stopped or self._thread is None or self._thread.is_alive()

    @property
    def idle(self) -> bool:
        with self._lock:
            return not self.waiting and not self.encoding and not self.active

    def warm_up(self, src_ids: list[int]) -> None:
        """Real translations through the encoder and the step graphs (before `start`): the first runs allocate and
        prepack. A greedy sentence alone, the server's default search (the one-row graph, where it is opened: a cold
        first run cost the default model's first greedy sentence ~1 ms), then three sentences of beam 2, six rows
        from their first step on (the step graph, past the few rows any one-row graph takes)."""
        decode_batch(self.runtime, [src_ids], [SearchOptions(max_new_tokens=8)], self.rules)
        decode_batch(self.runtime, [src_ids] * 3, [SearchOptions(beam_size=2, max_new_tokens=8)] * 3, self.rules)

    # -- the worker thread -----------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"scheduler-{self.model}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop admitting new requests; work already queued goes on."""
        with self._lock:
            self.shared.closing = True

    def stop(self, timeout: float = 5.0) -> None:
        """Close, let queued work finish for up to `timeout` seconds, then fail what is left and end."""
        self.close()
        deadline = time.monotonic() + timeout
        while not self.idle and time.monotonic() < deadline:
            time.sleep(0.01)
        with self._lock:
            self._stopped = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self._encoder is not None:
            self._encoder.shutdown()
        admitted = [job for encoding in self.encoding for job in encoding.jobs]
        for job in list(self.waiting) + admitted + [r.job for r in self.active]:
            job.ticket.fail(Overloaded("the server stopped before this request finished", "shutting_down"))

    def _loop(self) -> None:
        if self.cores is not None:
            pin_thread(self.cores.stream(self.stream))
        while True:
            with self._lock:
                if self._stopped:
                    return
                if not self.waiting and not self.encoding and not self.active:
                    self.shared.rows[self.stream] = 0  # holds nothing now: the other streams see it at once
                    self._lock.wait(timeout=0.5)
                    continue
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - the worker must survive anything; run_once fails the batch
                log.exception("scheduler iteration failed")

    def run_once(self) -> None:
        """One iteration: drop what expired or was abandoned, admit and encode newcomers, let those whose
        encoder pass is done join (waiting for the passes when nothing else could run), run one step."""
        self._drop_expired()
        admitted = self._admit()
        self._expire()
        self._encode(admitted)
        self._join(wait=not self.active)
        if self.active:
            self._step()

    # -- 1. dropping ---------------------------------------------------------------------------

    def _drop_expired(self) -> None:
        """Running sentences every step; the queue at most every WAITING_SCAN_SECONDS (it may be long)."""
        now = self.clock()
        if now - self._last_scan >= WAITING_SCAN_SECONDS:
            self._last_scan = now
            with self._lock:
                self.shared.keep(lambda job: self._alive(job.ticket, now))
                self.metrics.queue_depth.labels(self.model).set(len(self.waiting))
        alive = [self._alive(r.job.ticket, now) for r in self.active]
        if all(alive):
            return
        rows, offset = [], 0
        for running, keep in zip(self.active, alive, strict=True):
            if keep:
                rows.append(np.arange(offset, offset + running.search.rows))
            offset += running.search.rows
        self.cache.select(np.concatenate(rows) if rows else np.zeros(0, np.int64))
        self.active = [r for r, keep in zip(self.active, alive, strict=True) if keep]

    def _alive(self, ticket: Ticket, now: float) -> bool:
        """Whether the ticket's sentences should still run. One past its deadline is failed by `_expire`, once
        its sentences have left the queue and the queue's depth is set: an engine process sends that depth
        ahead of the failure, so the server never sees the answer before the queue it left."""
        if ticket.cancelled and ticket.drop():  # once, whichever stream sees it first
            self.metrics.cancelled.labels(self.model).inc()
        if ticket.abandoned:
            return False
        if now > ticket.deadline:
            self._expired[id(ticket)] = ticket  # by identity: tickets are dataclasses
            return False
        return True

    def _expire(self) -> None:
        if not self._expired:
            return
        expired, self._expired = self._expired, {}
        with self._lock:
            self.shared.keep(lambda job: id(job.ticket) not in expired)
            self.metrics.queue_depth.labels(self.model).set(len(self.waiting))
        for ticket in expired.values():  # a request whose sentences ran on two streams is counted once
            if ticket.fail(DeadlineExceeded("the request's deadline passed before its translation finished")):
                self.metrics.deadline_expired.labels(self.model).inc()

    # -- 2. admission --------------------------------------------------------------------------

    def _admit(self) -> list[SentenceJob]:
        """Newcomers in arrival order while the batch has room and, with several streams, this one holds less
        than its fair share (a step's time grows with its rows, so even batches finish the most); static mode
        waits for an empty batch."""
        if self.limits.static and self.active:
            return []
        if not self.waiting and len(self.shared.rows) == 1:  # (read without the lock: a newcomer waits one step)
            return []  # nothing to admit, no other stream to tell what this one holds: nothing to count
        held = [r.job for r in self.active] + [job for encoding in self.encoding for job in encoding.jobs]
        rows = sum(job.options.beam_size for job in held)  # what the admitted sentences may grow to
        tokens = sum(job.reserved_tokens for job in held)
        admitted: list[SentenceJob] = []
        now = self.clock()
        with self._lock:
            share = self._fair_share(rows)
            while self.waiting and rows < share:
                job = self.waiting[0]
                if not self._alive(job.ticket, now):  # expired or abandoned since the last scan
                    self.waiting.popleft().drop_early()
                    continue
                beam = job.options.beam_size
                if rows + beam > self.limits.max_rows or tokens + job.reserved_tokens > self.limits.max_tokens:
                    break
                admitted.append(self.waiting.popleft())
                rows, tokens = rows + beam, tokens + job.reserved_tokens
            self.shared.rows[self.stream] = rows
            self.metrics.queue_depth.labels(self.model).set(len(self.waiting))
        return admitted

    def _fair_share(self, rows: int) -> float:
        """The rows each stream would hold were the held rows and the waiting ones (as many as the streams could
        take) spread evenly; no bound for a single stream. Call with the lock held."""
        count = len(self.shared.rows)
        if count == 1:
            return math.inf
        others = sum(held for stream, held in self.shared.rows.items() if stream != self.stream)
        takeable = itertools.islice(self.waiting, count * self.limits.max_rows)
        return math.ceil((others + rows + sum(job.options.beam_size for job in takeable)) / count)

    # -- 3. encoder passes ---------------------------------------------------------------------

    def _encode(self, jobs: list[SentenceJob]) -> None:
        """Start one encoder pass per length bucket: on the encoder thread, or here and now; an early pass
        (`_encode_early`) whose whole bucket is admitted is taken as it is."""
        now = self.clock()
        for job in jobs:
            job.admitted_at = now
            self.metrics.queue_wait.labels(self.model).observe(now - job.enqueued_at)
            job.ticket.queue_seconds = max(job.ticket.queue_seconds, now - job.enqueued_at)
        admitted = {id(job) for job in jobs}
        early = {id(job.early): job.early for job in jobs if job.early is not None}
        taken = [e for e in early.values() if all(id(j) in admitted for j in e.jobs)]
        self.encoding += taken
        started = {id(job) for encoding in taken for job in encoding.jobs}
        for job in jobs:
            if id(job) in started:
                job.early = None  # the pass is the batch's now
            else:
                job.drop_early()  # its bucket was split: encoded again below
        buckets = self._buckets([j for j in jobs if id(j) not in started])
        # An idle worker (no rows, no pass in flight) would only wait for the encoder thread: one bucket is encoded
        # here (the default model at one client, paired in one process: 0.93x the static mode's speed through the
        # thread, 1.00x here); several go to the thread, which merges them
        inline = not self.active and not self.encoding and len(buckets) == 1
        self.encoding += [self._encoding(b, inline) for b in buckets]

    def _encoding(self, bucket: list[SentenceJob], inline: bool = False) -> Encoding:
        """A bucket's encoder pass: handed to the encoder thread (which pads it, perhaps with others), or (no
        thread, or `inline`) run here and now."""
        sources = [job.src_ids for job in bucket]
        if self._encoder is not None and not inline:
            return Encoding(bucket, source_mask(sources), self._encoder.submit(sources))  # (b, S) mask
        src_ids, src_mask = pad_batch(sources, self.rules.pad_id)  # (b, S) each
        memory: Future[Memory] = Future()
        try:
            memory.set_result(self._encoder_pass(src_ids, src_mask))
        except Exception as error:  # noqa: BLE001 - handed to _join, which fails only this bucket
            memory.set_exception(error)
        return Encoding(bucket, src_mask, memory)

    def _encoder_pass(self, src_ids: np.ndarray, src_mask: np.ndarray) -> Memory:
        started = time.perf_counter()
        memory = self.runtime.encode(src_ids, src_mask)
        self.metrics.encoder_duration.labels(self.model).observe(time.perf_counter() - started)
        return memory

    def _join(self, wait: bool) -> None:
        """Sentences whose encoder pass is done join the batch (with `wait`, every pass in flight first ends)."""
        encoded = self._encoded(wait)
        try:
            for encoding, memory in encoded:
                self.cache.add(
                    memory.keys, memory.values, encoding.src_mask, owned=True, candidates=memory.candidates
                )
                self.active += self._joined(encoding)
        except Exception as error:  # noqa: BLE001 - the cache's bookkeeping failed: fail the batch, keep serving
            self._fail([job for encoding, _ in encoded for job in encoding.jobs], error)
            self._reset(error)

    def _encoded(self, wait: bool) -> list[tuple[Encoding, Memory]]:
        """The encoder passes that are done (with `wait`, all of them, once done), taken out of `encoding`; a
        bucket whose pass failed is failed here."""
        done, pending = [], []
        for encoding in self.encoding:
            if not (wait or encoding.memory.done()):
                pending.append(encoding)
                continue
            try:
                done.append((encoding, encoding.memory.result()))
            except Exception as error:  # noqa: BLE001 - any graph failure fails only this bucket
                self._fail(encoding.jobs, error)
        self.encoding = pending
        return done

    def _joined(self, encoding: Encoding) -> list[Running]:
        """An encoder pass's sentences as they join the batch (the cache has their sources)."""
        now = self.clock()
        for job in encoding.jobs:
            job.joined_at = now
            self.metrics.join_wait.labels(self.model).observe(now - job.admitted_at)
        # once per sentence, as it joins: an early pass left unused and its bucket encoded again counts once
        self.metrics.input_tokens.labels(self.model).inc(sum(len(job.src_ids) for job in encoding.jobs))
        start, eos = self.rules.decoder_start_id, self.rules.eos_id
        return [Running(job, new_search(start, eos, job.options)) for job in encoding.jobs]

    def _buckets(self, jobs: list[SentenceJob]) -> list[list[SentenceJob]]:
        """Group newcomers of similar length so that an encoder pass pads little."""
        buckets: list[list[SentenceJob]] = []
        for job in sorted(jobs, key=lambda j: len(j.src_ids)):
            if buckets and mergeable(len(buckets[-1][0].src_ids), len(job.src_ids), self.limits.encoder_bucket_ratio):
                buckets[-1].append(job)
            else:
                buckets.append([job])
        return buckets

    # -- 4. one decoder step -------------------------------------------------------------------

    def _step(self) -> None:
        started = time.perf_counter()
        searches = [r.search for r in self.active]
        greedy = greedy_rows(searches)  # row i search i's (before the step: a search that finishes is done)
        input_ids = last_tokens(searches)  # (B,)
        self.cache.most_steps = max(r.job.options.max_new_tokens for r in self.active)  # the time axis's ceiling
        try:
            out = self.runtime.step(
                input_ids,
                self.cache,
                candidates=candidates_needed(searches),
                log_softmax=log_softmax_needed(searches),  # greedy rows asking no scores: skipped
            )
        except Exception as error:  # noqa: BLE001 - fail this batch's requests, keep serving
            self._reset(error)
            return
        order, rows = advance_all(searches, out.top_log_probs, out.top_ids)
        for running in self.active:
            if running.search.done:
                self._deliver(running)
        try:
            if rows is not None and greedy and self.cache.in_order and not self.limits.static:
                self._refill(rows)  # greedy rows, some finished: newcomers take their places
            else:
                self.cache.select(rows)
                self.active = [self.active[i] for i in order]
        except Exception as error:  # noqa: BLE001 - the cache's bookkeeping failed: fail the batch, keep serving
            self._reset(error)
            return
        self.metrics.step_rows.labels(self.model).observe(len(input_ids))
        self.metrics.step_duration.labels(self.model).observe(time.perf_counter() - started)

    def _refill(self, rows: np.ndarray) -> None:
        """After a step of greedy rows (row i search i's) of which some finished: the sentences whose encoder pass
        is done join now, into the finished rows' places (DecoderCache.refill), where otherwise the last rows
        would have moved there and the newcomers joined at the end before the next step. When as many join as
        finished, no row moves and the step's binding holds."""
        encoded = self._encoded(wait=False)
        try:
            layout = self.cache.refill(rows, sum(len(encoding.jobs) for encoding, _ in encoded))
            active: list[Running | None] = [self.active[row] if row >= 0 else None for row in layout.tolist()]
            for encoding, memory in encoded:
                places = self.cache.add(
                    memory.keys, memory.values, encoding.src_mask, owned=True, candidates=memory.candidates
                )  # (b,) its places
                for place, running in zip(places.tolist(), self._joined(encoding), strict=True):
                    active[place] = running
        except Exception as error:  # noqa: BLE001 - the newcomers fail with the batch (_step resets it)
            self._fail([job for encoding, _ in encoded for job in encoding.jobs], error)
            raise
        self.active = active  # type: ignore[assignment] - every place filled: add took them all

    def _reset(self, error: Exception) -> None:
        """A step, or the cache's bookkeeping around one, failed: the batch's sentences fail (their requests get
        500), a new cache starts empty, and the worker serves on."""
        self._fail([r.job for r in self.active], error)
        self.active = []
        self.cache = self.runtime.new_cache()

    def _deliver(self, running: Running) -> None:
        results = running.search.results()
        self.metrics.decoding.labels(self.model).observe(self.clock() - running.job.joined_at)
        self.metrics.sentences.labels(self.model).inc()
        self.metrics.generated_tokens.labels(self.model).inc(len(results[0].tokens))
        if not ends(results[0], self.rules):
            self.metrics.truncated.labels(self.model).inc()
        if not running.job.ticket.abandoned:
            running.job.ticket.deliver(running.job.index, results)

    def _fail(self, jobs: list[SentenceJob], error: Exception) -> None:
        log.error("inference failed for a batch of %d sentences: %s", len(jobs), error)
        self.metrics.inference_errors.labels(self.model).inc()
        for job in jobs:
            job.ticket.fail(InferenceError(f"inference failed: {type(error).__name__}"))


class Streams:
    """A model's decoding streams: Schedulers sharing one queue and the model's sessions, each with its own batch,
    cache and threads. What the Translator and the engine process use in place of one Scheduler."""

    def __init__(self, members: list[Scheduler]) -> None:
        self.members, self.first = members, members[0]  # built by new_scheduler, around one Waiting

    def submit(self, jobs: list[SentenceJob]) -> None:
        self.first.submit(jobs)  # into the shared queue

    def fits(self, options: SearchOptions, src_len: int) -> bool:
        return self.first.fits(options, src_len)

    def cancel(self, ticket: Ticket) -> None:
        self.first.cancel(ticket)

    @property
    def queued(self) -> int:
        return self.first.queued

    @property
    def providers(self) -> list[str]:
        return self.first.providers

    @property
    def alive(self) -> bool:
        return all(member.alive for member in self.members)

    @property
    def idle(self) -> bool:
        return all(member.idle for member in self.members)

    def warm_up(self, src_ids: list[int]) -> None:
        self.first.warm_up(src_ids)  # the sessions are shared: one warm-up allocates and prepacks for all

    def start(self) -> None:
        for member in self.members:
            member.start()

    def close(self) -> None:
        self.first.close()  # the shared queue takes no more

    def stop(self, timeout: float = 5.0) -> None:
        """As Scheduler.stop, for every stream: queued work may finish on any of them within `timeout`."""
        self.close()
        deadline = time.monotonic() + timeout
        while not self.idle and time.monotonic() < deadline:
            time.sleep(0.01)
        for member in self.members:
            member.stop(0.0)


def new_scheduler(
    runtime: Runtime,
    rules: TokenRules,
    limits: BatchLimits,
    metrics: Metrics,
    model: str,
    streams: int = 1,
    clock: Callable[[], float] = time.monotonic,
    cores: Cores | None = None,
) -> Scheduler | Streams:
    """One Scheduler, or `streams` of them sharing a queue; `cores`: where each runs (scheduling/placement.py)."""
    if streams == 1:
        return Scheduler(runtime, rules, limits, metrics, model, clock, cores=cores)
    shared = Waiting()
    members = [Scheduler(runtime, rules, limits, metrics, model, clock, shared, i, cores) for i in range(streams)]
    return Streams(members)
