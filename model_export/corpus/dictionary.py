"""Reads a FreeDict dictionary in dictd format (`.index` and `.dict.dz`) as word-level pairs.

One pair per headword: the headword and the first translation of its first sense. Knows the dictd layout and
FreeDict's entry text; not archives or cleaning.
"""

from __future__ import annotations

import gzip
import re
from collections.abc import Iterator
from pathlib import Path

from model_export.corpus.extract import RawPair

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_SENSE_RE = re.compile(r"^\s*(?:\d+\.\s*)?(.*)$")
_NOTE_RE = re.compile(r"\s*[(\[<][^)\]>]*[)\]>]\s*")


def is_dictionary_member(name: str) -> bool:
    """The dictd files of a FreeDict package."""
    return name.startswith("usr/share/dictd/") and name.endswith((".index", ".dict.dz"))


def dictd_number(text: str) -> int:
    """A dictd index number: base 64, most significant digit first."""
    value = 0
    for char in text:
        value = value * 64 + _B64.index(char)
    return value


def read_index(text: str) -> list[tuple[str, int, int]]:
    """(headword, offset, length) per index line, without the `00database...` header entries."""
    entries = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and not parts[0].startswith("00database"):
            entries.append((parts[0], dictd_number(parts[1]), dictd_number(parts[2])))
    return entries


def entry_pair(entry: str) -> tuple[str, str] | None:
    """(headword, first translation) of one entry: `word /ipa/` then senses, `1. a, b` or `a, b`, one a line."""
    lines = [line for line in entry.strip("\n").split("\n") if line.strip()]
    if len(lines) < 2:
        return None
    headword = lines[0].split(" /", 1)[0].strip()
    sense = _SENSE_RE.match(lines[1]).group(1)  # type: ignore[union-attr]
    translation = _NOTE_RE.sub(" ", sense.split(",", 1)[0].split(";", 1)[0]).strip()
    return (headword, translation) if headword and translation else None


def read_freedict(files: Path, package: str) -> Iterator[RawPair]:
    """Every headword's pair of each dictionary under `files`, in index order; the document is the dictionary."""
    for index in sorted(files.rglob("*.index")):
        data = index.with_name(index.name.removesuffix(".index") + ".dict.dz")
        text = gzip.decompress(data.read_bytes())
        for headword, offset, length in read_index(index.read_text(encoding="utf-8")):
            pair = entry_pair(text[offset : offset + length].decode("utf-8", errors="replace"))
            if pair is not None and pair[0] == headword:
                yield RawPair(pair[0], pair[1], package, index.stem)
