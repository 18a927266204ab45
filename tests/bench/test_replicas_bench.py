"""bench.replicas without a Docker engine: what it reads from HAProxy's exporter and Prometheus's API, and the
env file it gives docker compose (each replica its share of the CPUs)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import bench.replicas as replicas

EXPORTER = """# HELP haproxy_backend_active_servers Current number of active servers
haproxy_backend_active_servers{proxy="other"} 5
haproxy_backend_active_servers{proxy="translators"} 2
"""
QUERY = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1.0, "12.5"]}]}}


@pytest.fixture
def endpoint() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            if self.path == "/metrics":
                body = EXPORTER.encode()
            elif "query=empty" in self.path:
                body = json.dumps({"data": {"result": []}}).encode()
            else:
                body = json.dumps(QUERY).encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_it_reads_the_replicas_in_rotation_and_prometheus_values(endpoint: str) -> None:
    assert replicas.ready_replicas(endpoint) == 2
    assert replicas.query(endpoint, "sum(mt_queue_depth)") == 12.5
    assert replicas.query(endpoint, "empty") != replicas.query(endpoint, "empty")  # nan: no series


def test_each_replica_gets_its_share_of_the_cpus(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    seen: list[tuple[list[str], str, tuple[str, ...]]] = []

    def compose(project: str, files: list[str], env_file: Path, *args: str, timeout: float = 600) -> None:
        seen.append((files, env_file.read_text(), args))
        if args[0] == "up":
            raise SystemExit("stop here")

    monkeypatch.setattr(replicas, "compose", compose)
    args = replicas.argparse.Namespace(cpus=2.0, image="img:tag", clients=[8], seconds=1.0)
    for count, files, cpus in ((2, ["docker-compose.yml", "docker-compose.scale.yml"], "1"), (None, None, "2")):
        seen.clear()
        with pytest.raises(SystemExit, match="stop here"):
            replicas.measure_stack(args, ["a sentence"], count)
        (up_files, env, up), (_, _, down) = seen
        assert up[0] == "up" and down[0] == "down", "the stack is taken down whatever happened"
        assert up_files == (files or ["docker-compose.yml"])
        assert f"MT_CPUS={cpus}\n" in env and "MT_IMAGE=img:tag\n" in env
