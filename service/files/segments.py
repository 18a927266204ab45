"""A file's string as the engine reads it, and back: every string goes through the translator's HTML mode, in which
what must survive exactly stands as an element the translator keeps in place.

- a placeholder of any ecosystem (printf `%s %1$d %@`, Python `%(name)s`, `{name}` `{0}` `{{name}}`, `${name}`,
  Qt `%1`) as `<code>...</code>`, which the model reads as a placeholder and which comes back as written;
- a line break as `<br>`, which ends a sentence and comes back as written;
- an inline element of an XML format (XLIFF's `<x/>`, `<g>`, `<ph>`, Android's `<b>`, `<xliff:g>`) as `<img data-i>`
  (kept whole, where it stands) or `<span data-i>...</span>` (around the words of its translation);
- the rest of the text escaped, so that a `<` of the string is never read as a tag.
"""

from __future__ import annotations

import copy
import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

PLACEHOLDER = re.compile(
    r"%#@[A-Za-z0-9_]{1,64}@"  # .stringsdict: %#@files@
    r"|%\([^)\s]{1,64}\)[-+ 0#]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]"  # Python: %(name)s
    r"|%(?:\d+\$)?[-+ 0#']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|q|j|z|t)?[diouxXeEfFgGaAcspn@]"  # printf, iOS
    r"|%L?\d+"  # Qt: %1, %L1
    r"|\{\{[^{}\n]{1,64}\}\}"  # i18next, Handlebars: {{name}}
    r"|\$\{[^{}\n]{1,64}\}"  # ${name}
    r"|\{[A-Za-z0-9_.:$-]{0,64}\}"  # {name}, {0}, {}
    r"|%%"  # a printf percent sign
)
_PIECE = re.compile(r"<code>(?P<code>.*?)</code>|(?P<br><br\s*/?>)|<img data-i=\"(?P<void>\d+)\"\s*/?>"
                    r"|<span data-i=\"(?P<open>\d+)\">|(?P<close></span>)|(?P<tag><[^>]*>)|(?P<text>[^<]+)", re.DOTALL)


@dataclass
class Segment:
    """One string to translate: `markup`, what the engine is given, and the inline elements it stands for (XML
    formats), each kept whole (`void`) or around words (`paired`)."""

    markup: str
    elements: list[Any] = field(default_factory=list)  # lxml elements, in the order their markers stand
    paired: set[int] = field(default_factory=set)
    cdata: bool = False  # Android: the string is a CDATA section of HTML, given to the engine as it is

    @classmethod
    def of_text(cls, text: str) -> Segment:
        return cls(encoded(text))

    def text(self, translation: str) -> str:
        """The translation as plain text: placeholders and line breaks as written, inline markers dropped."""
        return "".join(piece for piece in pieces(translation) if isinstance(piece, str))


def encoded(text: str) -> str:
    """`text` as markup: escaped, its placeholders as `<code>` elements and its line breaks as `<br>`."""
    parts, at = [], 0
    for match in PLACEHOLDER.finditer(text):
        parts.append(_escaped(text[at : match.start()]))
        parts.append(f"<code>{html.escape(match.group(), quote=False)}</code>")
        at = match.end()
    parts.append(_escaped(text[at:]))
    return "".join(parts)


def _escaped(text: str) -> str:
    return html.escape(text, quote=False).replace("\r\n", "<br>").replace("\n", "<br>")


Piece = str | tuple[str, int]  # text, or ("void", i), ("open", i), ("close", -1)


def pieces(translation: str) -> list[Piece]:
    """A translation's markup as text (placeholders and line breaks back as written, references unescaped) and
    the markers of inline elements, in order; a tag of any other kind is dropped."""
    found: list[Piece] = []
    for match in _PIECE.finditer(translation):
        kind = match.lastgroup
        if kind == "code":
            found.append(html.unescape(match.group("code")))
        elif kind == "br":
            found.append("\n")
        elif kind == "text":
            found.append(html.unescape(match.group("text")))
        elif kind in ("void", "open"):
            found.append((kind, int(match.group(kind))))
        elif kind == "close":
            found.append(("close", -1))
    return found


# -- XML formats: a mixed-content element's text and children ---------------------------------------------------


def of_element(element: Any, paired: Callable[[Any], bool]) -> Segment:
    """An XML element's content as a Segment: its text encoded, each child a marker (`paired(child)`: around its
    own content, which is encoded in turn; else kept whole)."""
    segment = Segment("")
    segment.markup = _content(element, segment, paired)
    return segment


def _content(element: Any, segment: Segment, paired: Callable[[Any], bool]) -> str:
    parts = [encoded(element.text or "")]
    for child in element:
        index = len(segment.elements)
        segment.elements.append(child)
        if isinstance(child.tag, str) and paired(child):
            segment.paired.add(index)
            parts.append(f'<span data-i="{index}">{_content(child, segment, paired)}</span>')
        else:
            parts.append(f'<img data-i="{index}">')
        parts.append(encoded(child.tail or ""))
    return "".join(parts)


def fill_element(target: Any, segment: Segment, translation: str) -> None:
    """`target`'s content becomes the translation: its text, and a copy of each inline element where its marker
    stands (a paired one around the words it went to); an element whose marker the translation lost is put back at
    the end, so that no placeholder of the source goes missing."""
    for child in list(target):
        target.remove(child)
    target.text = ""
    stack = [target]
    placed: set[int] = set()
    for piece in pieces(translation):
        if isinstance(piece, str):
            _append_text(stack[-1], piece)
        elif piece[0] == "void" and piece[1] < len(segment.elements) and piece[1] not in placed:
            placed.add(piece[1])
            stack[-1].append(_copy(segment.elements[piece[1]], whole=True))
        elif piece[0] == "open" and piece[1] in segment.paired and piece[1] not in placed:
            placed.add(piece[1])
            element = _copy(segment.elements[piece[1]], whole=False)
            stack[-1].append(element)
            stack.append(element)
        elif piece[0] == "close" and len(stack) > 1:
            stack.pop()
    top = [i for i in range(len(segment.elements)) if i not in placed and not _inside_paired(segment, i)]
    for i in top:
        stack[0].append(_copy(segment.elements[i], whole=True))


def _inside_paired(segment: Segment, index: int) -> bool:
    element = segment.elements[index]
    return any(element in segment.elements[p].iterdescendants() for p in segment.paired if p != index)


def _copy(element: Any, whole: bool) -> Any:
    made = copy.deepcopy(element)
    made.tail = None
    if not whole:
        for child in list(made):
            made.remove(child)
        made.text = None
    return made


def _append_text(parent: Any, text: str) -> None:
    if len(parent):
        last = parent[-1]
        last.tail = (last.tail or "") + text
    else:
        parent.text = (parent.text or "") + text
