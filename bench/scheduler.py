"""Scheduler benchmark: continuous batching alone, no HTTP. N closed-loop clients, each submitting its next
test-set sentence the moment its last one is delivered, against the scheduler the server runs (same settings,
MT_* environment variables included), in this process. What the server's throughput would be if HTTP, the
engine process's pipe and the load generator cost nothing: the cleanest A/B of a scheduler or cache change on
a shared machine, where `bench.server` moves by 10-20 % from run to run. Besides throughput and CPU it prints the
rows per step and where a sentence's time went (the server's histograms): queued, to its first decoder step (the
encoder thread, its pass, the step in progress), in the batch; and, at the end, the process's peak resident memory.

    python -m bench.scheduler                       # the default model, 32 clients, 15 s
    python -m bench.scheduler --clients 8,32,64 --seconds 10
    python -m bench.scheduler --stages              # and where each thread's CPU time went, per row-step
    python -m bench.scheduler --unscored            # greedy steps without the log-softmax (no confidence)

`--stages` times the runtime's own calls on the threads that make them (`time.thread_time`) over the measured
window: the step graphs' runs, the rest of each step (binding, the cache's room), the cache's resizes (as rows grow
past its time axis, as sentences join and leave), the encoder passes; and each thread's whole CPU time from /proc.
The figures behind docs/performance.md's "The server's gap to the two-stream engine".
"""

from __future__ import annotations

import argparse
import collections
import itertools
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest

from bench.machine import describe, headline
from bench.processes import peak_rss_mb, thread_cpu_seconds
from bench.server import batch_figures, metric_totals
from bench.server import sentences as test_sentences
from service.arguments import description_of, positive_float, positive_int
from service.engine.decoding import SearchOptions
from service.engine.kv_cache import DecoderCache
from service.engine.runtime import OnnxRuntime, StepBinding
from service.engine.sessions import decoder_streams, open_runtime
from service.metrics import Metrics
from service.model.folder import load_model_folder
from service.scheduling.engine_process import EngineProcess
from service.scheduling.jobs import SentenceJob, Ticket
from service.scheduling.scheduler import Scheduler, Streams
from service.settings import Settings
from service.translation.translator import TranslateOptions, Translator

ROOT = Path(__file__).resolve().parent.parent


class ClosedLoop:
    """`clients` sentences in flight at all times: each delivery submits the next sentence (from the worker
    thread that delivered it); counts sentences and target tokens. A failed sentence stops the loop."""

    def __init__(
        self, scheduler: Scheduler | Streams, sentences: list[tuple[list[int], SearchOptions]], clients: int
    ) -> None:
        self.scheduler, self.sentences_in, self.clients = scheduler, sentences, clients
        self.sentences = self.tokens = 0
        self.error: Exception | None = None
        self._next = itertools.count()
        self._lock = threading.Lock()
        self._running = True

    def start(self) -> None:
        for _ in range(self.clients):
            self._submit()

    def stop(self) -> None:
        self._running = False

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return self.sentences, self.tokens

    def _submit(self) -> None:
        ids, options = self.sentences_in[next(self._next) % len(self.sentences_in)]
        ticket = Ticket(1, time.monotonic() + 600, self._done)
        self.scheduler.submit([SentenceJob(ids, options, ticket, 0)])

    def _done(self, ticket: Ticket) -> None:
        if ticket.error is not None:  # on the worker thread: noted, and measure() reports it
            self.error, self._running = ticket.error, False
            return
        with self._lock:
            self.sentences += 1
            self.tokens += len(ticket.results[0][0].tokens)  # type: ignore[index]
        if self._running:
            self._submit()


# The calls --stages times: (class, method, stage); a stage's time is the CPU its calls took on their own threads
TIMED = (
    (StepBinding, "run", "graphs"),  # a step graph's run in ONNX Runtime
    (OnnxRuntime, "step", "steps"),  # the whole of the runtime's step: the graph, binding, the cache's room
    (DecoderCache, "_resize", "resizes"),  # a cache buffer to a new size, in a step or as sentences join and leave
    (OnnxRuntime, "encode", "encoder"),  # an encoder pass
)


class StageClock:
    """CPU seconds per stage (TIMED) and rows stepped, summed over the threads that ran them, while installed."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.rows = 0
        self._lock = threading.Lock()

    def timed(self, method: Callable[..., Any], stage: str) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds[stage] += time.thread_time() - started
                    if stage == "steps":  # OnnxRuntime.step(self, input_ids, cache, ...): input_ids (B,)
                        self.rows += len(args[1] if len(args) > 1 else kwargs["input_ids"])

        return wrapper

    @contextmanager
    def installed(self) -> Iterator[StageClock]:
        originals = [(cls, name, getattr(cls, name)) for cls, name, _ in TIMED]
        for (cls, name, stage), (_, _, method) in zip(TIMED, originals, strict=True):
            setattr(cls, name, self.timed(method, stage))
        try:
            yield self
        finally:
            for cls, name, method in originals:
                setattr(cls, name, method)


def thread_cpu() -> dict[str, float]:
    """CPU seconds so far of this process's Python threads, summed by name (the streams' threads share theirs)."""
    totals: dict[str, float] = collections.defaultdict(float)
    for thread in threading.enumerate():
        if thread.native_id is not None:
            totals[thread.name] += thread_cpu_seconds(thread.native_id)
    return totals


def print_stages(clock: StageClock, before: dict[str, float], after: dict[str, float], elapsed: float) -> None:
    """The stages' µs per row-step (a row's one token), and each thread's cores, from a window's StageClock and
    thread_cpu at its ends."""
    rows = max(clock.rows, 1)
    per_row = collections.defaultdict(float, {stage: 1e6 * seconds / rows for stage, seconds in clock.seconds.items()})
    print(f"stages over {clock.rows:,} row-steps, µs a row-step (CPU on the threads that ran them):")
    print("| stage | µs a row-step |\n|---|---:|")
    for label, value in (
        ("the step graphs (ONNX Runtime's runs)", per_row["graphs"]),
        ("the rest of the runtime's steps (binding, the cache's room)", per_row["steps"] - per_row["graphs"]),
        ("cache resizes, in those steps (regrowth) or as sentences join and leave", per_row["resizes"]),
        ("encoder passes", per_row["encoder"]),
    ):
        print(f"| {label} | {value:,.1f} |")
    for name in sorted(after):
        cores = (after[name] - before.get(name, 0.0)) / elapsed
        if cores >= 0.005:
            print(f"| thread {name}: cores | {cores:.2f} |")


def measure(
    scheduler: Scheduler | Streams,
    sentences: list[tuple[list[int], SearchOptions]],
    clients: int,
    seconds: float,
    stages: bool = False,
) -> dict[str, Any]:
    """The window's figures; with `stages`, also "stages": (StageClock, thread_cpu before, after, seconds)."""
    registry = (scheduler.first if isinstance(scheduler, Streams) else scheduler).metrics.registry
    loop = ClosedLoop(scheduler, sentences, clients)
    loop.start()
    time.sleep(min(2.0, seconds / 4))  # warm-up at this concurrency
    clock = StageClock()
    with clock.installed() if stages else nullcontext():
        (sentences, tokens), cpu, started = loop.counts(), time.process_time(), time.perf_counter()
        threads, before = thread_cpu(), metric_totals(generate_latest(registry).decode())
        time.sleep(seconds)
        (sentences2, tokens2), cpu2, elapsed = loop.counts(), time.process_time(), time.perf_counter() - started
        threads2, after = thread_cpu(), metric_totals(generate_latest(registry).decode())
    loop.stop()
    while not scheduler.idle:
        time.sleep(0.01)
    if loop.error is not None:
        raise SystemExit(f"a sentence failed: {loop.error}")
    generated = tokens2 - tokens
    return {
        "clients": clients,
        "sentences_per_s": (sentences2 - sentences) / elapsed,
        "tokens_per_s": generated / elapsed,
        "cpu_us_per_token": (cpu2 - cpu) / max(generated, 1) * 1e6,
        **batch_figures(before, after),  # rows per step; queue, join, decoding ms (server: nan, no HTTP here)
        **({"stages": (clock, threads, threads2, elapsed)} if stages else {}),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scheduler", description=description_of(__doc__))
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "en-fr", help="a model folder")
    parser.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus", help="holds test.en")
    parser.add_argument("--clients", default="32")
    parser.add_argument("--seconds", type=positive_float, default=15.0)
    parser.add_argument("--sentences", type=positive_int, help="the test set's first N (default: all of it)")
    parser.add_argument("--stages", action="store_true", help="print where each thread's CPU time went, per row-step")
    parser.add_argument(
        "--unscored", action="store_true",
        help="greedy searches that read no log-probabilities, so that their steps skip the log-softmax: what the "
        "server's confidence (every search scored) costs, beside a run without it",
    )
    args = parser.parse_args(argv)
    print(headline(describe()), flush=True)
    settings = Settings()
    folder = load_model_folder(args.model, verify_checksums=False)
    runtime = open_runtime(folder, settings)
    translator = Translator(folder, settings, Metrics(), runtime)  # the server's scheduler, in this process
    scheduler = translator.scheduler
    assert not isinstance(scheduler, EngineProcess)  # a runtime was given
    options, target = TranslateOptions(beam_size=settings.default_beam_size), translator.target_languages[0]
    texts = test_sentences(args.corpus, args.sentences)
    encoded = [translator.tokenizer.encode(t, target) for t in texts]  # a line, a sentence
    sentences = [(ids, translator.search_options(len(ids), options)) for ids in encoded]  # the server's caps
    if args.unscored:
        sentences = [(ids, replace(search, scored=False)) for ids, search in sentences]
    translator.warm_up()
    scheduler.start()
    print(f"{folder.manifest.name}, {translator.variant}, {settings.batching}, "
          f"{decoder_streams(folder.manifest.config, settings)} stream(s), providers {runtime.providers[0]}"
          f"{', unscored' if args.unscored else ''}")
    print("| clients | sentences/s | target tok/s | CPU µs per target token | rows per step | queue ms "
          "| to first step ms | decoding ms |\n|---:|---:|---:|---:|---:|---:|---:|---:|")
    staged = []
    try:
        for clients in (int(c) for c in args.clients.split(",")):
            row = measure(scheduler, sentences, clients, args.seconds, args.stages)
            print(f"| {clients} | {row['sentences_per_s']:,.1f} | {row['tokens_per_s']:,.0f} | "
                  f"{row['cpu_us_per_token']:,.1f} | {row['rows_per_step']:.1f} | {row['queue_ms']:.1f} "
                  f"| {row['join_ms']:.1f} | {row['decoding_ms']:.1f} |", flush=True)
            staged += [(clients, row["stages"])] if args.stages else []
    finally:
        scheduler.stop(5.0)
    print(f"\npeak RSS of this process (the model, its caches, the load): {peak_rss_mb():,.0f} MB")
    for clients, stages in staged:
        print(f"\n{clients} clients, ", end="")
        print_stages(*stages)
    return 0


if __name__ == "__main__":
    sys.exit(main())
