"""Faults, overload and security, each with its status code, its message, and a normal request answered
afterwards: an inference failure, broken model folders, SIGTERM draining, a client that goes away, slow
clients, admission (concurrency, expected queue wait, draining), limits enforced before tokenisation, keys
that never reach the logs, protected metadata, model names that are never paths, and CORS.

Most run in-process on the tiny model; the ones about signals, sockets and process exits run the real
server (`python -m service`) on a loopback port."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from service.api.admission import Throughput
from service.api.app import create_app
from service.api.state import State
from service.api.translate import TranslateEndpoint
from service.metrics import Metrics
from service.translation import translator as translator_module
from tests.service.test_api import fail_first_call, settings_for
from tests.service.test_e2e import free_port, metric, running_server, start_server, wait_ready

NORMAL = {"q": "Open the file.", "source": "en", "target": "fr"}
MODEL = "tiny-en-fr"
SENTENCES = "Open the file. Delete %d items? Cannot connect to the server. Hello world, how are you today?"


def answers_normally(client: TestClient | httpx.Client) -> None:
    response = client.post("/translate", json=NORMAL)
    assert response.status_code == 200, response.text
    assert response.json()["translatedText"]


def service_state(client: TestClient) -> State:
    return client.app.state.service


@pytest.fixture(scope="module")
def client(model_dir: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(model_dir))) as c:
        yield c


# -- faults, in-process ------------------------------------------------------------------------------


def test_an_encoder_failure_is_500_for_its_request_only(model_dir: Path) -> None:
    with TestClient(create_app(settings_for(model_dir, engine_process=False))) as client:  # to reach the runtime
        translator = service_state(client).registry.translators[MODEL]
        translator.runtime.encode = fail_first_call(translator.runtime.encode)
        response = client.post("/translate", json=NORMAL)
        assert response.status_code == 500 and response.json() == {"error": "inference failed: RuntimeError"}
        assert metric(client.get("/metrics").text, "mt_inference_errors_total", f'{{model="{MODEL}"}}') >= 1
        assert client.get("/ready").status_code == 200
        answers_normally(client)


def test_a_body_sent_in_chunks_is_held_to_the_size_limit(model_dir: Path) -> None:
    with TestClient(create_app(settings_for(model_dir, max_body_bytes=1000))) as c:

        def chunks() -> Iterator[bytes]:  # no Content-Length: only counting while reading can stop it
            yield b'{"q": "'
            for _ in range(100):
                yield b"x" * 100
            yield b'", "source": "en", "target": "fr"}'

        response = c.post("/translate", content=chunks(), headers={"content-type": "application/json"})
        assert response.status_code == 413, response.text
        assert response.json() == {"error": "the body is over 1000 bytes; the limit is 1000"}
        assert response.headers["connection"] == "close"
        answers_normally(c)


# -- faults, the real process ------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_a_missing_or_truncated_graph_stops_the_start(model_dir: Path, tmp_path: Path, damage: str) -> None:
    broken = Path(shutil.copytree(model_dir, tmp_path / model_dir.name))
    graph = broken / "encoder.onnx"
    if damage == "missing":
        graph.unlink()
        expected = "encoder.onnx: missing (listed in manifest.json)"
    else:
        graph.write_bytes(graph.read_bytes()[:1000])
        expected = "encoder.onnx: 1000 bytes, the manifest says"
    process = start_server(broken, free_port())
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1, output
    assert "cannot start:" in output and expected in output, output
    assert "Traceback" not in output


@pytest.fixture(scope="module")
def live(model_dir: Path) -> Iterator[str]:
    """The real server with a 1 s body timeout (slow-client tests)."""
    with running_server(model_dir, MT_BODY_TIMEOUT_SECONDS="1", MT_LOG_LEVEL="WARNING") as url:
        yield url


def wait_for(condition: Callable[[], object], seconds: float, what: str | Callable[[], str]) -> None:
    """Until `condition()` is true; else fails saying `what` (a callable: what was seen last, for CI's log)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what() if callable(what) else what} within {seconds} s")


def slow_request_in_flight(url: str, texts: int) -> tuple[threading.Thread, dict[str, httpx.Response]]:
    """A beam-8 request of `texts` texts (4 sentences each), sent on a thread of its own and in flight on return:
    the thread, and where its answer lands (`["r"]`)."""
    answer: dict[str, httpx.Response] = {}
    body = {"q": [SENTENCES] * texts, "source": "en", "target": "fr", "beam_size": 8}
    worker = threading.Thread(target=lambda: answer.update(r=httpx.post(f"{url}/translate", json=body, timeout=120)))
    worker.start()
    wait_for(lambda: metric(httpx.get(f"{url}/metrics").text, "mt_requests_in_flight") == 1, 30, "not in flight")
    return worker, answer


@pytest.mark.parametrize("to", ["server", "group"])
def test_sigterm_drains_then_exits_0(model_dir: Path, to: str) -> None:
    """`group`: SIGTERM to the whole process group, as systemd's default KillMode, `timeout` or `kill -- -PGID` send
    it: the engine process ignores it, and the server drains as before (the engine had died at once: a 500)."""
    port = free_port()
    # one beam-8 sentence at a time: the slow request below takes seconds, on any machine
    process = start_server(
        model_dir, port, MT_MAX_BATCH_ROWS="8", MT_SHUTDOWN_GRACE_SECONDS="120", MT_REQUEST_TIMEOUT_SECONDS="120"
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process)
        worker, slow = slow_request_in_flight(url, 24)
        if to == "group":
            os.killpg(process.pid, signal.SIGTERM)
        else:
            process.send_signal(signal.SIGTERM)
        wait_for(lambda: httpx.get(f"{url}/ready").status_code == 503, 10, "readiness not false")
        assert httpx.get(f"{url}/ready").json() == {"error": "shutting down"}
        refused = httpx.post(f"{url}/translate", json=NORMAL)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json() == {"error": "the server is shutting down; retry on another instance"}
        assert worker.is_alive(), "the slow request finished before the checks: make it slower"
        assert 'mt_rejected_requests_total{reason="shutting_down"} 1.0' in httpx.get(f"{url}/metrics").text
        worker.join(timeout=120)
        assert slow["r"].status_code == 200, slow["r"].text
        assert len(slow["r"].json()["translatedText"]) == 24
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
    output = process.stdout.read() if process.stdout else ""
    assert "draining: 1 requests in flight" in output and "Traceback" not in output
    assert "(event loop: uvloop)" in output or sys.platform == "win32"  # a pinned dependency (Performance)


@pytest.mark.parametrize("end", ["grace period", "second signal"])
def test_work_left_when_the_grace_period_ends_is_answered_503_before_the_exit(model_dir: Path, end: str) -> None:
    """SIGTERM with a 1 s grace period (or a 120 s one and a second SIGTERM 0.5 s later) and a request of seconds in
    flight: at the period's end that request gets a JSON 503 (shutting_down, with Retry-After) on its open
    connection, and the process exits 0 soon after; before, uvicorn's shutdown cancelled it 5 s later (a plain-text
    500 and an ASGI traceback)."""
    port = free_port()
    grace = "1" if end == "grace period" else "120"
    process = start_server(
        model_dir, port, MT_MAX_BATCH_ROWS="8", MT_SHUTDOWN_GRACE_SECONDS=grace, MT_REQUEST_TIMEOUT_SECONDS="120"
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process)
        worker, slow = slow_request_in_flight(url, 128)  # 512 sentences: long
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        if end == "second signal":
            time.sleep(0.5)
            process.send_signal(signal.SIGTERM)
        worker.join(timeout=30)
        answered = time.monotonic() - signalled
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
    output = process.stdout.read() if process.stdout else ""
    assert slow["r"].status_code == 503, slow["r"].text
    assert slow["r"].json() == {"error": "the server stopped before this request finished"}
    assert slow["r"].headers["retry-after"] == "1"
    assert answered < 4, f"answered {answered:.1f} s after SIGTERM, for a 1 s grace period or a second signal"
    over = "over" if end == "grace period" else "cut short by a second stop signal"
    assert f"grace period of {grace}s {over} with 1 requests in flight" in output
    assert "Traceback" not in output and "Exception in ASGI application" not in output, output


def test_max_connections_lets_that_many_in(model_dir: Path) -> None:
    """MT_MAX_CONNECTIONS=2: two open keep-alive connections are served, a third is refused (uvicorn counts the
    connection asking among the open ones: its limit of N had let N - 1 in)."""
    def ask(conn: socket.socket) -> bytes:
        conn.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        return conn.recv(4096).split(b"\r\n", 1)[0]

    with running_server(model_dir, MT_MAX_CONNECTIONS="2", MT_LOG_LEVEL="WARNING") as url:
        port = int(url.rsplit(":", 1)[1])
        conns: list[socket.socket] = []
        try:  # the readiness probes' connections may not be closed on the server's side yet: until two fit
            deadline = time.monotonic() + 10
            while [ask(c) for c in conns] != [b"HTTP/1.1 200 OK"] * 2:
                assert time.monotonic() < deadline, "two connections were never served at once"
                for conn in conns:
                    conn.close()
                time.sleep(0.2)
                conns = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
            conns.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            assert ask(conns[2]) == b"HTTP/1.1 503 Service Unavailable"
        finally:
            for conn in conns:
                conn.close()


def test_a_client_that_disconnects_frees_its_rows(live: str) -> None:
    port, labels = int(live.rsplit(":", 1)[1]), f'{{model="{MODEL}"}}'
    before = metric(httpx.get(f"{live}/metrics").text, "mt_cancelled_requests_total", labels)
    body = {"q": [SENTENCES] * 128, "source": "en", "target": "fr", "beam_size": 8}  # 512 sentences: long

    async def send_and_leave() -> None:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        payload = httpx.Request("POST", f"{live}/translate", json=body).read()
        writer.write(
            b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        await writer.drain()
        # until it is queued (closing sooner, the server may find the client gone before reading the body: a 499,
        # and no rows to free)
        while not metric((await asyncio.to_thread(httpx.get, f"{live}/metrics")).text, "mt_queue_depth", labels):
            await asyncio.sleep(0.05)
        writer.close()

    asyncio.run(asyncio.wait_for(send_and_leave(), 30))

    seen: dict[str, float] = {}

    def freed() -> bool:
        text = httpx.get(f"{live}/metrics").text
        seen["cancelled"] = metric(text, "mt_cancelled_requests_total", labels) - before
        seen["in flight"] = metric(text, "mt_requests_in_flight")
        seen["queued"] = metric(text, "mt_queue_depth", labels)
        return seen == {"cancelled": 1, "in flight": 0, "queued": 0}

    wait_for(freed, 20, lambda: f"the cancelled request's rows were not freed (last seen: {seen})")
    answers_normally(httpx.Client(base_url=live))


async def dribble(port: int, part: str, seconds: float) -> bytes:
    """A slow client: its headers, or its body, one byte every 0.1 s for `seconds` or until the server
    answers; then what the server said (nothing, for headers that never end)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    head = b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    if part == "body":
        writer.write(head)
    answer = asyncio.ensure_future(reader.read())
    try:
        for byte in (head if part == "headers" else b'{"q": "' + b"x" * 1000)[: int(seconds * 10)]:
            if answer.done():
                break
            writer.write(bytes([byte]))
            await writer.drain()
            await asyncio.sleep(0.1)
        if part == "headers":
            answer.cancel()
            return b""
        return await asyncio.wait_for(answer, 5)
    except ConnectionError:
        return await asyncio.wait_for(answer, 5)
    finally:
        writer.close()


def test_slow_clients_do_not_hold_the_server_and_a_stalled_body_gets_408(live: str) -> None:
    port = int(live.rsplit(":", 1)[1])

    async def scenario() -> tuple[list[bytes], float, int]:
        slow = [asyncio.ensure_future(dribble(port, ("headers", "body")[i % 2], 3.0)) for i in range(20)]
        await asyncio.sleep(0.5)
        async with httpx.AsyncClient(base_url=live, timeout=30) as c:
            started = time.monotonic()
            normal = await c.post("/translate", json=NORMAL)
            elapsed = time.monotonic() - started
        return await asyncio.gather(*slow), elapsed, normal.status_code

    answers, elapsed, status = asyncio.run(scenario())
    assert status == 200 and elapsed < 3.0, (status, elapsed)
    bodies = answers[1::2]
    for raw in bodies:  # each dribbling body: 408 with the error shape after the 1 s body timeout
        assert raw.startswith(b"HTTP/1.1 408 "), raw[:200]
        assert b"connection: close" in raw.lower()
        assert raw.endswith(b'{"error":"the body did not arrive within 1 seconds"}'), raw[-200:]
    answers_normally(httpx.Client(base_url=live))


# -- overload: admission, in-process -------------------------------------------------------------------


def test_throughput_counts_only_busy_time() -> None:
    throughput = Throughput(window=5.0, min_busy=1.0)
    assert throughput.expected_wait(10) is None and throughput.expected_wait(0) == 0.0
    for i in range(9):  # idle: nothing waits, so nothing is learnt
        throughput.sample(i * 0.25, 0.0, 0)
    assert throughput.per_second is None
    for i in range(9):  # busy for 2 s, 50 sentences finished per 0.25 s: 200 sentences/s
        throughput.sample(10 + i * 0.25, 50.0 * i, 30)
    assert throughput.per_second == pytest.approx(200.0)
    assert throughput.expected_wait(400) == pytest.approx(2.0)
    for i in range(40):  # 10 s more at 100 sentences/s: the 5 s window forgets the faster past
        throughput.sample(12.25 + i * 0.25, 400.0 + 25.0 * i, 30)
    assert throughput.per_second == pytest.approx(100.0)
    throughput.sample(22.5, 1425.0, 0)  # the queue drained in this interval: it counts
    assert throughput.per_second == pytest.approx(100.0)
    throughput.sample(30.0, 1425.0, 5)  # a queue seen at one sample only (then idle): teaches nothing
    throughput.sample(30.25, 1425.0, 0)
    assert throughput.per_second == pytest.approx(100.0)


def test_a_queue_that_does_not_move_has_no_end() -> None:
    throughput = Throughput(window=5.0, min_busy=1.0)
    for i in range(6):  # 1.25 s with sentences waiting and none finished: stuck, not unknown
        throughput.sample(i * 0.25, 10.0, 8)
    assert throughput.per_second == 0.0 and throughput.expected_wait(8) == float("inf")


class SlowQueue(Throughput):
    """A model whose waiting sentences would take 25 s to leave the queue."""

    def expected_wait(self, waiting: int) -> float | None:
        return 25.0


def test_a_queue_too_long_to_wait_in_is_503(client: TestClient) -> None:
    state = service_state(client)
    measured = state.throughput[MODEL]
    state.throughput[MODEL] = SlowQueue()
    try:
        response = client.post("/translate", json=NORMAL)
        assert response.status_code == 503 and response.headers["retry-after"] == "1"
        expected = "the queue is full (about 25.0 s of work waiting; the limit is 10 s); retry later"
        assert response.json() == {"error": expected}
    finally:
        state.throughput[MODEL] = measured
    assert 'mt_rejected_requests_total{reason="queue_full"}' in client.get("/metrics").text
    answers_normally(client)


def test_a_real_backlog_is_measured_and_refused_then_drains(model_dir: Path) -> None:
    """No stubs: one beam-4 sentence at a time, a 512-sentence request with a 6 s deadline queues; once the
    throughput is measured, a newcomer is refused with 503 (queue_full); when the backlog is gone (translated,
    or its request past its deadline: 504, depending on the machine's speed), newcomers are admitted again."""
    settings = settings_for(model_dir, max_batch_rows=4, max_queue_wait_seconds=0.3)
    with TestClient(create_app(settings)) as c:
        big = {"q": [SENTENCES] * 128, "source": "en", "target": "fr", "beam_size": 4, "timeout": 6}
        result: dict[str, object] = {}
        worker = threading.Thread(target=lambda: result.update(r=c.post("/translate", json=big)))
        worker.start()
        gauge = f'{{model="{MODEL}"}}'
        wait_for(lambda: metric(c.get("/metrics").text, "mt_queue_expected_wait_seconds", gauge) > 0.3, 30, "no wait")
        refused = c.post("/translate", json=NORMAL)
        assert worker.is_alive() and refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        assert re.fullmatch(
            r"the queue is full \((about \d+\.\d s of work waiting|it has not moved lately); the limit is 0\.3 s\); "
            r"retry later",
            refused.json()["error"],
        ), refused.json()
        worker.join(timeout=60)
        assert result["r"].status_code in (200, 504)  # type: ignore[attr-defined]  # done or past its deadline
        answers_normally(c)  # nothing waits any more: admitted


def test_too_many_requests_at_once_is_503(model_dir: Path) -> None:
    settings = settings_for(
        model_dir, max_concurrent_requests=2, retry_after_seconds=3, cors_origins=["https://a.example"]
    )
    with TestClient(create_app(settings)) as c:
        service_state(c).handling = 2  # two requests being handled
        response = c.post("/translate", json=NORMAL, headers={"x-request-id": "r-1", "origin": "https://a.example"})
        assert response.status_code == 503 and response.headers["retry-after"] == "3"
        assert response.json() == {"error": "too many requests at once (the limit is 2); retry later"}
        assert response.headers["x-request-id"] == "r-1"  # refused before routing, inside the request context ...
        assert response.headers["access-control-allow-origin"] == "https://a.example"  # ... and CORS
        text = c.get("/metrics").text
        assert 'mt_rejected_requests_total{reason="too_many_requests"} 1.0' in text  # counted once
        requests = [line for line in text.splitlines() if line.startswith("mt_http_requests_total{")]
        assert 'mt_http_requests_total{method="POST",route="/translate",status="503"} 1.0' in requests
        service_state(c).handling = 0
        answers_normally(c)


def test_a_refusal_at_the_edge_never_reads_the_body(model_dir: Path) -> None:
    """TranslateEndpoint answers /translate itself: what State.admit refuses before the body is read (the HTTP
    process's CPU per refusal decides how much of a flood it can shed), other methods 405, and every other path is
    passed on to FastAPI."""
    state = State(settings_for(model_dir, max_concurrent_requests=1), Metrics())
    state.ready, state.handling = True, 1
    reached: list[str] = []
    bodies_read: list[str] = []

    async def inner(scope: dict, receive: object, send: object) -> None:
        reached.append(f"{scope['method']} {scope['path']}")

    async def call(method: str, path: str) -> list[dict]:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        async def receive() -> dict:
            bodies_read.append(path)
            return {"type": "http.request", "body": b"{}", "more_body": False}

        scope = {"type": "http", "method": method, "path": path, "headers": []}
        await TranslateEndpoint(inner, state)(scope, receive, send)
        return sent

    refused = asyncio.run(call("POST", "/translate"))
    assert reached == [] and bodies_read == [] and refused[0]["status"] == 503
    assert (b"retry-after", b"1") in refused[0]["headers"]
    assert json.loads(refused[1]["body"]) == {"error": "too many requests at once (the limit is 1); retry later"}
    wrong_method = asyncio.run(call("GET", "/translate"))
    assert wrong_method[0]["status"] == 405 and (b"allow", b"POST") in wrong_method[0]["headers"]
    assert asyncio.run(call("POST", "/v1/models")) == [] and reached == ["POST /v1/models"]  # passed on
    assert bodies_read == []
    state.handling = 0
    admitted = asyncio.run(call("POST", "/translate"))  # read and validated: {} has no q
    assert bodies_read == ["/translate"] and admitted[0]["status"] == 422 and state.handling == 0
    assert json.loads(admitted[1]["body"])["error"].startswith("invalid request: q: Field required")
    app = create_app(settings_for(model_dir, cors_origins=["https://a.example"]))
    stack = [m.cls.__name__ for m in app.user_middleware]  # outermost first
    assert stack == ["RequestContext", "CORSMiddleware", "TranslateEndpoint"]  # its answers get an id, metrics, CORS


def test_a_client_gone_while_its_body_is_read_is_499_and_a_bug_is_a_logged_500(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """TranslateEndpoint's answers for what no request should cause: the client leaving before its body is whole
    (499, in the access log and the metrics only), and an exception that is not the service's (500, logged with its
    traceback); either way the request stops counting towards the concurrency limit."""
    state = State(settings_for(model_dir), Metrics())
    state.ready = True

    async def call(receive: object) -> list[dict]:
        sent: list[dict] = []

        async def send(message: dict) -> None:
            sent.append(message)

        scope = {"type": "http", "method": "POST", "path": "/translate", "headers": []}
        await TranslateEndpoint(None, state)(scope, receive, send)  # type: ignore[arg-type]
        return sent

    parts = iter([{"type": "http.request", "body": b'{"q": "Open', "more_body": True}, {"type": "http.disconnect"}])

    async def leaves() -> dict:
        return next(parts)

    async def breaks() -> dict:
        raise KeyError("a bug")

    gone = asyncio.run(call(leaves))
    assert gone[0]["status"] == 499 and json.loads(gone[1]["body"]) == {"error": "client closed the request"}
    with caplog.at_level(logging.ERROR, logger="service.api.answers"):
        broken = asyncio.run(call(breaks))
    assert broken[0]["status"] == 500 and "request id" in json.loads(broken[1]["body"])["error"]
    assert any(r.exc_info and r.exc_info[0] is KeyError for r in caplog.records)
    assert state.handling == 0


def test_a_body_too_large_by_its_length_is_counted_as_too_large(model_dir: Path) -> None:
    with TestClient(create_app(settings_for(model_dir, max_body_bytes=1000))) as c:
        response = c.post("/translate", content=b"x" * 2000, headers={"content-type": "application/json"})
        assert response.status_code == 413
        assert 'mt_rejected_requests_total{reason="too_large"} 1.0' in c.get("/metrics").text


def test_draining_refuses_new_work_and_reports_not_ready(model_dir: Path) -> None:
    with TestClient(create_app(settings_for(model_dir))) as c:
        answers_normally(c)
        service_state(c).begin_drain()
        ready = c.get("/ready")
        assert ready.status_code == 503 and ready.json() == {"error": "shutting down"}
        refused = c.post("/translate", json=NORMAL)
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert refused.json() == {"error": "the server is shutting down; retry on another instance"}
        assert "mt_ready 0.0" in c.get("/metrics").text
        assert c.get("/health").status_code == 200  # liveness holds while draining


# -- limits before any tokenisation ------------------------------------------------------------------


class TokenizerSpy:
    """The tokenizer, noting every call that counts or encodes text."""

    def __init__(self, tokenizer: object) -> None:
        self.tokenizer, self.calls = tokenizer, []

    def __getattr__(self, name: str) -> object:
        attribute = getattr(self.tokenizer, name)
        if name in ("encode", "count"):
            return lambda *args: self.calls.append((name, args)) or attribute(*args)
        return attribute


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"q": ["x"] * 129, "source": "en", "target": "fr"}, "q has 129 texts; the limit is 128"),
        ({"q": [1] * 129, "source": "en", "target": "fr"}, "q has 129 texts; the limit is 128"),
        ({"q": "x" * 50_001, "source": "en", "target": "fr"}, "q has 50001 characters; the limit is 50000"),
        ({"q": ["x" * 30_000, "y" * 30_000], "source": "en", "target": "fr"}, "q has 60000 characters"),
        ({"q": "A b. " * 600, "source": "en", "target": "fr"}, "the request has 600 sentences; the limit is 512"),
    ],
)
def test_size_limits_hold_before_tokenisation(
    client: TestClient, body: dict, message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    translator = service_state(client).registry.translators[MODEL]
    spy = TokenizerSpy(translator.tokenizer)
    monkeypatch.setattr(translator, "tokenizer", spy)
    response = client.post("/translate", json=body)
    assert response.status_code == 413, response.text
    assert message in response.json()["error"]
    assert not spy.calls, "tokenised before refusing"
    monkeypatch.undo()
    answers_normally(client)


# -- security ----------------------------------------------------------------------------------------


def test_api_keys_never_reach_the_logs(model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    key, wrong = "k3y-THAT-must-not-leak", "wr0ng-KEY-must-not-leak"
    caplog.set_level(logging.DEBUG)
    with TestClient(create_app(settings_for(model_dir, api_keys=[key], metadata_api_keys=[key]))) as c:
        assert c.post("/translate", json={**NORMAL, "api_key": key}).status_code == 200
        assert c.post("/translate", data={**NORMAL, "api_key": key}).status_code == 200
        assert c.post("/translate", json=NORMAL, headers={"x-api-key": key}).status_code == 200
        assert c.post("/translate", json={**NORMAL, "api_key": wrong}).status_code == 403
        assert c.post("/translate", data={**NORMAL, "api_key": wrong}).status_code == 403
        assert c.post("/translate", json={**NORMAL, "api_key": [wrong]}).status_code == 403
        assert c.post("/translate", json=NORMAL, headers={"authorization": f"Bearer {wrong}"}).status_code == 403
        assert c.get("/metrics", headers={"authorization": f"Bearer {wrong}"}).status_code == 403
        assert c.get("/metrics", headers={"authorization": f"Bearer {key}"}).status_code == 200
    logged = caplog.text + "".join(f"{r.getMessage()} {r.args!r}" for r in caplog.records)
    assert "POST /translate 403" in logged  # the requests were logged...
    assert key not in logged and wrong not in logged  # ...but never their keys


def test_the_access_log_can_be_turned_off_alone(model_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with TestClient(create_app(settings_for(model_dir, access_log=False))) as c:
        assert c.post("/translate", json=NORMAL).status_code == 200
        assert c.post("/translate", json={**NORMAL, "beam_size": 0}).status_code == 422
    lines = [r.getMessage() for r in caplog.records if r.name == "service.api.answers"]
    assert not [line for line in lines if line.startswith(("POST /translate", "GET "))]  # no access lines
    assert any(r.levelno == logging.INFO and r.name != "service.api.answers" for r in caplog.records)  # INFO on
    caplog.clear()
    with TestClient(create_app(settings_for(model_dir))) as c:  # the default: a line a request
        assert c.post("/translate", json=NORMAL).status_code == 200
    assert any(r.getMessage().startswith("POST /translate 200 ") for r in caplog.records)


def test_metadata_routes_can_need_a_key(model_dir: Path) -> None:
    with TestClient(create_app(settings_for(model_dir))) as open_server:  # the default: open, for Prometheus
        assert open_server.get("/metrics").status_code == 200 and open_server.get("/v1/models").status_code == 200
    with TestClient(create_app(settings_for(model_dir, metadata_api_keys=["scrape-key"]))) as c:
        for route in ("/metrics", "/v1/models"):
            missing = c.get(route)
            assert missing.status_code == 403
            assert missing.json() == {"error": "this route needs a key (X-API-Key header or Authorization: Bearer)"}
            wrong = c.get(route, headers={"x-api-key": "guess"})
            assert wrong.status_code == 403
            assert wrong.json() == {"error": "a valid key is required (X-API-Key header or Authorization: Bearer)"}
            assert c.get(route, headers={"x-api-key": "scrape-key"}).status_code == 200
            assert c.get(route, headers={"authorization": "Bearer scrape-key"}).status_code == 200
        for route in ("/health", "/ready", "/languages"):  # probes and LibreTranslate's route stay open
            assert c.get(route).status_code == 200
        answers_normally(c)


@pytest.mark.parametrize("name", ["../../etc", "/etc/passwd", "tiny-en-fr/../tiny-en-fr", "..", "tiny-en-fr\x00"])
def test_a_model_name_is_looked_up_among_loaded_models_only(client: TestClient, name: str) -> None:
    response = client.post("/translate", json={**NORMAL, "model": name})
    assert response.status_code == 404
    assert response.json() == {"error": f"no model named {name!r}; loaded: tiny-en-fr"}
    answers_normally(client)


def test_cors_is_off_by_default(client: TestClient) -> None:
    preflight = client.options(
        "/translate",
        headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
    )
    assert preflight.status_code == 405 and "access-control-allow-origin" not in preflight.headers
    response = client.post("/translate", json=NORMAL, headers={"origin": "https://evil.example"})
    assert response.status_code == 200 and "access-control-allow-origin" not in response.headers


def test_cors_allows_only_the_listed_origins(model_dir: Path) -> None:
    with TestClient(create_app(settings_for(model_dir, cors_origins=["https://app.example"]))) as c:
        ask = {"access-control-request-method": "POST", "access-control-request-headers": "content-type,x-api-key"}
        allowed = c.options("/translate", headers={"origin": "https://app.example", **ask})
        assert allowed.status_code == 200
        assert allowed.headers["access-control-allow-origin"] == "https://app.example"
        denied = c.options("/translate", headers={"origin": "https://evil.example", **ask})
        assert denied.status_code == 400 and "access-control-allow-origin" not in denied.headers
        response = c.post("/translate", json=NORMAL, headers={"origin": "https://app.example"})
        assert response.status_code == 200
        assert response.headers["access-control-allow-origin"] == "https://app.example"
        assert "x-request-id" in response.headers["access-control-expose-headers"].lower()


def test_a_path_cannot_forge_access_log_lines(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    """The path is decoded before the log sees it: %0a would start a line of the client's, %1b colour a terminal."""
    caplog.set_level(logging.INFO)
    forged = "/x%0a2026-12-01 19:00:00,000 CRITICAL [-] service: engine died%1b[31m"
    assert client.get(forged).status_code == 404
    assert client.get("/" + "y" * 5000).status_code == 404
    lines = [r.getMessage() for r in caplog.records if r.name == "service.api.answers"]
    assert "GET /x\\n2026-12-01 19:00:00,000 CRITICAL [-] service: engine died\\x1b[31m 404" in "\n".join(lines)
    assert not any("\n" in line or "\x1b" in line for line in lines)
    assert any(line.startswith("GET /" + "y" * 199 + "... (5001 characters) 404") for line in lines)
    assert client.get("/health").status_code == 200
    assert any(line.startswith("GET /health 200") for line in [r.getMessage() for r in caplog.records])


@pytest.mark.parametrize("given", ["abc\x7fdef", "a b", "x" * 65, "ünïcode", "ok;rm -rf"])
def test_a_request_id_is_echoed_only_when_safe(client: TestClient, given: str) -> None:
    echoed = client.get("/health", headers={"x-request-id": given.encode("utf-8")}).headers["x-request-id"]
    assert echoed != given and len(echoed) == 16
    assert client.get("/health", headers={"x-request-id": "req-42.a:b"}).headers["x-request-id"] == "req-42.a:b"


def test_a_stuck_decoding_loop_still_answers_504_after_the_deadline(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scheduler fails a request at its deadline; if it (or its engine process) hangs, the server does, a grace
    period later, instead of waiting forever."""
    monkeypatch.setattr(translator_module, "DEADLINE_GRACE_SECONDS", 0.2)
    with TestClient(create_app(settings_for(model_dir, engine_process=False))) as client:
        translator = service_state(client).registry.translators[MODEL]
        translator.scheduler.submit = lambda jobs: None  # accepted, never run
        started = time.monotonic()
        response = client.post("/translate", json={**NORMAL, "timeout": 0.5})
        assert response.status_code == 504 and 0.6 < time.monotonic() - started < 5
        assert response.json() == {"error": "the request's deadline passed before its translation finished"}
