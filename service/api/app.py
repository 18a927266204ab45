"""The HTTP API: LibreTranslate-compatible /translate and /languages, plus /v1/models, /health, /ready and
/metrics. /translate is a pure ASGI endpoint in front of FastAPI (TranslateEndpoint: the hot route skips FastAPI's
routing, dependencies and response model; the app's OpenAPI schema documents it all the same); the other routes
are FastAPI's. Validates and admits at the edge (size, body time, concurrency, expected queue wait, draining), maps
every error to its HTTP answer in one place (`error_answer`), and never runs inference on the event loop (the
scheduler's worker thread, or the engine process, does).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import replace
from http import HTTPStatus
from typing import Any, Literal, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.admission import Throughput
from service.engine.sessions import decoder_streams, intra_op_threads
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
from service.scheduling.engine_process import EngineProcess
from service.settings import Settings
from service.text.glossary import MAX_REQUEST_TERMS, MAX_TERM_CHARS, problem
from service.translation.registry import Registry, load_translators
from service.translation.translator import TranslateOptions, Translation, Translator

log = logging.getLogger(__name__)
T = TypeVar("T")
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
THROUGHPUT_SAMPLE_SECONDS = 0.25
JSON, FORM = "application/json", "application/x-www-form-urlencoded"  # the media types /translate reads
ERROR_CODES = (400, 403, 404, 408, 413, 415, 422, 500, 503, 504)  # what /translate may answer besides 200


# -- request and response bodies ------------------------------------------------------------------


class TranslateRequest(BaseModel):
    """LibreTranslate's fields, then ours (all optional). Unknown fields are ignored, as LibreTranslate does."""

    model_config = ConfigDict(extra="ignore")
    q: str | list[str] = Field(description="text, or a list of texts, to translate")
    source: str = Field("auto", description="source language code, or 'auto'")
    target: str = Field(description="target language code")
    format: Literal["text", "html"] = Field(
        "text",
        description="html: tags are kept, text between them translated; a sentence runs through inline elements' "
        "tags, and code, samp, translate=\"no\" elements and those marked lang of another language stay in it as "
        "written; alt, title, placeholder and other attributes people read are translated too",
    )
    alternatives: int = Field(0, ge=0, description="alternative translations besides the best; at most max beam - 1")
    api_key: str | None = Field(None, description="needed when the server has API keys (or a header has it)")
    beam_size: int | None = Field(None, ge=1, description="1 is greedy; default from the server's settings")
    max_length: int | None = Field(None, ge=1, description="maximum generated tokens per sentence")
    length_penalty: float | None = Field(
        None, ge=0.0, le=5.0, allow_inf_nan=False, description="beam score = log p / length ** this"
    )
    model: str | None = Field(None, description="a loaded model's name (GET /v1/models); default: by languages")
    timeout: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="seconds; can only lower the server's deadline"
    )
    return_scores: bool = Field(False, description="add each text's mean normalised log-probability")
    glossary: dict[str, str] | None = Field(
        None,
        description="term -> its translation (the term itself keeps it as written): each occurrence of a term, a "
        "whole word in its case as written, goes to the model as a placeholder and comes back as its translation; "
        f"at most {MAX_REQUEST_TERMS} terms of {MAX_TERM_CHARS} characters (in a form: a JSON object)",
    )

    @field_validator("glossary", mode="before")
    @classmethod
    def _glossary_in_a_form(cls, value: object) -> object:
        """A form's field is text: a JSON object there is the glossary."""
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                raise ValueError("a glossary in a form is a JSON object of terms and their translations") from None
        return value

    @field_validator("glossary")
    @classmethod
    def _terms(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        for term, translation in (value or {}).items():
            found = problem(term, translation)
            if found:
                raise ValueError(f"glossary term {term[:MAX_TERM_CHARS]!r}: {found}")
        return value

    @field_validator("format", mode="before")
    @classmethod
    def _format_given(cls, value: object) -> object:
        """null or "" is the default, as LibreTranslate takes them (a form's empty field is dropped before)."""
        return "text" if value is None or value == "" else value


class DetectedLanguage(BaseModel):
    language: str
    confidence: float


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    queue_seconds: float
    total_seconds: float
    model: str
    truncated_sentences: int = Field(
        description="sentences whose translation stopped at the length cap (max_length or the server's) before "
        "the model ended it: a raised max_length may finish them"
    )


class TranslateResponse(BaseModel):
    translatedText: str | list[str]  # noqa: N815 - LibreTranslate's name
    alternatives: list[str] | list[list[str]]
    detectedLanguage: DetectedLanguage | list[DetectedLanguage] | None = None  # noqa: N815 - a list for a list q
    scores: float | list[float] | None = None
    usage: Usage


class ErrorBody(BaseModel):
    error: str


# -- middleware: request ids, metrics, body size --------------------------------------------------


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
    ) -> None:
        self.app, self.metrics, self.max_body_bytes, self.body_timeout = app, metrics, max_body_bytes, body_timeout
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
            if length.isdigit() and int(length) > self.max_body_bytes:
                response = rejection(
                    self.metrics, TooLarge(f"the body is {int(length)} bytes; the limit is {self.max_body_bytes}")
                )
                await response(scope, receive, send_with_id)
            else:
                guarded = BodyGuard(receive, self.max_body_bytes, self.body_timeout)
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


LOGGED_PATH_CHARS = 200


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


class TranslateEndpoint:
    """Pure ASGI middleware, inside CORS and the request context: the whole of /translate, answered without
    FastAPI's routing, middleware stack, dependency solving and response model (the HTTP process's CPU per request
    at 32 clients: 711 -> 569 µs, and more rows in the decoder's batch; docs/performance.md, the change table). A
    request is admitted (State.admit: draining, readiness, the concurrency limit) before its body is read, then read,
    validated, translated and answered with the same models (TranslateRequest, TranslateResponse; the app's OpenAPI
    schema documents them: `document_translate`) and the same errors (`error_answer`) as every route. Other paths
    go on to FastAPI."""

    path = "/translate"  # RequestContext labels the request's metrics with scope["route"].path

    def __init__(self, app: ASGIApp, state: State) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.app(scope, receive, send)
            return
        scope["route"] = self
        try:
            answer = await self.answer(scope, receive)
        except Exception as error:  # every error gets its answer
            answer = error_answer(self.state, error)
        await answer(scope, receive, send)

    async def answer(self, scope: Scope, receive: Receive) -> JSONResponse:
        if scope["method"] != "POST":
            raise StarletteHTTPException(405, f"use POST for {self.path}", headers={"Allow": "POST"})
        self.state.admit()  # before the body is read: a refusal under a flood costs little
        self.state.handling += 1
        try:
            return JSONAnswer(await translate(self.state, scope, receive))
        finally:
            self.state.handling -= 1


# -- the app --------------------------------------------------------------------------------------


class State:
    """What the routes share: the loaded models, readiness and draining, and admission's counts."""

    def __init__(self, settings: Settings, metrics: Metrics) -> None:
        self.settings, self.metrics = settings, metrics
        self.registry = Registry([])
        self.ready = False
        self.draining = False  # SIGTERM seen: /ready and /translate answer 503 until the process exits
        self.handling = 0  # /translate requests admitted past the concurrency check and not yet answered
        self.throughput: dict[str, Throughput] = {}
        self.on_fatal: Callable[[], None] | None = None  # the process's way out (python -m service: drain, exit 1)

    def engine_exited(self, model: str) -> None:
        """A model's engine died: stop admitting, and let the process end so that a supervisor restarts it."""
        log.critical("model %s can no longer translate; the server stops admitting requests", model)
        self.ready = False
        self.metrics.ready.set(0)
        if self.on_fatal is not None:
            self.on_fatal()

    def engine_failure(self) -> str | None:
        """Which models' decoding loops (engine process or worker thread) have ended on their own, if any."""
        dead = sorted(name for name, t in self.registry.translators.items() if not t.scheduler.alive)
        return f"the engine of {', '.join(dead)} has exited" if dead else None

    def begin_drain(self) -> None:
        """Stop admitting: readiness false, new translations 503 (reason shutting_down); work in flight goes on."""
        if not self.draining:
            self.draining, self.ready = True, False
            self.metrics.ready.set(0)
            log.info("draining: %d requests in flight", self.handling)

    async def stop_engines(self) -> None:
        """The grace period is over: every model's work in flight fails now, each request answered 503
        (shutting_down, "the server stopped before this request finished") while its connection is still open,
        rather than cancelled by uvicorn's shutdown (a plain-text 500) seconds later. Stopping again at the
        lifespan's end finds nothing left."""
        stopping = [asyncio.to_thread(t.scheduler.stop, 0.0) for t in self.registry.translators.values()]
        await asyncio.gather(*stopping)

    def admit(self) -> None:
        """The checks before a /translate request's body is read."""
        retry = self.settings.retry_after_seconds
        if self.draining:
            raise Overloaded("the server is shutting down; retry on another instance", "shutting_down", retry)
        if not self.ready:
            failure = self.engine_failure()
            message = f"{failure}; retry on another instance" if failure else "the server is not ready yet"
            raise Overloaded(message, "not_ready", retry)
        if self.handling >= self.settings.max_concurrent_requests:
            raise Overloaded(
                f"too many requests at once (the limit is {self.settings.max_concurrent_requests}); retry later",
                "too_many_requests",
                retry,
            )

    def check_queue_wait(self, translator: Translator) -> None:
        """503 when the sentences already waiting would keep a newcomer in the queue beyond the limit."""
        limit = self.settings.max_queue_wait_seconds
        throughput = self.throughput.get(translator.name)
        if limit <= 0 or throughput is None:
            return
        wait = throughput.expected_wait(translator.scheduler.queued)
        if wait is not None and wait > limit:
            waiting = "it has not moved lately" if math.isinf(wait) else f"about {wait:.1f} s of work waiting"
            raise Overloaded(
                f"the queue is full ({waiting}; the limit is {limit:g} s); retry later",
                "queue_full",
                self.settings.retry_after_seconds,
            )

    def sample_throughput(self, now: float) -> None:
        for name, translator in self.registry.translators.items():
            finished = self.metrics.registry.get_sample_value("mt_sentences_total", {"model": name}) or 0.0
            waiting = translator.scheduler.queued
            throughput = self.throughput.setdefault(name, Throughput())
            throughput.sample(now, finished, waiting)
            wait = throughput.expected_wait(waiting)
            self.metrics.expected_queue_wait.labels(name).set(-1.0 if wait is None else wait)


async def sample_throughput(state: State) -> None:
    """Forever: each model's throughput and expected queue wait, every THROUGHPUT_SAMPLE_SECONDS."""
    while True:
        state.sample_throughput(time.monotonic())
        await asyncio.sleep(THROUGHPUT_SAMPLE_SECONDS)


def create_app(
    settings: Settings, translators: list[Translator] | None = None, metrics: Metrics | None = None
) -> FastAPI:
    """The whole HTTP service. Models load (from settings, unless given) and warm up in the lifespan."""
    metrics = metrics or Metrics()
    state = State(settings, metrics)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        loaded = (
            translators if translators is not None else await asyncio.to_thread(load_translators, settings, metrics)
        )
        for translator in loaded:
            await asyncio.to_thread(translator.warm_up)
            translator.scheduler.start()
            if isinstance(translator.scheduler, EngineProcess):
                translator.scheduler.on_exit = lambda name=translator.name: state.engine_exited(name)
        state.registry = Registry(loaded)
        state.ready = not state.draining
        metrics.ready.set(int(state.ready))
        sampler = asyncio.ensure_future(sample_throughput(state))
        loop = type(asyncio.get_running_loop()).__module__.split(".")[0]  # uvloop, or asyncio where it is missing
        log.info("ready: %s (event loop: %s)", ", ".join(t.name for t in loaded), loop)
        yield
        sampler.cancel()
        state.ready = False
        metrics.ready.set(0)
        for translator in loaded:
            translator.scheduler.close()
        await asyncio.gather(*(asyncio.to_thread(t.scheduler.stop, settings.request_timeout_seconds) for t in loaded))

    app = FastAPI(
        title="transformer-mt-server",
        version="0.1.0",
        lifespan=lifespan,
        default_response_class=JSONAnswer,
        description="Translation with Transformer encoder-decoder models on ONNX Runtime. "
        "POST /translate is compatible with LibreTranslate's API.",
    )
    app.state.service = state
    _add_error_handlers(app, state)
    _add_routes(app, state)
    document_translate(app)
    app.add_middleware(TranslateEndpoint, state=state)  # inside CORS and the request context: its answers get both
    if settings.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["X-API-Key", "X-Request-ID", "Authorization"],
            expose_headers=["X-Request-ID", "Retry-After"],
        )
    app.add_middleware(
        RequestContext,
        metrics=metrics,
        max_body_bytes=settings.max_body_bytes,
        body_timeout=settings.body_timeout_seconds,
        access_log=settings.access_log,
        paths=frozenset([TranslateEndpoint.path, *(getattr(route, "path", "") for route in app.routes)]),
    )
    return app


def _add_error_handlers(app: FastAPI, state: State) -> None:
    """FastAPI's routes answer their errors through error_answer, as /translate does."""

    async def answer(_: Request, error: Exception) -> JSONResponse:
        return error_answer(state, error)

    for kind in (ServiceError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(kind, answer)


def describe_validation(errors: list[Any]) -> str:
    """Pydantic's error list as one sentence a client can act on."""
    parts = []
    for e in errors[:5]:
        where = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{where}: {str(e.get('msg', 'invalid')).removeprefix('Value error, ')}")  # ours say it all
    return "invalid request: " + "; ".join(parts)


async def read_payload(request: Request) -> dict[str, Any]:
    """JSON or form-encoded body -> dict; anything else is a 422/415 with a clear message. The body's size and
    arrival time are bounded by the middleware (BodyGuard) while it is read; a client gone before it is whole raises
    ClientDisconnect."""
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type in (FORM, "multipart/form-data"):
        try:
            form = await request.form()
        except StarletteHTTPException as error:  # Starlette's 400s: no multipart boundary, too many fields or files
            raise RequestValidationError([{"loc": ("body",), "msg": f"not a valid form ({error.detail})"}]) from None
        # an HTML form sends its empty fields too: an option left empty is an option not given
        given = [k for k in form if k == "q" or form.get(k) != ""]
        payload: dict[str, Any] = {k: form.getlist(k) if k == "q" else form.get(k) for k in given}
        if isinstance(payload.get("q"), list) and len(payload["q"]) == 1:
            payload["q"] = payload["q"][0]
        return payload
    if content_type not in (JSON, ""):
        raise StarletteHTTPException(415, f"unsupported content type {content_type!r}: send JSON or a form")
    raw = await request.body()
    try:
        payload = json.loads(raw)
    except RecursionError:  # [[[[...]]]]: the parser's recursion limit, not the server's
        raise RequestValidationError([{"loc": ("body",), "msg": "JSON nested too deeply"}]) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RequestValidationError([{"loc": ("body",), "msg": f"not valid JSON ({error})"}]) from None
    except ValueError:  # an integer of more digits than Python converts (4300)
        raise RequestValidationError([{"loc": ("body",), "msg": "not valid JSON (a number is too long)"}]) from None
    if not isinstance(payload, dict):
        raise RequestValidationError([{"loc": ("body",), "msg": "expected a JSON object"}])
    return payload


def key_matches(keys: list[str], given: str) -> bool:
    """Whether `given` is one of `keys`: every key is compared, each in constant time. Keys are never logged."""
    supplied, matched = given.encode(errors="surrogatepass"), False  # a lone surrogate matches no key: 403, not 500
    for key in keys:
        matched |= hmac.compare_digest(supplied, key.encode(errors="surrogatepass"))
    return matched


def header_key(request: Request) -> str:
    """The key an X-API-Key or an Authorization: Bearer header holds; "" when neither does."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return request.headers.get("x-api-key") or (token.strip() if scheme.lower() == "bearer" else "")


def check_key(settings: Settings, payload: dict[str, Any], request: Request) -> None:
    """/translate when MT_API_KEYS is set: the body's api_key (LibreTranslate's place), else a header's. Checked
    as soon as the body is parsed, before its size and fields: a client without a key learns nothing more."""
    if not settings.api_keys:
        return
    in_body, in_header = payload.get("api_key"), header_key(request)
    given = in_body if isinstance(in_body, str) and in_body else in_header  # a body key that is no text: a header's
    if not key_matches(settings.api_keys, given):
        sent = given or in_body not in (None, "")
        raise Forbidden("a valid api_key is required" if sent else "this server needs an api_key")


def check_metadata_key(settings: Settings, request: Request) -> None:
    """/metrics and /v1/models when MT_METADATA_API_KEYS is set: X-API-Key or Authorization: Bearer."""
    if not settings.metadata_api_keys:
        return
    given = header_key(request)
    if not key_matches(settings.metadata_api_keys, given):
        raise Forbidden(
            "a valid key is required (X-API-Key header or Authorization: Bearer)"
            if given
            else "this route needs a key (X-API-Key header or Authorization: Bearer)"
        )


def check_items(settings: Settings, payload: dict[str, Any]) -> None:
    """The length of q, and of a glossary, before validating them item by item (a 1 MB body holds 250,000 empty
    strings)."""
    q, glossary = payload.get("q"), payload.get("glossary")
    if isinstance(q, list) and len(q) > settings.max_request_items:
        raise TooLarge(f"q has {len(q)} texts; the limit is {settings.max_request_items}")
    if isinstance(glossary, dict) and len(glossary) > MAX_REQUEST_TERMS:
        raise TooLarge(f"the glossary has {len(glossary)} terms; the limit is {MAX_REQUEST_TERMS}")


def check_size(settings: Settings, texts: list[str]) -> None:
    if len(texts) > settings.max_request_items:
        raise TooLarge(f"q has {len(texts)} texts; the limit is {settings.max_request_items}")
    chars = sum(len(t) for t in texts)
    if chars > settings.max_request_chars:
        raise TooLarge(f"q has {chars} characters; the limit is {settings.max_request_chars}")


async def until_disconnected(receive: Receive) -> None:
    """Returns when the client goes away (the body has been read, so receive() waits for that)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def run_translation(receive: Receive, work: Callable[[], Awaitable[T]]) -> T:
    """Runs `work`, cancelling it (and so dropping its rows) if the client disconnects first."""
    task = asyncio.ensure_future(work())
    watcher = asyncio.ensure_future(until_disconnected(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        raise ClientDisconnect()
    return task.result()


# -- POST /translate ------------------------------------------------------------------------------


async def translate(state: State, scope: Scope, receive: Receive) -> dict[str, Any]:
    """POST /translate's work once admitted: the body read and validated, its texts translated by the model that
    the languages (or `model`) pick, the answer as TranslateResponse's fields."""
    settings, request = state.settings, Request(scope, receive)
    payload = await read_payload(request)
    check_key(settings, payload, request)
    check_items(settings, payload)
    body = TranslateRequest.model_validate(payload)
    texts = [body.q] if isinstance(body.q, str) else body.q
    check_size(settings, texts)
    options = translate_options(settings, body)
    translator, source = state.registry.pick(body.source, body.target, body.model)
    options = replace(options, glossary=translator.glossary(body.target, body.glossary))
    state.check_queue_wait(translator)
    state.metrics.in_flight.inc()
    try:
        result = await run_translation(receive, lambda: translator.translate(texts, body.target, options))
    finally:
        state.metrics.in_flight.dec()
    return translate_response(body, result, source, translator.name).model_dump(exclude_none=True)


def translate_options(settings: Settings, body: TranslateRequest) -> TranslateOptions:
    """A request's search, its omitted fields from the settings; InvalidRequest beyond the server's limits."""
    beam = body.beam_size or settings.default_beam_size
    if beam > settings.max_beam_size or body.alternatives + 1 > settings.max_beam_size:
        raise InvalidRequest(f"beam_size and alternatives + 1 may be at most {settings.max_beam_size}")
    if body.max_length is not None and body.max_length > settings.max_output_tokens:
        raise InvalidRequest(f"max_length may be at most {settings.max_output_tokens}")
    if body.glossary and not settings.mask_symbols:
        raise InvalidRequest(
            "this server gives its model no placeholders (MT_MASK_SYMBOLS=false), which a glossary needs: "
            "send the request without one"
        )
    return TranslateOptions(
        beam_size=beam,
        alternatives=body.alternatives,
        length_penalty=settings.default_length_penalty if body.length_penalty is None else body.length_penalty,
        max_length=body.max_length,
        html=body.format == "html",
        timeout=body.timeout,
        return_scores=body.return_scores,  # else greedy steps may skip the log-softmax
    )


def translate_response(body: TranslateRequest, result: Translation, source: str, model: str) -> TranslateResponse:
    """The answer: one value per field for a string `q`, a list for a list."""
    single = isinstance(body.q, str)
    detected = DetectedLanguage(language=source, confidence=100.0) if body.source == "auto" else None
    return TranslateResponse(
        translatedText=result.texts[0] if single else result.texts,
        alternatives=result.alternatives[0] if single else result.alternatives,
        detectedLanguage=detected if single or detected is None else [detected] * len(result.texts),
        scores=(result.scores[0] if single else result.scores) if body.return_scores else None,
        usage=Usage(
            input_tokens=result.input_tokens,
            output_tokens=result.output_tokens,
            queue_seconds=round(result.queue_seconds, 4),
            total_seconds=round(result.seconds, 4),
            model=model,
            truncated_sentences=result.truncated_sentences,
        ),
    )


def document_translate(app: FastAPI) -> None:
    """Adds POST /translate (TranslateEndpoint, not a FastAPI route) to the app's OpenAPI schema: its body as JSON
    or a form (TranslateRequest), its answer (TranslateResponse) and its errors (ErrorBody)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        template = "#/components/schemas/{model}"
        _, definitions = models_json_schema(
            [(TranslateRequest, "validation"), (TranslateResponse, "serialization"), (ErrorBody, "serialization")],
            ref_template=template,
        )
        schema.setdefault("components", {}).setdefault("schemas", {}).update(definitions["$defs"])

        def content(model: type[BaseModel], *kinds: str) -> dict[str, Any]:
            return {kind: {"schema": {"$ref": template.format(model=model.__name__)}} for kind in kinds}

        answers = {"200": {"description": "the translation", "content": content(TranslateResponse, JSON)}}
        for code in ERROR_CODES:
            answers[str(code)] = {"description": HTTPStatus(code).phrase, "content": content(ErrorBody, JSON)}
        operation = {
            "summary": "Translate text (LibreTranslate-compatible)",
            "operationId": "translate",
            "requestBody": {"required": True, "content": content(TranslateRequest, JSON, FORM)},
            "responses": answers,
        }
        schema["paths"] = {"/translate": {"post": operation}, **schema.get("paths", {})}
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _add_routes(app: FastAPI, state: State) -> None:
    settings = state.settings

    @app.get("/languages", summary="Languages and their targets (LibreTranslate's format)")
    async def languages() -> list[dict[str, object]]:
        return state.registry.languages()

    @app.get("/frontend/settings", summary="What a LibreTranslate front-end needs to know (LibreTranslate's format)")
    async def frontend_settings() -> dict[str, object]:
        return frontend_settings_of(state.registry.languages(), settings)

    @app.get(
        "/v1/models",
        summary="Loaded models and their manifest data",
        responses={403: {"model": ErrorBody}},
    )
    async def models(request: Request) -> dict[str, object]:
        check_metadata_key(settings, request)
        return {"models": [model_card(t, settings) for t in state.registry.translators.values()]}

    @app.get(
        "/health",
        summary="Liveness: the process answers and every model's decoding loop runs",
        responses={503: {"model": ErrorBody}},
    )
    async def health() -> Response:
        failure = state.engine_failure()
        if failure:
            return JSONAnswer({"error": f"{failure}; restart the server"}, 503)
        return JSONAnswer({"status": "ok"})

    @app.get(
        "/ready",
        summary="Readiness: models loaded and warmed up, admitting requests",
        responses={503: {"model": ErrorBody}},
    )
    async def ready() -> Response:
        failure = state.engine_failure()
        if state.ready and not failure:
            return JSONAnswer({"status": "ready", "models": sorted(state.registry.translators)})
        reason = "shutting down" if state.draining else failure or "not ready"
        retry = {"Retry-After": str(settings.retry_after_seconds)}
        return JSONAnswer({"error": reason}, status_code=503, headers=retry)

    @app.get(
        "/metrics",
        summary="Prometheus metrics",
        response_class=Response,
        responses={200: {"content": {CONTENT_TYPE_LATEST.split(";")[0]: {}}}, 403: {"model": ErrorBody}},
    )
    async def metrics(request: Request) -> Response:
        check_metadata_key(settings, request)
        return Response(generate_latest(state.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    for route in [r for r in app.routes if isinstance(r, APIRoute) and "GET" in r.methods]:  # uptime probes' HEAD
        app.add_api_route(route.path, route.endpoint, methods=["HEAD"], include_in_schema=False)


def frontend_settings_of(languages: list[dict[str, object]], settings: Settings) -> dict[str, object]:
    """LibreTranslate's GET /frontend/settings: its character limit, timeout and key requirement, no suggestions and
    no file translation (not offered yet), and the default pair: the first language with targets and its first
    target."""
    source = next((lang for lang in languages if lang["targets"]), languages[0])
    targets = source["targets"]
    target = next((lang for lang in languages if targets and lang["code"] == targets[0]), source)  # type: ignore[index]
    return {
        "charLimit": settings.max_request_chars,
        "frontendTimeout": int(settings.request_timeout_seconds * 1000),  # milliseconds
        "apiKeys": bool(settings.api_keys),
        "keyRequired": bool(settings.api_keys),
        "suggestions": False,
        "filesTranslation": False,
        "supportedFilesFormat": [],
        "language": {
            "source": {"code": source["code"], "name": source["name"]},
            "target": {"code": target["code"], "name": target["name"]},
        },
    }


def model_card(translator: Translator, settings: Settings) -> dict[str, object]:
    manifest = translator.folder.manifest
    return {
        "name": manifest.name,
        "version": manifest.version,
        "source_language": manifest.source_language,
        "target_languages": manifest.target_languages,
        "variant": translator.variant,
        "variants": sorted(manifest.variants),
        "providers": translator.scheduler.providers,
        "decoder_streams": decoder_streams(manifest.config, settings),  # each with its own batch, cache and threads
        "intra_op_threads": intra_op_threads(manifest.config, settings),  # per stream
        "stream_cores": list(translator.cores.streams) if translator.cores else None,  # pinned (MT_PIN_CORES)
        "glossary_terms": {target: len(g.given) for target, g in translator.glossaries.items()},  # MT_GLOSSARY_FILE
        "rare_letters": manifest.tokenizer.rare_letters,  # given to the model as placeholders (format 9)
        # a sentence's output does not depend on what shares its batch (MT_BATCH_INVARIANT, format 12)
        "batch_invariant": settings.batch_invariant and translator.folder.variant(translator.variant).batch_invariant,
        "weight_bits": translator.folder.variant(translator.variant).weight_bits,  # int8 products' (format 11)
        "warnings": translator.warnings,  # what to change for it to run as measured (translator.weight_bits_warnings)
        "config": manifest.config.model_dump(),
        "provenance": manifest.provenance,
    }
