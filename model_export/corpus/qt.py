"""Reads Qt's compiled translation catalogs (`.qm`, what `lrelease` writes and GCompris ships) as raw pairs.

Knows the `.qm` layout: a 16-byte magic, then sections (a tag byte, a big-endian 32-bit length, the bytes); the
Messages section is a run of records, each a sequence of tagged fields ended by an End tag. translate-toolkit's
`qmfile` stops at the first record without a source text, which `lrelease` writes, so the corpus reads them here.
Not cleaning: that is clean.py's.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from model_export.corpus.extract import RawPair, path_locale

log = logging.getLogger(__name__)

MAGIC = bytes.fromhex("3cb86418caef9c95cd211cbf60a1bddd")
SECTION_MESSAGES = 0x69
TAG_END, TAG_SOURCE16, TAG_TRANSLATION, TAG_CONTEXT16, TAG_OBSOLETE1 = 1, 2, 3, 4, 5
TAG_SOURCE, TAG_CONTEXT, TAG_COMMENT = 6, 7, 8
NULL_LENGTH = 0xFFFFFFFF  # a Translation field of this length is a null translation


class QmFormatError(ValueError):
    """The bytes are not a `.qm` catalog this reader understands."""


@dataclass
class QmMessage:
    """One record of a catalog's Messages section; `translations` has one form a plural (numerus) form."""

    source: str | None = None
    context: str = ""
    translations: list[str] = field(default_factory=list)


def is_qm_catalog(name: str) -> bool:
    """A French Qt catalog (`gcompris_fr.qm`, `translations/fr/app.qm`)."""
    return path_locale(name, ".qm") is not None


def _field(data: bytes, pos: int) -> tuple[bytes, int]:
    """A length-prefixed field at `pos`: its bytes and the position after it."""
    if pos + 4 > len(data):
        raise QmFormatError(f"a field's length runs past the Messages section at byte {pos}")
    (length,) = struct.unpack_from(">I", data, pos)
    if length == NULL_LENGTH:
        return b"", pos + 4
    end = pos + 4 + length
    if end > len(data):
        raise QmFormatError(f"a field of {length} bytes runs past the Messages section at byte {pos}")
    return data[pos + 4 : end], end


def messages_section(data: bytes) -> bytes:
    """The Messages section of a whole `.qm` file."""
    if data[:16] != MAGIC:
        raise QmFormatError("not a Qt .qm catalog (its first 16 bytes are not the .qm magic)")
    pos = 16
    while pos + 5 <= len(data):
        tag, length = data[pos], struct.unpack_from(">I", data, pos + 1)[0]
        if tag == SECTION_MESSAGES:
            return data[pos + 5 : pos + 5 + length]
        pos += 5 + length
    raise QmFormatError("the catalog has no Messages section")


def read_messages(data: bytes) -> Iterator[QmMessage]:
    """Every record of a `.qm` file's Messages section, in file order (Qt orders them by hash)."""
    section, pos, message = messages_section(data), 0, QmMessage()
    while pos < len(section):
        tag, pos = section[pos], pos + 1
        if tag == TAG_END:
            yield message
            message = QmMessage()
        elif tag == TAG_OBSOLETE1:
            pos += 4
        elif tag in (TAG_TRANSLATION, TAG_SOURCE, TAG_CONTEXT, TAG_COMMENT, TAG_SOURCE16, TAG_CONTEXT16):
            # a comment (a disambiguation) and the old 16-bit fields are read past, not kept
            value, pos = _field(section, pos)
            if tag == TAG_TRANSLATION:
                message.translations.append(value.decode("utf-16-be"))
            elif tag == TAG_SOURCE:
                message.source = value.decode("utf-8")
            elif tag == TAG_CONTEXT:
                message.context = value.decode("utf-8")
        else:
            raise QmFormatError(f"unknown message field tag {tag:#04x} at byte {pos - 1} of the Messages section")


def read_qm(path: Path, package: str, catalog: str) -> Iterator[RawPair]:
    """The (source, translation) pairs of a `.qm` catalog, each context a document (`catalog#context`).

    Records without a source text and plural (numerus) records are left out: a plural's one source (`%n hour(s)`)
    matches none of its forms. A catalog that cannot be read is skipped with a warning, as a broken .mo is.
    """
    try:
        found = list(read_messages(path.read_bytes()))
    except (OSError, QmFormatError, UnicodeDecodeError) as exc:
        log.warning("skipping unreadable catalog %s: %s", path, exc)
        return
    for message in found:
        if message.source is None or len(message.translations) != 1:
            continue
        yield RawPair(message.source, message.translations[0], package, f"{catalog}#{message.context}")
