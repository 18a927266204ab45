"""`python -m service` (or `mt-server`): the translation server under uvicorn, one worker process. The first
SIGTERM or SIGINT drains (readiness false, new translations 503, work in flight finishes within the grace
period), then the process exits 0; a second one ends the grace period at once (what is still running is answered
503), a third stops uvicorn without waiting for its connections to close."""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import logging
import os
import signal
import sys
import time
from types import FrameType
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from service.api.answers import RequestIdFilter
from service.api.app import create_app
from service.api.state import State
from service.arguments import os_error_line, port
from service.errors import ServiceError
from service.metrics import Metrics
from service.settings import load_settings, warn_unknown_variables
from service.translation.registry import load_translators

LOG_FORMAT = "%(asctime)s %(levelname)s [%(request_id)s] %(name)s: %(message)s"


def configure_logging(level: str) -> None:
    """Log lines to stderr, each with its request id. A LogRecord leaves out what LOG_FORMAT does not print (the
    logging HOWTO's "Optimization"): the caller's file and line (a walk up the stack), the thread, the process and
    its multiprocessing name; a request's line, warm, 9.4 -> 7.3 us. At INFO (the default) every request logs a
    line: in the server at 32 clients ~45 us of the HTTP process's CPU a request (docs/performance.md)."""
    logging._srcfile = None  # type: ignore[attr-defined]  # no findCaller
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)


GRACEFUL_CLOSE_SECONDS = 5  # after draining: for uvicorn to finish responses and close connections


class OneSendTransport:
    """A connection's transport whose writes within one turn of the event loop leave in one send. uvicorn's
    httptools protocol writes a response's status line and headers, then its body, each at once: two sends, two
    TCP segments, and a client that reads the headers wakes twice. Everything else goes to the transport itself;
    closing, aborting or handing the connection to another protocol first sends (or, aborting, drops) what waits."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport, self._loop = transport, loop
        self._waiting: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._waiting:
            self._loop.call_soon(self._send)
        self._waiting.append(data)

    def _send(self) -> None:
        if self._waiting:
            data = b"".join(self._waiting)
            self._waiting.clear()
            if not self._transport.is_closing():
                self._transport.write(data)

    def close(self) -> None:
        self._send()
        self._transport.close()

    def write_eof(self) -> None:
        self._send()
        self._transport.write_eof()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._send()
        self._transport.set_protocol(protocol)

    def abort(self) -> None:
        self._waiting.clear()
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class OneSendHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a OneSendTransport."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(OneSendTransport(transport, self.loop))  # type: ignore[arg-type]


class DrainingServer(uvicorn.Server):
    """uvicorn whose first stop signal drains instead of closing the listening socket at once: the socket
    stays open so that new requests get 503 (reason shutting_down) and /ready 503, until the requests in
    flight are answered or `grace` seconds have passed; then uvicorn's own shutdown runs."""

    def __init__(self, config: uvicorn.Config, state: State, grace: float) -> None:
        super().__init__(config)
        self.state, self.grace = state, grace
        self.drain_requested_at: float | None = None
        self.cut_short = False  # a second stop signal: the grace period is over
        self.failed = False
        state.on_fatal = self.fail

    def fail(self) -> None:
        """A model can no longer translate (its engine died): drain as on SIGTERM, then exit with status 1."""
        self.failed = True
        if self.drain_requested_at is None:
            self.drain_requested_at = time.monotonic()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_requested_at is None:  # inside a signal handler: only note it, on_tick does the work
            self.drain_requested_at = time.monotonic()
        elif not self.should_exit:  # a second signal: the grace period ends now, work left is answered 503
            self.cut_short = True
        else:  # a third: uvicorn stops without waiting for connections to close
            super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_requested_at is not None and not self.should_exit:
            self.state.begin_drain()
            waited = time.monotonic() - self.drain_requested_at
            if self.state.handling == 0 or waited >= self.grace or self.cut_short:
                if self.state.handling:
                    logging.getLogger("service").warning(
                        "grace period of %gs %s with %d requests in flight",
                        self.grace,
                        "cut short by a second stop signal" if self.cut_short else "over",
                        self.state.handling,
                    )
                    await self.state.stop_engines()  # their answers (503) go out before the connections close
                self.should_exit = True
        return await super().on_tick(counter)


def start_error_line(error: OSError) -> str:
    """`os_error_line`, and for a refused read the user this process runs as (in the image, uid 10001)."""
    line = os_error_line(error)
    if error.errno == errno.EACCES and hasattr(os, "getuid"):
        line += f" (this server runs as uid {os.getuid()}: the model folders must be readable by it)"
    return line


def settle_garbage_collector() -> None:
    """Once the models are loaded and the app built: everything alive now (modules, FastAPI's routes, pydantic's
    schemas, the tokenizers) leaves the cyclic collector's generations for good, and a young-object collection
    waits for 20,000 new objects instead of 700. A request makes a few thousand short-lived objects, nearly all
    freed by reference counting before any collection sees them; at 32 clients the collector had taken 7.5 % of
    the HTTP process's CPU (perf), 5.5 % with the freeze alone, 1.3 % with both (docs/performance.md, the change
    table)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 in a container)")
    parser.add_argument("--port", type=port, default=8000, help="1-65535 (0: one the system picks)")
    args = parser.parse_args(argv)
    log = logging.getLogger("service")
    configure_logging("INFO")  # until the settings say otherwise: a bad one is logged as every start error is
    try:  # the settings, then every model folder loaded and checked before listening: each error stops the start
        settings = load_settings()
        configure_logging(settings.log_level)
        warn_unknown_variables(log)
        metrics = Metrics()
        translators = load_translators(settings, metrics, pin=True)
    except ServiceError as error:  # a bad setting, a broken model folder, an engine process that could not start
        log.error("cannot start: %s", error)
        return 1
    except OSError as error:  # a model file this process may not read (a mounted folder, another owner)
        log.error("cannot start: %s", start_error_line(error))
        return 1
    app = create_app(settings, translators, metrics)
    settle_garbage_collector()
    config = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        workers=1,
        # pinned dependencies (uvloop: not on Windows, where "auto" is asyncio's loop): at 32 clients the HTTP side
        # took 0.48 cores with asyncio's loop and h11, 0.41 with these, and served 7 % more (Performance)
        loop="auto",
        http=OneSendHttpToolsProtocol,
        log_config=None,
        access_log=False,
        # uvicorn counts the connection asking among the open ones: N + 1 lets N connections in, not N - 1
        limit_concurrency=settings.max_connections + 1,
        timeout_keep_alive=settings.keep_alive_seconds,
        timeout_graceful_shutdown=GRACEFUL_CLOSE_SECONDS,
    )
    server = DrainingServer(config, app.state.service, settings.shutdown_grace_seconds)
    # after a second signal uvicorn re-raises it to the handler that was there before it: make that one a
    # no-op, so that a requested shutdown exits with status 0
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, lambda *_: None)
    server.run()
    return 0 if server.started and not server.failed else 1


if __name__ == "__main__":
    sys.exit(main())
