"""Reads documentation built in both languages as block-aligned pairs: XHTML pages under `en-US/` and `fr-FR/`
(DocBook, Publican), Mallard pages under `help/C/` and `help/fr/` (GNOME help).

A page pair is aligned only when both pages have the same sequence of text blocks (paragraphs, titles, terms); a
block pair with as many sentences on each side is split into sentence pairs. Knows XHTML and Mallard; not archives
or cleaning.
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
_MALLARD = "{http://projectmallard.org/1.0/}"
_BLOCK_TAGS = {
    _XHTML: frozenset({"p", "h1", "h2", "h3", "h4", "h5", "h6", "dt", "th", "td"}),
    _MALLARD: frozenset({"p", "title", "subtitle", "desc"}),
}
_BLOCK_CLASSES = frozenset({"para", "title"})  # DocBook/Publican's <div class="para">
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+(?=[A-ZÀ-Ý«\"“(])")
#: (suffix, English folder, French folder) of each layout
LAYOUTS = ((".html", "/en-US/", "/fr-FR/"), (".page", "/help/C/", "/help/fr/"))


def is_document_member(name: str) -> bool:
    """A page of the English or the French build of a document."""
    path = "/" + name
    return any(path.endswith(suffix) and (en in path or fr in path) for suffix, en, fr in LAYOUTS)


def french_twin(path: Path) -> tuple[Path, str] | None:
    """Where the French build puts the page of an English one, and the page's name below the language folder
    (`apt`, `gnome-help/net-proxy`); None if `path` is not an English page."""
    text = path.as_posix()
    for suffix, english, french in LAYOUTS:
        if text.endswith(suffix) and english in text:
            return Path(text.replace(english, french, 1)), text.split(english, 1)[1].removesuffix(suffix)
    return None


def _tag(element: Element) -> str:
    return element.tag if isinstance(element.tag, str) else ""


def _is_block(element: Element) -> bool:
    tag = _tag(element)
    namespace, _, name = tag.rpartition("}")
    if name in _BLOCK_TAGS.get(namespace + "}", frozenset()):
        return True
    return tag == f"{_XHTML}div" and element.get("class") in _BLOCK_CLASSES


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
            blocks.append((_tag(element).rpartition("}")[2], " ".join("".join(element.itertext()).split())))
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
    for english in sorted(files.rglob("*")):
        twin = french_twin(english)
        pairs = aligned_pairs(english, twin[0]) if twin is not None and twin[0].exists() else None
        for source, target in pairs or []:
            yield RawPair(source, target, package, twin[1])  # type: ignore[index]
