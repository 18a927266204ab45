"""What is translated and how the output is put back together: cleaning, sentence splitting of plain text and
HTML into a Document, HTML's inline elements inside a sentence (their tags put back around the words of its
translation, kept elements as placeholders), and cutting of over-long sentences. Knows nothing of tokens except
through a counting callback, nothing of models or requests.
"""

from __future__ import annotations

import html
import html.entities
import itertools
import logging
import re
import unicodedata
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from difflib import SequenceMatcher
from functools import cached_property, partial
from operator import attrgetter
from os.path import commonprefix
from typing import NamedTuple

from service.errors import InvalidRequest, TooLarge

logger = logging.getLogger(__name__)

Count = Callable[[str], int]  # text -> the number of tokens it would take

TERMINALS = ".!?…‽"  # end a sentence when followed by whitespace and a sentence start
CLOSERS = "\"'”’»›)]}"  # may follow the terminal punctuation: `done.")`
OPENERS = "\"'“‘„«‹([{¿¡"  # may precede the first letter of a sentence: `"Yes`
_ABBREVIATED = """
    Mr Mrs Ms Mx Dr Prof Sr Jr St Mt Rev Hon Gen Col Capt Lt Sgt Gov Sen Rep Pres Fr Mme Mlle Messrs
    vs etc al cf ca approx esp incl excl resp viz Fig Figs fig figs Vol vol Vols pp Ch Sec Art Eq
    Ref Dept Inc Ltd Co Corp Bros Ave Blvd Rd Jan Feb Mar Apr Jun Jul Aug Sep Sept Oct Nov Dec
    bzw usw vgl ggf Hr Hrn Abs Bd Mio Mrd
"""
ABBREVIATIONS = frozenset(_ABBREVIATED.split())  # words a period follows without ending the sentence, as written
# abbreviations only before a number: "see no. 5", "ext. 42", but "Are you sure? No. Cancel it."
BEFORE_NUMBER = frozenset(["No", "Nos", "Nr", "no", "nos", "nr", "Ext", "ext", "Tel", "tel"])

_LINE = re.compile(r"[^\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]+")  # str.splitlines' line breaks
# Unicode's format characters (category Cf: soft hyphen, bidi marks, word joiner, ...) but the zero-width
# (non-)joiners, which shape the letters around them: invisible, and out of the model's vocabulary (a leading
# U+2060 or a pair of bidi embedding marks derailed the default model's whole sentence)
_FORMAT_CHARS = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b\u200e-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)
# format characters to drop, but the tags of a subdivision flag (🏴 + tags + cancel tag: Scotland's), part of it
_FORMAT = re.compile(f"(\U0001f3f4[\U000e0020-\U000e007e]+\U000e007f)|[{_FORMAT_CHARS}]")
_TOKEN = re.compile(rf"[^\s{_FORMAT_CHARS}]+")  # a word: format characters alone are not one (kept verbatim)
_SPACE = re.compile(r"\s+")
_DOTTED = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]")  # e.g, i.e, U.S (the final period stripped)
_CLAUSE_END = re.compile(r"[;:,.!?…]+(?=\s)|[，；：、。！？]+")  # where a long sentence is best cut
# C0 and C1 controls but \t and the line breaks str.splitlines knows (\n \v \f \r \x1c-\x1e \x85): kept as written
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x1f\x7f-\x84\x86-\x9f]")
_BREAK_CONTROL = re.compile(r"[\x0b\x0c\x1c-\x1e\x85]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
_REFERENCE = re.compile(r"&(#[0-9]+;?|#[xX][0-9a-fA-F]+;?|[^\t\n\f <&#;]{1,32};?)")  # html.unescape's own
_TAG_NAME = re.compile(r"</?([A-Za-z][^\s/>]*)")
_TAG_STOP = re.compile(r"[>\"']")
_RAW_TEXT_END = {name: re.compile(rf"</{name}[\s/>]", re.IGNORECASE) for name in ("script", "style")}
_UNTRANSLATED = frozenset({"code", "pre"})  # elements whose text is kept as is (they may hold tags)
_VOID = frozenset(  # elements without an end tag
    ["area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"]
)
# phrasing elements a sentence runs through (`The <b>red</b> car.`): the sentence is translated whole, and their tags
# go back around the words of the translation they stand for (Tagged); any other tag ends a sentence
INLINE = frozenset(
    ["a", "abbr", "b", "bdi", "bdo", "big", "cite", "data", "del", "dfn", "em", "font", "i", "ins", "kbd", "mark"]
    + ["q", "s", "small", "span", "strike", "strong", "sub", "sup", "time", "tt", "u", "var"]
)
# inline elements whose content is kept as written (and any element marked translate="no" or class="notranslate"):
# inside a sentence the model reads one as a placeholder, %1, %2, ..., which it copies, and the element goes back
# in its place (Tagged.atoms)
KEPT_INLINE = frozenset(["code", "samp"])
KEPT_VOID = frozenset(["img", "input"])  # ... and these, which have no content: the tag alone
_NO_TRANSLATE = re.compile(r"""\s(?:translate\s*=\s*["']?no\b|class\s*=\s*["'][^"']*\bnotranslate\b)""", re.IGNORECASE)
_NUMBERED = re.compile(r"%(\d+)")
# Attributes whose values are text for people to read (HTML's translatable attributes, ARIA's labels): element ->
# its attributes ("*": every element's). Also `value` of a button-like input and `content` of a meta description
# (_translatable). Their values are translated as documents of their own (Attribute).
ATTRIBUTES = {
    "*": frozenset(["title", "aria-label", "aria-description", "aria-placeholder", "aria-roledescription"]),
    "img": frozenset(["alt"]), "area": frozenset(["alt"]), "input": frozenset(["alt", "placeholder"]),
    "textarea": frozenset(["placeholder"]), "th": frozenset(["abbr"]),
    "optgroup": frozenset(["label"]), "option": frozenset(["label"]), "track": frozenset(["label"]),
}  # fmt: skip
_BUTTONS = frozenset(["button", "reset", "submit"])  # input types whose value is the button's label
_DESCRIPTIONS = frozenset(  # meta elements, by name or property, whose content is
    ["description", "keywords", "og:title", "og:description", "twitter:title", "twitter:description"]
)
_ATTRIBUTE = re.compile(r"""([^\s"'>/=]+)(?:\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s"'=<>`]+)))?""")
_LANG = frozenset(["lang", "xml:lang"])  # attributes that name the language of an element's text
# languages written right to left (their primary subtags): a page translated into one reads dir="rtl"
_RIGHT_TO_LEFT = frozenset(["ar", "arc", "ckb", "dv", "fa", "he", "iw", "ps", "sd", "ug", "ur", "yi"])
_PAGE = frozenset(["html", "head", "body"])  # elements whose lang and dir are the whole page's
_VERBATIM = _UNTRANSLATED | KEPT_INLINE | frozenset(_RAW_TEXT_END)  # elements whose text is never translated
_MARKER = re.compile("\ue000([0-9]+)\ue001")  # where an attribute's translated value goes (Document.attributes)
_WORD = re.compile(r"\w+")
_REACH = 24  # words either side of where an element stood that its words are looked for, when not found as such
_NEAR = 0.65  # how like an element's words (difflib's ratio) the words of the translation it goes around must be


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


class Inline(NamedTuple):
    """An inline element inside a sentence: its tags as written, the span of the sentence's text it wraps, and the
    element it sits in (an index into the sentence's elements, in the order they open; None: the sentence)."""

    start: int
    end: int
    opening: str
    closing: str
    parent: int | None


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
            return _with_tags(translation, [], [], tagged.atoms) if _atoms_fit(translation, tagged.atoms, []) else None
        pieces = translations[tagged.first : tagged.first + len(tagged.pieces.sentences)]
        spans = _project(tagged, self.sentences[i], translation, pieces)
        if spans is None or not _atoms_fit(translation, tagged.atoms, spans):
            return tagged.pieces.join(pieces)
        return _with_tags(translation, tagged.elements, spans, tagged.atoms)

    def unplaced(self, translations: Sequence[str]) -> list[int]:
        """The sentences with kept elements only whose translation has no place for them: join wants their pieces'
        translations (Tagged.pieces)."""
        return [i for i, t in self.tagged.items() if not t.eager and self.render(i, translations) is None]

    def expand(self, count: Count, limit: int) -> Document:
        """A document whose sentences are those of this one cut by limit_sentence; join still rebuilds it. A tagged
        sentence or one of its pieces over the limit becomes its pieces, each cut so."""
        builder = _Builder(self.markup)
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

    def _limited(self, original: str, sentence: str, count: Count, limit: int) -> tuple[_Source, list[tuple[int, int]]]:
        source = _Source.of(original, self.markup)
        can_cut = source.can_cut if self.markup else partial(_between_characters, sentence)
        spans = _limit_spans(sentence, count, limit, can_cut)
        if len(spans) > 1:
            logger.debug(
                "a sentence of %d characters cut into %d pieces of <= %d tokens", len(sentence), len(spans), limit
            )
        return source, spans


def split(text: str, fmt: str) -> Document:
    """The Document of a request's text in its format, "text" or "html"."""
    if fmt == "text":
        return split_text(text)
    if fmt == "html":
        return split_html(text)
    raise InvalidRequest(f"format {fmt!r} is not supported; use 'text' or 'html'")


def split_text(text: str) -> Document:
    """Plain text: sentences never cross a line break; whitespace and line structure go to the separators."""
    builder = _Builder(markup=False)
    builder.add_text(text)
    return builder.build()


def split_html(
    markup: str,
    inline: bool = True,
    placeholders: bool = True,
    attributes: bool = True,
    languages: tuple[str, str] | None = None,
) -> Document:
    """HTML: text between tags is translated, never inside script, style, code or pre; so are the values of the
    translatable attributes (ATTRIBUTES: alt, title, placeholder, ...) of the tags around translated text, unless
    `attributes` is False, or the tag or its element is marked translate="no" or class="notranslate". With
    `languages` (source, target), an element marked lang of another language than the source is kept as written,
    and (unless `attributes` is False) a translated tag's lang="source" (or "source-REGION") says the target, and
    the page's dir (on html or body) turns where the target's script runs the other way (_localised).

    Tags, comments, doctypes and character references are kept verbatim. An unterminated tag or comment runs
    to the end of the input, as in a browser, and is kept untranslated. A sentence runs through the tags of
    inline elements (INLINE) that open and close inside it, and code, samp, img, input and any inline element
    marked translate="no" or class="notranslate" inside it stand in it as placeholders (Tagged); another element so
    marked is kept as written. `inline` False: every tag ends a sentence (and every kept element);
    `placeholders` False (a model not trained to copy %1: MT_MASK_SYMBOLS): every kept element does.
    """
    builder = _Builder(markup=True)
    run = _Run(builder)  # text and inline tags since the last other tag
    inside: Counter[str] = Counter()  # open code/pre elements
    source = languages[0] if languages else None  # elements in another language are kept as written
    kept = _kept_elements(markup, source)  # start tag -> the end of its element, kept as written
    # a tag's translatable attribute values: markers in its place (none where the input holds a marker's characters)
    markers = attributes and "\ue000" not in markup and "\ue001" not in markup
    marked = _Attributes(languages=languages) if markers else None
    at = marked.marked if marked is not None else str
    text_start, i = 0, markup.find("<")
    while i != -1:
        end = _markup_end(markup, i)
        if end is None:  # a "<" that starts nothing: text
            i = markup.find("<", i + 1)
            continue
        translate = not any(inside.values())
        run.text(markup[text_start:i]) if translate else run.keep(markup[text_start:i])
        tag = _tag_at(markup, i, end) if inline and translate else None  # None: every tag ends a sentence
        if translate and i in kept:  # inline: a placeholder in its sentence; any other: kept between sentences
            element, text_start = markup[i : kept[i]], kept[i]
            inside_sentence = placeholders and tag is not None and tag.name in INLINE | KEPT_INLINE
            run.atom(element) if inside_sentence else run.keep(element)
        elif placeholders and tag is not None and not tag.closing and tag.name in KEPT_VOID:  # an image: a placeholder
            run.atom(at(markup[i:end]))
            text_start = end
        elif tag is not None and (tag.opens or tag.closing) and tag.name in INLINE:
            run.tag(at(markup[i:end]), tag.name, tag.closing)
            text_start = end
        else:
            run.keep(at(markup[i:end]) if translate else markup[i:end])
            text_start = _after_tag(markup, i, end, run, inside)
        i = markup.find("<", text_start)
    run.text(markup[text_start:]) if not any(inside.values()) else run.keep(markup[text_start:])
    run.flush()
    document = builder.build()
    return replace(document, attributes=tuple(marked.found)) if marked is not None and marked.found else document


def limit_sentence(sentence: str, count: Count, limit: int) -> list[str]:
    """[sentence] if count(sentence) <= limit, else consecutive pieces each within the limit, best cut after
    ; : , (or . ! ?), then at whitespace, inside a word only as a last resort; nothing is dropped but the
    whitespace at the cuts. TooLarge if a single character is over the limit."""
    return [sentence[a:b] for a, b in _limit_spans(sentence, count, limit, partial(_between_characters, sentence))]


# Sentences of a stretch of text


def _sentence_spans(text: str, hard_lines: bool) -> Iterator[tuple[int, int]]:
    """(start, end) of each sentence, without surrounding whitespace or marks (`_words_of`); with hard_lines never
    across a line."""
    lines = [(0, len(text))] if not hard_lines else [line.span() for line in _LINE.finditer(text)]
    for pos, endpos in lines:
        for start, end in _spans_in(text, pos, endpos):
            words = _words_of(text, start, end)
            if words is not None:
                yield words


def _words_of(text: str, start: int, end: int) -> tuple[int, int] | None:
    """The span of text[start:end] the model is given: without the leading tokens that hold no letter or digit
    (list bullets, "##", "|", "<<", "⚠️") and the trailing ones made of symbols alone ("🙂", "✓", "€", "|"), which
    stay as written; None when no letter is left ("•", "10:00", "★★★★☆", "??"): kept as written, as the
    model, trained on sentences with letters, turned such text into words ("•" -> "gramme")."""
    tokens = [token.span() for token in _TOKEN.finditer(text, start, end)]
    first, last = 0, len(tokens)
    while first < last and not any(c.isalnum() for c in text[slice(*tokens[first])]):
        first += 1
    while first < last and all(_is_symbol(c) for c in text[slice(*tokens[last - 1])]):
        last -= 1
    if not any(c.isalpha() for a, b in tokens[first:last] for c in text[a:b]):
        return None
    return tokens[first][0], tokens[last - 1][1]


def _is_symbol(char: str) -> bool:
    """A symbol (math, currency, modifier, other: emoji), or what joins one (a combining mark, a variation
    selector, the zero-width joiner)."""
    return unicodedata.category(char)[0] in "SM" or char == "\u200d"


def _spans_in(text: str, pos: int, endpos: int) -> Iterator[tuple[int, int]]:
    first = last = None  # the current sentence's first token, the previous token
    for token in _TOKEN.finditer(text, pos, endpos):
        if first is None:
            first = token
        elif (
            last is not None
            and _ends_sentence(last.group(), first is last, token.group())
            and _starts_sentence(token.group())
        ):
            yield first.start(), last.end()
            first = token
        last = token
    if first is not None and last is not None:
        yield first.start(), last.end()


def _ends_sentence(token: str, alone: bool, following: str) -> bool:
    """Whether a sentence may end with this whitespace-free token (`alone`: it would be the whole sentence) before
    the token `following`."""
    core = token.rstrip(CLOSERS)
    if not core or core[-1] not in TERMINALS:
        return False
    if core[-1] != "." or core.endswith(".."):
        return True
    word = core[:-1].lstrip(OPENERS)
    if alone and word.isdigit() and len(word) <= 3:  # "1. Open the file." is a numbered line
        return False
    initial = len(word) == 1 and word.isupper() and word != "I"  # "J. R. Tolkien", not "So did I."
    numbered = word in BEFORE_NUMBER and following[:1].isdigit()
    return not (initial or numbered or word in ABBREVIATIONS or _DOTTED.fullmatch(word))


def _starts_sentence(token: str) -> bool:
    """An opening quote or bracket, a capital, a digit, or a letter of a script without case."""
    first = token[0]
    return first in OPENERS or first.isdigit() or (first.isalpha() and not first.islower())


# The input as written vs the text to translate


class _Reference(NamedTuple):
    """A character reference: where it is in the raw input and where its expansion is in the text."""

    text_start: int
    text_end: int
    raw_start: int
    raw_end: int


@dataclass(frozen=True)
class _Source:
    """A stretch of input as written (`raw`) and its text to translate: with markup, character references
    expanded as html.unescape does; `references` locate each one in both, in order."""

    raw: str
    text: str
    references: list[_Reference] = field(default_factory=list)

    @classmethod
    def of(cls, raw: str, markup: bool) -> _Source:
        if not markup or "&" not in raw:
            return cls(raw, raw)
        parts: list[str] = []
        references: list[_Reference] = []
        length = done = 0
        for ref in _REFERENCE.finditer(raw):
            end = ref.start() + _replaced_length(ref.group())
            if end == ref.start():
                continue  # "&" and what follows are plain text
            expansion = html.unescape(raw[ref.start() : end])
            length += ref.start() - done
            references.append(_Reference(length, length + len(expansion), ref.start(), end))
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
class _Builder:
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
            source = _Source.of(raw, self.markup)
            self.add_spans(source, _sentence_spans(source.text, hard_lines=not self.markup))
        else:
            self.keep(raw)

    def add_spans(self, source: _Source, spans: Iterable[tuple[int, int]], origin: int | None = None) -> None:
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


# The markup of HTML


def _markup_end(markup: str, i: int) -> int | None:
    """The end of the tag, comment or declaration at markup[i] == "<"; len(markup) if the input ends inside it;
    None if no markup starts there (a "<" of the text)."""
    after = markup[i + 1 : i + 3]
    if markup.startswith("<!--", i):
        return _end_of(markup, "-->", i + 2)  # "<!-->" is a whole (empty) comment in a browser too
    if markup.startswith("<![CDATA[", i):  # in SVG, MathML and XHTML; it may hold ">"
        return _end_of(markup, "]]>", i + 9)
    if after[:1] in ("!", "?") or (after[:1] == "/" and not _is_tag_letter(after[1:])):
        return _end_of(markup, ">", i + 2)  # a doctype, a processing instruction, a bogus comment
    if _is_tag_letter(after[:1]) or after[:1] == "/":
        return _tag_end(markup, i)
    return None


def _is_tag_letter(char: str) -> bool:
    return char.isascii() and char.isalpha()


def _end_of(markup: str, marker: str, start: int) -> int:
    found = markup.find(marker, start)
    return len(markup) if found == -1 else found + len(marker)


def _tag_end(markup: str, i: int) -> int:
    """After the first ">" outside a quoted attribute value; len(markup) for a tag the input ends in."""
    j = i + 1
    while (stop := _TAG_STOP.search(markup, j)) is not None:
        if stop.group() == ">":
            return stop.end()
        if not markup[j : stop.start()].rstrip().endswith("="):  # a quote in a name or an unquoted value
            j = stop.end()
            continue
        close = markup.find(stop.group(), stop.end())
        if close == -1:
            return len(markup)
        j = close + 1
    return len(markup)


def _after_tag(markup: str, start: int, end: int, builder: _Builder | _Run, inside: Counter[str]) -> int:
    """Where text resumes after the tag markup[start:end]: past the content, kept verbatim, of a script or
    style element; counts the open code and pre elements in `inside`."""
    name = _TAG_NAME.match(markup, start, end)
    if name is None:
        return end
    tag, closing = name.group(1).lower(), markup[start + 1] == "/"
    if tag in _UNTRANSLATED:
        inside[tag] = max(0, inside[tag] - 1) if closing else inside[tag] + 1
    elif tag in _RAW_TEXT_END and not closing:
        close = _RAW_TEXT_END[tag].search(markup, end)
        resume = close.start() if close else len(markup)
        builder.keep(markup[end:resume])
        return resume
    return end


@dataclass
class _Attributes:
    """The translatable attribute values of the tags split_html gives it, in order (Document.attributes)."""

    found: list[Attribute] = field(default_factory=list)
    languages: tuple[str, str] | None = None  # (source, target): lang and the page's dir follow the target (_localised)

    def marked(self, tag: str) -> str:
        """The whole start tag `tag` with a marker in place of each translatable attribute value that holds a
        sentence, and the target's language code in place of a lang attribute's source language; as it is for any
        other markup, or a tag marked translate="no" or class="notranslate"."""
        name = _TAG_NAME.match(tag)
        if "=" not in tag or name is None or tag[1] == "/" or not tag.endswith(">") or _NO_TRANSLATE.search(tag):
            return tag
        element = name.group(1).lower()
        found = _attributes_of(tag, name.end())
        values: dict[str, str] = {}  # the first of each name, as a browser reads them
        for attribute, group, m in found:
            values.setdefault(attribute, m[group] if group else "")
        parts, at = [], 0
        for attribute, group, m in found:
            written = _localised(element, attribute, m[group], self.languages) if group is not None else None
            if written is not None:
                parts += [tag[at : m.start(group)], written]
                at = m.end(group)
                continue
            if group is None or not _translatable(element, attribute, values):
                continue
            value = _Builder(markup=True)
            value.add_text(m[group])
            if not value.sentences:
                continue
            parts += [tag[at : m.start(group)], f"\ue000{len(self.found)}\ue001"]
            self.found.append(Attribute(value.build(), '"' if group == 2 else "'" if group == 3 else ""))
            at = m.end(group)
        return "".join([*parts, tag[at:]]) if parts else tag


def _attributes_of(tag: str, after: int) -> list[tuple[str, int | None, re.Match[str]]]:
    """The attributes of the whole start tag `tag` from `after` (past its name): each one's name in lower case, the
    group of the match that holds its value (2: double-quoted, 3: single-quoted, 4: unquoted; None: no value), and
    the match."""
    return [
        (m[1].lower(), next((g for g in (2, 3, 4) if m[g] is not None), None), m)
        for m in _ATTRIBUTE.finditer(tag, after, len(tag) - 1)
    ]


def _localised(element: str, attribute: str, value: str, languages: tuple[str, str] | None) -> str | None:
    """What a translated tag's lang or dir says once its text is in the target language: lang="en-US" -> "fr";
    the page's direction (dir on html or body) where the two languages' scripts run opposite ways ("ltr" -> "rtl"
    for Arabic); None where it stays as written."""
    if languages is None or element in _VERBATIM:  # (its text stays as written, in its language)
        return None
    source, target = languages
    if attribute in _LANG:
        return target if _is_language(value, source) else None
    rtl = _primary(target) in _RIGHT_TO_LEFT
    if attribute == "dir" and element in _PAGE and (_primary(source) in _RIGHT_TO_LEFT) != rtl:
        return ("rtl" if rtl else "ltr") if value.strip().lower() == ("ltr" if rtl else "rtl") else None
    return None


def _foreign(tag: str, source: str) -> bool:
    """Whether this start tag says its element's text is in a language other than `source` (lang="de" in an English
    text): the model, trained on the source's, would garble it."""
    name = _TAG_NAME.match(tag)
    if name is None or "lang" not in tag.lower():
        return False
    found = _attributes_of(tag, name.end())
    language = next((m[group] for attribute, group, m in found if attribute in _LANG and group and m[group]), "")
    return bool(language.strip()) and not _is_language(language, source)


def _is_language(tag: str, language: str) -> bool:
    """Whether a BCP 47 language tag ("en", "en-GB", "EN_us") is of this language."""
    return _primary(tag) == _primary(language)


def _primary(tag: str) -> str:
    """A language tag's primary language subtag, in lower case: "en" for "EN-us"."""
    return re.split(r"[-_]", tag.strip(), maxsplit=1)[0].lower()


def _translatable(element: str, attribute: str, values: Mapping[str, str]) -> bool:
    """Whether this attribute of this element holds text for people to read (ATTRIBUTES), given the element's
    attributes' values (an input's type, a meta element's name)."""
    if attribute in ATTRIBUTES["*"] or attribute in ATTRIBUTES.get(element, ()):
        return True
    if element == "input" and attribute == "value":
        return values.get("type", "").strip().lower() in _BUTTONS
    if element == "meta" and attribute == "content":
        return (values.get("name") or values.get("property") or "").strip().lower() in _DESCRIPTIONS
    return False


# Inline elements: a sentence through their tags, and the tags back in its translation


class _TagAt(NamedTuple):
    """A whole tag (one that ends with ">", not one the input ends in): its element's name in lower case."""

    name: str
    closing: bool
    opens: bool  # a start tag that is not self-closing ("<b>", not "<span/>")


def _tag_at(markup: str, start: int, end: int) -> _TagAt | None:
    """The whole start or end tag at markup[start:end]; None for other markup or a tag the input ends in."""
    name = _TAG_NAME.match(markup, start, end)
    if name is None or not markup.endswith(">", start, end):
        return None
    closing = markup[start + 1] == "/"
    return _TagAt(name.group(1).lower(), closing, not closing and not markup.endswith("/>", start, end))


class _Tag(NamedTuple):
    raw: str
    name: str
    closing: bool
    raw_at: int  # where it stands in the run's text as written, tags left out
    text_at: int  # ... and in its text to translate


class _Atom(NamedTuple):
    """An element kept as written inside a run: a placeholder in the text to translate."""

    raw: str
    placeholder: str = ""
    raw_at: int = 0  # where it starts in the run's text as written, tags left out
    text_at: int = 0  # ... and in its text to translate (its placeholder)


_TEXT_AT = attrgetter("text_at")


@dataclass
class _Run:
    """Text and inline tags since the last other markup of an HTML input: one stretch of text to the builder."""

    builder: _Builder
    items: list[str | _Tag | _Atom] = field(default_factory=list)  # text as written, tags, kept elements

    def text(self, raw: str) -> None:
        if raw:
            self.items.append(raw)

    def tag(self, raw: str, name: str, closing: bool) -> None:
        self.items.append(_Tag(raw, name, closing, 0, 0))

    def atom(self, raw: str) -> None:
        self.items.append(_Atom(raw))

    def keep(self, raw: str) -> None:
        self.flush()
        self.builder.keep(raw)

    def flush(self) -> None:
        items, self.items = self.items, []
        if any(not isinstance(item, str) for item in items):
            _add_run(self.builder, items)
        elif items:
            self.builder.add_text("".join(items))  # type: ignore[arg-type]  # all text


def _add_run(builder: _Builder, items: list[str | _Tag | _Atom]) -> None:
    """Text with inline tags in it: its sentences across the tags. An element inside one sentence becomes that
    sentence's (Tagged); one around whole sentences, or around none, stays between them as written. Where tags
    do not pair, or an element is empty beside or inside a sentence, or runs from one sentence into another or
    out of it, every tag of the run ends a sentence, as other tags do."""
    joined = _joined(items)
    parts = None
    if joined is not None:
        source, tags, atoms = joined
        spans = list(_sentence_spans(source.text, hard_lines=False))
        owner = _owners(source.text, tags, spans)
        parts = _run_parts(source, tags, atoms, spans, owner) if owner is not None else None
    if parts is None:
        for item in items:
            builder.add_text(item) if isinstance(item, str) else builder.keep(item.raw)
        return
    for part in parts:
        builder.keep(part) if isinstance(part, str) else builder.add(*part)


def _run_parts(
    source: _Source, tags: list[_Tag], atoms: list[_Atom], spans: list[tuple[int, int]], owner: list[int | None]
) -> list[str | tuple[str, str, None, Tagged | None]] | None:
    """What is kept and the sentences, in order, with each tag where it stood; None if that order would not
    rebuild the run as written. Linear in the run's tags and sentences."""
    parts: list[str | tuple[str, str, None, Tagged | None]] = []
    pending = 0  # tags before this one are placed
    placed = [False] * len(tags)
    mine: dict[int | None, list[_Tag]] = {}
    for k, tag in enumerate(tags):
        mine.setdefault(owner[k], []).append(tag)

    def raw_with_tags(start: int, end: int, sentence: int | None) -> str | None:
        """source.raw[start:end] with the tags that stand in [start, end] and belong to `sentence` put back; None
        if one that stands inside it belongs elsewhere."""
        nonlocal pending
        pieces, at, k = [], start, pending
        while k < len(tags) and tags[k].raw_at <= end:
            tag = tags[k]
            if not placed[k] and owner[k] == sentence and tag.raw_at >= start:
                pieces += [source.raw[at : tag.raw_at], tag.raw]
                at, placed[k] = tag.raw_at, True
            elif not placed[k] and start < tag.raw_at < end:
                return None
            k += 1
        while pending < len(tags) and placed[pending]:
            pending += 1
        return "".join([*pieces, source.raw[at:end]])

    done = 0
    for j, (start, end) in enumerate(spans):
        inner = mine.get(j, [])
        raw_start = min([source.to_raw(start), *(tag.raw_at for tag in inner)])
        raw_end = max([source.to_raw(end), *(tag.raw_at for tag in inner)])
        before, original = raw_with_tags(done, raw_start, None), raw_with_tags(raw_start, raw_end, j)
        if before is None or original is None:
            return None
        kept = atoms[bisect_left(atoms, start, key=_TEXT_AT) : bisect_left(atoms, end, key=_TEXT_AT)]
        pieces = _pieces(source.raw, inner, kept, raw_start, raw_end) if inner or kept else None
        atoms_in = {atom.placeholder: atom.raw for atom in kept}
        tagged = Tagged(_elements(inner, start, end), pieces, atoms=atoms_in) if pieces is not None else None
        parts += [before, (source.text[start:end], original, None, tagged)]
        done = raw_end
    after = raw_with_tags(done, len(source.raw), None)
    if after is None:
        return None
    parts.append(after)
    written = "".join(part if isinstance(part, str) else part[1] for part in parts)
    return parts if all(placed) and written == _rebuilt(source.raw, tags) else None


def _pieces(raw: str, tags: list[_Tag], atoms: list[_Atom], start: int, end: int) -> Document:
    """raw[start:end] with these tags, all inside it, put back, split at every tag and kept element (as written):
    split_html(..., inline=False) of a sentence's original, without parsing its markup again."""
    breaks = sorted(  # in the order written: a tag before a kept element that starts where it stands
        [(tag.raw_at, 0, k, tag.raw_at, tag.raw) for k, tag in enumerate(tags)]
        + [(atom.raw_at, 1, k, atom.raw_at + len(atom.raw), atom.raw) for k, atom in enumerate(atoms)]
    )
    builder, at = _Builder(markup=True), start
    for position, _, _, after, written in breaks:
        builder.add_text(raw[at:position])
        builder.keep(written)
        at = after
    builder.add_text(raw[at:end])
    return builder.build()


def _rebuilt(raw: str, tags: list[_Tag]) -> str:
    """The run as written: its text with its tags where they stood."""
    parts, at = [], 0
    for tag in tags:
        parts += [raw[at : tag.raw_at], tag.raw]
        at = tag.raw_at
    return "".join([*parts, raw[at:]])


def _joined(items: list[str | _Tag | _Atom]) -> tuple[_Source, list[_Tag], list[_Atom]] | None:
    """The run's text as one _Source (each stretch between tags unescaped on its own, each kept element a
    placeholder the text holds nowhere else, as a reference to it), its tags and kept elements, placed; None if a
    kept element stands before a digit or after "%" (its placeholder would run into them)."""
    raws: list[str] = []
    texts: list[str] = []
    references: list[_Reference] = []
    tags: list[_Tag] = []
    atoms: list[_Atom] = []
    taken = {int(n) for item in items if isinstance(item, str) for n in _NUMBERED.findall(html.unescape(item))}
    free = (f"%{n}" for n in itertools.count(1) if n not in taken)
    following, after = [""] * len(items), ""  # the text that follows each item, tags being none of it
    for k in range(len(items) - 1, -1, -1):
        following[k] = after
        item = items[k]
        after = item if isinstance(item, str) else "%" if isinstance(item, _Atom) else after
    raw_at = text_at = 0
    for k, item in enumerate(items):
        if isinstance(item, _Tag):
            tags.append(item._replace(raw_at=raw_at, text_at=text_at))
            continue
        if isinstance(item, _Atom):
            if following[k][:1].isdigit() or (texts and texts[-1].endswith("%")):
                return None
            atom = item._replace(placeholder=next(free), raw_at=raw_at, text_at=text_at)
            atoms.append(atom)
            references.append(_Reference(text_at, text_at + len(atom.placeholder), raw_at, raw_at + len(item.raw)))
            raws.append(item.raw)
            texts.append(atom.placeholder)
            raw_at, text_at = raw_at + len(item.raw), text_at + len(atom.placeholder)
            continue
        part = _Source.of(item, markup=True)
        references += [
            _Reference(r.text_start + text_at, r.text_end + text_at, r.raw_start + raw_at, r.raw_end + raw_at)
            for r in part.references
        ]
        raws.append(item)
        texts.append(part.text)
        raw_at, text_at = raw_at + len(item), text_at + len(part.text)
    return _Source("".join(raws), "".join(texts), references), tags, atoms


def _owners(text: str, tags: list[_Tag], spans: list[tuple[int, int]]) -> list[int | None] | None:
    """For each tag, the sentence whose element it belongs to (None: it stays between sentences); None when the
    tags do not pair, or an element is empty beside or inside a sentence or runs out of one. Sentences are found
    by bisection: linear in the tags, whatever the number of sentences."""
    owner: list[int | None] = [None] * len(tags)
    starts, ends = [s for s, _ in spans], [e for _, e in spans]
    open_: list[int] = []
    for k, tag in enumerate(tags):
        if not tag.closing:
            open_.append(k)
            continue
        if not open_ or tags[open_[-1]].name != tag.name:
            return None
        first = open_.pop()
        start, end = _trimmed(text, tags[first].text_at, tag.text_at)
        if start >= end:  # nothing but whitespace: beside or inside a sentence, nowhere to go in its translation
            j = bisect_right(starts, start) - 1
            if j >= 0 and start <= ends[j]:
                return None
            continue
        lo, hi = bisect_right(ends, start), bisect_left(starts, end)  # the sentences the element overlaps
        if hi - lo == 1 and starts[lo] <= start and end <= ends[lo] and (starts[lo], ends[lo]) != (start, end):
            owner[first] = owner[k] = lo  # inside one sentence
        elif hi > lo and not (start <= starts[lo] and ends[hi - 1] <= end):
            return None  # part of a sentence and part of what is outside it, or of another sentence
    return None if open_ else owner


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    """start and end moved in past whitespace."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _elements(tags: list[_Tag], start: int, end: int) -> list[Inline]:
    """The elements of a sentence at text[start:end] that these tags (paired, in order) make."""
    elements: list[Inline] = []
    open_: list[tuple[int, _Tag]] = []
    for tag in tags:
        if not tag.closing:
            elements.append(Inline(0, 0, tag.raw, "", open_[-1][0] if open_ else None))
            open_.append((len(elements) - 1, tag))
            continue
        k, opening = open_.pop()
        span = max(opening.text_at, start) - start, min(tag.text_at, end) - start
        elements[k] = elements[k]._replace(start=span[0], end=span[1], closing=tag.raw)
    return elements


def _project(tagged: Tagged, sentence: str, translation: str, pieces: Sequence[str]) -> list[tuple[int, int]] | None:
    """Where each element goes in the translation: around the words most like its pieces' translation or its words
    as written, the nearest to where it stood where several are; None if one has none, or they would not nest."""
    where = _piece_spans(sentence, tagged.pieces.sentences)
    spans: list[tuple[int, int]] = []
    for element in tagged.elements:
        start, end = _trimmed(sentence, element.start, element.end)
        inner = " ".join(t for (a, b), t in zip(where, pieces, strict=True) if start <= a and b <= end)
        candidates = list(dict.fromkeys(c for c in (inner.strip(), sentence[start:end]) if c))
        centre = (start + end) / 2 / max(1, len(sentence)) * len(translation)
        found = _exactly(translation, candidates, centre) or _nearly(translation, candidates, centre)
        if found is None:
            return None
        spans.append(found)
    return spans if _nests(tagged.elements, spans) else None


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


def _atoms_fit(translation: str, atoms: dict[str, str], spans: list[tuple[int, int]]) -> bool:
    """Whether each kept element's placeholder is in the translation exactly once, no element's span cutting it."""
    found = [match for match in _NUMBERED.finditer(translation) if match.group() in atoms]
    if sorted(match.group() for match in found) != sorted(atoms):
        return False
    edges = {edge for span in spans for edge in span}
    return not any(match.start() < edge < match.end() for match in found for edge in edges)


def _with_tags(
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
        return _NUMBERED.sub(lambda m: atoms.get(m.group(), m.group()), escaped) if atoms else escaped

    parts, at = [], 0
    for position, _, _, tag in marks:
        parts += [put(translation[at:position]), tag]
        at = position
    return "".join([*parts, put(translation[at:])])


def _kept_elements(markup: str, source: str | None = None) -> dict[int, int]:
    """Where each element kept as written (KEPT_INLINE, or marked translate="no" or class="notranslate", or, given
    the `source` language, marked lang="xx" of another language) starts, and where its end tag ends, nested elements
    of its name counted; one with no end tag is not in it. One pass over the markup, and none when it names no such
    element."""
    lowered = markup.lower()
    names = ("<code", "<samp", "translate", "lang") if source else ("<code", "<samp", "translate")
    if not any(name in lowered for name in names):
        return {}
    kept: dict[int, int] = {}
    open_: dict[str, list[tuple[int, bool]]] = {}  # name -> its open start tags: (where, kept)
    i = markup.find("<")
    while i != -1:
        end = _markup_end(markup, i)
        if end is None:
            i = markup.find("<", i + 1)
            continue
        tag = _tag_at(markup, i, end)
        if tag is not None:
            if tag.closing:
                if open_.get(tag.name):
                    start, keep = open_[tag.name].pop()
                    if keep:
                        kept[start] = end
            elif tag.name in _RAW_TEXT_END:
                close = _RAW_TEXT_END[tag.name].search(markup, end)
                end = close.start() if close else len(markup)
            elif tag.opens and tag.name not in _VOID:
                keep = tag.name in KEPT_INLINE or _NO_TRANSLATE.search(markup, i, end) is not None
                # (a page's own lang, on html or body, is the request's to say: templates often leave "en")
                foreign = source is not None and tag.name not in _PAGE and _foreign(markup[i:end], source)
                keep = keep or foreign
                open_.setdefault(tag.name, []).append((i, keep))
        i = markup.find("<", end)
    return kept


# Cutting a long sentence


def _limit_spans(sentence: str, count: Count, limit: int, can_cut: Callable[[int], bool]) -> list[tuple[int, int]]:
    """Spans of sentence, each within the limit, covering all of it but the whitespace at the cuts."""
    if count(sentence) <= limit:
        return [(0, len(sentence))]
    start, end = len(sentence) - len(sentence.lstrip()), len(sentence.rstrip())
    spans: list[tuple[int, int]] = []
    while start < end:
        window = _window(sentence, start, end, count, limit)
        if window == end and count(sentence[start:end]) <= limit:
            spans.append((start, end))
            break
        cut = _cut(sentence, start, window, count, limit, can_cut)
        spans.append((start, cut))
        start = _skip_space(sentence, cut)
    return spans


def _skip_space(text: str, offset: int) -> int:
    space = _SPACE.match(text, offset)
    return space.end() if space else offset


def _window(sentence: str, start: int, end: int, count: Count, limit: int) -> int:
    """An offset past which no piece from start fits, found by doubling: the pieces tried stay near the
    piece's own length, so that cutting is linear in the sentence."""
    size = max(limit, 1)
    while start + size < end and count(sentence[start : start + size]) <= limit:
        size *= 2
    return min(end, start + size)


def _cut(sentence: str, start: int, window: int, count: Count, limit: int, can_cut: Callable[[int], bool]) -> int:
    """The end of the longest piece from start that fits, at the best kind of cut that gives one."""

    def fits(cut: int) -> bool:
        return count(sentence[start:cut]) <= limit

    for cuts in _candidate_cuts(sentence, start, window, can_cut):
        best = _last_fitting(cuts, fits)
        if best is not None:
            return best
    raise TooLarge(
        f"a sentence cannot be cut into pieces of at most {limit} tokens: the character {sentence[start]!r} "
        f"alone counts more; raise the limit"
    )


def _candidate_cuts(sentence: str, start: int, window: int, can_cut: Callable[[int], bool]) -> Iterator[list[int]]:
    """Cut offsets in (start, window], ascending, best kind first: after a clause, at whitespace, in a word."""
    yield [m.end() for m in _CLAUSE_END.finditer(sentence, start, window)]
    yield [m.start() for m in _SPACE.finditer(sentence, start, window)]
    in_words = [cut for cut in range(start + 1, window + 1) if not sentence[cut - 1].isspace()]
    yield [cut for cut in in_words if can_cut(cut)]
    yield in_words


def _last_fitting(cuts: list[int], fits: Callable[[int], bool]) -> int | None:
    """The last cut that fits, by bisection (a longer piece never counts fewer tokens, nearly always)."""
    low, high, best = 0, len(cuts) - 1, None
    while low <= high:
        middle = (low + high) // 2
        if fits(cuts[middle]):
            best, low = cuts[middle], middle + 1
        else:
            high = middle - 1
    return best
