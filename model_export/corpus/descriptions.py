"""Reads package metadata translated by people as block-aligned pairs: Debian's package descriptions (the
archive's `Translation-en` and `Translation-fr`, the latter from the Description Translation Project) and AppStream
component data (DEP-11 `Components-<arch>.yml`: names, summaries and descriptions with their French versions).

A description pair is aligned only when both sides have the same sequence of blocks (the summary, paragraphs, list
items), then split into sentences as documentation is (documents.block_pairs). Knows these two formats; not
archives, fetching or cleaning.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from xml.etree.ElementTree import ParseError

import defusedxml.ElementTree as SafeET
import yaml
from defusedxml import DefusedXmlException

from model_export.corpus import CorpusError
from model_export.corpus.documents import block_pairs
from model_export.corpus.extract import RawPair

#: the licence of each index group, its first line the NOTICE's summary
DESCRIPTIONS_LICENCE = (
    "each description under the licence of the package it describes (Debian main: DFSG-free)\n\n"
    "Package descriptions of Debian's main archive, with the French translations of the Debian Description "
    "Translation Project (https://ddtp.debian.org). Each description is part of the package it describes and is "
    "distributed under that package's licence.\n"
)
APPSTREAM_LICENCE = (
    "the metadata licences of the upstream metainfo files (permissive: CC0-1.0, FSFAP, MIT, ...)\n\n"
    "AppStream component data (DEP-11) of Debian's main archive, generated from each package's upstream metainfo "
    "file, whose metadata_license the AppStream specification requires to be a permissive licence.\n"
)
_BULLET_RE = re.compile(r"^\s*[-*+o]\s+")
_XML_BLOCKS = frozenset({"p", "li"})


def stanzas(text: str) -> Iterator[dict[str, str]]:
    """The fields of each deb822 stanza (blank-line separated; a continuation line starts with a space and is
    kept, newline included, in its field's value)."""
    for chunk in text.split("\n\n"):
        fields: dict[str, str] = {}
        name = ""
        for line in chunk.split("\n"):
            if line.startswith((" ", "\t")) and name:
                fields[name] += "\n" + line
            elif ":" in line:
                name, _, value = line.partition(":")
                fields[name] = value.strip()
        if fields:
            yield fields


def description_blocks(description: str) -> list[tuple[str, str]]:
    """(kind, text) of a package description: its summary line, then each paragraph of the long description
    (` .` lines separate them), a paragraph of list items cut into its items; whitespace collapsed."""
    summary, *long = description.split("\n")
    blocks = [("summary", summary.strip())]
    paragraphs: list[list[str]] = [[]]
    for line in long:
        if line.strip() == ".":
            paragraphs.append([])
        else:
            paragraphs[-1].append(line[1:])
    for lines in filter(None, paragraphs):
        items: list[list[str]] = []
        for line in lines:
            if _BULLET_RE.match(line) or not items:
                items.append([])
            items[-1].append(line)
        for item in items:
            kind = "item" if _BULLET_RE.match(item[0]) else "para"
            blocks.append((kind, " ".join(_BULLET_RE.sub("", " ".join(item), count=1).split())))
    return blocks


def aligned_blocks(source: list[tuple[str, str]], target: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Sentence pairs of two block sequences of the same kinds (empty English blocks left out), else none."""
    if [kind for kind, _ in source] != [kind for kind, _ in target]:
        return []
    return [pair for (_, s), (_, t) in zip(source, target, strict=True) if s for pair in block_pairs(s, t)]


def read_descriptions(french: Path, english: Path, package: str) -> Iterator[RawPair]:
    """The aligned pairs of each French package description and the English one it translates (the same
    `Description-md5`); the document is the described package."""
    sources = {
        fields["Description-md5"]: fields["Description-en"]
        for fields in stanzas(english.read_text(encoding="utf-8", errors="replace"))
        if "Description-md5" in fields and "Description-en" in fields
    }
    for fields in stanzas(french.read_text(encoding="utf-8", errors="replace")):
        source = sources.get(fields.get("Description-md5", ""))
        if source is None or "Description-fr" not in fields:
            continue
        pairs = aligned_blocks(description_blocks(source), description_blocks(fields["Description-fr"]))
        for src, tgt in pairs:
            yield RawPair(src, tgt, package, fields.get("Package", ""))


def markup_blocks(markup: str) -> list[tuple[str, str]] | None:
    """(tag, text) of an AppStream description's paragraphs and list items, whitespace collapsed; None if it is
    not well-formed."""
    try:
        root = SafeET.fromstring(f"<description>{markup}</description>")
    except (ParseError, DefusedXmlException):
        return None
    return [(e.tag, " ".join("".join(e.itertext()).split())) for e in root.iter() if e.tag in _XML_BLOCKS]


def _component_pairs(component: dict[str, Any]) -> list[tuple[str, str]]:
    pairs = []
    for field in ("Name", "Summary"):
        texts = component.get(field)
        if isinstance(texts, dict) and isinstance(texts.get("C"), str) and isinstance(texts.get("fr"), str):
            pairs += block_pairs(" ".join(texts["C"].split()), " ".join(texts["fr"].split()))
    descriptions = component.get("Description")
    if isinstance(descriptions, dict) and isinstance(descriptions.get("fr"), str):
        source, target = markup_blocks(str(descriptions.get("C", ""))), markup_blocks(descriptions["fr"])
        if source is not None and target is not None:
            pairs += aligned_blocks(source, target)
    return pairs


def read_appstream(components: Path, package: str) -> Iterator[RawPair]:
    """The pairs of each AppStream component with French text (name, summary, aligned description blocks); the
    document is the component's ID."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        with components.open(encoding="utf-8") as stream:
            for component in yaml.load_all(stream, Loader=loader):
                if isinstance(component, dict) and "ID" in component:
                    for src, tgt in _component_pairs(component):
                        yield RawPair(src, tgt, package, str(component["ID"]))
    except yaml.YAMLError as exc:
        raise CorpusError(f"cannot read AppStream data {components}: {exc}") from exc
