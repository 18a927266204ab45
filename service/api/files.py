"""POST /translate_file, as LibreTranslate takes it (multipart `file`, `source` or "auto", `target`, `api_key`), and
GET /download_file/{token}/{filename}: a localisation file's strings go through the model together (service/files
reads and writes the formats), and the file comes back whole or not at all: by a download URL that serves it for
MT_FILE_STORE_SECONDS, or in the answer itself with `response=file`. A `glossary` field (a JSON object, checked as
/translate checks its own) adds its terms over the server's MT_GLOSSARY_FILE."""

from __future__ import annotations

import asyncio
from urllib.parse import quote

from fastapi import Request
from fastapi.responses import Response
from pydantic import ValidationError
from starlette.datastructures import UploadFile

from service.api.answers import STATUS, JSONAnswer, describe_validation
from service.api.schemas import GLOSSARY
from service.api.state import State
from service.api.translate import check_glossary, check_items, check_key
from service.errors import InvalidRequest, NotFound, ServiceError, TooLarge
from service.files import FileError, FileOptions, Translated, formats, source_texts, translate_file
from service.text.detection import auto_source
from service.translation.bulk import translated_texts

DETECTED_TEXTS = 200  # with source "auto", the strings of the file the detector reads
FIELDS = frozenset({"file", "source", "target", "api_key", "fuzzy", "overwrite", "response", "model", "glossary"})
TRUE, FALSE = frozenset({"1", "true", "yes", "on"}), frozenset({"0", "false", "no", "off"})


async def translate_file_route(state: State, request: Request) -> Response:
    """The upload read (within MT_MAX_FILE_BYTES) and checked, its strings translated, the file written back; each
    file counted by format and outcome (mt_files_total)."""
    state.admit()
    settings, suffix = state.settings, "unknown"
    try:
        form = await request.form(max_files=1, max_fields=len(FIELDS))
        upload = form.get("file")
        if not isinstance(upload, UploadFile) or not upload.filename:
            raise InvalidRequest("send the file as the multipart/form-data field `file`, with its file name")
        suffix = known_suffix(upload.filename)
        fields = {key: value for key, value in form.items() if isinstance(value, str)}
        check_key(settings, fields, request)
        data = await upload.read(settings.max_file_bytes + 1)
        if len(data) > settings.max_file_bytes:
            raise TooLarge(f"the file is over {settings.max_file_bytes} bytes (MT_MAX_FILE_BYTES)")
        answer = await translated_answer(state, request, fields, upload.filename, data)
    except (FileError, ServiceError) as error:
        state.metrics.files.labels(suffix, "refused" if status_of(error) < 500 else "failed").inc()
        if isinstance(error, FileError):
            raise (TooLarge if error.status == 413 else InvalidRequest)(str(error)) from None
        raise
    except Exception:
        state.metrics.files.labels(suffix, "failed").inc()
        raise
    state.metrics.files.labels(suffix, "translated").inc()
    return answer


async def translated_answer(
    state: State, request: Request, fields: dict[str, str], filename: str, data: bytes
) -> Response:
    settings = state.settings
    target = fields.get("target") or ""
    if not target:
        raise InvalidRequest("give the target language as the field `target`")
    options = FileOptions(
        max_bytes=settings.max_file_bytes,
        max_units=settings.max_file_units,
        fuzzy=flag(fields, "fuzzy", settings.file_fuzzy),
        low_confidence=settings.low_confidence,
        only_untranslated=not flag(fields, "overwrite", False),
    )
    glossary = form_glossary(state, fields.get("glossary") or "")
    model = fields.get("model") or None
    source = fields.get("source") or "auto"
    if source == "auto":
        texts = (await asyncio.to_thread(source_texts, data, filename, options))[:DETECTED_TEXTS]
        sources, pairs = state.registry.sources_into(target, model), state.registry.pairs(model)
        refuse_at = settings.detect_refuse_confidence
        joined = ["\n".join(texts)]  # one text: the file is in one language
        source, _ = await asyncio.to_thread(auto_source, joined, sources, state.detector, refuse_at, target, pairs)
    translator = state.registry.pick(source, target, model)
    state.check_queue_wait(translator)
    loop = asyncio.get_running_loop()

    def translate(texts: list[str], fmt: str) -> Translated:  # on a worker thread: the file's strings, all at once
        work = translated_texts(translator, texts, target, fmt == "html", settings, glossary)
        return asyncio.run_coroutine_threadsafe(work, loop).result()

    result = await asyncio.to_thread(translate_file, data, filename, target, translate, options)
    if fields.get("response") == "file":
        disposition = f"attachment; filename*=UTF-8''{quote(result.filename)}"
        return Response(result.data, media_type=result.media_type, headers={"Content-Disposition": disposition})
    token = await asyncio.to_thread(state.file_store.put, result.data, result.filename, result.media_type)
    url = request.url_for("download_file", token=token, filename=result.filename)
    return JSONAnswer({"translatedFileUrl": str(url)})


async def download_file(state: State, token: str, filename: str) -> Response:
    """A translated file while the store keeps it; 404 once it has expired (or for a token never given)."""
    stored = await asyncio.to_thread(state.file_store.get, token)
    if stored is None or stored.filename != filename:
        raise NotFound("no such translated file: it has expired, or the link is wrong; translate the file again")
    disposition = f"attachment; filename*=UTF-8''{quote(stored.filename)}"
    return Response(stored.data, media_type=stored.media_type, headers={"Content-Disposition": disposition})


def form_glossary(state: State, text: str) -> dict[str, str] | None:
    """The form's `glossary`, a JSON object of terms and their translations, checked as /translate checks its own
    (TooLarge over MAX_REQUEST_TERMS terms, InvalidRequest naming the term and what to change); None if empty."""
    if not text.strip():
        return None
    try:
        terms = GLOSSARY.validate_python(text)
    except ValidationError as error:
        errors = [{**e, "loc": ("glossary", *e["loc"])} for e in error.errors()]
        raise InvalidRequest(describe_validation(errors)) from None
    check_items(state.settings, {"glossary": terms})
    check_glossary(state.settings, terms)
    return terms or None


def known_suffix(filename: str) -> str:
    """The file's extension as the metrics label it: one of the supported formats, else "unknown"."""
    name = filename.lower()
    longest_first = sorted(formats(), key=len, reverse=True)
    return next((suffix.lstrip(".") for suffix in longest_first if name.endswith(suffix)), "unknown")


def flag(fields: dict[str, str], name: str, default: bool) -> bool:
    value = fields.get(name, "").strip().lower()
    if not value:
        return default
    if value not in TRUE | FALSE:
        raise InvalidRequest(f"`{name}` is {value!r}: give true or false")
    return value in TRUE


def status_of(error: Exception) -> int:
    if isinstance(error, FileError):
        return error.status
    return next((code for kind, code in STATUS.items() if isinstance(error, kind)), 500)
