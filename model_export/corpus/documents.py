"""Reads documentation built in both languages (XHTML pages under `en-US/` and `fr-FR/`) as block-aligned pairs.

A page pair is aligned only when both pages have the same sequence of text blocks (paragraphs, titles, terms); a
block pair with as many sentences on each side is split into sentence pairs. Knows XHTML; not archives or cleaning.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path
from xml.etree.ElementTree import Element, ParseError

import defusedxml.ElementTree as SafeET
from defusedxml import DefusedXmlException

from model_export.corpus.extract import RawPair

log = logging.getLogger(__name__)

_XHTML = "{http://www.w3.org/1999/xhtml}"
_BLOCK_TAGS = frozenset({"p", "h1", "h2", "h3", "h4", "h5", "h6", "dt", "th", "td"})
_BLOCK_CLASSES = frozenset({"para", "title"})  # DocBook/Publican's <div class="para">
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+(?=[A-ZÀ-Ý«\"“(])")
ENGLISH_DIR, FRENCH_DIR = "/en-US/", "/fr-FR/"


def is_document_member(name: str) -> bool:
    """An XHTML page of the English or the French build of a document."""
    return name.endswith(".html") and (ENGLISH_DIR in name or FRENCH_DIR in name)


def _is_block(element: Element) -> bool:
    tag = element.tag.removeprefix(_XHTML) if isinstance(element.tag, str) else ""
    return tag in _BLOCK_TAGS or tag == "div" and element.get("class") in _BLOCK_CLASSES


def page_blocks(path: Path) -> list[tuple[str, str]] | None:
    """(tag, text) of a page's innermost text blocks in document order, whitespace collapsed; None if unreadable."""
    try:
        root = SafeET.parse(path).getroot()
    except (ParseError, DefusedXmlException) as exc:
        log.warning("skipping unreadable page %s: %s", path, exc)
        return None
    blocks = []
    for element in root.iter():
        if _is_block(element) and not any(_is_block(inner) for inner in element.iter() if inner is not element):
            blocks.append((str(element.tag).removeprefix(_XHTML), " ".join("".join(element.itertext()).split())))
    return blocks


def sentences(text: str) -> list[str]:
    """A block's sentences: split after . ! ? before a capital, a quote or a parenthesis."""
    return _SENTENCE_END_RE.split(text)


def block_pairs(source: str, target: str) -> list[tuple[str, str]]:
    """Sentence pairs when both blocks have as many sentences, else the blocks whole."""
    src, tgt = sentences(source), sentences(target)
    return list(zip(src, tgt, strict=True)) if len(src) == len(tgt) else [(source, target)]


def aligned_pairs(english: Path, french: Path) -> list[tuple[str, str]] | None:
    """The pairs of a page and its translation (empty English blocks left out), None when their block sequences
    differ."""
    source, target = page_blocks(english), page_blocks(french)
    if source is None or target is None or [t for t, _ in source] != [t for t, _ in target]:
        return None
    return [pair for (_, s), (_, t) in zip(source, target, strict=True) if s for pair in block_pairs(s, t)]


def read_documents(files: Path, package: str) -> Iterator[RawPair]:
    """Every aligned pair of each English page under `files` and its French twin; the document is the page."""
    for english in sorted(files.rglob("*.html")):
        if ENGLISH_DIR not in english.as_posix() + "/":
            continue
        french = Path(english.as_posix().replace(ENGLISH_DIR, FRENCH_DIR))
        pairs = aligned_pairs(english, french) if french.exists() else None
        if pairs is None:
            log.debug("no aligned French twin for %s", english)
            continue
        for source, target in pairs:
            yield RawPair(source, target, package, english.stem)
