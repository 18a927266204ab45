"""The bodies of /translate's requests and answers, and of every error answer, as pydantic models (the OpenAPI
schema documents them)."""

from __future__ import annotations

import json
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, field_validator

from service.text.glossary import MAX_REQUEST_TERMS, MAX_TERM_CHARS, problem


def _glossary_in_a_form(value: object) -> object:
    """A form's field is text: a JSON object there is the glossary."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            raise ValueError("a glossary in a form is a JSON object of terms and their translations") from None
    return value


def _terms(value: dict[str, str] | None) -> dict[str, str] | None:
    for term, translation in (value or {}).items():
        found = problem(term, translation)
        if found:
            raise ValueError(f"glossary term {term[:MAX_TERM_CHARS]!r}: {found}")
    return value


# a request's glossary, /translate's and /translate_file's: a JSON object (in a form, its text), each term checked
RequestGlossary = Annotated[dict[str, str] | None, BeforeValidator(_glossary_in_a_form), AfterValidator(_terms)]
GLOSSARY = TypeAdapter(RequestGlossary)


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
    glossary: RequestGlossary = Field(
        None,
        description="term -> its translation (the term itself keeps it as written): each occurrence of a term, a "
        "whole word in its case as written, goes to the model as a placeholder and comes back as its translation; "
        f"at most {MAX_REQUEST_TERMS} terms of {MAX_TERM_CHARS} characters (in a form: a JSON object)",
    )

    @field_validator("format", mode="before")
    @classmethod
    def _format_given(cls, value: object) -> object:
        """null or "" is the default, as LibreTranslate takes them (a form's empty field is dropped before)."""
        return "text" if value is None or value == "" else value


class DetectedLanguage(BaseModel):
    """A language a text may be in, and the detector's confidence in it, from 0 to 100 (LibreTranslate's scale)."""

    language: str
    confidence: float


class DetectRequest(BaseModel):
    """POST /detect's body, as LibreTranslate takes it. Unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")
    q: str | list[str] = Field(description="text, or a list of texts, whose language to detect")
    api_key: str | None = Field(None, description="needed when the server has MT_API_KEYS")


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
    # each text's confidence in [0, 1] (GET /v1/models says how it is computed); LibreTranslate clients ignore it
    confidence: float | list[float]
    usage: Usage


class ErrorBody(BaseModel):
    error: str
