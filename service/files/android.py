"""Android string resources (res/values/strings.xml): <string>, <plurals> and <string-array> translated where they
stand, names and comments kept, translatable="false" left alone; Android's escapes (\\' \\" \\n \\t \\@ \\? \\\\
\\uXXXX) read and written; inline markup (<b>, <i>, <u>, <a>, <annotation>) around the words of the translation and
<xliff:g> (a placeholder) kept whole; a CDATA string's HTML translated as HTML. A <plurals> gets the quantities the
target language uses (CLDR), each new one from `other`."""

from __future__ import annotations

import re
from typing import Any

from lxml import etree

from service.files.catalogue import FileError, FileOptions, Item, plural_categories
from service.files.segments import Segment, fill_element, of_element
from service.files.xml import local, parsed, serialised

PAIRED = frozenset({"b", "i", "u", "a", "em", "strong", "font", "span", "annotation", "big", "small", "sup", "sub"})
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|.)", re.DOTALL)
_UNESCAPED = {"n": "\n", "t": "\t", "'": "'", '"': '"', "@": "@", "?": "?", "\\": "\\"}


class AndroidStrings:
    name, suffixes, media_type = "android", ("strings.xml",), "application/xml"

    def __init__(self, data: bytes, filename: str, target: str, options: FileOptions) -> None:
        self.root = parsed(data, filename, "an Android resource file")
        if local(self.root) != "resources":
            raise FileError(400, f"{filename}: not an Android resource file (the root is <{local(self.root)}>)")
        self.target = target.split("-")[0].split("_")[0]
        self.items: list[Item] = []
        self.units = self.kept = 0
        for element in self.root:
            if not isinstance(element.tag, str) or element.get("translatable") == "false":
                self.kept += isinstance(element.tag, str)
                continue
            strings = [element] if local(element) == "string" else [i for i in element if local(i) == "item"]
            for string in strings:
                if "".join(string.itertext()).strip():
                    self.units += 1
                    self.items.append(Item([_segment(string)], string))
            if local(element) == "plurals":
                self._add_quantities(element)

    def _add_quantities(self, plurals: Any) -> None:
        """The quantities the target uses and the source lacks, as copies of `other` (translated with it)."""
        have = {item.get("quantity"): item for item in plurals if local(item) == "item"}
        other = have.get("other")
        for quantity in plural_categories(self.target):
            if quantity not in have and other is not None:
                made = etree.Element(other.tag, attrib={**other.attrib, "quantity": quantity})
                made.text = other.text
                for child in other:
                    made.append(etree.fromstring(etree.tostring(child)))
                made.tail = other.tail
                other.addprevious(made)
                self.items.append(Item([_segment(made)], made))

    def put(self, item: Item, translations: list[str]) -> None:
        string, segment = item.at, item.sources[0]
        if segment.cdata:
            string.text = etree.CDATA(translations[0])
            return
        fill_element(string, segment, translations[0])
        for node in [string, *string.iterdescendants()]:
            if local(node) != "g":  # xliff:g holds a placeholder: as written
                node.text = _escaped(node.text) if node.text else node.text
            if node is not string:
                node.tail = _escaped(node.tail) if node.tail else node.tail

    def dump(self) -> bytes:
        return serialised(self.root)


def _segment(string: Any) -> Segment:
    """A string's content as a Segment, its escapes undone (a copy: the tree keeps them until put)."""
    if b"<![CDATA[" in etree.tostring(string):
        segment = Segment(string.text or "")  # the CDATA holds HTML: the engine reads it as HTML
        segment.cdata = True
        return segment
    copy = etree.fromstring(etree.tostring(string))
    copy.tail = None
    for node in [copy, *copy.iterdescendants()]:
        if local(node) != "g":
            node.text = _unescaped(node.text) if node.text else node.text
        if node is not copy:
            node.tail = _unescaped(node.tail) if node.tail else node.tail
    segment = of_element(copy, lambda child: local(child) in PAIRED)

    return segment


def _unescaped(text: str) -> str:
    """Android's escapes undone; a value in double quotes keeps its spaces, outside them runs of space are one."""
    if len(text) >= 2 and text.startswith('"') and text.endswith('"'):
        text = text[1:-1]
    else:
        text = re.sub(r"[ \t\n]+", " ", text)
    return _ESCAPE.sub(lambda m: chr(int(m.group(1)[1:], 16)) if m.group(1)[0] == "u" and len(m.group(1)) == 5
                       else _UNESCAPED.get(m.group(1), m.group(1)), text)


def _escaped(text: str) -> str:
    out = text.replace("\\", "\\\\").replace("'", "\\'").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return "\\" + out if out[:1] in ("@", "?") else out
