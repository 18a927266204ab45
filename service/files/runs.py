"""Paragraphs made of runs (WordprocessingML's w:r, DrawingML's a:r), each run's formatting in its properties (w:rPr,
a:rPr): the paragraph read as one Segment, the text of runs formatted as most of the paragraph is as plain text, that
of each other formatting inside a paired marker (so the translator puts it around the words it went to), a tab and
what holds no text of the paragraph (a bookmark, a field, a drawing) as a marker kept whole; and the paragraph's
runs rebuilt from the translation, each piece of text in a copy of a run of its formatting, each element kept whole
moved where its marker stands; a hyperlink of runs of one formatting as one marked piece. A paragraph with text this
reading would lose (a hyperlink of several formattings, tracked changes) is None: its caller translates it whole."""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

from lxml import etree

from service.files.segments import Segment, encoded, pieces

XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"
_BREAKS = re.compile(r"([\n\t])")


@dataclass(frozen=True)
class Dialect:
    """One markup's names: its run, the run's properties and text, and where line breaks and tabs live."""

    namespace: str
    fixed: frozenset[str]  # the paragraph's children that stay where they are: its properties, its end's
    breaks_in_runs: bool  # WordprocessingML: <w:br/> and <w:tab/> inside a run; DrawingML: <a:br> between runs
    kept: frozenset[str] = frozenset()  # kept whole though they hold text: fields (a page's, a slide's number)
    dropped: frozenset[str] = frozenset()  # marks the translation makes wrong: Word's spelling and grammar errors

    def tag(self, name: str) -> str:
        return f"{{{self.namespace}}}{name}"


WORD = Dialect(
    "http://schemas.openxmlformats.org/wordprocessingml/2006/main", frozenset({"pPr"}), True,
    kept=frozenset({"fldSimple"}), dropped=frozenset({"proofErr"}),
)
DRAWING = Dialect(
    "http://schemas.openxmlformats.org/drawingml/2006/main", frozenset({"pPr", "endParaRPr"}), False,
    kept=frozenset({"fld"}),
)
# what a WordprocessingML run of plain text holds, and what each adds to its text
_WORD_RUN = {"rPr": "", "lastRenderedPageBreak": "", "softHyphen": "", "tab": "\t", "br": "\n", "cr": "\n",
             "noBreakHyphen": "\u2011"}
_WORD_TYPE = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}type"


@dataclass
class Runs:
    """A paragraph read as runs: its Segment, and the run whose formatting its plain text takes."""

    paragraph: Any
    segment: Segment
    base: Any
    dialect: Dialect


def read(paragraph: Any, dialect: Dialect) -> Runs | None:
    """The paragraph's runs as a Segment (module docstring); None where it has text this reading would lose."""
    groups: list[tuple[Any, str | None]] = []  # (a run and its text, or an element kept whole and None)
    for child in paragraph:
        if not isinstance(child.tag, str) or etree.QName(child).localname in dialect.fixed | dialect.dropped:
            continue
        text = _text(child, dialect) if etree.QName(child).localname != "hyperlink" else _link_text(child, dialect)
        if text == "\n" and etree.QName(child).localname == "br" and groups and groups[-1][1] is not None:
            groups[-1] = (groups[-1][0], groups[-1][1] + text)  # DrawingML's break: a line of the run before it
        elif text is None or etree.QName(child).localname == "br":
            if own_texts(child, paragraph, dialect):
                return None  # text of this paragraph inside what is not a plain run
            groups.append((child, None))  # a text box's own paragraphs are read as paragraphs of their own
        elif _is_link(child):
            groups.append((child, text))  # one marked piece; a tab in it stays a character of its text
        else:
            for i, part in enumerate(text.split("\t")):
                if i:
                    groups.append((_tab(child, dialect), None))  # in its place, wherever the model puts it
                if part:
                    _add(groups, child, part, dialect)
    chars: dict[bytes, int] = {}
    for run, text in groups:
        if text is not None and text.strip() and not _is_link(run):
            chars[_key(run, dialect)] = chars.get(_key(run, dialect), 0) + len(text)
    links = [run for run, text in groups if _is_link(run)]
    if not chars and not links or not any(text and text.strip() for _, text in groups):
        return None
    base_key = max(chars, key=chars.__getitem__) if chars else b""  # the first of the commonest, as max keeps it
    segment, parts = Segment(""), []
    for run, text in groups:
        index = len(segment.elements)
        if text is None:
            segment.elements.append(run)
            parts.append(f'<img data-i="{index}">')
        elif _key(run, dialect) == base_key:
            parts.append(encoded(text))
        else:
            segment.elements.append(run)
            segment.paired.add(index)
            parts.append(f'<span data-i="{index}">{encoded(text)}</span>')
    segment.markup = "".join(parts)
    bases = (run for run, text in groups if text is not None and not _is_link(run) and _key(run, dialect) == base_key)
    base = next(bases, None)
    return Runs(paragraph, segment, links[0].find(dialect.tag("r")) if base is None else base, dialect)


def _link_text(link: Any, dialect: Dialect) -> str | None:
    """A WordprocessingML hyperlink's text, where it is plain runs of one formatting (read as one marked piece, the
    link around the words of its translation); None otherwise."""
    runs = list(link)
    texts = [_text(run, dialect) for run in runs]
    if not runs or any(text is None for text in texts):
        return None
    if len({_key(run, dialect) for run in runs}) > 1:
        return None
    return "".join(text or "" for text in texts)


def _is_link(element: Any) -> bool:
    return isinstance(element.tag, str) and etree.QName(element).localname == "hyperlink"


def _add(groups: list[tuple[Any, str | None]], run: Any, text: str, dialect: Dialect) -> None:
    """A run's text after the groups, in the last one where that is a run of the same formatting."""
    if groups and groups[-1][1] is not None and _key(groups[-1][0], dialect) == _key(run, dialect):
        groups[-1] = (groups[-1][0], groups[-1][1] + text)
    else:
        groups.append((run, text))


def _tab(run: Any, dialect: Dialect) -> Any:
    """A run of `run`'s formatting that is one tab (WordprocessingML's <w:tab/>, DrawingML's tab character)."""
    made = _element(dialect.tag("r"), run.find(dialect.tag("rPr")), run.attrib)
    if dialect.breaks_in_runs:
        etree.SubElement(made, dialect.tag("tab"))
    else:
        etree.SubElement(made, dialect.tag("t")).text = "\t"
    return made


def own_texts(element: Any, paragraph: Any, dialect: Dialect) -> list[Any]:
    """The text elements under `element` that are `paragraph`'s own: not a paragraph's inside it (a text box's),
    not inside an element kept whole (a field)."""
    return [text for text in element.iter(dialect.tag("t")) if _owner(text, dialect) is paragraph]


def _owner(text: Any, dialect: Dialect) -> Any:
    """The paragraph a text element's words belong to; None inside an element kept whole."""
    for ancestor in text.iterancestors():
        name = etree.QName(ancestor)
        if name.namespace == dialect.namespace and name.localname in dialect.kept:
            return None
        if name.namespace == dialect.namespace and name.localname == "p":
            return ancestor
    return None


def _text(child: Any, dialect: Dialect) -> str | None:
    """A plain run's text (its breaks "\\n", its tabs "\\t"); None for anything else."""
    name = etree.QName(child).localname
    if not dialect.breaks_in_runs:
        if name == "br":
            return "\n"
        if name != "r" or any(etree.QName(c).localname not in ("rPr", "t") for c in child if isinstance(c.tag, str)):
            return None
        return "".join(t.text or "" for t in child.iter(dialect.tag("t")))
    if name != "r" or any(_plain_word(c) is None for c in child):
        return None
    return "".join(_plain_word(c) or "" for c in child)


def _plain_word(child: Any) -> str | None:
    """What a WordprocessingML run's child adds to its text ("" for its properties); None for what is no text."""
    name = etree.QName(child).localname if isinstance(child.tag, str) else ""
    if name == "t":
        return child.text or ""
    if name == "br" and child.get(_WORD_TYPE, "textWrapping") != "textWrapping":
        return None  # a page or column break is no line of text
    return _WORD_RUN.get(name)


def _key(run: Any, dialect: Dialect) -> bytes:
    """A run's formatting: its properties as written (a hyperlink's: its own, shared with nothing else)."""
    if _is_link(run):
        return b"hyperlink %d" % id(run)
    props = run.find(dialect.tag("rPr"))
    return etree.tostring(props) if props is not None else b""


def write(runs: Runs, translation: str) -> None:
    """The paragraph's runs replaced by the translation's: its plain text in copies of the base run, each marked
    piece in a copy of its own run (a hyperlink's in a copy of the hyperlink), each element kept whole where its
    marker stands (at the end where the translation lost it)."""
    segment, made, placed, text = runs.segment, [], set(), [""]
    stack: list[tuple[Any, Any]] = [(runs.base, made)]  # (the run whose formatting text takes, where its runs go)

    def flush() -> None:
        template, sink = stack[-1]
        sink.extend(_runs_of(template, text[0], runs.dialect))
        text[0] = ""

    for piece in pieces(translation):
        if isinstance(piece, str):
            text[0] += piece
        elif piece[0] == "open" and piece[1] in segment.paired and piece[1] not in placed:
            flush()
            placed.add(piece[1])
            element = segment.elements[piece[1]]
            if _is_link(element):
                link = etree.Element(element.tag, dict(element.attrib))
                stack[-1][1].append(link)
                stack.append((element.find(runs.dialect.tag("r")), link))
            else:
                stack.append((element, stack[-1][1]))
        elif piece[0] == "close" and len(stack) > 1:
            flush()
            stack.pop()
        elif piece[0] == "void" and piece[1] < len(segment.elements) and piece[1] not in segment.paired | placed:
            flush()
            placed.add(piece[1])
            stack[-1][1].append(segment.elements[piece[1]])  # moved, not copied: a text box in it is an item itself
    flush()
    made += [segment.elements[i] for i in range(len(segment.elements)) if i not in segment.paired | placed]
    _replace_content(runs.paragraph, made, runs.dialect)


def _runs_of(template: Any, text: str, dialect: Dialect) -> list[Any]:
    """`text` as runs formatted as `template`: one run with <w:t>, <w:br/>, <w:tab/> (WordprocessingML), or runs
    and <a:br> between them (DrawingML)."""
    if not text:
        return []
    props = template.find(dialect.tag("rPr"))
    if not dialect.breaks_in_runs:
        made: list[Any] = []
        for i, line in enumerate(text.split("\n")):
            if i:
                made.append(_element(dialect.tag("br"), props))
            if line:
                made.append(_element(dialect.tag("r"), props, template.attrib))
                etree.SubElement(made[-1], dialect.tag("t")).text = line
        return made
    run = _element(dialect.tag("r"), props, template.attrib)
    for part in _BREAKS.split(text):
        if part == "\n":
            etree.SubElement(run, dialect.tag("br"))
        elif part == "\t":
            etree.SubElement(run, dialect.tag("tab"))
        elif part:
            etree.SubElement(run, dialect.tag("t"), {XML_SPACE: "preserve"}).text = part
    return [run]


def _element(tag: str, props: Any, attrib: Any = None) -> Any:
    made = etree.Element(tag, dict(attrib or {}))
    if props is not None:
        made.append(copy.deepcopy(props))
    return made


def _replace_content(paragraph: Any, made: list[Any], dialect: Dialect) -> None:
    """The paragraph's children but the fixed ones removed, `made` put after its properties (and before the
    properties of its end, DrawingML's a:endParaRPr, which stay last)."""
    for child in [c for c in paragraph if not isinstance(c.tag, str) or etree.QName(c).localname not in dialect.fixed]:
        paragraph.remove(child)
    at = 1 if len(paragraph) and etree.QName(paragraph[0]).localname == "pPr" else 0
    for offset, element in enumerate(made):
        paragraph.insert(at + offset, element)
