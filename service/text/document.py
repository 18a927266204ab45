"""A request's text as a Document: the sentences to translate, what lies between them as written, and how their
translations are put back together; the cleaning of input text, and plain text split into a Document. HTML is
split by markup.py, a sentence's inline elements placed by inline.py, sentences found and cut by sentences.py.
Knows nothing of tokens except through a counting callback, nothing of models or requests.
"""

from __future__ import annotations

import html
import html.entities
import logging
import re
import unicodedata
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, partial
from typing import NamedTuple

from service.text.inline import (
    Inline,
    atoms_fit,
    project,
    with_tags,
)
from service.text.sentences import (
    FORMAT_CHARS,
    Count,
    limit_spans,
    sentence_spans,
)

logger = logging.getLogger(__name__)
# format characters to drop, but the tags of a subdivision flag (🏴 + tags + cancel tag: Scotland's), part of it
_FORMAT = re.compile(f"(\U0001f3f4[\U000e0020-\U000e007e]+\U000e007f)|[{FORMAT_CHARS}]")
# C0 and C1 controls but \t and the line breaks str.splitlines knows (\n \v \f \r \x1c-\x1e \x85): kept as written
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x1f\x7f-\x84\x86-\x9f]")
_BREAK_CONTROL = re.compile(r"[\x0b\x0c\x1c-\x1e\x85]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_REFERENCE = re.compile(r"&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)")  # html.unescape's own
_MARKER = re.compile("\ue000([0-9]+)\ue001")  # where an attribute's translated value goes (Document.attributes)


def clean(text: str) -> str:
    """Lone surrogates to U+FFFD, no control characters but tab and line breaks. Everything else stays as written
    (a CRLF text comes back with its CRLFs; HTML's untranslated attributes, comments, pre and script keep their
    characters): what the model reads of a sentence is `model_input`'s."""
    if _SURROGATE.search(text):
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")  # pairs joined
    return _CONTROL.sub("", text)


def model_input(sentence: str, keep_flags: bool = False) -> str:
    """A sentence as the tokenizer gets it: Unicode NFC, without format characters (`_FORMAT`); line breaks (an
    HTML sentence may cross lines) as \\n, without the control characters among them (\\v \\f \\x1c-\\x1e \\x85).
    `keep_flags`: a subdivision flag's tags stay with it, for placeholders (text/placeholders.py) to take whole."""
    sentence = _BREAK_CONTROL.sub("", sentence.replace("\r\n", "\n").replace("\r", "\n"))
    kept = _flag_or_nothing if keep_flags else _black_flag_or_nothing
    return unicodedata.normalize("NFC", _FORMAT.sub(kept, sentence))


def _flag_or_nothing(match: re.Match[str]) -> str:
    return match.group(1) or ""


def _black_flag_or_nothing(match: re.Match[str]) -> str:
    return match.group(1)[0] if match.group(1) else ""  # the flag without its tags


@dataclass
class Tagged:
    """A sentence that inline elements run through. The sentence is translated whole, and `pieces`, its text
    between tags as the sentences of a document of their own (what the tags split before), are translated too.
    Each element goes around the words of the whole translation most like its own words' translation, or its
    words as written (names, numbers); each element kept as written (`atoms`: code, samp, translate="no") stands
    in the sentence as a placeholder and goes back where the translation has it. When an element finds no words,
    they would not nest as the elements do, or a placeholder is not in the translation exactly once, the answer
    is the pieces' translations between the tags and kept elements, as written. A sentence with elements has its
    pieces translated with it (their translations are where its elements look for words: `eager`); one with kept
    elements only, when the translation has no place for them (Document.unplaced): 32-37 of 500 test sentences
    with a <code> element on the default model, where translating every one's pieces gave the server 414
    requests/s against 547 so (plain text 563-570)."""

    elements: list[Inline]
    pieces: Document
    first: int = 0  # where pieces.sentences start in the document's texts, if eager
    atoms: dict[str, str] = field(default_factory=dict)  # placeholder -> an element kept as written, in its place

    @property
    def eager(self) -> bool:
        return bool(self.elements)


@dataclass(frozen=True)
class Attribute:
    """A translatable attribute's value (ATTRIBUTES: alt, title, placeholder, ...) as a document of its own, and
    the quote around it as written; its tag holds a marker where the value stood (Document.attributes)."""

    value: Document  # markup: its character references kept where its text comes back unchanged
    quote: str  # '"', "'", or "" (unquoted)

    def put(self, translations: Sequence[str]) -> str:
        """The value to write back: as written where its translation is its text, else the translation escaped
        for its quotes (quoted where it was not)."""
        out = self.value.join(translations)
        if list(translations) == self.value.sentences:
            return out  # the value as written
        if self.quote == "'":
            return out.replace("'", "&#39;")
        return out.replace('"', "&quot;") if self.quote else '"' + out.replace('"', "&quot;") + '"'


@dataclass(frozen=True)
class Document:
    """Sentences to translate and everything else, kept verbatim, to put the translations back.

    join(t) is separators[0] + out[0] + separators[1] + ... + out[n-1] + separators[n], where out[i] is
    originals[i] when t[i] == sentences[i] (so identity rebuilds the input exactly, character references
    included) and t[i] otherwise, html-escaped when `markup`; a sentence in `tagged` puts its tags back in t[i]
    (Tagged). `texts` are what is translated: the sentences, then each eager tagged sentence's pieces; join takes
    one translation for each, and the answer for each sentence `unplaced` says has none in them. expand() cuts
    sentences into pieces that become sentences of their own with the whitespace between them as separators;
    origins[i] is the index, in the document split_text/split_html returned, of the sentence that piece i comes
    from. `attributes`: in HTML, the translatable attribute values of the tags whose text is translated, each a
    document of its own whose sentences come last in `texts`; the tags, in separators, originals and Tagged, hold
    a marker in each one's place (\\ue000k\\ue001), and join puts the translated value there.
    """

    sentences: list[str]
    separators: list[str]  # len(sentences) + 1: the input between, before and after the sentences
    originals: list[str]  # each sentence as written in the input (with its character references in HTML)
    origins: list[int]
    markup: bool = False
    tagged: dict[int, Tagged] = field(default_factory=dict)  # sentence index -> its inline elements
    attributes: tuple[Attribute, ...] = ()

    @cached_property  # (a frozen document's: join and the translator's offsets read it several times)
    def texts(self) -> list[str]:
        if not self.tagged and not self.attributes:
            return self.sentences
        eager = [s for i in sorted(self.tagged) if self.tagged[i].eager for s in self.tagged[i].pieces.sentences]
        return self.sentences + eager + self.attribute_texts

    @cached_property
    def attribute_texts(self) -> list[str]:
        return [s for attribute in self.attributes for s in attribute.value.sentences]

    def join(self, translations: Sequence[str], placed: Mapping[int, str] | None = None) -> str:
        """The input with each sentence replaced by its translation, in order; `placed`: the answers of the
        unplaced sentences (their pieces' translations, joined by their Tagged.pieces)."""
        if len(translations) != len(self.texts):
            raise ValueError(f"{len(translations)} translations for {len(self.texts)} sentences")
        if self.attributes:
            own = len(translations) - len(self.attribute_texts)
            return self._put_attributes(self._join(translations[:own], placed), translations[own:])
        return self._join(translations, placed)

    def _join(self, translations: Sequence[str], placed: Mapping[int, str] | None) -> str:
        if not self.tagged:  # (every plain-text request: no call a sentence)
            return self._join_plain(translations)
        parts = [self.separators[0]]
        for i in range(len(self.sentences)):
            out = self.render(i, translations)
            if out is None:
                if placed is None or i not in placed:
                    raise ValueError(f"sentence {i}'s kept elements have no place in its translation: give its pieces'")
                out = placed[i]
            parts += [out, self.separators[i + 1]]
        return "".join(parts)

    def _put_attributes(self, joined: str, translations: Sequence[str]) -> str:
        """`joined` with each attribute's marker replaced by its value (Attribute.put), `translations` the
        attributes' sentences' in order."""
        values, at = [], 0
        for attribute in self.attributes:
            values.append(attribute.put(translations[at : at + len(attribute.value.sentences)]))
            at += len(attribute.value.sentences)
        return _MARKER.sub(lambda marker: values[int(marker[1])], joined)

    def _join_plain(self, translations: Sequence[str]) -> str:
        parts = [self.separators[0]]
        for i, translation in enumerate(translations):
            parts.append(self.originals[i] if translation == self.sentences[i] else self._put(translation))
            parts.append(self.separators[i + 1])
        return "".join(parts)

    def _put(self, translation: str) -> str:
        return html.escape(translation, quote=False) if self.markup else translation

    def render(self, i: int, translations: Sequence[str]) -> str | None:
        """Sentence i's part of the answer; None for a sentence with kept elements only whose translation has no
        place for them."""
        translation = translations[i]
        if translation == self.sentences[i]:
            return self.originals[i]
        tagged = self.tagged.get(i)
        if tagged is None:
            return self._put(translation)
        if not tagged.eager:
            return with_tags(translation, [], [], tagged.atoms) if atoms_fit(translation, tagged.atoms, []) else None
        pieces = translations[tagged.first : tagged.first + len(tagged.pieces.sentences)]
        spans = project(tagged.elements, self.sentences[i], tagged.pieces.sentences, translation, pieces)
        if spans is None or not atoms_fit(translation, tagged.atoms, spans):
            return tagged.pieces.join(pieces)
        return with_tags(translation, tagged.elements, spans, tagged.atoms)

    def unplaced(self, translations: Sequence[str]) -> list[int]:
        """The sentences with kept elements only whose translation has no place for them: join wants their pieces'
        translations (Tagged.pieces)."""
        return [i for i, t in self.tagged.items() if not t.eager and self.render(i, translations) is None]

    def expand(self, count: Count, limit: int) -> Document:
        """A document whose sentences are those of this one cut by limit_sentence; join still rebuilds it. A tagged
        sentence or one of its pieces over the limit becomes its pieces, each cut so."""
        builder = Builder(self.markup)
        builder.keep(self.separators[0])
        for i, sentence in enumerate(self.sentences):
            tagged = self.tagged.get(i)
            if tagged is None:
                builder.add_spans(*self._limited(self.originals[i], sentence, count, limit), self.origins[i])
            elif all(count(s) <= limit for s in [sentence, *tagged.pieces.sentences]):
                builder.add(sentence, self.originals[i], self.origins[i], tagged)
            else:
                pieces = tagged.pieces
                for k, piece in enumerate(pieces.sentences):
                    builder.keep(pieces.separators[k])
                    builder.add_spans(*self._limited(pieces.originals[k], piece, count, limit), self.origins[i])
                builder.keep(pieces.separators[-1])
            builder.keep(self.separators[i + 1])
        attributes = tuple(replace(a, value=a.value.expand(count, limit)) for a in self.attributes)
        return replace(builder.build(), attributes=attributes)

    def _limited(self, original: str, sentence: str, count: Count, limit: int) -> tuple[Source, list[tuple[int, int]]]:
        source = Source.of(original, self.markup)
        can_cut = source.can_cut if self.markup else partial(_between_characters, sentence)
        spans = limit_spans(sentence, count, limit, can_cut)
        if len(spans) > 1:
            logger.debug(
                "a sentence of %d characters cut into %d pieces of <= %d tokens", len(sentence), len(spans), limit
            )
        return source, spans


def split_text(text: str) -> Document:
    """Plain text: sentences never cross a line break; whitespace and line structure go to the separators."""
    builder = Builder(markup=False)
    builder.add_text(text)
    return builder.build()


def limit_sentence(sentence: str, count: Count, limit: int) -> list[str]:
    """[sentence] if count(sentence) <= limit, else consecutive pieces each within the limit, best cut after
    ; : , (or . ! ?), then at whitespace, inside a word only as a last resort; nothing is dropped but the
    whitespace at the cuts. TooLarge if a single character is over the limit."""
    return [sentence[a:b] for a, b in limit_spans(sentence, count, limit, partial(_between_characters, sentence))]


# The input as written vs the text to translate


class Reference(NamedTuple):
    """A character reference: where it is in the raw input and where its expansion is in the text."""

    text_start: int
    text_end: int
    raw_start: int
    raw_end: int


@dataclass(frozen=True)
class Source:
    """A stretch of input as written (`raw`) and its text to translate: with markup, character references
    expanded as html.unescape does; `references` locate each one in both, in order."""

    raw: str
    text: str
    references: list[Reference] = field(default_factory=list)

    @classmethod
    def of(cls, raw: str, markup: bool) -> Source:
        if not markup or "&" not in raw:
            return cls(raw, raw)
        parts: list[str] = []
        references: list[Reference] = []
        length = done = 0
        for ref in _REFERENCE.finditer(raw):
            end = ref.start() + _replaced_length(ref.group())
            if end == ref.start():
                continue  # "&" and what follows are plain text
            expansion = html.unescape(raw[ref.start() : end])
            length += ref.start() - done
            references.append(Reference(length, length + len(expansion), ref.start(), end))
            parts += [raw[done : ref.start()], expansion]
            length, done = length + len(expansion), end
        parts.append(raw[done:])
        return cls(raw, "".join(parts), references)

    def to_raw(self, offset: int) -> int:
        """The raw offset of a text offset; one inside a reference's expansion goes to the reference's start."""
        k = bisect_right(self.references, offset, key=lambda r: r.text_start) - 1
        if k < 0:
            return offset
        ref = self.references[k]
        return ref.raw_start if offset < ref.text_end else ref.raw_end + offset - ref.text_end

    def can_cut(self, offset: int) -> bool:
        """Whether a sentence may be cut at this text offset: not inside a reference's expansion."""
        k = bisect_right(self.references, offset, key=lambda r: r.text_start) - 1
        inside = k >= 0 and self.references[k].text_start < offset < self.references[k].text_end
        return not inside and _between_characters(self.text, offset)


def _replaced_length(match: str) -> int:
    """How much of a _REFERENCE match html.unescape replaces, as it decides: all of a numeric or a known named
    reference; of an unknown name without ";", its longest prefix that is a known name, the rest staying as
    text; nothing otherwise. (Taking the whole match let a sentence end inside such plain text.)"""
    name = match[1:]
    if name.startswith("#") or name in html.entities.html5:
        return len(match)
    return next((1 + x for x in range(len(name) - 1, 1, -1) if name[:x] in html.entities.html5), 0)


def _between_characters(text: str, offset: int) -> bool:
    """Not before a combining mark or a zero-width joiner (which belong to the character before)."""
    return offset >= len(text) or (unicodedata.category(text[offset])[0] != "M" and text[offset] != "\u200d")


@dataclass
class Builder:
    """Collects sentences and the verbatim input between them, in input order."""

    markup: bool
    sentences: list[str] = field(default_factory=list)
    originals: list[str] = field(default_factory=list)
    origins: list[int] = field(default_factory=list)
    separators: list[str] = field(default_factory=list)
    pending: list[str] = field(default_factory=list)  # verbatim input since the last sentence
    tagged: dict[int, Tagged] = field(default_factory=dict)  # sentence index -> its inline elements

    def keep(self, raw: str) -> None:
        self.pending.append(raw)

    def add(self, sentence: str, original: str, origin: int | None = None, tagged: Tagged | None = None) -> None:
        """A sentence, from sentence `origin` of the split (None: it is one of the split)."""
        if tagged is not None:
            self.tagged[len(self.sentences)] = tagged
        self.separators.append("".join(self.pending))
        self.pending.clear()
        self.origins.append(len(self.sentences) if origin is None else origin)
        self.sentences.append(sentence)
        self.originals.append(original)

    def add_text(self, raw: str, translate: bool = True) -> None:
        """A stretch of text: its sentences (not across lines unless markup) and the whitespace around them."""
        if translate:
            source = Source.of(raw, self.markup)
            self.add_spans(source, sentence_spans(source.text, hard_lines=not self.markup))
        else:
            self.keep(raw)

    def add_spans(self, source: Source, spans: Iterable[tuple[int, int]], origin: int | None = None) -> None:
        """Sentences at these text spans of source (ascending), from sentence `origin` of the split (None:
        each is a sentence of the split); the rest of source is kept verbatim."""
        done = 0
        for start, end in spans:
            raw_start, raw_end = source.to_raw(start), source.to_raw(end)
            self.keep(source.raw[done:raw_start])
            self.add(source.text[start:end], source.raw[raw_start:raw_end], origin)
            done = raw_end
        self.keep(source.raw[done:])

    def build(self) -> Document:
        separators = [*self.separators, "".join(self.pending)]
        tagged, first = {}, len(self.sentences)
        for i in sorted(self.tagged):
            tagged[i] = replace(self.tagged[i], first=first)
            first += len(tagged[i].pieces.sentences) if tagged[i].eager else 0
        return Document(self.sentences, separators, self.originals, self.origins, self.markup, tagged)
