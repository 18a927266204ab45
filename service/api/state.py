"""What the routes share: the loaded models and the language detector, readiness and draining, and admission's
counts (the concurrency limit, each model's throughput and expected queue wait)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from service.api.admission import Throughput
from service.api.file_store import FileStore
from service.errors import (
    Overloaded,
)
from service.metrics import Metrics
from service.settings import Settings
from service.text.detection import Detector
from service.translation.registry import Registry
from service.translation.translator import Translator

log = logging.getLogger(__name__)
THROUGHPUT_SAMPLE_SECONDS = 0.25


class State:
    """What the routes share: the loaded models, readiness and draining, and admission's counts."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings, self.metrics = settings, metrics
        self.registry = Registry([])
        self.detector = Detector([])  # the served languages' once the models are loaded
        self.file_store = FileStore(settings.file_store_dir, settings.file_store_seconds, settings.file_store_bytes)
        self.ready = False
        self.draining = False  # SIGTERM seen: /ready and /translate answer 503 until the process exits
        self.handling = 0  # /translate requests admitted past the concurrency check and not yet answered
        self.throughput: dict[str, Throughput] = {}
        self.on_fatal: Callable[[], None] | None = None  # the process's way out (python -m service: drain, exit 1)

    def engine_exited(self, model: str) -> None:
        """A model's engine died: stop admitting, and let the process end so that a supervisor restarts it."""
        log.critical("model %s can no longer translate; the server stops admitting requests", model)
        self.ready = False
        self.metrics.ready.set(0)
        if self.on_fatal is not None:
            self.on_fatal()

    def engine_failure(self) -> str | None:
        """Which models' decoding loops (engine process or worker thread) have ended on their own, if any."""
        dead = sorted(name for name, t in self.registry.translators.items() if not t.scheduler.alive)
        return f"the engine of {', '.join(dead)} has exited" if dead else None

    def begin_drain(self) -> None:
        """Stop admitting: readiness false, new translations 503 (reason shutting_down); work in flight goes on."""
        if not self.draining:
            self.draining, self.ready = True, False
            self.metrics.ready.set(0)
            log.info("draining: %d requests in flight", self.handling)

    async def stop_engines(self) -> None:
        """The grace period is over: every model's work in flight fails now, each request answered 503
        (shutting_down, "the server stopped before this request finished") while its connection is still open,
        rather than cancelled by uvicorn's shutdown (a plain-text 500) seconds later. Stopping again at the
        lifespan's end finds nothing left."""
        stopping = [asyncio.to_thread(t.scheduler.stop, 0.0) for t in self.registry.translators.values()]
        await asyncio.gather(*stopping)

    def admit(self) -> None:
        """The checks before a /translate request's body is read."""
        retry = self.settings.retry_after_seconds
        if self.draining:
            raise Overloaded("the server is shutting down; retry on another instance", "shutting_down", retry)
        if not self.ready:
            failure = self.engine_failure()
            message = f"{failure}; retry on another instance" if failure else "the server is not ready yet"
            raise Overloaded(message, "not_ready", retry)
        if self.handling >= self.settings.max_concurrent_requests:
            raise Overloaded(
                f"too many requests at once (the limit is {self.settings.max_concurrent_requests}); retry later",
                "too_many_requests",
                retry,
            )

    def check_queue_wait(self, translator: Translator) -> None:
        """503 when the sentences already waiting would keep a newcomer in the queue beyond the limit."""
        limit = self.settings.max_queue_wait_seconds
        throughput = self.throughput.get(translator.name)
        if limit <= 0 or throughput is None:
            return
        wait = throughput.expected_wait(translator.scheduler.queued)
        if wait is not None and wait > limit:
            waiting = "it has not moved lately" if math.isinf(wait) else f"about {wait:.1f} s of work waiting"
            raise Overloaded(
                f"the queue is full ({waiting}; the limit is {limit:g} s); retry later",
                "queue_full",
                self.settings.retry_after_seconds,
            )

    def sample_throughput(self, now: float) -> None:
        for name, translator in self.registry.translators.items():
            finished = self.metrics.registry.get_sample_value("mt_sentences_total", {"model": name}) or 0.0
            waiting = translator.scheduler.queued
            throughput = self.throughput.setdefault(name, Throughput())
            throughput.sample(now, finished, waiting)
            wait = throughput.expected_wait(waiting)
            self.metrics.expected_queue_wait.labels(name).set(-1.0 if wait is None else wait)


async def sample_throughput(state: State) -> None:
    """Forever: each model's throughput and expected queue wait, every THROUGHPUT_SAMPLE_SECONDS."""
    while True:
        state.sample_throughput(time.monotonic())
        await asyncio.sleep(THROUGHPUT_SAMPLE_SECONDS)
