"""End to end: the real server process (`python -m service`) on a loopback port, 64 concurrent requests
mixing greedy and beam search and lengths, each answer checked against the same text translated
alone; then /metrics must add up. A broken model folder must stop the start with a clear message."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from service.settings import available_cores
from tests.service.test_api import solo

SENTENCES = [
    "Open the file.",
    "Save the document as %s.",
    "The printer is not responding.",
    "Delete %d items?",
    "Cannot connect to the server.",
    "Select a color for the background.",
    "Hello world, how are you today?",
    "Settings were saved successfully.",
    "An unknown error occurred while reading {name}.",
    "The quick brown fox jumps over the lazy dog.",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_dir: Path, port: int, **env: str) -> subprocess.Popen[str]:
    environment = {
        **os.environ,
        "MT_MODELS_DIR": str(model_dir.parent),
        "MT_MODELS": model_dir.name,
        "MT_INTRA_OP_THREADS": "1",
        **env,
    }
    return subprocess.Popen(
        [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port)],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a process group of its own, which a test may signal as a whole
    )


def wait_ready(url: str, process: subprocess.Popen[str], seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"server exited early:\n{process.stdout.read() if process.stdout else ''}")
        try:
            if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError("server not ready in time")


@contextmanager
def running_server(model_dir: Path, **env: str) -> Iterator[str]:
    """The real server on a free loopback port, ready; stopped with SIGTERM afterwards, which must exit 0."""
    port = free_port()
    process = start_server(model_dir, port, **env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process)
        yield url
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-stream", "two-streams"])
def server(model_dir: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    # admission by expected queue wait is tested elsewhere; here all 64 requests must be admitted
    env = {"MT_MAX_BATCH_ROWS": "48", "MT_MAX_QUEUE_WAIT_SECONDS": "0", "MT_DECODER_STREAMS": request.param}
    with running_server(model_dir, **env) as url:
        yield url


def metric(text: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name)}{re.escape(labels)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def request_mix(n: int) -> list[dict]:
    """n requests: greedy and beam 2/4, one to three sentences, single strings and lists."""
    mix = []
    for i in range(n):
        sentences = [SENTENCES[(i + k) % len(SENTENCES)] for k in range(1 + i % 3)]
        q: str | list[str] = " ".join(sentences) if i % 2 else sentences
        mix.append({"q": q, "source": "en", "target": "fr", "beam_size": (1, 2, 4)[i % 3]})
    return mix


def expected_answer(model_dir: Path, request: dict, cache: dict) -> str | list[str]:
    def one(sentence: str) -> str:
        key = (sentence, request["beam_size"])
        if key not in cache:
            cache[key] = solo(model_dir, sentence, beam_size=request["beam_size"])
        return cache[key]

    if isinstance(request["q"], list):
        return [one(s) for s in request["q"]]
    return " ".join(one(s) for s in re.split(r"(?<=[.?!]) ", request["q"]))


def test_64_concurrent_requests_match_their_solo_translations(server: str, model_dir: Path) -> None:
    requests = request_mix(64)

    async def send_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=server, timeout=120) as client:
            return await asyncio.gather(*(client.post("/translate", json=r) for r in requests))

    responses = asyncio.run(send_all())
    assert [r.status_code for r in responses] == [200] * 64
    cache: dict = {}
    for request, response in zip(requests, responses, strict=True):
        assert response.json()["translatedText"] == expected_answer(model_dir, request, cache), request

    metrics = httpx.get(f"{server}/metrics").text
    bodies = [r.json() for r in responses]
    sentences = sum(
        len(r["q"]) if isinstance(r["q"], list) else len(re.split(r"(?<=[.?!]) ", r["q"])) for r in requests
    )
    assert metric(metrics, "mt_http_requests_total", '{method="POST",route="/translate",status="200"}') == 64
    # the warm-up translates one sentence outside the scheduler, so the counters are exactly ours: each sentence, and
    # again each one the guards found degenerate and searched again with beams (the random model loops)
    retried = sum(float(v) for v in re.findall(r'^mt_degenerate_outputs_total\{.*outcome="retried_\w+"\} (\S+)$',
                                               metrics, re.MULTILINE))
    assert metric(metrics, "mt_sentences_total", '{model="tiny-en-fr"}') == sentences + retried
    assert metric(metrics, "mt_input_tokens_total", '{model="tiny-en-fr"}') == sum(
        b["usage"]["input_tokens"] for b in bodies
    )
    assert metric(metrics, "mt_generated_tokens_total", '{model="tiny-en-fr"}') == sum(
        b["usage"]["output_tokens"] for b in bodies
    )
    steps = metric(metrics, "mt_decoder_step_rows_count", '{model="tiny-en-fr"}')
    rows = metric(metrics, "mt_decoder_step_rows_sum", '{model="tiny-en-fr"}')
    assert rows / steps > 2  # requests really shared decoder steps
    assert metric(metrics, "mt_requests_in_flight") == 0
    assert metric(metrics, "mt_queue_depth", '{model="tiny-en-fr"}') == 0


def test_libretranslates_own_python_client_works_unchanged(model_dir: Path) -> None:
    """libretranslatepy, as LibreTranslate's users call it: translate, detect and languages, over real HTTP."""
    from libretranslatepy import LibreTranslateAPI

    with running_server(model_dir) as url:
        client = LibreTranslateAPI(url + "/")
        assert client.translate("Open the file.", "en", "fr") == solo(model_dir, "Open the file.")
        found = client.detect("Le fichier est introuvable sur le disque, veuillez vérifier le chemin.")
        assert found[0]["language"] == "fr" and 0 < found[0]["confidence"] <= 100
        assert {lang["code"] for lang in client.languages()} == {"en", "fr"}


def test_a_broken_model_folder_stops_the_start(model_dir: Path, tmp_path: Path) -> None:
    broken = Path(shutil.copytree(model_dir, tmp_path / model_dir.name))
    data = bytearray((broken / "decoder_step.onnx").read_bytes())
    data[100] ^= 0xFF
    (broken / "decoder_step.onnx").write_bytes(bytes(data))
    process = start_server(broken, free_port())
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 1
    assert "cannot start:" in output and "decoder_step.onnx: checksum mismatch" in output
    assert "Traceback" not in output


def thread_cores(pid: int) -> list[frozenset[int]]:
    """The cores each thread of process `pid` may run on."""
    return [frozenset(os.sched_getaffinity(int(task.name))) for task in Path(f"/proc/{pid}/task").iterdir()]


def children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir() for c in (task / "children").read_text().split()]


@contextmanager
def translated_once(model_dir: Path, **env: str) -> Iterator[tuple[str, int, list[int]]]:
    """The real server, ready and past its first translation: its URL, its process id and its engine processes' ids;
    stopped with SIGTERM afterwards, which must exit 0."""
    port = free_port()
    process = start_server(model_dir, port, **env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process)
        assert (
            httpx.post(f"{url}/translate", json={"q": SENTENCES[0], "source": "en", "target": "fr"}).status_code == 200
        )
        engines = [pid for pid in children(process.pid) if "spawn_main" in Path(f"/proc/{pid}/cmdline").read_text()]
        yield url, process.pid, engines
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0


@pytest.mark.skipif(available_cores() < 2, reason="pinning needs 2 cores (affinity and CPU quota)")
@pytest.mark.parametrize("pin", ["true", "false"])
def test_the_real_server_gives_its_decoding_stream_a_core_of_its_own(model_dir: Path, pin: str, tmp_path: Path) -> None:
    allowed = frozenset(os.sched_getaffinity(0))
    stream_core, others = max(allowed), allowed - {max(allowed)}
    # one stream of one thread (MT_INTRA_OP_THREADS=1); claims of its own, whatever else runs on this machine
    with translated_once(model_dir, MT_PIN_CORES=pin, MT_PIN_CLAIMS_DIR=str(tmp_path)) as (url, server, engines):
        card = httpx.get(f"{url}/v1/models").json()["models"][0]
        server_threads = thread_cores(server)
        engine_threads = [cores for pid in engines for cores in thread_cores(pid)]
    assert engine_threads, "no engine process found"
    if pin == "true":
        assert card["stream_cores"] == [stream_core]
        assert set(server_threads) == {others}  # HTTP, its thread pools and libuv's
        # the scheduler's thread alone on its core; the engine's main thread, outbox and encoder thread on the rest
        assert engine_threads.count(frozenset({stream_core})) == 1
        assert set(engine_threads) == {frozenset({stream_core}), others}
    else:
        assert card["stream_cores"] is None
        assert set(server_threads) == set(engine_threads) == {allowed}


def thread_policies(pid: int) -> set[int]:
    """The scheduling policies of process `pid`'s threads."""
    policies = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            policies.add(os.sched_getscheduler(int(task.name)))
    return policies


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
@pytest.mark.parametrize("batch", ["true", "false"])
def test_the_real_servers_engine_threads_run_as_batch_and_its_http_process_does_not(
    model_dir: Path, batch: str, tmp_path: Path
) -> None:
    with translated_once(model_dir, MT_ENGINE_BATCH_SCHEDULING=batch, MT_PIN_CLAIMS_DIR=str(tmp_path)) as found:
        _, pid, engines = found
        server = thread_policies(pid)
        engine = set().union(*(thread_policies(engine) for engine in engines))
    assert engines, "no engine process found"
    assert server == {os.SCHED_OTHER}  # the event loop and its helpers: their wake-ups still preempt
    assert engine == ({os.SCHED_BATCH} if batch == "true" else {os.SCHED_OTHER})  # every thread, streams too


@pytest.mark.skipif(available_cores() < 2, reason="pinning needs 2 cores (affinity and CPU quota)")
def test_a_second_server_on_the_machine_pins_to_another_core_or_not_at_all(model_dir: Path, tmp_path: Path) -> None:
    """Both claim cores in one directory: the second leaves the first's core alone (on 2 cores it then has none
    to spare, and pins nothing); once the first has exited, its core is free again."""
    allowed = sorted(os.sched_getaffinity(0))
    claims = {"MT_PIN_CLAIMS_DIR": str(tmp_path)}
    with running_server(model_dir, **claims) as first, running_server(model_dir, **claims) as second:
        cores = [httpx.get(f"{url}/v1/models").json()["models"][0]["stream_cores"] for url in (first, second)]
        answer = httpx.post(f"{second}/translate", json={"q": SENTENCES[1], "source": "en", "target": "fr"})
    assert answer.status_code == 200
    assert cores[0] == [allowed[-1]]
    assert cores[1] == ([allowed[-2]] if len(allowed) > 2 else None)
    with running_server(model_dir, **claims) as third:  # the first two have exited: their claims went with them
        assert httpx.get(f"{third}/v1/models").json()["models"][0]["stream_cores"] == [allowed[-1]]


@pytest.mark.parametrize("port", ["70000", "-5", "http"])
def test_a_port_out_of_range_stops_the_start_before_anything_loads(
    port: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Out of range, asyncio's loop had bound the port modulo 65,536 (70000 listened on 4464)."""
    from service.__main__ import main

    with pytest.raises(SystemExit) as stopped:
        main([f"--port={port}"])
    assert stopped.value.code == 2
    assert "argument --port: " in capsys.readouterr().err


class RecordingTransport:
    """What a connection's transport was asked to do, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes]] = []
        self.closing = False

    def write(self, data: bytes) -> None:
        self.calls.append(("write", data))

    def close(self) -> None:
        self.calls.append(("close", b""))
        self.closing = True

    def abort(self) -> None:
        self.calls.append(("abort", b""))
        self.closing = True

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str) -> str:
        return f"extra {name}"


def test_a_responses_headers_and_body_written_in_one_turn_of_the_loop_leave_in_one_send() -> None:
    """uvicorn writes a response's headers, then its body: OneSendTransport sends them together, once the turn
    that wrote them ends; a close sends what waits first, an abort drops it; the rest is the transport's own."""
    from service.__main__ import OneSendTransport

    async def scenario() -> list[list[tuple[str, bytes]]]:
        loop, seen = asyncio.get_running_loop(), []
        for ending in ("turn", "close", "abort"):
            inner = RecordingTransport()
            transport = OneSendTransport(inner, loop)  # type: ignore[arg-type]
            transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
            transport.write(b"{}")
            assert inner.calls == [] and transport.get_extra_info("peername") == "extra peername"
            if ending == "close":
                transport.close()
            elif ending == "abort":
                transport.abort()
            await asyncio.sleep(0)  # the turn ends
            transport.write(b"late")  # after a close: dropped, as the transport itself would
            await asyncio.sleep(0)
            seen.append(inner.calls)
        return seen

    turn, close, abort = asyncio.run(scenario())
    assert turn == [("write", b"HTTP/1.1 200 OK\r\n\r\n{}"), ("write", b"late")]
    assert close == [("write", b"HTTP/1.1 200 OK\r\n\r\n{}"), ("close", b"")]
    assert abort == [("abort", b"")]
