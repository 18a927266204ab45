"""What every format's reader gives: the strings to translate as Items (each one Segment a source text: a plural
has one a form it is written in), the counts, and the file written back once the translations are in; and the one
error of this package, FileError, which carries its HTTP status."""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Any, Protocol

from service.files.segments import Segment

# CLDR's plural categories of each language (integers), for the quantities a translated <plurals> needs
PLURAL_CATEGORIES = {
    "ar": ("zero", "one", "two", "few", "many", "other"), "cs": ("one", "few", "many", "other"),
    "de": ("one", "other"), "en": ("one", "other"), "es": ("one", "many", "other"), "fr": ("one", "many", "other"),
    "it": ("one", "many", "other"), "ja": ("other",), "ko": ("other",), "nl": ("one", "other"),
    "pl": ("one", "few", "many", "other"), "pt": ("one", "many", "other"), "ru": ("one", "few", "many", "other"),
    "sv": ("one", "other"), "tr": ("one", "other"), "uk": ("one", "few", "many", "other"), "zh": ("other",),
}


def plural_categories(language: str) -> tuple[str, ...]:
    """The CLDR plural categories `language` uses for whole numbers ("fr-CA" as "fr"); () where not known."""
    return PLURAL_CATEGORIES.get(language.replace("_", "-").split("-")[0].lower(), ())


class FileError(Exception):
    """A file that cannot be translated as sent: `status` 400 (malformed, unknown format, wrong encoding) or 413
    (too large, too many strings, an archive over its limits); the message names the file and what to change."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class FileOptions:
    max_bytes: int = 10_000_000
    max_units: int = 20_000
    fuzzy: bool = True  # mark machine translations as needing review where the format can
    low_confidence: float = 0.0  # ... and those of a confidence below this whatever `fuzzy` says (0: none)
    only_untranslated: bool = True  # False: translate the translated entries again


@dataclass
class Item:
    """One string of the file to translate: a Segment a source text (a plural's: singular and plural), and where
    it lives in the parsed file (`at`: the format's own handle)."""

    sources: list[Segment]
    at: Any = None
    extra: dict[str, Any] = field(default_factory=dict)
    confidence: float | None = None  # its translations' least confidence, where the translator gave them


def needs_review(item: Item, options: FileOptions) -> bool:
    """Whether the item's translation is to be marked for review: all are with `fuzzy`, and a low-confidence one
    (below `low_confidence`) is even without."""
    low = item.confidence is not None and item.confidence < options.low_confidence
    return options.fuzzy or low


class Catalogue(Protocol):
    units: int  # strings the file holds (a header and untranslatable entries not counted)
    kept: int  # of them, left as they were: already translated, or marked not to translate
    items: list[Item]  # the rest, to translate

    def put(self, item: Item, translations: list[str]) -> None:
        """One item's translations (one a source Segment, in order) into the parsed file."""
        ...

    def dump(self) -> bytes: ...


def decoded(data: bytes, name: str, encodings: tuple[str, ...] = ("utf-8",)) -> str:
    """The file's text: a byte-order mark says its encoding, else the first of `encodings` that reads it;
    FileError 400 naming the file otherwise."""
    marks = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
    for bom, encoding in marks:
        if data.startswith(bom):
            encodings = (encoding,)
            break
    for encoding in encodings:
        try:
            return data.decode(encoding)
        except UnicodeDecodeError as error:
            last = error
    raise FileError(400, f"{name}: not {' or '.join(encodings)} text (byte {last.start}): save it as UTF-8") from None
