"""POST /translate: a pure ASGI endpoint in front of FastAPI (TranslateEndpoint), the checks of its payload (keys,
items, size), its translation while the client stays, and its answer."""

from __future__ import annotations

import asyncio
import hmac
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from http import HTTPStatus
from typing import Any, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.answers import (
    JSONAnswer,
    error_answer,
)
from service.api.schemas import DetectedLanguage, ErrorBody, TranslateRequest, TranslateResponse, Usage
from service.api.state import State
from service.errors import (
    Forbidden,
    InvalidRequest,
    TooLarge,
)
from service.settings import Settings
from service.text.detection import auto_source
from service.text.glossary import MAX_REQUEST_TERMS
from service.translation.translator import INLINE_CHARS, TranslateOptions, Translation, off_loop

T = TypeVar("T")
JSON, FORM = "application/json", "application/x-www-form-urlencoded"  # the media types /translate reads


ERROR_CODES = (400, 403, 404, 408, 413, 415, 422, 500, 503, 504)  # what /translate may answer besides 200


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
    source, detected = body.source, None
    if source == "auto":
        source, detected = await detected_source(state, texts, body.target, body.model)
    translator = state.registry.pick(source, body.target, body.model)
    options = replace(options, glossary=translator.glossary(body.target, body.glossary))
    state.check_queue_wait(translator)
    state.metrics.in_flight.inc()
    try:
        result = await run_translation(receive, lambda: translator.translate(texts, body.target, options))
    finally:
        state.metrics.in_flight.dec()
    return translate_response(body, result, detected, translator.name).model_dump(exclude_none=True)


async def detected_source(
    state: State, texts: list[str], target: str, model: str | None
) -> tuple[str, list[DetectedLanguage]]:
    """`source: "auto"`: the served source language the texts are in (detection.auto_source), and each text's
    detected language with its confidence; off the event loop for long texts."""
    sources = state.registry.sources_into(target, model)
    refuse_at, pairs = state.settings.detect_refuse_confidence, state.registry.pairs(model)
    inline = sum(len(text) for text in texts) <= INLINE_CHARS
    source, chosen = await off_loop(inline, auto_source, texts, sources, state.detector, refuse_at, target, pairs)
    return source, [DetectedLanguage(language=c.language, confidence=round(c.confidence * 100, 2)) for c in chosen]


def translate_options(settings: Settings, body: TranslateRequest) -> TranslateOptions:
    """A request's search, its omitted fields from the settings; InvalidRequest beyond the server's limits."""
    beam = body.beam_size or settings.default_beam_size
    if beam > settings.max_beam_size or body.alternatives + 1 > settings.max_beam_size:
        raise InvalidRequest(f"beam_size and alternatives + 1 may be at most {settings.max_beam_size}")
    if body.max_length is not None and body.max_length > settings.max_output_tokens:
        raise InvalidRequest(f"max_length may be at most {settings.max_output_tokens}")
    check_glossary(settings, body.glossary)
    return TranslateOptions(
        beam_size=beam,
        alternatives=body.alternatives,
        length_penalty=settings.default_length_penalty if body.length_penalty is None else body.length_penalty,
        max_length=body.max_length,
        html=body.format == "html",
        timeout=body.timeout,
        return_scores=body.return_scores,
    )


def check_glossary(settings: Settings, glossary: dict[str, str] | None) -> None:
    """A request's glossary needs the model's placeholders; InvalidRequest where the server gives it none."""
    if glossary and not settings.mask_symbols:
        raise InvalidRequest(
            "this server gives its model no placeholders (MT_MASK_SYMBOLS=false), which a glossary needs: "
            "send the request without one"
        )


def translate_response(
    body: TranslateRequest, result: Translation, detected: list[DetectedLanguage] | None, model: str
) -> TranslateResponse:
    """The answer: one value per field for a string `q`, a list for a list; `detected`: each text's language when
    the source was "auto"."""
    single = isinstance(body.q, str)
    confidences = [round(c, 4) for c in result.confidences]
    return TranslateResponse(
        translatedText=result.texts[0] if single else result.texts,
        alternatives=result.alternatives[0] if single else result.alternatives,
        detectedLanguage=(detected[0] if single else detected) if detected is not None else None,
        scores=(result.scores[0] if single else result.scores) if body.return_scores else None,
        confidence=confidences[0] if single else confidences,
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
