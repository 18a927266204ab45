"""Inline elements within a sentence (<b>, <a>, <code> ...): what a sentence's elements are, and where each goes
in its translation, around the words most like its own words' translation."""

from __future__ import annotations

import html
import html.entities
import re
from bisect import bisect_right
from collections.abc import Sequence
from difflib import SequenceMatcher
from os.path import commonprefix
from typing import NamedTuple

_WORD = re.compile(r"\w+")
_REACH = 24  # words either side of where an element stood that its words are looked for, when not found as such
_NEAR = 0.65  # how like an element's words (difflib's ratio) the words of the translation it goes around must be
NUMBERED = re.compile(r"%(\d+)")


class Inline(NamedTuple):
    """An inline element inside a sentence: its tags as written, the span of the sentence's text it wraps, and the
    element it sits in (an index into the sentence's elements, in the order they open; None: the sentence)."""

    start: int
    end: int
    opening: str
    closing: str
    parent: int | None


def project(
    elements: list[Inline], sentence: str, sources: list[str], translation: str, pieces: Sequence[str]
) -> list[tuple[int, int]] | None:
    """Where each of a sentence's elements goes in its translation: around the words most like the translation
    (`pieces`) of its pieces (`sources`: the sentence's text between tags) or its words as written, the nearest to
    where it stood where several are; None if one has none, or they would not nest."""
    where = _piece_spans(sentence, sources)
    spans: list[tuple[int, int]] = []
    for element in elements:
        start, end = trimmed(sentence, element.start, element.end)
        inner = " ".join(t for (a, b), t in zip(where, pieces, strict=True) if start <= a and b <= end)
        candidates = list(dict.fromkeys(c for c in (inner.strip(), sentence[start:end]) if c))
        centre = (start + end) / 2 / max(1, len(sentence)) * len(translation)
        found = _exactly(translation, candidates, centre) or _nearly(translation, candidates, centre)
        if found is None:
            return None
        spans.append(found)
    return spans if _nests(elements, spans) else None


def _piece_spans(sentence: str, pieces: list[str]) -> list[tuple[int, int]]:
    """Where each piece (in order, each a part of the sentence) is in it."""
    spans, at = [], 0
    for piece in pieces:
        start = sentence.find(piece, at)
        start = at if start == -1 else start
        spans.append((start, start + len(piece)))
        at = start + len(piece)
    return spans


def _exactly(translation: str, candidates: list[str], centre: float) -> tuple[int, int] | None:
    """The occurrence of a candidate (case aside, not inside a word) nearest the centre."""
    best: tuple[float, tuple[int, int]] | None = None
    for candidate in candidates:
        for match in re.finditer(re.escape(candidate), translation, re.IGNORECASE):
            a, b = match.span()
            if _word_edge(translation, a) and _word_edge(translation, b):
                distance = abs((a + b) / 2 - centre)
                best = min(best, (distance, (a, b))) if best else (distance, (a, b))
    return None if best is None else best[1]


def _word_edge(text: str, at: int) -> bool:
    """Not between two letters or digits."""
    return at == 0 or at == len(text) or not (text[at - 1].isalnum() and text[at].isalnum())


def _nearly(translation: str, candidates: list[str], centre: float) -> tuple[int, int] | None:
    """The run of whole words most like a candidate of at most 12 words (difflib's ratio, at least _NEAR), the
    nearest the centre among equals; runs starting within _REACH words of the centre."""
    words = [match.span() for match in _WORD.finditer(translation)]
    middle = bisect_right(words, centre, key=lambda span: span[0])
    best: tuple[float, float, tuple[int, int]] | None = None
    for candidate in candidates:
        n = len(_WORD.findall(candidate))
        if not 0 < n <= 12:
            continue
        matcher = SequenceMatcher(None, b=candidate.lower())  # what it learns of b serves every window
        for size in range(max(1, n - 1), n + 2):
            for i in range(max(0, middle - _REACH - size), min(len(words) - size + 1, middle + _REACH)):
                a, b = words[i][0], words[i + size - 1][1]
                run = translation[a:b].lower()
                matcher.set_seq1(run)
                if matcher.real_quick_ratio() >= _NEAR and matcher.quick_ratio() >= _NEAR:  # ratio()'s upper bounds
                    like = matcher.ratio()
                elif n == size == 1 and _same_stem(run, candidate.lower()):
                    like = _NEAR  # "nouvelles" for "nouveau": after every run more like it
                else:
                    continue
                key = (-like, abs((a + b) / 2 - centre), (a, b))
                if like >= _NEAR and (best is None or key < best):
                    best = key
    return None if best is None else best[2]


def _same_stem(word: str, other: str) -> bool:
    """Two words that begin alike for at least 5 letters and 70 % of the shorter: one word's inflections
    ("nouveau", "nouvelles"; "utiliser", "utilisation"), which difflib's ratio puts under _NEAR."""
    shared = len(commonprefix([word, other]))
    return shared >= 5 and shared >= 0.7 * min(len(word), len(other))


def _nests(elements: list[Inline], spans: list[tuple[int, int]]) -> bool:
    """Whether the spans keep the elements' nesting: each inside the one it sat in, and apart from the others."""
    for j, element in enumerate(elements):
        ancestors, parent = set(), element.parent
        while parent is not None:
            ancestors.add(parent)
            parent = elements[parent].parent
        for i in range(j):
            (a, b), (c, d) = spans[i], spans[j]
            if (i in ancestors and not a <= c <= d <= b) or (i not in ancestors and c < b and a < d):
                return False
    return True


def atoms_fit(translation: str, atoms: dict[str, str], spans: list[tuple[int, int]]) -> bool:
    """Whether each kept element's placeholder is in the translation exactly once, no element's span cutting it."""
    found = [match for match in NUMBERED.finditer(translation) if match.group() in atoms]
    if sorted(match.group() for match in found) != sorted(atoms):
        return False
    edges = {edge for span in spans for edge in span}
    return not any(match.start() < edge < match.end() for match in found for edge in edges)


def with_tags(
    translation: str, elements: list[Inline], spans: list[tuple[int, int]], atoms: dict[str, str] | None = None
) -> str:
    """The translation, html-escaped, with each element's tags around its span and each kept element in place of
    its placeholder."""
    depth = [0] * len(elements)
    for k, element in enumerate(elements):
        depth[k] = 0 if element.parent is None else depth[element.parent] + 1
    marks = sorted(
        [(a, 1, depth[k], element.opening) for k, (element, (a, _)) in enumerate(zip(elements, spans, strict=True))]
        + [(b, 0, -depth[k], element.closing) for k, (element, (_, b)) in enumerate(zip(elements, spans, strict=True))]
    )

    def put(text: str) -> str:
        escaped = html.escape(text, quote=False)
        return NUMBERED.sub(lambda m: atoms.get(m.group(), m.group()), escaped) if atoms else escaped

    parts, at = [], 0
    for position, _, _, tag in marks:
        parts += [put(translation[at:position]), tag]
        at = position
    return "".join([*parts, put(translation[at:])])


def trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    """start and end moved in past whitespace."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end
