"""POST /detect, as LibreTranslate answers it: the languages a text (or a list of texts, merged) may be in, most
likely first, with confidences from 0 to 100."""

from __future__ import annotations

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from service.api.schemas import DetectedLanguage, DetectRequest
from service.api.state import State
from service.api.translate import check_items, check_key, check_size, read_payload
from service.text.detection import Candidate, merged
from service.translation.translator import INLINE_CHARS, off_loop


async def detect(state: State, request: Request) -> list[DetectedLanguage]:
    """The body read and checked as /translate's is (key, items, size), then each text's candidates; for a list, one
    list, each language's confidence averaged over the texts by their lengths. A text with no letter has no
    candidate: the answer is then the first served language at confidence 0, as LibreTranslate answers."""
    state.admit()  # not before the models (and so the languages) are loaded, nor while draining
    settings = state.settings
    payload = await read_payload(request)
    check_key(settings, payload, request)
    check_items(settings, payload)
    try:
        body = DetectRequest.model_validate(payload)
    except ValidationError as error:  # FastAPI's handlers answer its own kind: 422 saying what to change
        raise RequestValidationError(error.errors()) from None
    texts = [body.q] if isinstance(body.q, str) else body.q
    check_size(settings, texts)
    inline = sum(len(text) for text in texts) <= INLINE_CHARS
    per_text = await off_loop(inline, lambda: [state.detector.candidates(text) for text in texts])
    found = per_text[0] if len(texts) == 1 else merged(per_text, [len(text) for text in texts])
    if not found:
        found = [Candidate(state.registry.languages_served()[0], 0.0)]
    return [DetectedLanguage(language=c.language, confidence=round(c.confidence * 100, 2)) for c in found]
