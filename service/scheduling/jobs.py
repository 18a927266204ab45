"""What the scheduler is given: a request's sentences as jobs with their search options, the ticket that collects their
hypotheses for the request, the batch limits a job must fit, and a bucket of jobs' encoder pass (Encoding)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

import numpy as np

from service.engine.decoding import Hypothesis, SearchOptions
from service.engine.runtime import Memory
from service.errors import ServiceError


@dataclass(frozen=True)
class BatchLimits:
    static: bool = False  # True: a batch is formed, then run to completion before the next one
    max_rows: int = 64  # rows (sentences x beams) in one step
    max_tokens: int = 16384  # sum over running sentences of beams x (source length + max output length)
    max_queue: int = 2048  # sentences waiting
    encoder_bucket_ratio: float = 1.5  # newcomers encoded together when their lengths are within this ratio
    overlap_encoder: bool = False  # True: encoder passes run beside the decoder steps (continuous mode only)


def fits(limits: BatchLimits, options: SearchOptions, src_len: int) -> bool:
    """Whether one sentence can ever run under the batch limits (checked before it is queued)."""
    reserved = options.beam_size * (src_len + options.max_new_tokens)
    return options.beam_size <= limits.max_rows and reserved <= limits.max_tokens


@dataclass
class Ticket:
    """One request's sentences: results as they finish, its deadline, and how to hand them back. Its sentences
    may run on several streams: their threads deliver under the ticket's lock, and only one of them finishes it."""

    size: int
    deadline: float  # time.monotonic() after which the request fails with 504
    on_done: Callable[[Ticket], None]  # called once, from a worker thread
    results: list[list[Hypothesis] | None] = field(init=False)
    error: ServiceError | None = None
    cancelled: bool = False
    queue_seconds: float = 0.0
    finished: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.results = [None] * self.size

    @property
    def abandoned(self) -> bool:
        return self.cancelled or self.finished

    def deliver(self, index: int, hypotheses: list[Hypothesis]) -> None:
        with self._lock:
            self.results[index] = hypotheses
            if self.finished or any(r is None for r in self.results):
                return
            self.finished = True
        self.on_done(self)

    def fail(self, error: ServiceError) -> bool:
        """Finish with `error`, unless finished already; whether this call finished it."""
        with self._lock:
            if self.finished:
                return False
            self.error, self.finished = error, True
        self.on_done(self)
        return True

    def drop(self) -> bool:
        """The client went away: finished without an answer (nobody waits for one); whether this call did it."""
        with self._lock:
            if self.finished:
                return False
            self.finished = True
            return True


@dataclass
class SentenceJob:
    src_ids: list[int]
    options: SearchOptions
    ticket: Ticket
    index: int  # position in the ticket
    enqueued_at: float = 0.0  # the scheduler's clock, at each stage: queued, admitted, in the decoder batch
    admitted_at: float = 0.0
    joined_at: float = 0.0
    early: Encoding | None = None  # its bucket's encoder pass, started as it was queued (Scheduler._encode_early)

    @property
    def reserved_tokens(self) -> int:
        return self.options.beam_size * (len(self.src_ids) + self.options.max_new_tokens)

    def drop_early(self) -> None:
        """Its early encoder pass will not be used: cancelled, so that the encoder thread skips it if it has not
        started it yet."""
        if self.early is not None:
            self.early.memory.cancel()
            self.early = None


@dataclass
class Encoding:
    """One encoder pass of newcomers of similar length, finished or in flight."""

    jobs: list[SentenceJob]
    src_mask: np.ndarray  # (b, S)
    memory: Future[Memory]
