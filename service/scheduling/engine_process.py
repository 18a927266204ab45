"""A model's scheduler and ONNX Runtime sessions in a process of their own (`MT_ENGINE_PROCESS`, on by default).

In one process, the HTTP side (uvicorn, FastAPI, text and tokens: ~0.9 ms of Python per request) and the
decoding loop (~2 ms of Python per step between graph runs) take turns on one GIL: on the default model at 32
clients the server used 1.5 of 2 cores and delivered 72 % of what the scheduler alone delivers. Here the HTTP
process keeps the text path and the tokenizer; the engine process gets token ids and search options and sends
back hypotheses. The server process talks to it through `EngineProcess`, which offers what the Translator and
the API use of an in-process `Scheduler`. Its threads run under SCHED_BATCH (`MT_ENGINE_BATCH_SCHEDULING`,
`placement.run_as_batch`): one that wakes waits for the HTTP process's turn on a shared core.

Messages are tuples of plain values over a multiprocessing Pipe, sent as lists: one write and one read for all
that one side had to say at once (the server: a turn of its event loop; the engine: what its outbox had queued).
`Wire` pickles each list itself, and search options and hypotheses cross as tuples (`options_wire`, `hypotheses_wire`):
see `Wire` for what that saves.
    server -> engine: ("warm_up", src_ids), ("submit", key, deadline, [(src_ids, options), ...]),
                      ("cancel", key), ("close",), ("stop", timeout)
    engine -> server: ("ready", providers) or ("failed", message) once, at start; ("warmed", error or None);
                      ("metrics", updates); ("done", key, results, queue_seconds);
                      ("error", key, kind, message, reason); ("stopped",)
Deadlines are `time.monotonic()` values: one clock for every process of a machine. The engine's metric updates
are recorded and replayed on the server's registry (before each result and every METRICS_SECONDS), so /metrics
stays one registry. The engine process ignores SIGINT and SIGTERM, which reach the whole process group (Ctrl-C,
systemd's default KillMode, `kill -- -PGID`): the server drains first, then stops it; it exits when told to or when
its pipe closes (the server gone), and SIGKILL ends it. If it dies, its requests fail with 500, /health and /ready
answer 503, and `python -m service` drains and exits with status 1, so that a supervisor restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing as mp
import os
import pickle
import queue
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, fields
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from service import errors
from service.engine.batches import TokenRules
from service.engine.decoding import Hypothesis, SearchOptions
from service.errors import InferenceError, ModelFolderError, Overloaded, ServiceError
from service.metrics import Metrics
from service.model.folder import load_model_folder
from service.scheduling.jobs import BatchLimits, SentenceJob, Ticket, fits
from service.scheduling.placement import Cores, pin_process, run_as_batch
from service.scheduling.scheduler import Scheduler, Streams, new_scheduler
from service.settings import Settings

log = logging.getLogger(__name__)
METRICS_SECONDS = 0.1  # the longest an engine's metric update waits to reach the server's registry
STOP_MARGIN_SECONDS = 10.0  # past the drain timeout, before a stopped engine process is killed
Update = tuple[str, tuple[str, ...], str, Any]  # (metric, label values, method, value): see MetricsRecorder
_OPTION_FIELDS = tuple(f.name for f in fields(SearchOptions))
_HYPOTHESIS_FIELDS = tuple(f.name for f in fields(Hypothesis))
_CLOSED = object()


class Wire:
    """One end of the engine's pipe: each list of messages pickled here, with the standard pickler, and sent as
    bytes. A Connection's own `send` pickles with multiprocessing's ForkingPickler, which builds a pickler with a
    copy of its reducer table at every call: a request's submit and its results, as they were (dataclasses, that
    pickler), took 62 and 65 us of CPU to pickle and unpickle with caches as cold as a server's, against 17 and 26
    as plain tuples pickled here (AMD EPYC, 2 ms between calls)."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn

    def send(self, messages: list[tuple[Any, ...]]) -> None:
        self.conn.send_bytes(pickle.dumps(messages, pickle.HIGHEST_PROTOCOL))

    def recv(self) -> list[tuple[Any, ...]]:
        return pickle.loads(self.conn.recv_bytes())  # noqa: S301 - our own engine process, over our own pipe

    def poll(self) -> bool:
        return self.conn.poll()

    def fileno(self) -> int:
        return self.conn.fileno()

    def close(self) -> None:
        self.conn.close()


def options_wire(options: SearchOptions) -> tuple[Any, ...]:
    """A sentence's search options as the pipe carries them: their fields' values, in order."""
    return tuple(getattr(options, name) for name in _OPTION_FIELDS)


def hypotheses_wire(results: list[list[Hypothesis] | None]) -> list[list[tuple[Any, ...]]]:
    """A request's results as the pipe carries them: per sentence, each hypothesis's fields' values."""
    return [[tuple(getattr(h, name) for name in _HYPOTHESIS_FIELDS) for h in hyps or ()] for hyps in results]


def hypotheses_from_wire(results: list[list[tuple[Any, ...]]]) -> list[list[Hypothesis]]:
    return [[Hypothesis(*h) for h in hyps] for hyps in results]


class EngineProcess:
    """The server's handle on one model's engine process."""

    def __init__(
        self,
        folder: Path,
        settings: Settings,
        rules: TokenRules,
        limits: BatchLimits,
        metrics: Metrics,
        model: str,
        cores: Cores | None = None,
    ) -> None:
        self.limits, self.metrics, self.model = limits, metrics, model
        self.queued = 0  # sentences waiting in the engine, as its last metric update said
        self._replayed = MetricsReplay(metrics)  # the engine's metric updates, on this process's registry
        self._tickets: dict[int, Ticket] = {}
        self._keys: dict[int, int] = {}  # id(ticket) -> key
        self._next_key = itertools.count()
        self._lock = threading.Lock()  # the two dicts, and sends
        self._closing = self._stopping = False
        self._ended = threading.Event()  # the engine said it stopped, or its pipe closed
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._outgoing: list[tuple[Any, ...]] = []  # messages posted on the loop, written at the end of its turn
        self._reader: threading.Thread | None = None
        self.on_exit: Callable[[], None] | None = None  # called once if the engine dies (not when stopped)
        context = mp.get_context("spawn")  # a fresh interpreter: forking a process with ONNX Runtime threads is unsafe
        parent, child = context.Pipe()
        self._conn = Wire(parent)
        self._process = context.Process(
            target=serve,
            args=(Engine(folder, settings, rules, limits, model, cores), child),
            name=f"engine-{model}",
            daemon=True,
        )
        self._process.start()
        child.close()
        self.providers = self._await_ready()  # the messages that came with "ready" are handled: set up all first

    def _await_ready(self) -> list[str]:
        try:
            message = self._await("ready", "failed")
        except (EOFError, OSError):
            self._process.join(5)
            raise ServiceError(
                f"the engine process of model {self.model} exited while loading ({exit_reason(self._process.exitcode)})"
            ) from None
        if message[0] == "failed":
            self._process.join(5)
            raise ModelFolderError(message[1])
        return list(message[1])

    def _await(self, *kinds: str) -> tuple[Any, ...]:
        """Read the engine's messages (before `start`: nobody else reads) until one of `kinds`, handling the rest;
        any that came with it in the same write are handled after it."""
        while True:
            messages = self._conn.recv()
            for index, message in enumerate(messages):
                if message[0] in kinds:
                    for later in messages[index + 1 :]:
                        self._handle(later)
                    return message
                self._handle(message)

    # -- what the Translator and the API use ---------------------------------------------------------

    def fits(self, options: SearchOptions, src_len: int) -> bool:
        return fits(self.limits, options, src_len)

    @property
    def alive(self) -> bool:
        return self._stopping or self._process.is_alive()

    def start(self) -> None:
        """Start reading the engine's messages: on the running event loop when there is one (the server: no
        thread, no hop between threads, no second thread wanting the GIL), else on a thread of its own."""
        try:
            loop = asyncio.get_running_loop()
            loop.add_reader(self._conn.fileno(), self._read_ready)
            # uvloop (libuv's uv_poll_init) leaves the descriptor non-blocking, where asyncio's loop does not
            # (uvloop issue 712): a message read or sent in parts would then fail with BlockingIOError
            os.set_blocking(self._conn.fileno(), True)
            self._loop, self._loop_thread = loop, threading.get_ident()
        except (RuntimeError, NotImplementedError):  # no running loop, or one without add_reader (Windows)
            self._reader = threading.Thread(target=self._read_all, name=f"engine-reader-{self.model}", daemon=True)
            self._reader.start()

    def warm_up(self, src_ids: list[int]) -> None:
        """One real translation through the engine's graphs (outside its scheduler and metrics), before `start`."""
        self._send(("warm_up", src_ids))
        try:
            message = self._await("warmed")
        except (EOFError, OSError):
            raise ServiceError(f"the engine process of model {self.model} exited while warming up") from None
        if message[1] is not None:
            raise ServiceError(f"the engine of model {self.model} failed to warm up: {message[1]}")

    def submit(self, jobs: list[SentenceJob]) -> None:
        """Hands a request's sentences (all of one ticket) to the engine; its queue answers Overloaded when full."""
        ticket = jobs[0].ticket
        with self._lock:
            if self._closing:
                raise Overloaded("the server is shutting down; retry on another instance", "shutting_down")
            if self._ended.is_set():
                raise Overloaded(f"the engine process of model {self.model} has exited", "not_ready")
            key = next(self._next_key)
            self._tickets[key], self._keys[id(ticket)] = ticket, key  # before the answer can arrive
            payload = [(job.src_ids, options_wire(job.options)) for job in sorted(jobs, key=lambda j: j.index)]
            # if the engine has just died, the write fails or is never read: the reader sees the pipe close and
            # fails every ticket it holds, this one too
            self._post(("submit", key, ticket.deadline, payload))

    def cancel(self, ticket: Ticket) -> None:
        ticket.cancelled = True
        with self._lock:
            key = self._keys.pop(id(ticket), None)
            if key is not None:
                self._tickets.pop(key, None)
                self._post(("cancel", key))  # after its submit, if that is still waiting for the loop's turn to end

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._send(("close",))

    def stop(self, timeout: float = 5.0) -> None:
        """Let the engine finish its work for up to `timeout` seconds, then end it; what is left fails."""
        with self._lock:
            self._closing = self._stopping = True
            self._send(("stop", timeout))
        if self._loop is None and self._reader is None:  # never started: nobody else reads
            self._read_all()
        self._ended.wait(timeout + STOP_MARGIN_SECONDS)
        self._process.join(STOP_MARGIN_SECONDS)
        if self._process.is_alive():
            log.error("the engine process of model %s did not stop; killing it", self.model)
            self._process.kill()
            self._process.join()
        self._fail_all(Overloaded("the server stopped before this request finished", "shutting_down"))

    def _post(self, message: tuple[Any, ...]) -> None:
        """(Under the lock.) On the event loop, queue `message` for the write at the end of the loop's turn: the
        requests one turn admits (a write each, and a wake-up of the engine's reader each, were a fifth of the
        server's samples at 32 clients) leave together. Elsewhere, send it at once."""
        if self._loop is None or threading.get_ident() != self._loop_thread:
            self._send(message)
            return
        self._outgoing.append(message)
        if len(self._outgoing) == 1:
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        with self._lock:
            self._write()

    def _send(self, message: tuple[Any, ...]) -> None:
        """(Under the lock, or before the reader starts.) `message`, after any still queued."""
        self._outgoing.append(message)
        self._write()

    def _write(self) -> None:
        messages, self._outgoing = self._outgoing, []
        if messages:
            with contextlib.suppress(OSError, ValueError):  # the engine is gone: the reader fails what it had
                self._conn.send(messages)

    # -- the engine's messages ----------------------------------------------------------------------------

    def _read_ready(self) -> None:
        """The pipe is readable (on the event loop): every message already there."""
        try:
            while self._conn.poll():
                if not self._handle_all(self._conn.recv()):
                    break
        except (EOFError, OSError):
            self._end()

    def _read_all(self) -> None:
        try:
            while self._handle_all(self._conn.recv()):
                pass
        except (EOFError, OSError):
            self._end()

    def _handle_all(self, messages: list[tuple[Any, ...]]) -> bool:
        """One write's messages, in order; False once the engine has stopped."""
        return all(self._handle(message) for message in messages)

    def _handle(self, message: tuple[Any, ...]) -> bool:
        """One message from the engine; False once it has stopped."""
        kind = message[0]
        if kind == "metrics":
            self._replay(message[1])
        elif kind == "done":
            ticket = self._pop(message[1])
            if ticket is not None:
                ticket.queue_seconds = message[3]
                for index, hypotheses in enumerate(hypotheses_from_wire(message[2])):
                    ticket.deliver(index, hypotheses)
        elif kind == "error":
            ticket = self._pop(message[1])
            if ticket is not None:
                ticket.fail(rebuilt_error(*message[2:]))
        elif kind == "stopped":
            self._end()
            return False
        return True

    def _end(self) -> None:
        """No more messages: the engine stopped, or its process is gone."""
        if self._ended.is_set():
            return
        if self._loop is not None:
            self._loop.remove_reader(self._conn.fileno())
        self._ended.set()
        if not self._stopping:
            self._process.join(0.2)  # for its exit code, which it has by now when it crashed
            log.critical("the engine process of model %s exited (%s)", self.model, exit_reason(self._process.exitcode))
            self._fail_all(InferenceError(f"the engine process of model {self.model} exited"))
            if self.on_exit is not None:
                self.on_exit()

    def _pop(self, key: int) -> Ticket | None:
        with self._lock:
            ticket = self._tickets.pop(key, None)
            if ticket is not None:
                self._keys.pop(id(ticket), None)
            return ticket

    def _fail_all(self, error: ServiceError) -> None:
        with self._lock:
            tickets = list(self._tickets.values())
            self._tickets.clear()
            self._keys.clear()
        for ticket in tickets:
            ticket.fail(error)

    def _replay(self, updates: list[Update]) -> None:
        depth = self._replayed.apply(updates)
        if depth is not None:
            self.queued = depth


def rebuilt_error(kind: str, message: str, reason: str | None) -> ServiceError:
    """An engine-side ServiceError, rebuilt in the server (exceptions do not all pickle)."""
    if kind == "Overloaded":
        return Overloaded(message, reason or "queue_full")
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, ServiceError):
        return cls(message)
    return InferenceError(message)


# -- the engine process ------------------------------------------------------------------------------------


class MetricsRecorder:
    """Stands in for Metrics in the engine process: `recorder.step_rows.labels(model).observe(v)` records the
    update for the server to replay on its registry. Updates are gathered per metric, labels and method until the
    outbox takes them: an observe's values as one list, an inc's amounts as their sum, a set as its last value.
    At 32 clients the engine records ~5,000 updates a second (3 a step, 5 a sentence, 2 an encoder pass): gathered,
    an update costs the decoding thread 0.6-1.0 us and the server 0.4-0.6 us to replay, against 1.6 and 1.75 us for
    an entry made anew for every call."""

    def __init__(self) -> None:
        self._pending: dict[tuple[str, tuple[str, ...], str], Any] = {}
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> _Family:
        family = _Family(self, name)
        # found without __getattr__ from now on; no metric's name starts with _, as the recorder's own methods' do
        setattr(self, name, family)
        return family

    def _observe(self, key: tuple[str, tuple[str, ...], str], value: float) -> None:
        with self._lock:
            values = self._pending.get(key)
            if values is None:
                self._pending[key] = [value]
            else:
                values.append(value)

    def _inc(self, key: tuple[str, tuple[str, ...], str], value: float) -> None:
        with self._lock:
            self._pending[key] = self._pending.get(key, 0.0) + value

    def _set(self, key: tuple[str, tuple[str, ...], str], value: float) -> None:
        with self._lock:
            self._pending[key] = value

    def take(self) -> list[Update]:
        """The updates recorded since the last take: (metric, labels, "observe", [values]), (.., "inc", sum),
        (.., "set", last value)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        return [(name, labels, method, value) for (name, labels, method), value in pending.items()]


class _Family:
    def __init__(self, recorder: MetricsRecorder, name: str) -> None:
        self.recorder, self.name = recorder, name
        self._children: dict[tuple[str, ...], _Child] = {}

    def labels(self, *values: str) -> _Child:
        child = self._children.get(values)
        if child is None:
            child = self._children[values] = _Child(self.recorder, self.name, values)
        return child


class _Child:
    def __init__(self, recorder: MetricsRecorder, name: str, labels: tuple[str, ...]) -> None:
        self.recorder = recorder
        self._keys = {method: (name, labels, method) for method in ("observe", "inc", "set")}

    def observe(self, value: float) -> None:
        self.recorder._observe(self._keys["observe"], value)

    def inc(self, value: float = 1.0) -> None:
        self.recorder._inc(self._keys["inc"], value)

    def set(self, value: float) -> None:
        self.recorder._set(self._keys["set"], value)


class MetricsReplay:
    """The server's side of MetricsRecorder: its gathered updates replayed on the server's registry."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._children: dict[tuple[str, tuple[str, ...]], Any] = {}  # (metric, labels) -> its labelled child

    def apply(self, updates: list[Update]) -> int | None:
        """Replays `updates` (MetricsRecorder.take); returns the engine's queue depth if they set it, else None."""
        depth = None
        for name, labels, method, value in updates:
            child = self._children.get((name, labels))
            if child is None:
                child = self._children[(name, labels)] = getattr(self.metrics, name).labels(*labels)
            if method == "observe":
                for observed in value:
                    child.observe(observed)
            else:
                getattr(child, method)(value)
            if name == "queue_depth":
                depth = int(value)
        return depth


class _Outbox:
    """The engine's side of the pipe, sent from a thread of its own: the scheduler thread hands a finished
    request's results over and steps on, and they are pickled and written while its next step runs (ONNX Runtime
    releases the GIL). Everything queued by the time the thread wakes leaves as one list, in one write: a step
    that ends several requests costs the server one read, not two per request (metrics, then results). Metric
    updates always go ahead of the messages queued after them."""

    def __init__(self, conn: Wire, recorder: MetricsRecorder) -> None:
        self.conn, self.recorder = conn, recorder
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None | object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="engine-outbox", daemon=True)
        self._thread.start()

    def send(self, message: tuple[Any, ...] | None) -> None:
        """Queue `message` (None: only the metric updates); the sending thread sends the updates recorded by then
        ahead of it."""
        self._queue.put(message)

    def close(self) -> None:
        """Send everything queued, then end the sending thread."""
        self._queue.put(_CLOSED)
        self._thread.join()

    def _run(self) -> None:
        closed = False
        while not closed:
            queued = [self._queue.get()]
            with contextlib.suppress(queue.Empty):
                while True:
                    queued.append(self._queue.get_nowait())
            closed = _CLOSED in queued  # the last thing ever queued
            updates = self.recorder.take()  # everything recorded before the last of `queued`, and perhaps more
            messages = [("metrics", updates)] if updates else []
            messages += [message for message in queued if message is not None and message is not _CLOSED]
            if messages:
                with contextlib.suppress(OSError, ValueError):  # the server is gone; the main loop sees it and ends
                    self.conn.send(messages)


@dataclass(frozen=True)
class Engine:
    """What an engine process is started with (pickled to it)."""

    folder: Path
    settings: Settings
    rules: TokenRules
    limits: BatchLimits
    model: str
    cores: Cores | None = None  # where its streams and its other threads run (service/scheduling/placement.py)


def serve(engine: Engine, pipe: Connection) -> None:
    """The engine process's main: load, warm, report ready, then take messages until told to stop."""
    conn = Wire(pipe)
    for stop in (signal.SIGINT, signal.SIGTERM):  # sent to the whole process group: the server drains, then stops it
        signal.signal(stop, signal.SIG_IGN)
    if engine.cores is not None:  # every thread but the streams' (which pin themselves) on the others' cores
        pin_process(engine.cores.others)
    if engine.settings.engine_batch_scheduling:  # before any other thread starts: they all inherit it
        run_as_batch()
    level = engine.settings.log_level.upper()
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s [-] %(name)s: %(message)s")  # as the server's
    outbox = _Outbox(conn, MetricsRecorder())
    try:
        _serve(engine, conn, outbox)
    finally:
        outbox.close()  # what is queued leaves before the process does


def _serve(engine: Engine, conn: Wire, outbox: _Outbox) -> None:
    """`serve`, its outbox open."""
    from service.engine.sessions import decoder_streams, open_runtime

    try:
        loaded = load_model_folder(engine.folder, verify_checksums=False)  # the server checked the files
        runtime = open_runtime(loaded, engine.settings)
        streams = decoder_streams(loaded.manifest.config, engine.settings)
        recorder: Any = outbox.recorder  # takes the Metrics' calls, replayed on the server's registry
        scheduler = new_scheduler(
            runtime, engine.rules, engine.limits, recorder, engine.model, streams, cores=engine.cores
        )
        scheduler.start()
    except Exception as error:  # noqa: BLE001 - reported to the server, which stops with the message
        outbox.send(("failed", f"{engine.folder}: {error}"))
        return
    outbox.send(("ready", runtime.providers))
    stopped = threading.Event()
    threading.Thread(target=_flush_metrics, args=(outbox, stopped), name="engine-metrics", daemon=True).start()
    tickets: dict[int, Ticket] = {}
    while True:
        try:
            messages = conn.recv()
        except (EOFError, OSError):  # the server is gone
            scheduler.stop(0.0)
            return
        for message in messages:
            if not _take(message, scheduler, outbox, tickets, stopped):
                return


def _take(
    message: tuple[Any, ...],
    scheduler: Scheduler | Streams,
    outbox: _Outbox,
    tickets: dict[int, Ticket],
    stopped: threading.Event,
) -> bool:
    """One message from the server; False once told to stop."""
    kind = message[0]
    if kind == "submit":
        _, key, deadline, payload = message
        ticket = Ticket(len(payload), deadline, lambda t, key=key: _finished(outbox, tickets, key, t))
        tickets[key] = ticket
        try:
            jobs = [SentenceJob(ids, SearchOptions(*opts), ticket, i) for i, (ids, opts) in enumerate(payload)]
            scheduler.submit(jobs)
        except ServiceError as error:
            ticket.fail(error)
    elif kind == "cancel":
        cancelled = tickets.pop(message[1], None)
        if cancelled is not None:
            scheduler.cancel(cancelled)
    elif kind == "warm_up":
        try:
            scheduler.warm_up(message[1])
            outbox.send(("warmed", None))
        except Exception as error:  # noqa: BLE001 - the server stops with the message
            outbox.send(("warmed", f"{type(error).__name__}: {error}"))
    elif kind == "close":
        scheduler.close()
    elif kind == "stop":
        scheduler.stop(message[1])
        stopped.set()
        outbox.send(("stopped",))
        return False
    return True


def _finished(outbox: _Outbox, tickets: dict[int, Ticket], key: int, ticket: Ticket) -> None:
    tickets.pop(key, None)
    if ticket.error is not None:
        error = ticket.error
        outbox.send(("error", key, type(error).__name__, str(error), getattr(error, "reason", None)))
    else:
        outbox.send(("done", key, hypotheses_wire(ticket.results), ticket.queue_seconds))


def _flush_metrics(outbox: _Outbox, stopped: threading.Event) -> None:
    while not stopped.wait(METRICS_SECONDS):
        outbox.send(None)


def exit_reason(code: int | None) -> str:
    """An engine process's exit as the log says it: a SIGKILL nobody sent is most often the kernel's out-of-memory
    killer (a container's memory limit), which leaves no other trace in the server's log."""
    if code is None or code >= 0:
        return f"exit code {code}"
    name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else f"signal {-code}"
    hint = ": out of memory? (a container's memory limit, the kernel's OOM killer)" if -code == signal.SIGKILL else ""
    return f"killed by {name}{hint}"
