"""A small closed-loop HTTP load generator on raw asyncio streams (keep-alive HTTP/1.1): N clients, each
sending its next request as soon as the previous answer arrives. Light enough to share a 2-core machine
with the server it measures. Used by the server, overload and soak benchmarks.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class LoadResult:
    """Rates count the answered requests' share of the measured window: a request that straddles the window's end
    counts for the part of it inside (its tokens spread evenly over its time). Counting whole requests over the
    time until the last one answers would credit the window with the drain, when fewer than N clients are left:
    7 % less on the paper-size model, whose requests take 2.5 s."""

    clients: int
    seconds: float  # the measured window: from the start until the clients stop sending
    latencies: list[float] = field(default_factory=list)  # seconds, answered requests only
    statuses: dict[int, int] = field(default_factory=dict)
    output_tokens: int = 0  # of every answered request
    failures: int = 0  # connection errors, not HTTP statuses
    answered: list[tuple[float, float, int]] = field(default_factory=list)  # (sent, answered, output tokens)

    @property
    def ok(self) -> int:
        return self.statuses.get(200, 0)

    def in_window(self) -> tuple[float, float]:
        """(requests, output tokens) answered within the window, straddlers pro rata."""
        requests = tokens = 0.0
        for sent, answered, n in self.answered:
            share = 1.0 if answered <= self.seconds else max(0.0, self.seconds - sent) / (answered - sent)
            requests, tokens = requests + share, tokens + share * n
        return requests, tokens

    @property
    def errors(self) -> int:
        return sum(n for status, n in self.statuses.items() if status != 200) + self.failures

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) if self.latencies else float("nan")

    def summary(self) -> dict[str, float]:
        requests, tokens = self.in_window()
        return {
            "clients": self.clients,
            "requests_per_s": requests / self.seconds,
            "tokens_per_s": tokens / self.seconds,
            "mean_ms": 1000 * float(np.mean(self.latencies)) if self.latencies else float("nan"),
            "p50_ms": 1000 * self.percentile(50),
            "p95_ms": 1000 * self.percentile(95),
            "p99_ms": 1000 * self.percentile(99),
            "errors": self.errors,
        }


class Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if self.writer is None or self.writer.is_closing():
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.write(head + body)
        await self.writer.drain()
        assert self.reader is not None
        status_line = await self.reader.readline()
        headers = {}
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        payload = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection") == "close":
            self.writer.close()
        return int(status_line.split()[1]), headers, payload

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def run_load(
    host: str, port: int, clients: int, seconds: float, next_body: Callable[[int], bytes], path: str = "/translate"
) -> LoadResult:
    """`clients` closed loops for `seconds`; next_body(i) gives the i-th request's JSON body."""
    result = LoadResult(clients, seconds)
    counter = iter(range(10**12))
    window_start = time.perf_counter()
    deadline = window_start + seconds

    async def client() -> None:
        connection = Connection(host, port)
        try:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    status, _, payload = await connection.request(path, next_body(next(counter)))
                except (OSError, asyncio.IncompleteReadError):
                    result.failures += 1
                    connection.close()
                    connection = Connection(host, port)
                    await asyncio.sleep(0.01)
                    continue
                result.statuses[status] = result.statuses.get(status, 0) + 1
                if status == 200:
                    answered = time.perf_counter()
                    result.latencies.append(answered - started)
                    tokens = json.loads(payload)["usage"]["output_tokens"]
                    result.output_tokens += tokens
                    result.answered.append((started - window_start, answered - window_start, tokens))
        finally:
            connection.close()

    await asyncio.gather(*(client() for _ in range(clients)))
    return result
