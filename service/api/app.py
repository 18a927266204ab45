"""The HTTP API: LibreTranslate-compatible /translate and /languages, plus /v1/models, /health, /ready and
/metrics. /translate is a pure ASGI endpoint in front of FastAPI (TranslateEndpoint: the hot route skips FastAPI's
routing, dependencies and response model; the app's OpenAPI schema documents it all the same); the other routes
are FastAPI's. Validates and admits at the edge (size, body time, concurrency, expected queue wait, draining), maps
every error to its HTTP answer in one place (`error_answer`), and never runs inference on the event loop (the
scheduler's worker thread, or the engine process, does).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.api.answers import (
    JSONAnswer,
    RequestContext,
    error_answer,
)
from service.api.detect import detect
from service.api.files import download_file, translate_file_route
from service.api.schemas import DetectedLanguage, DetectRequest, ErrorBody
from service.api.state import State, sample_throughput
from service.api.translate import (
    FORM,
    JSON,
    TranslateEndpoint,
    check_metadata_key,
    document_translate,
)
from service.engine.sessions import decoder_streams, intra_op_threads
from service.errors import (
    ServiceError,
)
from service.files import formats
from service.metrics import Metrics
from service.model.folder import Calibration
from service.scheduling.engine_process import EngineProcess
from service.settings import Settings
from service.text.detection import Detector
from service.translation.registry import Registry, load_translators
from service.translation.translator import Translator

log = logging.getLogger(__name__)
T = TypeVar("T")


MULTIPART_BYTES = 64 * 1024  # a /translate_file body's form fields and part headers, besides the file
DETECT_SCHEMA = DetectRequest.model_json_schema()  # /detect reads its body itself, as JSON or a form
FILE_SCHEMA = {  # /translate_file's form, as LibreTranslate's (file, source, target, api_key) and ours
    "type": "object",
    "required": ["file", "target"],
    "properties": {
        "file": {"type": "string", "format": "binary", "description": "the file; its extension says its format"},
        "source": {"type": "string", "default": "auto"},
        "target": {"type": "string"},
        "api_key": {"type": "string"},
        "fuzzy": {"type": "boolean", "description": "mark machine translations for review (MT_FILE_FUZZY)"},
        "overwrite": {"type": "boolean", "default": False, "description": "translate translated entries again"},
        "response": {"type": "string", "enum": ["url", "file"], "default": "url"},
        "model": {"type": "string"},
    },
}


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
        state.detector = detector_for(state.registry, settings)
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
        body_bytes={"/translate_file": max(settings.max_body_bytes, settings.max_file_bytes + MULTIPART_BYTES)},
    )
    return app


def _add_error_handlers(app: FastAPI, state: State) -> None:
    """FastAPI's routes answer their errors through error_answer, as /translate does."""

    async def answer(_: Request, error: Exception) -> JSONResponse:
        return error_answer(state, error)

    for kind in (ServiceError, RequestValidationError, StarletteHTTPException, Exception):
        app.add_exception_handler(kind, answer)


def _add_routes(app: FastAPI, state: State) -> None:
    settings = state.settings

    @app.get("/languages", summary="Languages and their targets (LibreTranslate's format)")
    async def languages() -> list[dict[str, object]]:
        return state.registry.languages()

    @app.post(
        "/detect",
        summary="Detect the language of a text or of a list of texts (LibreTranslate-compatible)",
        responses={code: {"model": ErrorBody} for code in (400, 403, 413, 415, 422, 503)},
        openapi_extra={
            "requestBody": {"required": True, "content": {kind: {"schema": DETECT_SCHEMA} for kind in (JSON, FORM)}}
        },
    )
    async def detect_route(request: Request) -> list[DetectedLanguage]:
        return await detect(state, request)

    @app.post(
        "/translate_file",
        summary="Translate a localisation file or document (LibreTranslate-compatible)",
        response_model=None,
        responses={
            200: {"description": '{"translatedFileUrl": "..."}, or with response=file the file itself'},
            **{code: {"model": ErrorBody} for code in (400, 403, 404, 413, 503, 504)},
        },
        openapi_extra={"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": FILE_SCHEMA}}}},
    )
    async def translate_file(request: Request) -> Response:
        return await translate_file_route(state, request)

    @app.get(
        "/download_file/{token}/{filename}",
        name="download_file",
        summary="A translated file, while the store keeps it (MT_FILE_STORE_SECONDS)",
        response_class=Response,
        responses={404: {"model": ErrorBody}},
    )
    async def download(token: str, filename: str) -> Response:
        return await download_file(state, token, filename)

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


def detector_for(registry: Registry, settings: Settings) -> Detector:
    """The language detector over the served languages and MT_DETECT_LANGUAGES; its models load on first use."""
    detector = Detector([*registry.languages_served(), *settings.detect_languages], settings.detect_accuracy)
    if detector.unknown:
        log.warning("language detection does not know %s: texts in them are taken for others", detector.unknown)
    return detector


def frontend_settings_of(languages: list[dict[str, object]], settings: Settings) -> dict[str, object]:
    """LibreTranslate's GET /frontend/settings: its character limit, timeout and key requirement, no suggestions,
    file translation and its formats (the extensions service/files reads), and the default pair: the first language
    with targets and its first target."""
    source = next((lang for lang in languages if lang["targets"]), languages[0])
    targets = source["targets"]
    target = next((lang for lang in languages if targets and lang["code"] == targets[0]), source)  # type: ignore[index]
    return {
        "charLimit": settings.max_request_chars,
        "frontendTimeout": int(settings.request_timeout_seconds * 1000),  # milliseconds
        "apiKeys": bool(settings.api_keys),
        "keyRequired": bool(settings.api_keys),
        "suggestions": False,
        "filesTranslation": True,
        "supportedFilesFormat": formats(),
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
        # each sentence's steps score its shortlist's candidates only (MT_SHORTLIST), that many
        "shortlist": manifest.shortlist.candidates if settings.shortlist and manifest.shortlist else None,
        # how /translate's `confidence` is computed: the manifest's calibration (format 13), or uncalibrated
        "confidence": confidence_card(manifest.confidence),
        "warnings": translator.warnings,  # what to change for it to run as measured (translator.weight_bits_warnings)
        "config": manifest.config.model_dump(),
        "provenance": manifest.provenance,
    }


def confidence_card(calibration: Calibration | None) -> dict[str, object]:
    """/v1/models' word on a model's confidences: calibrated (its method, parameters, label and dev-set measures),
    or the geometric mean of the tokens' probabilities, exp(mean log-probability), which no measure calibrated."""
    if calibration is None:
        return {"calibrated": False, "method": "exp(mean_token_logprob)"}
    return {"calibrated": True, **calibration.model_dump()}
