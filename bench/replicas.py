"""Scale-out benchmark: the compose stack of docker-compose.scale.yml (HAProxy in front of MT_REPLICAS
translators, each with cores / replicas CPUs) under N closed-loop clients sending the test set's sentences, one per
request, through the balancer: throughput, p50/p95/p99 latency, errors, and the queue the replicas reported
meanwhile (Prometheus's view of mt_queue_depth and mt_queue_expected_wait_seconds, averaged over the window). With
--direct, also the single translator of docker-compose.yml alone, published without a balancer, on every core.

    python -m bench.replicas --corpus data/corpus                    # 1 and 2 replicas, 8 and 32 clients
    python -m bench.replicas --replicas 1,2,4 --cpus 8 --clients 32,128 --direct

Needs a Docker engine with Compose v2 (shared/docker-local.sh); the load generator (bench.load) runs on this
machine beside the containers, so on a small machine it takes some of their cores. The rows go to
runs/bench/replicas.json with the machine (bench/machine.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from bench.load import run_load
from bench.machine import describe, headline
from bench.server import free_port, sentences
from service.arguments import description_of, positive_float, positive_int

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "runs" / "bench" / "replicas.json"


def compose(project: str, files: list[str], env_file: Path, *args: str, timeout: float = 600) -> None:
    command = ["docker", "compose", "--project-name", project, "--project-directory", str(ROOT)]
    for file in files:
        command += ["--file", str(ROOT / file)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MT_", "COMPOSE_", "HAPROXY_", "PROMETHEUS_"))}
    result = subprocess.run(
        [*command, "--env-file", str(env_file), *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise SystemExit(f"docker compose {' '.join(args)} failed:\n{result.stderr[-3000:]}")


def query(prometheus: str, expr: str) -> float:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as response:
        result = json.load(response)["data"]["result"]
    return float(result[0]["value"][1]) if result else float("nan")


def ready_replicas(stats: str) -> int:
    with urllib.request.urlopen(f"{stats}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith('haproxy_backend_active_servers{proxy="translators"}'):
                return int(float(line.split()[-1]))
    return 0


def wait_for(check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit("the stack did not come up in time")


def measure_stack(args: argparse.Namespace, texts: list[str], replicas: int | None) -> list[dict[str, Any]]:
    """replicas None: docker-compose.yml's single translator, published directly."""
    port, stats, prometheus = free_port(), free_port(), free_port()
    cpus = args.cpus if replicas is None else args.cpus / replicas
    files = ["docker-compose.yml"] + ([] if replicas is None else ["docker-compose.scale.yml"])
    project = f"mt-bench-replicas-{os.getpid()}"
    with tempfile.TemporaryDirectory() as folder:
        env_file = Path(folder) / "bench.env"
        env_file.write_text(
            f"MT_PORT={port}\nHAPROXY_STATS_PORT={stats}\nPROMETHEUS_PORT={prometheus}\nMT_IMAGE={args.image}\n"
            f"MT_REPLICAS={replicas or 1}\nMT_CPUS={cpus:g}\nMT_MAX_QUEUE_WAIT_SECONDS=0\n"
        )
        rows = []
        try:
            compose(project, files, env_file, "up", "--detach", "--build", "--wait", "--wait-timeout", "300")
            if replicas is not None:
                wait_for(lambda: ready_replicas(f"http://127.0.0.1:{stats}") == replicas, 120)
            base = f"http://127.0.0.1:{prometheus}"
            wait_for(lambda: query(base, 'count(up{job="translator"} == 1)') == (replicas or 1), 120)

            def body(i: int) -> bytes:
                return json.dumps({"q": texts[i % len(texts)], "source": "en", "target": "fr"}).encode()

            for clients in args.clients:
                asyncio.run(run_load("127.0.0.1", port, clients, 5.0, body))  # warm-up at this concurrency
                summary = asyncio.run(run_load("127.0.0.1", port, clients, args.seconds, body)).summary()
                time.sleep(6)  # one more scrape (5 s) of the window's end
                window = f"[{int(args.seconds)}s:1s]"
                depth = query(base, f"avg_over_time((sum(mt_queue_depth) / count(up{{job='translator'}})){window})")
                wait = query(base, f"avg_over_time(max(clamp_min(mt_queue_expected_wait_seconds, 0)){window})")
                row = {
                    "setup": "direct" if replicas is None else f"{replicas} x {cpus:g} CPU",
                    "replicas": replicas or 1,
                    "cpus_per_replica": cpus,
                    "balancer": replicas is not None,
                    **summary,
                    "queue_depth_per_replica": depth,
                    "expected_wait_s": wait,
                }
                rows.append(row)
                print_row(row)
        finally:
            compose(project, files, env_file, "down", "--volumes", "--remove-orphans", "--timeout", "20")
    return rows


def print_row(row: dict[str, Any]) -> None:
    print(
        f"{row['setup']:>14} {row['clients']:>7} {row['requests_per_s']:>8.1f} {row['tokens_per_s']:>8.0f} "
        f"{row['p50_ms']:>7.0f} {row['p95_ms']:>7.0f} {row['p99_ms']:>7.0f} {row['errors']:>6} "
        f"{row['queue_depth_per_replica']:>8.1f} {row['expected_wait_s']:>8.3f}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.replicas", description=description_of(__doc__))
    parser.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus")
    parser.add_argument("--replicas", default="1,2", help="replica counts, comma-separated")
    parser.add_argument("--cpus", type=positive_float, default=float(len(os.sched_getaffinity(0))),
                        help="CPUs shared out between the replicas (default: this machine's)")  # fmt: skip
    parser.add_argument("--clients", default="8,32")
    parser.add_argument("--seconds", type=positive_float, default=20.0)
    parser.add_argument("--sentences", type=positive_int, help="the test set's first N (default: all of it)")
    parser.add_argument("--image", default="transformer-mt-server:latest")
    parser.add_argument("--direct", action="store_true", help="also the single translator without a balancer")
    args = parser.parse_args(argv)
    args.clients = [int(c) for c in args.clients.split(",")]
    texts = sentences(args.corpus, args.sentences)
    machine = describe()
    print(headline(machine))
    print(f"{'setup':>14} {'clients':>7} {'req/s':>8} {'tok/s':>8} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} "
          f"{'errors':>6} {'queue/r':>8} {'wait s':>8}")  # fmt: skip
    rows = []
    if args.direct:
        rows += measure_stack(args, texts, None)
    for replicas in (int(r) for r in args.replicas.split(",")):
        rows += measure_stack(args, texts, replicas)
    OUTPUT.parent.mkdir(parents=True, exist_ok=True)
    OUTPUT.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
