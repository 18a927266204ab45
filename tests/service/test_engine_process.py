"""The engine process (MT_ENGINE_PROCESS, the default): a model's scheduler and sessions in a process of their
own. Its answers, errors, metrics and cancellations reach the server as they would in one process; a folder it
cannot load stops the start with its message; its death fails its requests and the server's liveness, and the
real server then drains and exits 1; the server stops it on the way out."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from multiprocessing import Pipe
from pathlib import Path

import httpx
import pytest
import uvloop
from fastapi.testclient import TestClient
from prometheus_client import generate_latest

from bench.processes import children
from service.api.app import create_app
from service.engine.decoding import Hypothesis, SearchOptions
from service.errors import DeadlineExceeded, InferenceError, ModelFolderError, Overloaded
from service.metrics import Metrics
from service.scheduling.engine_process import (
    EngineProcess,
    MetricsRecorder,
    MetricsReplay,
    Wire,
    _Outbox,
    hypotheses_from_wire,
    hypotheses_wire,
    options_wire,
    rebuilt_error,
)
from service.scheduling.jobs import SentenceJob, Ticket
from service.translation.registry import load_translators
from service.translation.translator import TranslateOptions, Translator
from tests.service.test_api import settings_for
from tests.service.test_e2e import free_port, metric, start_server, wait_ready

NORMAL = {"q": "Open the file.", "source": "en", "target": "fr"}
MODEL = '{model="tiny-en-fr"}'


def engine(client: TestClient) -> EngineProcess:
    scheduler = client.app.state.service.registry.translators["tiny-en-fr"].scheduler
    assert isinstance(scheduler, EngineProcess)
    return scheduler


def test_translations_and_metrics_come_back_from_the_engine(model_dir: Path) -> None:
    with TestClient(create_app(settings_for(model_dir))) as client:
        process = engine(client)._process
        assert process.is_alive() and process.pid != os.getpid()
        in_process = TestClient(create_app(settings_for(model_dir, engine_process=False)))
        with in_process:
            expected = in_process.post("/translate", json={**NORMAL, "beam_size": 3}).json()
        answer = client.post("/translate", json={**NORMAL, "beam_size": 3})
        assert answer.status_code == 200
        got = answer.json()
        for body in (got, expected):  # timings differ; all else is equal
            assert all(0 <= body["usage"].pop(key) < 5 for key in ("queue_seconds", "total_seconds"))
        assert got == expected
        metrics = client.get("/metrics").text  # the engine's updates are replayed before its answer
        assert metric(metrics, "mt_sentences_total", MODEL) == 1
        assert metric(metrics, "mt_decoder_step_rows_count", MODEL) >= 1
        assert metric(metrics, "mt_generated_tokens_total", MODEL) == answer.json()["usage"]["output_tokens"]
        assert client.get("/v1/models").json()["models"][0]["providers"] == ["CPUExecutionProvider"]
    assert not process.is_alive()  # stopped with the server


def test_a_request_larger_than_the_engine_queue_is_413(model_dir: Path) -> None:
    """More sentences than the queue can ever hold: 413 saying what to change, not a 503 to retry forever."""
    with TestClient(create_app(settings_for(model_dir, max_queue_sentences=2))) as client:
        refused = client.post("/translate", json={**NORMAL, "q": "One. Two. Three."})
        assert refused.status_code == 413 and "retry-after" not in refused.headers
        assert refused.json() == {
            "error": "the request has 3 sentences; the queue holds at most 2 (MT_MAX_QUEUE_SENTENCES): "
            "send them in smaller requests"
        }
        assert client.post("/translate", json={**NORMAL, "q": "One. Two."}).status_code == 200


def test_engine_errors_are_rebuilt_as_the_service_errors_they_were() -> None:
    overloaded = rebuilt_error("Overloaded", "the server is shutting down", "shutting_down")
    assert isinstance(overloaded, Overloaded) and overloaded.reason == "shutting_down"
    assert isinstance(rebuilt_error("DeadlineExceeded", "late", None), DeadlineExceeded)
    unknown = rebuilt_error("KeyError", "boom", None)  # anything else is an inference failure
    assert isinstance(unknown, InferenceError) and str(unknown) == "boom"


def test_a_cancelled_request_leaves_the_engine(model_dir: Path) -> None:
    settings = settings_for(model_dir, max_batch_rows=4)
    [translator] = load_translators(settings, Metrics())
    scheduler = translator.scheduler
    assert isinstance(scheduler, EngineProcess)
    scheduler.start()  # no event loop here: a reader thread
    try:
        prepared = translator.prepare(["Open the file. " * 40], "fr", TranslateOptions(beam_size=4))
        done = threading.Event()
        ticket = Ticket(len(prepared.jobs), time.monotonic() + 60, lambda _: done.set())
        pairs = enumerate(zip(prepared.jobs, prepared.options, strict=True))
        scheduler.submit([SentenceJob(ids, o, ticket, i) for i, (ids, o) in pairs])
        scheduler.cancel(ticket)
        deadline = time.monotonic() + 10
        while metric_value(translator, "cancelled") < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metric_value(translator, "cancelled") == 1 and not done.is_set()
        assert ticket_count(scheduler) == 0
    finally:
        scheduler.stop(1.0)


def test_under_uvloop_the_pipe_stays_blocking_and_answers_arrive(model_dir: Path) -> None:
    """The server runs on uvloop, whose add_reader leaves the descriptor non-blocking (asyncio's does not): a
    message then read or sent in parts fails with BlockingIOError, which the reader took for the engine's death."""
    [translator] = load_translators(settings_for(model_dir), Metrics())
    scheduler = translator.scheduler
    assert isinstance(scheduler, EngineProcess)

    async def translate() -> list[str]:
        scheduler.start()  # on the running (uvloop) loop
        try:
            assert os.get_blocking(scheduler._conn.fileno())
            texts = [f"Open the file number {i} and close the window. " * 3 for i in range(32)]
            return (await translator.translate(texts, "fr", TranslateOptions())).texts
        finally:  # while the loop still runs: it reads the engine's last messages
            await asyncio.to_thread(scheduler.stop, 1.0)

    texts = uvloop.run(translate())
    assert len(texts) == 32 and all(texts)


def test_requests_submitted_in_one_turn_of_the_loop_leave_in_one_write(model_dir: Path) -> None:
    [translator] = load_translators(settings_for(model_dir, guards=False), Metrics())  # no retries' submissions
    scheduler = translator.scheduler
    assert isinstance(scheduler, EngineProcess)
    writes: list[list[tuple]] = []
    texts = ["Open the file.", "Close the window.", "The cat sleeps."]

    async def translate() -> tuple[list[str], list[str]]:
        scheduler.start()
        send = scheduler._conn.send
        scheduler._conn.send = lambda messages: (writes.append(messages), send(messages))[1]  # type: ignore[method-assign]
        try:
            together = await asyncio.gather(*(translator.translate([t], "fr", TranslateOptions()) for t in texts))
            alone = [(await translator.translate([t], "fr", TranslateOptions())).texts[0] for t in texts]
            return [t.texts[0] for t in together], alone
        finally:
            await asyncio.to_thread(scheduler.stop, 1.0)

    together, alone = asyncio.run(translate())
    assert together == alone
    assert [[m[0] for m in messages] for messages in writes[:4]] == [["submit"] * 3, ["submit"], ["submit"], ["submit"]]
    assert [m[3][0][0] for m in writes[0]] == [translator.prepare([t], "fr", TranslateOptions()).jobs[0] for t in texts]


def test_the_outbox_writes_what_it_has_queued_at_once_metric_updates_first() -> None:
    class Pipe:  # the first write blocks until released, while more is queued behind it
        def __init__(self) -> None:
            self.writes: list[list[tuple]] = []
            self.entered, self.release = threading.Event(), threading.Event()

        def send(self, messages: list[tuple]) -> None:
            self.entered.set()
            self.release.wait(10)
            self.writes.append(messages)

    pipe, recorder = Pipe(), MetricsRecorder()
    outbox = _Outbox(pipe, recorder)  # type: ignore[arg-type]
    outbox.send(("done", 1, [], 0.0))
    assert pipe.entered.wait(10)
    recorder.sentences.labels("m").inc()  # recorded before the next results were queued
    outbox.send(("done", 2, [], 0.0))
    outbox.send(None)  # metric updates only
    outbox.send(("error", 3, "InferenceError", "boom", None))
    pipe.release.set()
    outbox.close()
    assert pipe.writes == [
        [("done", 1, [], 0.0)],
        [
            ("metrics", [("sentences", ("m",), "inc", 1.0)]),
            ("done", 2, [], 0.0),
            ("error", 3, "InferenceError", "boom", None),
        ],
    ]


def test_options_and_hypotheses_cross_the_pipe_as_plain_tuples_and_come_back_equal() -> None:
    """Every field, none at its default, survives the trip: a field added to either dataclass travels too."""
    options = SearchOptions(
        beam_size=3, max_new_tokens=17, length_penalty=0.6, n_best=2, min_new_tokens=4, scored=False
    )
    assert set(vars(options).items()).isdisjoint(vars(SearchOptions()).items())
    results = [[Hypothesis((5, 6, 3), -1.5, -0.5), Hypothesis((7, 3), -2.0, -1.0)], [Hypothesis((3,), -0.1, -0.1)]]
    a, b = Pipe()
    wire_a, wire_b = Wire(a), Wire(b)
    wire_a.send([("submit", 1, 2.5, [([4, 5, 3], options_wire(options))]), ("done", 1, hypotheses_wire(results), 0.0)])
    (_, _, _, [(ids, sent)]), (_, _, carried, _) = wire_b.recv()
    assert ids == [4, 5, 3] and SearchOptions(*sent) == options
    assert all(type(value) in (int, float, bool) for value in sent)  # no dataclass pickled
    assert all(type(h) is tuple for hyps in carried for h in hyps)
    assert hypotheses_from_wire(carried) == results


def test_engine_metric_updates_are_gathered_and_replay_as_the_calls_would() -> None:
    """Observations of one metric and labels travel as one list, increments as their sum, a gauge as its last
    value; replayed, the server's registry reads as if the engine's calls had been made on it."""
    recorder, direct = MetricsRecorder(), Metrics()
    calls = [
        ("step_rows", ("m",), "observe", 3.0),
        ("sentences", ("m",), "inc", 1.0),
        ("step_rows", ("m",), "observe", 30.0),
        ("queue_depth", ("m",), "set", 7.0),
        ("step_rows", ("n",), "observe", 1.0),
        ("sentences", ("m",), "inc", 2.0),
        ("queue_depth", ("m",), "set", 2.0),
    ]
    for name, labels, method, value in calls:
        getattr(getattr(recorder, name).labels(*labels), method)(value)
        getattr(getattr(direct, name).labels(*labels), method)(value)
    updates = recorder.take()
    assert sorted(updates) == [
        ("queue_depth", ("m",), "set", 2.0),
        ("sentences", ("m",), "inc", 3.0),
        ("step_rows", ("m",), "observe", [3.0, 30.0]),
        ("step_rows", ("n",), "observe", [1.0]),
    ]
    assert recorder.take() == []
    replayed = Metrics()
    assert MetricsReplay(replayed).apply(updates) == 2
    assert samples(replayed) == samples(direct)


def test_no_metric_is_named_like_something_the_recorder_has_itself() -> None:
    """The recorder finds a metric by attribute (`recorder.step_rows`): a metric named like one of its own
    attributes (`take`, say) would reach that attribute instead."""
    assert not set(vars(Metrics())) & set(dir(MetricsRecorder()))


def samples(metrics: Metrics) -> list[str]:
    """A registry's exposition without the `_created` timestamps (when each labelled child was first made)."""
    return [line for line in generate_latest(metrics.registry).decode().splitlines() if "_created{" not in line]


def metric_value(translator: Translator, name: str) -> float:
    return getattr(translator.metrics, name).labels(translator.name)._value.get()


def ticket_count(scheduler: EngineProcess) -> int:
    return len(scheduler._tickets)


def test_an_engine_that_dies_fails_its_requests_and_the_liveness_check(model_dir: Path) -> None:
    with TestClient(create_app(settings_for(model_dir))) as client:
        assert client.get("/health").status_code == 200
        os.kill(engine(client)._process.pid, signal.SIGKILL)
        engine(client)._process.join(10)
        deadline = time.monotonic() + 10
        while client.get("/health").status_code == 200 and time.monotonic() < deadline:
            time.sleep(0.05)
        health = client.get("/health")
        assert health.status_code == 503
        assert health.json() == {"error": "the engine of tiny-en-fr has exited; restart the server"}
        assert client.get("/ready").json() == {"error": "the engine of tiny-en-fr has exited"}
        refused = client.post("/translate", json=NORMAL)
        assert refused.status_code == 503
        assert refused.json() == {"error": "the engine of tiny-en-fr has exited; retry on another instance"}


def test_a_graph_the_engine_cannot_load_stops_the_start_with_its_message(model_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / model_dir.name
    shutil.copytree(model_dir, broken)
    graph = broken / "decoder_step.onnx"
    graph.write_bytes(b"\0" * graph.stat().st_size)  # same size: only the checksum (off here) would tell
    settings = settings_for(broken, verify_checksums=False)
    with pytest.raises(ModelFolderError, match=f"{broken}: .*"):
        load_translators(settings, Metrics())


def cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


def test_the_real_server_drains_and_exits_1_when_its_engine_dies(model_dir: Path) -> None:
    """So that a supervisor (Docker's restart policy, systemd, Kubernetes) starts it again."""
    port = free_port()
    process = start_server(model_dir, port)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, process)
        assert httpx.post(f"{url}/translate", json=NORMAL).status_code == 200
        [engine_pid] = [pid for pid in children(process.pid) if b"spawn_main" in cmdline(pid)]  # not the tracker
        os.kill(engine_pid, signal.SIGKILL)
        assert process.wait(timeout=60) == 1
    finally:
        if process.poll() is None:
            process.kill()
    output = process.stdout.read() if process.stdout else ""
    assert "the engine process of model tiny-en-fr exited (killed by SIGKILL: out of memory? (a container's" in output
    assert "model tiny-en-fr can no longer translate" in output and "Traceback" not in output


def test_the_server_process_does_not_load_onnx_runtime() -> None:
    """With engine processes, the server's own process holds HTTP, text and tokens only."""
    code = "import sys, service.__main__, service.api.app; sys.exit('onnxruntime' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_the_server_process_settles_its_garbage_collector() -> None:
    """Once loaded, the server's objects leave the cyclic collector's generations and young collections are rarer
    (at 32 clients the collector had taken 7.5 % of the HTTP process's CPU)."""
    code = (
        "import gc, sys, service.__main__ as server; server.settle_garbage_collector(); "
        "sys.exit(0 if gc.get_freeze_count() > 1000 and gc.get_threshold()[0] == 20_000 else 1)"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
