"""The formats by extension, and translate_file: a file read by its format's reader, every string to translate sent
in one call of `translate`, the file written back whole, or an error and nothing."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePath
from typing import Protocol

from service.files import android, documents, gettext, messages, office, properties, stringsdict, xliff
from service.files.catalogue import Catalogue, FileError, FileOptions

HANDLERS = (
    gettext.Gettext,
    xliff.Xliff,
    android.AndroidStrings,
    messages.JsonMessages,
    properties.JavaProperties,
    properties.AppleStrings,
    stringsdict.StringsDict,
    documents.Subtitles,
    documents.PlainText,
    documents.Html,
    documents.Epub,
    office.Docx,
    office.Pptx,
    office.Odt,
    office.Odp,
)


@dataclass(frozen=True)
class Translated:
    """The translations of `Translate`, one a text, in order, with each one's confidence in [0, 1]."""

    texts: list[str]
    confidences: list[float]


class Translate(Protocol):
    def __call__(self, texts: list[str], fmt: str) -> list[str] | Translated:
        """One translation a text, in order, with their confidences where the translator gives them (a plain list:
        none, as from a server that sends none); `fmt` "html": each text is markup (segments.py)."""
        ...


@dataclass(frozen=True)
class TranslatedFile:
    data: bytes
    filename: str
    media_type: str
    format: str  # the format's short name (its handler's `name`): po, xliff, android, json, ..., docx, pptx, epub
    units: int  # strings the file holds
    translated: int  # translated now
    kept: int  # left as they were (already translated, or marked not to translate)


def formats() -> list[str]:
    """The extensions translate_file reads."""
    return [suffix for handler in HANDLERS for suffix in handler.suffixes]


def _handler(filename: str) -> type:
    name = PurePath(filename).name.lower()
    for handler in HANDLERS:
        if any(name.endswith(suffix) for suffix in handler.suffixes):
            return handler
    raise FileError(400, f"{filename}: not a format this server translates; send one of {', '.join(formats())}")


def _read(data: bytes, filename: str, target: str, options: FileOptions) -> tuple[type, Catalogue]:
    if len(data) > options.max_bytes:
        raise FileError(413, f"{filename}: {len(data)} bytes, over the limit of {options.max_bytes}")
    handler = _handler(filename)
    catalogue = handler(data, filename, target, options)
    strings = sum(len(item.sources) for item in catalogue.items)
    if strings > options.max_units:
        raise FileError(413, f"{filename}: {strings} strings to translate, over the limit of {options.max_units}")
    return handler, catalogue


def source_texts(data: bytes, filename: str, options: FileOptions) -> list[str]:
    """The strings of the file that translate_file would translate, as plain text (for language detection)."""
    _, catalogue = _read(data, filename, "und", options)
    return [segment.text(segment.markup) for item in catalogue.items for segment in item.sources]


def translate_file(
    data: bytes, filename: str, target: str, translate: Translate, options: FileOptions
) -> TranslatedFile:
    """The file with its strings translated into `target`: FileError for a file that cannot be (nothing written);
    an error of `translate` goes to the caller as it is."""
    handler, catalogue = _read(data, filename, target, options)
    segments = [segment for item in catalogue.items for segment in item.sources]
    answer = translate([segment.markup for segment in segments], "html") if segments else []
    translations, confidences = (answer.texts, answer.confidences) if isinstance(answer, Translated) else (answer, [])
    if len(translations) != len(segments) or len(confidences) not in (0, len(segments)):
        given = f"{len(translations)} translations and {len(confidences)} confidences"
        raise RuntimeError(f"{given} for {len(segments)} strings")
    at = 0
    for item in catalogue.items:
        if confidences:  # a plural's: its least sure form's
            item.confidence = min(confidences[at : at + len(item.sources)])
        catalogue.put(item, translations[at : at + len(item.sources)])
        at += len(item.sources)
    output = catalogue.dump()
    name = getattr(handler, "output_name", None)
    renamed = name(filename, target) if name else filename
    return TranslatedFile(
        output, renamed, handler.media_type, handler.name, catalogue.units, len(catalogue.items), catalogue.kept
    )
