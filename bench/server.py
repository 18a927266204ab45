"""Server benchmark: the real server on loopback under 1, 8, 32 and 128 concurrent clients sending real
sentences (one per request, the default model's test set): throughput, p50/p95/p99 latency, errors;
continuous batching vs the static mode vs one sentence at a time; int8 vs fp32. The engine's own
batch-32 throughput on the same sentences is measured alongside, as the ceiling to compare with: warm (a pass to
warm up, then passes for --engine-seconds), before and after the servers of its round, whose rows are set against
the mean of the two.

    python -m bench.server                      # everything (about 15 minutes)
    python -m bench.server --modes continuous --variants int8 --clients 32
    python -m bench.server --modes one-process,continuous,continuous-1t,continuous-all-cores --clients 32,128
        # the engine process against threads of one process; one decoder thread per step, or one per core
    python -m bench.server --modes continuous --variants int8 --clients 32 --rounds 5
        # the issue's server target: 5 rounds of (engine alone, the server, the engine again), each server run
        # against the engine bracketing it, and a summary: medians, spreads, rounds at or above 90 %

Each row gives the server's share of the engine in both layouts: one batch of 32 on every thread (`% of 1 x 32`)
and 2 x 16 on a thread each (`% of 2 x 16`). On this shared machine one run moves by 10-20 %: quote rounds. The
output starts with the machine (bench/machine.py); runs/bench/server.json keeps it with the rows. A second table
says where each run's time went: the decoder's steps' share of the wall, its rows per step, and the cores the
server's processes and the load generator used (from /proc and the server's /metrics). A third says where a
request's time went, from the server's own histograms: in the HTTP process, queued in the engine, waiting to join
the decoder batch (the encoder thread, its pass, the step in progress), in the batch, and the rest.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from math import nan
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.load import run_load
from bench.machine import describe, headline
from bench.processes import cpu_seconds, own_cpu_seconds
from service.arguments import description_of, positive_float, positive_int

ROOT = Path(__file__).resolve().parent.parent
ENGINE_THREADS = 2  # the engine alone: this project's development machines have 2 cores
MODES = {  # server settings per mode
    "continuous": {"MT_BATCHING": "continuous"},  # streams and threads as the model's size says (the defaults)
    "continuous-1t": {"MT_BATCHING": "continuous", "MT_INTRA_OP_THREADS": "1"},  # one thread per decoder step
    "continuous-all-cores": {  # one stream, every core in its steps
        "MT_BATCHING": "continuous",
        "MT_DECODER_STREAMS": "1",
        "MT_INTRA_OP_THREADS": str(len(os.sched_getaffinity(0))),
    },
    "continuous-unpinned": {"MT_BATCHING": "continuous", "MT_PIN_CORES": "false"},  # the kernel places all threads
    "continuous-1-stream": {"MT_BATCHING": "continuous", "MT_DECODER_STREAMS": "1"},
    "continuous-2-streams": {"MT_BATCHING": "continuous", "MT_DECODER_STREAMS": "2"},  # two batches, cores split
    "one-process": {"MT_BATCHING": "continuous", "MT_ENGINE_PROCESS": "false"},  # the engine as threads
    "static": {"MT_BATCHING": "static"},
    "sequential": {"MT_BATCHING": "static", "MT_MAX_BATCH_ROWS": "1"},
}


def sentences(corpus: Path, limit: int | None = None) -> list[str]:
    """The test set's sentences, the first `limit` of them (None: all). The test set runs project by project: its
    first 1,000 sentences are shorter than its last (target tokens p99 72 against 98 here), so a prefix is not a
    sample of it."""
    path = corpus / "test.en"
    if not path.is_file():
        raise SystemExit(f"{path} not found: build the corpus first (python -m model_export.corpus build)")
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()][:limit]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVER_LOG = ROOT / "runs" / "bench" / "server.log"  # where the benchmarks' servers write their log lines


def start_server(
    models_dir: Path, port: int, env: dict[str, str], checkout: Path = ROOT, log: Path | None = None
) -> subprocess.Popen[bytes]:
    """`python -m service` from `checkout` (its code; this one by default) on `models_dir`, ready to serve, with
    the server's own defaults but for `env` (its log level too: at INFO a line a request, part of what is
    measured); its output appended to `log` (None: ours)."""
    environment = {**os.environ, "MT_MODELS_DIR": str(models_dir), **env}
    output = None
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        output = log.open("ab")
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port)],
            env=environment,
            cwd=checkout,
            stdout=output,
            stderr=subprocess.STDOUT if output else None,
        )
    finally:
        if output is not None:
            output.close()  # the server holds its own descriptor
    seen = f" (its output: {log})" if log is not None else ""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server in {checkout} exited with status {process.returncode}{seen}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200:
                return process
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise SystemExit(f"the server in {checkout} did not become ready{seen}")


def stop_server(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)


def engine_throughput(folder: Path, variant: str, texts: list[str], streams: int, seconds: float) -> float:
    """(In the engine's own process.) Target tokens/s of the engine alone, warm: static batches of 32 (as `streams`
    sub-batches decoded at once, the two threads split between them), the same sentences, greedy; one pass to warm
    up (a fresh runtime's first pass ran 3-28 % below the next ones here), then whole passes until `seconds`
    have gone, as the server is measured over a window after its own warm-up."""
    from model_export.evaluate import StaticBatches

    engine = StaticBatches(folder, variant, ENGINE_THREADS, streams)
    engine.translate(texts, 1, 32)
    tokens, elapsed = 0, 0.0
    while True:  # at least one measured pass
        _, generated, took = engine.translate(texts, 1, 32)
        tokens, elapsed = tokens + generated, elapsed + took
        if elapsed >= seconds:
            return tokens / elapsed


def engine_ceiling(models_dir: Path, variant: str, texts: list[str], streams: int, seconds: float) -> float:
    """engine_throughput in a process of its own, the server stopped."""
    code = (
        "import sys, json\n"
        "from pathlib import Path\n"
        "from bench.server import engine_throughput\n"
        "texts = json.loads(sys.stdin.read())\n"
        f"folder = next(p for p in Path({str(models_dir)!r}).iterdir() if (p / 'manifest.json').exists())\n"
        f"print(engine_throughput(folder, {variant!r}, texts, {streams}, {seconds}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], input=json.dumps(texts), capture_output=True, text=True, cwd=ROOT, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def measure(port: int, pid: int, texts: list[str], clients: int, seconds: float) -> dict[str, float]:
    """`clients` closed loops for `seconds` after 3 s of warm-up: the load's figures (bench.load) and what serving it
    took (server_usage)."""

    def body(i: int) -> bytes:
        return json.dumps({"q": texts[i % len(texts)], "source": "en", "target": "fr"}).encode()

    asyncio.run(run_load("127.0.0.1", port, clients, 3.0, body))  # warm-up at this concurrency
    before, loadgen_cpu, started = server_usage(port, pid), time.process_time(), time.perf_counter()
    summary = asyncio.run(run_load("127.0.0.1", port, clients, seconds, body)).summary()
    after, elapsed = server_usage(port, pid), time.perf_counter() - started
    return {**summary, **usage_figures(before, after, time.process_time() - loadgen_cpu, elapsed)}


# A request's stages: name -> the server's histogram of it, and the labels it must have (summed over the rest)
STAGES = {
    "server": ("mt_http_request_duration_seconds", {"route": "/translate"}),  # received to answered (HTTP process)
    "queue": ("mt_queue_wait_seconds", {}),  # queued in the engine, to admitted
    "join": ("mt_join_wait_seconds", {}),  # admitted, to its first step: encoder thread, pass, the step in progress
    "decoding": ("mt_decoding_seconds", {}),  # its first step to its last
}
# The running totals read from a server's metrics: name -> (sample, the labels it must have), summed over the rest
TOTALS = {
    "steps": ("mt_decoder_step_duration_seconds_count", {}),
    "step_seconds": ("mt_decoder_step_duration_seconds_sum", {}),
    "rows": ("mt_decoder_step_rows_sum", {}),
    **{
        f"{stage}_{part}": (f"{metric}_{part}", labels)
        for stage, (metric, labels) in STAGES.items()
        for part in ("count", "sum")
    },
}


def server_usage(port: int, pid: int) -> dict[str, float]:
    """Running totals: the CPU seconds of the server and its engine processes, and of the server's own (HTTP)
    process alone (/proc), and metric_totals of its /metrics."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
    http = own_cpu_seconds(pid)  # before the whole, which then counts at least as much of this process
    return {"cpu_seconds": cpu_seconds(pid), "http_cpu_seconds": http, **metric_totals(text)}


def metric_totals(text: str) -> dict[str, float]:
    """TOTALS from a server's metrics (Prometheus text): the decoder steps, their seconds and their rows, and each
    request stage's count and seconds (`{stage}_count`, `{stage}_sum`), summed over models and streams."""
    totals = dict.fromkeys(TOTALS, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for total, (name, labels) in TOTALS.items():
                if sample.name == name and labels.items() <= sample.labels.items():
                    totals[total] += sample.value
    return totals


def usage_figures(
    before: dict[str, float], after: dict[str, float], loadgen_cpu: float, elapsed: float
) -> dict[str, float]:
    """Where a run's time went: the decoder's steps' share of the wall (per stream, summed: 2.0 is two streams
    stepping all the time), the cores the server's processes and the load generator used, the HTTP process's CPU
    per /translate request in µs (it shares a core with the encoder thread: docs/performance.md, "What bounds the
    server here"), and batch_figures."""
    requests = after["server_count"] - before["server_count"]
    http_seconds = after["http_cpu_seconds"] - before["http_cpu_seconds"]
    return {
        "decoder_busy": (after["step_seconds"] - before["step_seconds"]) / elapsed,
        "server_cores": (after["cpu_seconds"] - before["cpu_seconds"]) / elapsed,
        "loadgen_cores": loadgen_cpu / elapsed,
        "http_us_per_request": 1e6 * http_seconds / requests if requests else nan,
        **batch_figures(before, after),
    }


def batch_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """From two metric_totals: the rows per decoder step in between, and each request stage's mean in ms
    (`{stage}_ms`, STAGES; nan when none was timed)."""
    delta = {key: after[key] - before[key] for key in TOTALS}
    stages = {
        f"{stage}_ms": 1000 * delta[f"{stage}_sum"] / delta[f"{stage}_count"] if delta[f"{stage}_count"] else nan
        for stage in STAGES
    }
    return {"rows_per_step": delta["rows"] / delta["steps"] if delta["steps"] else 0.0, **stages}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.server", description=description_of(__doc__))
    parser.add_argument("--models-dir", type=Path, default=ROOT / "models")
    parser.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus")
    parser.add_argument("--modes", default="continuous,static,sequential")
    parser.add_argument("--variants", default="int8,fp32")
    parser.add_argument("--clients", default="1,8,32,128")
    parser.add_argument("--seconds", type=positive_float, default=20.0)
    parser.add_argument("--sentences", type=positive_int, help="the test set's first N (default: all of it)")
    parser.add_argument(
        "--rounds", type=positive_int, default=1,
        help="repeat (engine alone, every mode, the engine again) this many times",
    )
    parser.add_argument(
        "--engine-seconds", type=positive_float, default=10.0,
        help="the engine alone's measured window, after a warm-up pass",
    )
    parser.add_argument("--server-log", type=Path, default=SERVER_LOG, help="the servers' output, appended")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    texts = sentences(args.corpus, args.sentences)
    machine = describe()
    print(headline(machine), flush=True)
    load = f"{len(texts):,} lines of {args.corpus / 'test.en'}" + ("" if args.sentences is None else " (its first)")
    print(f"load: {load}, a line a request; the servers' output: {args.server_log}", flush=True)
    rows = []
    for variant in args.variants.split(","):
        for round_ in range(1, args.rounds + 1):
            rows += run_round(args, texts, variant, round_)
    print_rows(rows)
    print_usage(rows)
    print_stages(rows)
    if args.rounds > 1:
        print_summary(rows)
    out = ROOT / "runs" / "bench" / "server.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "load": load, "rows": rows}, indent=2))
    return 0


def run_round(args: argparse.Namespace, texts: list[str], variant: str, round_: int) -> list[dict]:
    """The engine alone (one batch of 32, then 2 x 16), every mode served, then the engine's one batch again: each
    server run is set against the mean of the two, which brackets it (this machine's speed drifts by 10-20 % over
    minutes)."""
    ceiling = functools.partial(engine_ceiling, args.models_dir, variant, texts, seconds=args.engine_seconds)
    before, two = ceiling(streams=1), ceiling(streams=2)
    print(
        f"round {round_}: engine alone, {variant}, batch 32: {before:,.0f} target tok/s, "
        f"as 2 x 16 on a thread each {two:,.0f}",
        flush=True,
    )
    served = [row for mode in args.modes.split(",") for row in serve_mode(args, texts, variant, mode)]
    after = ceiling(streams=1)
    print(f"round {round_}: engine alone again, batch 32: {after:,.0f} target tok/s", flush=True)
    for row in served:
        row.update(bracketed(round_, before, after, two, row["tokens_per_s"]))
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}), flush=True)
    return served


def bracketed(round_: int, before: float, after: float, two: float, served: float) -> dict[str, float]:
    """A server run's engine figures: its one-batch ceiling is the mean of the engine measured before and after it."""
    one = (before + after) / 2
    return {
        "round": round_,
        "engine_1x32": one,
        "engine_1x32_before": before,
        "engine_1x32_after": after,
        "engine_2x16": two,
        "of_1x32": served / one,
        "of_2x16": served / two,
    }


def serve_mode(args: argparse.Namespace, texts: list[str], variant: str, mode: str) -> list[dict]:
    """One server in `mode`, measured at each client count."""
    rows = []
    port = free_port()
    server = start_server(args.models_dir, port, {"MT_VARIANT": variant, **MODES[mode]}, log=args.server_log)
    try:
        for clients in (int(c) for c in args.clients.split(",")):
            rows.append({"variant": variant, "mode": mode, **measure(port, server.pid, texts, clients, args.seconds)})
            print(f"  {mode}, {clients} clients: {rows[-1]['tokens_per_s']:,.0f} target tok/s", flush=True)
    finally:
        stop_server(server)
    return rows


def rest_ms(r: dict) -> float:
    """A request's time in the server outside the engine's stages: the HTTP side's own work and the pipes."""
    return r["server_ms"] - r["queue_ms"] - r["join_ms"] - r["decoding_ms"]


def print_runs(rows: list[dict], columns: dict[str, Callable[[dict], str]]) -> None:
    """A table of one line per run: its round, variant, mode and clients, then `columns` (header -> its cell)."""
    print("| round | variant | mode | clients | " + " | ".join(columns) + " |")
    print("|---:|---|---|---:|" + "---:|" * len(columns))
    for r in rows:
        cells = [str(r["round"]), r["variant"], r["mode"], str(r["clients"]), *(cell(r) for cell in columns.values())]
        print("| " + " | ".join(cells) + " |")


def print_rows(rows: list[dict]) -> None:
    print_runs(
        rows,
        {
            "requests/s": lambda r: f"{r['requests_per_s']:.1f}",
            "target tok/s": lambda r: f"{r['tokens_per_s']:,.0f}",
            "engine 1 x 32, before / after": lambda r: (
                f"{r['engine_1x32_before']:,.0f} / {r['engine_1x32_after']:,.0f}"
            ),
            "% of 1 x 32": lambda r: f"{100 * r['of_1x32']:.0f}%",
            "% of 2 x 16": lambda r: f"{100 * r['of_2x16']:.0f}%",
            "p50 ms": lambda r: f"{r['p50_ms']:.0f}",
            "p95 ms": lambda r: f"{r['p95_ms']:.0f}",
            "p99 ms": lambda r: f"{r['p99_ms']:.0f}",
            "p99 ÷ p50": lambda r: f"{r['p99_ms'] / r['p50_ms']:.2f}",
            "errors": lambda r: str(r["errors"]),
        },
    )


def print_usage(rows: list[dict]) -> None:
    """Where each run's time went (usage_figures): is the decoder busy, and are the cores full?"""
    print()
    print_runs(
        rows,
        {
            "decoder busy": lambda r: f"{r['decoder_busy']:.2f}",
            "rows per step": lambda r: f"{r['rows_per_step']:.1f}",
            "server cores": lambda r: f"{r['server_cores']:.2f}",
            "HTTP process µs per request": lambda r: f"{r['http_us_per_request']:.0f}",
            "load generator cores": lambda r: f"{r['loadgen_cores']:.2f}",
        },
    )


def print_stages(rows: list[dict]) -> None:
    """Where a request's time went, means in ms (one sentence a request: a request's stages are its sentence's).
    Client: as the load generator saw it; server: the HTTP process, received to answered; in the engine: queued,
    to its first step (the encoder thread's backlog, its pass, the step in progress), in the decoder batch; the
    rest of the server's time is the HTTP side's own work and the pipe to the engine and back."""
    print()
    print_runs(
        rows,
        {
            "client ms": lambda r: f"{r['mean_ms']:.1f}",
            "server ms": lambda r: f"{r['server_ms']:.1f}",
            "queue ms": lambda r: f"{r['queue_ms']:.1f}",
            "to first step ms": lambda r: f"{r['join_ms']:.1f}",
            "decoding ms": lambda r: f"{r['decoding_ms']:.1f}",
            "rest of the server ms": lambda r: f"{rest_ms(r):.1f}",
        },
    )


def print_summary(rows: list[dict]) -> None:
    """Per variant, mode and client count over the rounds: medians, spreads, rounds meeting the issue's targets
    (at least 90 % of the engine's one batch of 32; p99 at most 3x p50)."""
    print(
        "\n| variant | mode | clients | rounds | target tok/s, median | % of 1 x 32, median (min-max) | rounds >= 90 % "
        "| p99 ÷ p50, median (min-max) | rounds <= 3 | errors |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["variant"], r["mode"], r["clients"]), []).append(r)
    for (variant, mode, clients), group in groups.items():
        shares = [100 * r["of_1x32"] for r in group]
        ratios = [r["p99_ms"] / r["p50_ms"] for r in group]
        print(
            f"| {variant} | {mode} | {clients} | {len(group)} "
            f"| {statistics.median(r['tokens_per_s'] for r in group):,.0f} "
            f"| {statistics.median(shares):.0f}% ({min(shares):.0f}-{max(shares):.0f}) "
            f"| {sum(s >= 90 for s in shares)} | {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) "
            f"| {sum(x <= 3 for x in ratios)} | {sum(r['errors'] for r in group)} |"
        )


if __name__ == "__main__":
    sys.exit(main())
