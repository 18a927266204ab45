"""Soak benchmark: the real server on loopback under a steady moderate open-loop load (a fraction of its
sustainable rate) for many minutes: errors and latency per window, and the growth of its resident memory
(VmRSS) after warm-up, which must stay under 5 %. Exits 1 when there were errors or memory grew more.

    python -m bench.soak --minutes 30                # the full run
    python -m bench.soak --minutes 2                 # a short check that it works

Same model choice as bench.overload (--models-dir, --bench-model).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

import numpy as np

from bench.machine import describe, headline
from bench.overload import (
    BENCH_MODELS,
    ROOT,
    MemoryTrace,
    Outcome,
    bench_models_dir,
    bench_sentences,
    body_maker,
    ms,
    open_loop,
    sustainable_rate,
)
from bench.server import SERVER_LOG, free_port, start_server, stop_server
from service.arguments import description_of, non_negative_float, positive_float

MAX_GROWTH = 0.05


def window_row(index: int, seconds: float, outcomes: list[Outcome], memory: list[float]) -> dict:
    ok = [o.seconds for o in outcomes if o.status == 200]
    errors: dict[int, int] = {}
    for o in outcomes:
        if o.status != 200:
            errors[o.status] = errors.get(o.status, 0) + 1
    return {
        "window": index,
        "seconds": seconds,
        "sent": len(outcomes),
        "ok_per_s": len(ok) / seconds,
        "errors": errors,
        "p50_ms": ms(ok, 50),
        "p99_ms": ms(ok, 99),
        "rss_median_mb": float(np.median(memory)) if memory else float("nan"),
        "rss_max_mb": max(memory) if memory else float("nan"),
    }


async def soak(port: int, pid: int, rate: float, windows: int, window_seconds: float, seed: int) -> list[dict]:
    trace, rows = MemoryTrace(pid), []
    started = time.perf_counter()
    sampler = asyncio.ensure_future(trace.run(started))
    body = body_maker(bench_sentences())
    try:
        for index in range(windows):
            begin = time.perf_counter() - started
            outcomes = await open_loop("127.0.0.1", port, rate, window_seconds, body, seed=seed + index)
            memory = trace.between(begin, time.perf_counter() - started)
            rows.append(window_row(index, window_seconds, outcomes, memory))
            print(json.dumps({k: round(v, 2) if isinstance(v, float) else v for k, v in rows[-1].items()}), flush=True)
    finally:
        sampler.cancel()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=description_of(__doc__))
    parser.add_argument("--minutes", type=positive_float, default=30.0)
    parser.add_argument(
        "--warmup-minutes", type=non_negative_float, default=None, help="default: a quarter of the run, at most 5"
    )
    parser.add_argument(
        "--rate", type=positive_float, default=None, help="requests/s; default: --fraction x sustainable"
    )
    parser.add_argument(
        "--fraction", type=positive_float, default=0.3, help="of the sustainable rate (closed loop, 32)"
    )
    parser.add_argument("--models-dir", type=Path, default=None)
    parser.add_argument("--bench-model", choices=sorted(BENCH_MODELS), default=None, help="serve a random model")
    parser.add_argument("--server-env", action="append", default=[], metavar="MT_X=V", help="a server setting")
    args = parser.parse_args(argv)
    warmup = args.warmup_minutes if args.warmup_minutes is not None else min(5.0, args.minutes / 4)
    window_seconds = min(60.0, args.minutes * 60 / 8)
    windows = max(2, round(args.minutes * 60 / window_seconds))
    warm_windows = max(1, round(warmup * 60 / window_seconds))

    machine = describe()
    print(headline(machine), flush=True)
    models_dir = bench_models_dir(args.models_dir, args.bench_model)
    port = free_port()
    server = start_server(models_dir, port, dict(item.split("=", 1) for item in args.server_env), log=SERVER_LOG)
    try:
        rate = args.rate
        if rate is None:
            rate = args.fraction * sustainable_rate(port, body_maker(bench_sentences()), 10.0, 32)["requests_per_s"]
        print(f"soak: {rate:.1f} req/s for {args.minutes:g} min ({windows} windows of {window_seconds:.0f} s), "
              f"warm-up {warm_windows} windows", flush=True)
        rows = asyncio.run(soak(port, server.pid, rate, windows, window_seconds, seed=7))
    finally:
        stop_server(server)

    warm = rows[warm_windows - 1]["rss_median_mb"]
    last = rows[-1]["rss_median_mb"]
    growth = (last - warm) / warm
    errors = sum(sum(r["errors"].values()) for r in rows)
    print("\n| window | sent | 200/s | errors | p50 ms | p99 ms | RSS median MB | RSS max MB |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['window']} | {r['sent']} | {r['ok_per_s']:.1f} | {sum(r['errors'].values())} {r['errors'] or ''} "
            f"| {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['rss_median_mb']:.1f} | {r['rss_max_mb']:.1f} |"
        )
    verdict = errors == 0 and growth < MAX_GROWTH
    print(f"\n{errors} errors; RSS {warm:.1f} MB after warm-up -> {last:.1f} MB at the end: {100 * growth:+.1f}% "
          f"(limit {100 * MAX_GROWTH:.0f}%): {'PASS' if verdict else 'FAIL'}")
    out = ROOT / "runs" / "bench" / "soak.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {"machine": machine, "rate": rate, "windows": rows, "rss_growth": growth, "errors": errors}
    out.write_text(json.dumps(result, indent=2))
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
