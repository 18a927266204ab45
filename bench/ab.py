"""Server A/B: two versions of the server, or two settings, served in turn at one concurrency, pair after pair.

On a shared machine a run moves by 10-20 % from one minute to the next (docs/performance.md), more than most
changes are worth; what survives that is the same load on A and B alternating, many times, A first in one pair and
B first in the next. Each arm is a checkout of this project (its own `service/` and `models/`; the current
interpreter runs both) and extra environment variables; each run starts a fresh server, warms it, measures a
window with `bench.server`'s load generator and stops it. Prints a line per run, then, for throughput, the HTTP
process's CPU per request, rows per step, a sentence's wait for its first step and the latencies: the means of
both arms, their ratio, the median ratio within a pair, in how many pairs B came out ahead, and a sign test over
the pairs (how likely so uneven a split is by chance: 4 pairs cannot go below p 0.125, 6 below 0.031). The change
table's side-by-side figures are runs of this.
    python -m bench.ab --a ../before --b .                                  # two checkouts, 6 pairs at 32 clients
    python -m bench.ab --a . --b . --b-env MT_PIN_CORES=false --pairs 4     # one checkout, two settings
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from bench.machine import describe, headline
from bench.server import SERVER_LOG, free_port, measure, sentences, start_server, stop_server
from service.arguments import description_of, positive_float, positive_int

ROOT = Path(__file__).resolve().parent.parent
# (key in bench.server's figures, label, whether lower is better)
FIGURES = (
    ("tokens_per_s", "target tok/s", False),
    ("http_us_per_request", "HTTP process µs per request", True),
    ("rows_per_step", "rows per step", False),
    ("join_ms", "to first step ms", True),
    ("p50_ms", "p50 ms", True),
    ("p99_ms", "p99 ms", True),
)


def served(
    tree: Path, env: dict[str, str], texts: list[str], clients: int, seconds: float, log: Path
) -> dict[str, float]:
    """One run: a fresh server, 3 s of warm-up at this concurrency, then the measured window."""
    port = free_port()
    process = start_server(tree / "models", port, env, tree, log)
    try:
        measure(port, process.pid, texts, clients, 3.0)
        return measure(port, process.pid, texts, clients, seconds)
    finally:
        stop_server(process)


class Row(NamedTuple):
    """One figure of the summary."""

    label: str
    a: float  # mean of A's runs
    b: float  # mean of B's runs
    ratio: float  # B's mean / A's
    pair_ratio: float  # median of each pair's B / A: one bad minute moves it less than the means
    better: int  # pairs in which B did better
    decided: int  # pairs that were not ties
    p: float  # two-sided sign test: how often `better` of `decided` (or a split as far from even) comes by chance


def summary(a: list[dict[str, float]], b: list[dict[str, float]]) -> list[Row]:
    """Per figure: the arms' means, their ratio, the median ratio within a pair, the pairs in which B did better
    (lower being better for costs and latencies) and a sign test over the pairs."""
    rows = []
    for key, label, lower_is_better in FIGURES:
        xa, xb = np.array([r[key] for r in a]), np.array([r[key] for r in b])  # (pairs,) each
        better = int(np.sum(xb < xa if lower_is_better else xb > xa))
        decided = int(np.sum(xb != xa))
        mean_a, mean_b, pair_ratio = float(xa.mean()), float(xb.mean()), float(np.median(xb / xa))
        p = sign_test(better, decided)
        rows.append(Row(label, mean_a, mean_b, mean_b / mean_a, pair_ratio, better, decided, p))
    return rows


def sign_test(wins: int, trials: int) -> float:
    """Two-sided exact sign test: the chance of a split at least as uneven as `wins` of `trials` when either arm is
    as likely to win a pair (1.0 for no trials). Four pairs cannot go below 0.125, six below 0.031."""
    if not trials:
        return 1.0
    tail = min(wins, trials - wins)
    return min(1.0, 2 * sum(math.comb(trials, k) for k in range(tail + 1)) / 2**trials)


def alternate(pairs: int, run: Callable[[str], dict[str, float]]) -> dict[str, list[dict[str, float]]]:
    """`pairs` runs of each arm, A then B in even pairs and B then A in odd ones."""
    results: dict[str, list[dict[str, float]]] = {"A": [], "B": []}
    for pair in range(pairs):
        for arm in ("A", "B") if pair % 2 == 0 else ("B", "A"):
            results[arm].append(run(arm))
    return results


def environment(pairs: list[str]) -> dict[str, str]:
    env = {}
    for item in pairs:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--a-env/--b-env take NAME=VALUE, not {item!r}")
        env[name] = value
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=description_of(__doc__))
    parser.add_argument("--a", type=Path, default=ROOT, help="arm A's checkout (default: this one)")
    parser.add_argument("--b", type=Path, default=ROOT, help="arm B's checkout (default: this one)")
    parser.add_argument("--a-env", action="append", default=[], metavar="NAME=VALUE", help="for A's server")
    parser.add_argument("--b-env", action="append", default=[], metavar="NAME=VALUE", help="for B's server")
    parser.add_argument("--pairs", type=positive_int, default=6)
    parser.add_argument("--clients", type=positive_int, default=32)
    parser.add_argument("--seconds", type=positive_float, default=15.0, help="each run's measured window")
    parser.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus", help="holds test.en")
    parser.add_argument("--sentences", type=positive_int, help="the test set's first N (default: all of it)")
    parser.add_argument("--server-log", type=Path, default=SERVER_LOG, help="the servers' output, appended")
    args = parser.parse_args(argv)
    arms = {"A": (args.a.resolve(), environment(args.a_env)), "B": (args.b.resolve(), environment(args.b_env))}
    for name, (tree, _) in arms.items():
        if not (tree / "service").is_dir() or not (tree / "models").is_dir():
            raise SystemExit(f"--{name.lower()} {tree}: not a checkout of this project (no service/ or models/)")
    if arms["A"] == arms["B"]:
        raise SystemExit("A and B are the same checkout with the same settings: give --b, --a-env or --b-env")
    texts = sentences(args.corpus, args.sentences)
    print(headline(describe()), flush=True)
    for name, (tree, env) in arms.items():
        print(f"{name}: {tree} {' '.join(f'{k}={v}' for k, v in env.items())}".rstrip(), flush=True)
    print(f"the servers' output: {args.server_log}", flush=True)

    def run(arm: str) -> dict[str, float]:
        figures = served(*arms[arm], texts, args.clients, args.seconds, args.server_log)
        print(
            f"  {arm}: {figures['tokens_per_s']:,.0f} target tok/s, HTTP {figures['http_us_per_request']:,.0f} µs a "
            f"request, {figures['rows_per_step']:.1f} rows a step, first step {figures['join_ms']:.1f} ms, p50 "
            f"{figures['p50_ms']:.1f} ms, p99 {figures['p99_ms']:.1f} ms, errors {figures['errors']}",
            flush=True,
        )
        return figures

    results = alternate(args.pairs, run)
    print(f"\n{args.pairs} pairs of {args.seconds:g} s at {args.clients} clients, A and B alternating")
    print(
        "| figure | A, mean | B, mean | B ÷ A | B ÷ A in a pair, median | pairs where B did better | p, sign test |\n"
        "|---|---:|---:|---:|---:|---:|---:|"
    )
    for row in summary(results["A"], results["B"]):
        print(
            f"| {row.label} | {row.a:,.1f} | {row.b:,.1f} | {row.ratio:.3f} | {row.pair_ratio:.3f} "
            f"| {row.better} of {args.pairs} | {row.p:.3f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
