"""HTML in, a Document out: which text of a page is translated (elements, translatable attributes, lang and
translate="no"), the inline elements a sentence runs through, and the page's language and direction put right."""

from __future__ import annotations

import html
import html.entities
import itertools
import re
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import NamedTuple

from service.errors import InvalidRequest
from service.text.document import (
    Attribute,
    Builder,
    Document,
    Reference,
    Source,
    Tagged,
    split_text,
)
from service.text.inline import (
    NUMBERED,
    Inline,
    trimmed,
)
from service.text.sentences import (
    sentence_spans,
)

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
_TEXT_AT = attrgetter("text_at")


def split(text: str, fmt: str) -> Document:
    """The Document of a request's text in its format, "text" or "html"."""
    if fmt == "text":
        return split_text(text)
    if fmt == "html":
        return split_html(text)
    raise InvalidRequest(f"format {fmt!r} is not supported; use 'text' or 'html'")


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
    builder = Builder(markup=True)
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


def _after_tag(markup: str, start: int, end: int, builder: Builder | _Run, inside: Counter[str]) -> int:
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
            value = Builder(markup=True)
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


@dataclass
class _Run:
    """Text and inline tags since the last other markup of an HTML input: one stretch of text to the builder."""

    builder: Builder
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


def _add_run(builder: Builder, items: list[str | _Tag | _Atom]) -> None:
    """Text with inline tags in it: its sentences across the tags. An element inside one sentence becomes that
    sentence's (Tagged); one around whole sentences, or around none, stays between them as written. Where tags
    do not pair, or an element is empty beside or inside a sentence, or runs from one sentence into another or
    out of it, every tag of the run ends a sentence, as other tags do."""
    joined = _joined(items)
    parts = None
    if joined is not None:
        source, tags, atoms = joined
        spans = list(sentence_spans(source.text, hard_lines=False))
        owner = _owners(source.text, tags, spans)
        parts = _run_parts(source, tags, atoms, spans, owner) if owner is not None else None
    if parts is None:
        for item in items:
            builder.add_text(item) if isinstance(item, str) else builder.keep(item.raw)
        return
    for part in parts:
        builder.keep(part) if isinstance(part, str) else builder.add(*part)


def _run_parts(
    source: Source, tags: list[_Tag], atoms: list[_Atom], spans: list[tuple[int, int]], owner: list[int | None]
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
    builder, at = Builder(markup=True), start
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


def _joined(items: list[str | _Tag | _Atom]) -> tuple[Source, list[_Tag], list[_Atom]] | None:
    """The run's text as one Source (each stretch between tags unescaped on its own, each kept element a
    placeholder the text holds nowhere else, as a reference to it), its tags and kept elements, placed; None if a
    kept element stands before a digit or after "%" (its placeholder would run into them)."""
    raws: list[str] = []
    texts: list[str] = []
    references: list[Reference] = []
    tags: list[_Tag] = []
    atoms: list[_Atom] = []
    taken = {int(n) for item in items if isinstance(item, str) for n in NUMBERED.findall(html.unescape(item))}
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
            references.append(Reference(text_at, text_at + len(atom.placeholder), raw_at, raw_at + len(item.raw)))
            raws.append(item.raw)
            texts.append(atom.placeholder)
            raw_at, text_at = raw_at + len(item.raw), text_at + len(atom.placeholder)
            continue
        part = Source.of(item, markup=True)
        references += [
            Reference(r.text_start + text_at, r.text_end + text_at, r.raw_start + raw_at, r.raw_end + raw_at)
            for r in part.references
        ]
        raws.append(item)
        texts.append(part.text)
        raw_at, text_at = raw_at + len(item), text_at + len(part.text)
    return Source("".join(raws), "".join(texts), references), tags, atoms


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
        start, end = trimmed(text, tags[first].text_at, tag.text_at)
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
