"""Admission by expected queue wait: a model's throughput (sentences per second, measured only while its queue
is non-empty, so the batch was full) turns the number of waiting sentences into seconds. Knows counts and
clocks; nothing of HTTP, nor of how the scheduler batches.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class Throughput:
    """Sentences finished per second of busy time, over the last `window` seconds of busy time.

    Fed by `sample(now, finished, waiting)` at a steady period. An interval counts as busy when sentences were
    waiting at both of its ends, or at its start and some finished in it (the queue drained): then the
    scheduler ran as fast as its batch limits let it. A queue waiting at a single sample (between a request's
    arrival and the next step) teaches nothing.
    """

    window: float = 10.0
    min_busy: float = 1.0  # no estimate before this much busy time has been seen
    intervals: deque[tuple[float, float]] = field(default_factory=deque)  # (seconds, sentences finished)
    last: tuple[float, float, int] | None = None  # (time, finished so far, waiting) at the previous sample

    def sample(self, now: float, finished: float, waiting: int) -> None:
        if self.last is not None:
            then, finished_then, waiting_then = self.last
            moved = finished > finished_then
            if waiting_then > 0 and (waiting > 0 or moved) and now > then and finished >= finished_then:
                self.intervals.append((now - then, finished - finished_then))
                while self.intervals and sum(dt for dt, _ in self.intervals) - self.intervals[0][0] >= self.window:
                    self.intervals.popleft()
        self.last = (now, finished, waiting)

    @property
    def per_second(self) -> float | None:
        """Sentences per second while busy (0: a queue that did not move); None before min_busy of busy time."""
        busy = sum(dt for dt, _ in self.intervals)
        if busy < self.min_busy:
            return None
        return sum(n for _, n in self.intervals) / busy

    def expected_wait(self, waiting: int) -> float | None:
        """Seconds until `waiting` sentences have left the queue (inf: it has not moved lately); None while the
        throughput is not known yet."""
        if waiting <= 0:
            return 0.0
        rate = self.per_second
        if rate is None:
            return None
        return math.inf if rate == 0 else waiting / rate
