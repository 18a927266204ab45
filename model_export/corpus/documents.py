"""Reads documentation built in both languages as block-aligned pairs: XHTML or HTML pages (DocBook, Publican,
LibreOffice's help), Mallard pages (GNOME help) and manual pages (roff, read by manpages.py), the French build
beside the English one or in another package.

A page pair is aligned only when both pages have the same sequence of text blocks (paragraphs, titles, terms); a
block pair with as many sentences on each side is split into sentence pairs. Knows the page formats and where each
layout puts its French pages; not archives or cleaning.
"""

from __future__ import annotations

import gzip
import logging
import re
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from xml.etree.ElementTree import ParseError

import defusedxml.ElementTree as SafeET
import lxml.etree
import lxml.html
from defusedxml import DefusedXmlException

from model_export.corpus.extract import RawPair
from model_export.corpus.manpages import roff_blocks

log = logging.getLogger(__name__)

_XHTML = "{http://www.w3.org/1999/xhtml}"
_MALLARD = "{http://projectmallard.org/1.0/}"
_HTML_BLOCKS = frozenset({"p", "h1", "h2", "h3", "h4", "h5", "h6", "dt", "th", "td"})
_BLOCK_TAGS = {_XHTML: _HTML_BLOCKS, "": _HTML_BLOCKS, _MALLARD: frozenset({"p", "title", "subtitle", "desc"})}
_BLOCK_CLASSES = frozenset({"para", "title"})  # DocBook/Publican's <div class="para">
_SENTENCE_END_RE = re.compile(r"(?<=[.!?])\s+(?=[A-ZÀ-Ý«\"“(])")
#: (English marker, French marker, extension, the marker without its language) of each layout, specific first
LAYOUTS = (
    ("/help/en-US/", "/help/fr/", ".html", "/help/"),  # LibreOffice's help
    ("/help/en/", "/help/fr/", ".html", "/help/"),  # the GIMP help
    ("/en-US/", "/fr-FR/", ".html", "/"),  # Publican (debian-handbook)
    ("/help/C/", "/help/fr/", ".page", "/help/"),  # Mallard (GNOME help)
    (".en.html", ".fr.html", ".html", ".html"),  # DocBook pages named by language (debian-reference)
    ("/share/man/man", "/share/man/fr/man", ".gz", "/share/man/man"),  # manual pages (manpages-fr)
)


def is_document_member(name: str) -> bool:
    """A page of the English or the French build of a document."""
    path = "/" + name
    return any(path.endswith(ext) and (en in path or fr in path) for en, fr, ext, _ in LAYOUTS)


def french_twins(relative: str) -> list[tuple[str, str]]:
    """Where each matching layout puts the French page of an English one (a relative path), with the page's name
    (its path without the language and the extension); none if it is not an English page."""
    path = "/" + relative
    twins = []
    for english, french, ext, neutral in LAYOUTS:
        if path.endswith(ext) and english in path:
            name = path.replace(english, neutral, 1).removesuffix(ext).strip("/")
            twins.append((path.replace(english, french, 1).lstrip("/"), name))
    return twins


def _parse(path: Path) -> Any:
    """The root element of a page: XML without entities or DTD fetching, else (an HTML5 page) lxml's HTML parser."""
    try:
        return SafeET.parse(path).getroot()
    except (ParseError, DefusedXmlException) as exc:
        if path.suffix != ".html":
            log.warning("skipping unreadable page %s: %s", path, exc)
            return None
    parser = lxml.html.HTMLParser(no_network=True, remove_comments=True, remove_pis=True)
    try:
        return lxml.html.parse(str(path), parser).getroot()
    except (OSError, lxml.etree.ParserError) as exc:
        log.warning("skipping unreadable page %s: %s", path, exc)
        return None


def _split_tag(element: Any) -> tuple[str, str]:
    tag = element.tag if isinstance(element.tag, str) else ""
    if tag.startswith("{"):
        namespace, _, name = tag.partition("}")
        return namespace + "}", name
    return "", tag


def _is_block(element: Any) -> bool:
    namespace, name = _split_tag(element)
    if name in _BLOCK_TAGS.get(namespace, frozenset()):
        return True
    return name == "div" and namespace in (_XHTML, "") and element.get("class") in _BLOCK_CLASSES


def _manual_blocks(path: Path) -> list[tuple[str, str]] | None:
    try:
        return roff_blocks(gzip.decompress(path.read_bytes()).decode("utf-8", errors="replace"))
    except (OSError, EOFError, zlib.error) as exc:
        log.warning("skipping unreadable manual page %s: %s", path, exc)
        return None


def page_blocks(path: Path) -> list[tuple[str, str]] | None:
    """(tag, text) of a page's innermost text blocks in document order, whitespace collapsed; None if unreadable."""
    if path.suffix == ".gz":
        return _manual_blocks(path)
    root = _parse(path)
    if root is None:
        return None
    blocks = []
    for element in root.iter():
        if _is_block(element) and not any(_is_block(inner) for inner in element.iter() if inner is not element):
            blocks.append((_split_tag(element)[1], " ".join("".join(element.itertext()).split())))
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


def _find_twin(relative: str, roots: Sequence[Path]) -> tuple[Path, str] | None:
    for twin, name in french_twins(relative):
        for root in roots:
            if (root / twin).is_file():
                return root / twin, name
    return None


def read_documents(files: Path, package: str, others: Sequence[Path] = ()) -> Iterator[RawPair]:
    """Every aligned pair of each English page under `files` and its French twin, there or under one of `others`
    (the French build in another package); the document is the page's name."""
    for english in sorted(p for p in files.rglob("*") if p.is_file()):
        found = _find_twin(english.relative_to(files).as_posix(), [files, *others])
        pairs = aligned_pairs(english, found[0]) if found is not None else None
        for source, target in pairs or []:
            yield RawPair(source, target, package, found[1])  # type: ignore[index]
