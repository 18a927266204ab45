"""Every request's context and every error's answer: the request id, the body's size and time limits, the HTTP
metrics and access log (RequestContext), and the one mapping from an exception to its HTTP answer (error_answer)."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from contextvars import ContextVar
from typing import Any

from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.state import State
from service.errors import (
    DeadlineExceeded,
    Forbidden,
    InferenceError,
    InvalidRequest,
    ModelFolderError,
    NotFound,
    Overloaded,
    RequestTimeout,
    ServiceError,
    TooLarge,
)
from service.metrics import Metrics

log = logging.getLogger(__name__)
request_id: ContextVar[str] = ContextVar("request_id", default="-")
STATUS: dict[type[ServiceError], int] = {
    InvalidRequest: 400,
    Forbidden: 403,
    NotFound: 404,
    RequestTimeout: 408,
    TooLarge: 413,
    InferenceError: 500,
    ModelFolderError: 500,
    Overloaded: 503,
    DeadlineExceeded: 504,
}


SAFE_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")  # echoed in headers and logs: nothing else is taken
LOGGED_PATH_CHARS = 200


class BodyGuard:
    """Wraps an ASGI receive: the whole body must arrive within `timeout` seconds of the request's start
    (RequestTimeout, 408) and within `limit` bytes, chunked bodies included (TooLarge, 413). Once the body is
    complete, messages pass through untouched (the disconnect watch reads them)."""

    def __init__(self, receive: Receive, limit: int, timeout: float) -> None:
        self.receive, self.limit, self.timeout = receive, limit, timeout
        self.deadline = time.monotonic() + timeout
        self.received, self.complete = 0, False

    async def __call__(self) -> Message:
        if self.complete:
            return await self.receive()
        try:
            message = await asyncio.wait_for(self.receive(), max(0.0, self.deadline - time.monotonic()))
        except TimeoutError:
            raise RequestTimeout(f"the body did not arrive within {self.timeout:g} seconds") from None
        if message["type"] != "http.request":
            self.complete = True
            return message
        self.received += len(message.get("body", b""))
        if self.received > self.limit:
            raise TooLarge(f"the body is over {self.limit} bytes; the limit is {self.limit}")
        self.complete = not message.get("more_body", False)
        return message


class RequestContext:
    """Pure ASGI middleware: request id (X-Request-ID in and out), access log (`access_log`), HTTP metrics, body
    size and body time limits."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        max_body_bytes: int,
        body_timeout: float,
        access_log: bool = True,
        paths: frozenset[str] = frozenset(),
        body_bytes: dict[str, int] | None = None,
    ) -> None:
        self.app, self.metrics, self.max_body_bytes, self.body_timeout = app, metrics, max_body_bytes, body_timeout
        self.body_bytes = body_bytes or {}  # a path's own body limit (/translate_file's), else max_body_bytes
        self.access_log = access_log
        self.paths = paths  # the app's routes: a request refused here, before routing, is labelled with its own

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        given = headers.get(b"x-request-id", b"").decode("latin-1")
        rid = given if SAFE_REQUEST_ID.fullmatch(given) else uuid.uuid4().hex[:16]
        token = request_id.set(rid)
        started, status = time.perf_counter(), [500]

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                message["headers"] = list(message.get("headers", [])) + [(b"x-request-id", rid.encode())]
            await send(message)

        try:
            length = headers.get(b"content-length", b"0")
            limit = self.body_bytes.get(scope["path"], self.max_body_bytes)
            if length.isdigit() and int(length) > limit:
                response = rejection(self.metrics, TooLarge(f"the body is {int(length)} bytes; the limit is {limit}"))
                await response(scope, receive, send_with_id)
            else:
                guarded = BodyGuard(receive, limit, self.body_timeout)
                await self.app(scope, guarded, send_with_id)
        finally:
            route = scope.get("route")
            path = getattr(route, "path", scope["path"] if scope["path"] in self.paths else "unmatched")
            elapsed = time.perf_counter() - started
            self.metrics.http_requests.labels(path, scope["method"], str(status[0])).inc()
            self.metrics.http_duration.labels(path).observe(elapsed)
            if self.access_log:
                shown = scope["path"] if scope["path"] in self.paths else loggable(scope["path"])
                log.info("%s %s %d %.1fms", scope["method"], shown, status[0], elapsed * 1000)
            request_id.reset(token)


def loggable(path: str) -> str:
    """A path no route has, as the access log shows it: escaped (a decoded %0a would start a forged log line, a %1b
    colour the terminal), at most LOGGED_PATH_CHARS of it."""
    escaped = ascii(path)[1:-1]
    if len(escaped) <= LOGGED_PATH_CHARS:
        return escaped
    return f"{escaped[:LOGGED_PATH_CHARS]}... ({len(path)} characters)"


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id.get()
        return True


class JSONAnswer(JSONResponse):
    """JSON in UTF-8; an answer that cannot be encoded (a lone surrogate of a request echoed in an error
    message) is sent \\u-escaped instead of failing."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode()


def error_response(error: ServiceError, retry_after_seconds: int | None = None) -> JSONResponse:
    """The one error shape. 503 carries Retry-After; 408 and 413 close the connection (the body may be unread)."""
    status = next(code for cls, code in STATUS.items() if isinstance(error, cls))
    headers = {}
    if isinstance(error, Overloaded):
        headers["Retry-After"] = str(retry_after_seconds or error.retry_after_seconds)
    if isinstance(error, RequestTimeout | TooLarge):
        headers["Connection"] = "close"
    return JSONAnswer({"error": str(error)}, status_code=status, headers=headers or None)


def rejection(metrics: Metrics, error: ServiceError, retry_after_seconds: int | None = None) -> JSONResponse:
    """A refused request's answer (error_response), counted in mt_rejected_requests_total by its reason."""
    if isinstance(error, Overloaded):
        metrics.rejected.labels(error.reason).inc()
    elif isinstance(error, TooLarge):
        metrics.rejected.labels("too_large").inc()
    return error_response(error, retry_after_seconds)


def error_answer(state: State, error: Exception) -> JSONResponse:
    """The one mapping from an exception to its HTTP answer, for /translate (TranslateEndpoint) and for FastAPI's
    routes (their exception handlers call it): the service's errors by STATUS (refusals counted), an invalid body
    422 saying what to change, HTTP's own (404, 405, 415) as raised, a client gone before its answer 499, anything
    else a logged 500."""
    if isinstance(error, ServiceError):
        return rejection(state.metrics, error, state.settings.retry_after_seconds)
    if isinstance(error, RequestValidationError | ValidationError):
        return JSONAnswer({"error": describe_validation(list(error.errors()))}, status_code=422)
    if isinstance(error, StarletteHTTPException):
        return JSONAnswer({"error": str(error.detail)}, status_code=error.status_code, headers=error.headers)
    if isinstance(error, ClientDisconnect):
        return JSONAnswer({"error": "client closed the request"}, status_code=499)
    log.error("unexpected error", exc_info=error)
    return JSONAnswer({"error": "internal error; the request id is in the X-Request-ID header"}, status_code=500)


def describe_validation(errors: list[Any]) -> str:
    """Pydantic's error list as one sentence a client can act on."""
    parts = []
    for e in errors[:5]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {str(e.get('msg', 'invalid')).removeprefix('Value error, ')}")  # ours say it all
    return "invalid request: " + "; ".join(parts)
