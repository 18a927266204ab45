"""Overload benchmark: the real server on loopback, its sustainable rate measured (closed loop, 32 clients),
then open-loop (Poisson) arrivals at normal load, at 4x the sustainable rate, and at normal load again. Per
phase: the 503 share, how fast a refusal comes (time-to-503), p50/p99 of the admitted requests, other errors
and the server's resident memory (VmRSS, its engine processes included); then recovery in 5 s windows and memory
over time.

    python -m bench.overload                         # about 2 minutes after the model is ready
    python -m bench.overload --overload-seconds 10 --calibrate-seconds 5 --normal-seconds 10   # a short run
    python -m bench.overload --server-env MT_MAX_QUEUE_WAIT_SECONDS=0    # only the sentence bound, to compare

The model: --models-dir; or --bench-model tiny|small, a random-weight model built once into runs/bench/models/
(needs the export extra); by default models/ when it holds a model folder, else the random 'small' one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from bench.load import Connection, run_load
from bench.machine import describe, headline
from bench.processes import rss_mb
from bench.server import SERVER_LOG, free_port, start_server, stop_server
from service.arguments import description_of, positive_float, positive_int

ROOT = Path(__file__).resolve().parent.parent
BUILT = ROOT / "runs" / "bench" / "models"
FALLBACK_SENTENCES = [
    "Open the file.",
    "Save the document as %s.",
    "The printer is not responding.",
    "Delete %d items?",
    "Cannot connect to the server.",
    "Select a color for the background.",
    "Settings were saved successfully.",
    "An unknown error occurred while reading {name}.",
]
BENCH_MODELS = {  # random weights: what matters here is the work per sentence, not the translation
    "tiny": {},
    "small": {"d_model": 256, "n_heads": 4, "d_ff": 1024, "n_encoder_layers": 3, "n_decoder_layers": 3},
}


# -- the model and the text ---------------------------------------------------------------------------


def has_models(folder: Path) -> bool:
    return folder.is_dir() and any((p / "manifest.json").is_file() for p in folder.iterdir())


def bench_models_dir(models_dir: Path | None, bench_model: str | None) -> Path:
    """A folder of model folders to serve: the one given, else the random model asked for, else models/ when
    it has a model folder, else the random 'small' model (built once)."""
    if models_dir is not None:
        return models_dir
    if bench_model is None and has_models(ROOT / "models"):
        return ROOT / "models"
    bench_model = bench_model or "small"
    root = BUILT / bench_model
    if not has_models(root):
        from model_export.export import export_folder  # needs torch: the export extra
        from tests.factories import tiny_checkpoint, train_sentencepiece

        print(f"building the random-weight '{bench_model}' model into {root} ...", flush=True)
        checkpoint = tiny_checkpoint(train_sentencepiece(), **BENCH_MODELS[bench_model])
        export_folder(checkpoint, root / f"bench-{bench_model}", f"bench-{bench_model}", "0.0.1")
    return root


def bench_sentences(limit: int | None = None) -> list[str]:
    """The corpus's test (or dev) sentences, the first `limit` (None: all), else a few built-in ones."""
    for name in ("test.en", "dev.en"):
        path = ROOT / "data" / "corpus" / name
        if path.is_file():
            lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
            return lines[:limit]
    return FALLBACK_SENTENCES


def body_maker(texts: list[str]) -> Callable[[int], bytes]:
    return lambda i: json.dumps({"q": texts[i % len(texts)], "source": "auto", "target": "fr"}).encode()


# -- open-loop load and memory ------------------------------------------------------------------------


IDLE_REUSE_SECONDS = 3.0  # under the server's keep-alive (MT_KEEP_ALIVE_SECONDS, 5): never race its close


@dataclass
class Outcome:
    at: float  # seconds from the phase's start to the request's planned send time
    status: int  # HTTP status; 0: connection failed; -1: the client had no connection left to send it on
    seconds: float  # from the planned send time to the answer (coordinated omission included)
    server_seconds: float = float("nan")  # usage.total_seconds of a 200: the time inside the translator
    queue_seconds: float = float("nan")  # usage.queue_seconds of a 200: its longest wait in the queue
    lag: float = 0.0  # how late the client sent it (the generator falling behind shows here)


async def open_loop(
    host: str,
    port: int,
    rate: float,
    seconds: float,
    next_body: Callable[[int], bytes],
    max_connections: int = 2000,
    seed: int = 0,
) -> list[Outcome]:
    """Poisson arrivals at `rate` per second for `seconds`, each on an idle keep-alive connection or a new
    one; waits for the stragglers (at most 60 s)."""
    rng, outcomes, tasks = random.Random(seed), [], set()
    idle: list[tuple[Connection, float]] = []  # with the time each went idle
    opened = [0]
    started = time.perf_counter()

    def idle_connection() -> Connection | None:
        while idle:
            connection, since = idle.pop()
            if time.perf_counter() - since < IDLE_REUSE_SECONDS:
                return connection
            connection.close()
            opened[0] -= 1
        return None

    async def one(i: int, at: float) -> None:
        planned = started + at
        lag = time.perf_counter() - planned
        connection = idle_connection()
        if connection is None:
            if opened[0] >= max_connections:
                outcomes.append(Outcome(at, -1, 0.0))
                return
            opened[0] += 1
            connection = Connection(host, port)
        try:
            status, _, payload = await connection.request("/translate", next_body(i))
        except (OSError, asyncio.IncompleteReadError, ValueError, IndexError):
            connection.close()
            opened[0] -= 1
            outcomes.append(Outcome(at, 0, time.perf_counter() - planned, lag=lag))
            return
        done = time.perf_counter()
        usage = json.loads(payload)["usage"] if status == 200 else {}
        nan = float("nan")
        outcome = Outcome(at, status, done - planned, usage.get("total_seconds", nan), usage.get("queue_seconds", nan))
        outcome.lag = lag
        outcomes.append(outcome)
        if connection.writer is None or connection.writer.is_closing():
            opened[0] -= 1
        else:
            idle.append((connection, done))

    at, i = 0.0, 0
    while at < seconds:
        delay = started + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.ensure_future(one(i, at))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        i += 1
        at += rng.expovariate(rate)
    if tasks:
        await asyncio.wait(tasks, timeout=60)
    for connection, _ in idle:
        connection.close()
    return outcomes


@dataclass
class MemoryTrace:
    pid: int
    samples: list[tuple[float, float]] = field(default_factory=list)  # (seconds since start, MB)

    async def run(self, started: float, period: float = 1.0) -> None:
        while True:
            self.samples.append((time.perf_counter() - started, rss_mb(self.pid)))
            await asyncio.sleep(period)

    def between(self, start: float, end: float) -> list[float]:
        return [mb for t, mb in self.samples if start <= t <= end]


async def traced(trace: MemoryTrace, started: float, work: Coroutine[object, object, list[Outcome]]) -> list[Outcome]:
    """Runs `work` while sampling the server's memory."""
    sampler = asyncio.ensure_future(trace.run(started))
    try:
        return await work
    finally:
        sampler.cancel()


def server_counts(port: int) -> dict[str, float]:
    """From the server's /metrics: refusals by reason, and /translate requests handled within 10 ms and in all
    (its own time, from the request's headers to its answer: what the CPU queue in front of it does not add)."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    found = re.findall(r'^mt_rejected_requests_total\{reason="([a-z_]+)"\} (\S+)$', text, re.MULTILINE)
    counts = {reason: float(value) for reason, value in found}
    for key, pattern in (
        ("handled_10ms", r'^mt_http_request_duration_seconds_bucket\{le="0\.01",route="/translate"\} (\S+)$'),
        ("handled", r'^mt_http_request_duration_seconds_count\{route="/translate"\} (\S+)$'),
    ):
        match = re.search(pattern, text, re.MULTILINE)
        counts[key] = float(match.group(1)) if match else 0.0
    return counts


# -- summaries ----------------------------------------------------------------------------------------


def ms(values: list[float], q: float) -> float:
    return 1000 * float(np.percentile(values, q)) if values else float("nan")


def summarise(
    name: str, offered: float, seconds: float, outcomes: list[Outcome], memory: list[float], counts: dict
) -> dict:
    admitted = [o.seconds for o in outcomes if o.status == 200]
    inside = [o.server_seconds for o in outcomes if o.status == 200]
    rejected = [o.seconds for o in outcomes if o.status == 503]
    others = [o for o in outcomes if o.status not in (200, 503)]
    return {
        "phase": name,
        "offered_per_s": offered,
        "sent": len(outcomes),
        "ok_per_s": len(admitted) / seconds,
        "share_503": len(rejected) / len(outcomes) if outcomes else float("nan"),
        "to_503_p50_ms": ms(rejected, 50),
        "to_503_p99_ms": ms(rejected, 99),
        "ok_p50_ms": ms(admitted, 50),
        "ok_p99_ms": ms(admitted, 99),
        "server_p99_ms": ms(inside, 99),
        "queue_p99_ms": ms([o.queue_seconds for o in outcomes if o.status == 200], 99),
        "client_lag_p99_ms": ms([o.lag for o in outcomes], 99),
        "refused_by_reason": {k: v for k, v in counts.items() if v and not k.startswith("handled")},
        "server_within_10ms_share": counts["handled_10ms"] / counts["handled"] if counts.get("handled") else 0.0,
        "other_errors": len(others),
        "other_statuses": sorted({o.status for o in others}),
        "rss_max_mb": max(memory) if memory else float("nan"),
    }


def windows(outcomes: list[Outcome], seconds: float, width: float = 5.0) -> list[dict]:
    rows = []
    for start in np.arange(0.0, seconds, width):
        mine = [o for o in outcomes if start <= o.at < start + width]
        ok = [o.seconds for o in mine if o.status == 200]
        rows.append(
            {
                "from_s": float(start),
                "sent": len(mine),
                "errors": sum(o.status != 200 for o in mine),
                "ok_p50_ms": ms(ok, 50),
                "ok_p99_ms": ms(ok, 99),
            }
        )
    return rows


def print_tables(rows: list[dict], recovery: list[dict], memory: list[tuple[float, float]]) -> None:
    print(
        "\n| phase | offered req/s | sent | 200/s | 503 share | time-to-503 p50 / p99 ms | admitted p50 / p99 ms "
        "| server p99 ms | queue p99 ms | handled in <= 10 ms | other errors | max RSS MB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['phase']} | {r['offered_per_s']:.0f} | {r['sent']} | {r['ok_per_s']:.1f} "
            f"| {100 * r['share_503']:.1f}% | {r['to_503_p50_ms']:.1f} / {r['to_503_p99_ms']:.1f} "
            f"| {r['ok_p50_ms']:.0f} / {r['ok_p99_ms']:.0f} | {r['server_p99_ms']:.0f} | {r['queue_p99_ms']:.0f} "
            f"| {100 * r['server_within_10ms_share']:.1f}% "
            f"| {r['other_errors']} {r['other_statuses'] or ''} | {r['rss_max_mb']:.0f} |"
        )
    print("\nrecovery (normal load after the overload), 5 s windows:")
    print("| from s | sent | errors | admitted p50 / p99 ms |")
    print("|---:|---:|---:|---:|")
    for w in recovery:
        print(f"| {w['from_s']:.0f} | {w['sent']} | {w['errors']} | {w['ok_p50_ms']:.0f} / {w['ok_p99_ms']:.0f} |")
    print("\nserver RSS over time (MB):", " ".join(f"{t:.0f}s:{mb:.0f}" for t, mb in memory[::5]))


# -- the run ------------------------------------------------------------------------------------------


def sustainable_rate(port: int, body: Callable[[int], bytes], seconds: float, clients: int) -> dict[str, float]:
    asyncio.run(run_load("127.0.0.1", port, clients, min(3.0, seconds), body))  # warm-up
    return asyncio.run(run_load("127.0.0.1", port, clients, seconds, body)).summary()


def run(args: argparse.Namespace) -> dict:
    machine = describe()
    print(headline(machine), flush=True)
    models_dir = bench_models_dir(args.models_dir, args.bench_model)
    body = body_maker(bench_sentences())
    env = dict(item.split("=", 1) for item in args.server_env)
    port = free_port()
    server = start_server(models_dir, port, env, log=SERVER_LOG)
    try:
        calibration = sustainable_rate(port, body, args.calibrate_seconds, args.clients)
        rate = calibration["requests_per_s"]
        print(f"sustainable: {rate:.1f} req/s at {args.clients} clients (closed loop), "
              f"p50 {calibration['p50_ms']:.0f} ms, p99 {calibration['p99_ms']:.0f} ms", flush=True)
        trace = MemoryTrace(server.pid)
        plan = [
            ("normal (before)", args.normal_fraction * rate, args.normal_seconds),
            (f"overload ({args.factor:g}x)", args.factor * rate, args.overload_seconds),
            ("normal (after)", args.normal_fraction * rate, args.normal_seconds),
        ]
        started = time.perf_counter()
        rows, outcomes = [], []
        for seed, (name, offered, seconds) in enumerate(plan):
            begin = time.perf_counter() - started
            before = server_counts(port)
            load = open_loop("127.0.0.1", port, offered, seconds, body, seed=seed)
            outcomes = asyncio.run(traced(trace, started, load))
            memory = trace.between(begin, time.perf_counter() - started)
            counts = {k: v - before.get(k, 0.0) for k, v in server_counts(port).items()}
            rows.append(summarise(name, offered, seconds, outcomes, memory, counts))
            print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in rows[-1].items()}), flush=True)
        recovery = windows(outcomes, args.normal_seconds)
    finally:
        stop_server(server)
    print_tables(rows, recovery, trace.samples)
    result = {"machine": machine, "calibration": calibration, "phases": rows, "recovery": recovery}
    result["rss"] = trace.samples
    out = ROOT / "runs" / "bench" / "overload.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.overload", description=description_of(__doc__))
    parser.add_argument("--models-dir", type=Path, default=None)
    parser.add_argument("--bench-model", choices=sorted(BENCH_MODELS), default=None, help="serve a random model")
    parser.add_argument(
        "--clients", type=positive_int, default=32, help="closed-loop clients that find the sustainable rate"
    )
    parser.add_argument("--calibrate-seconds", type=positive_float, default=20.0)
    parser.add_argument("--factor", type=positive_float, default=4.0, help="overload = factor x the sustainable rate")
    parser.add_argument("--normal-fraction", type=positive_float, default=0.5, help="normal load = this x sustainable")
    parser.add_argument("--overload-seconds", type=positive_float, default=60.0)
    parser.add_argument("--normal-seconds", type=positive_float, default=30.0)
    parser.add_argument("--server-env", action="append", default=[], metavar="MT_X=V", help="a server setting")
    result = run(parser.parse_args(argv))
    overload = result["phases"][1]
    after = result["recovery"][-1]
    print(f"\nrefusals answered in {overload['to_503_p99_ms']:.1f} ms (p99); admitted p99 under overload "
          f"{overload['ok_p99_ms']:.0f} ms; errors in the last recovery window: {after['errors']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
