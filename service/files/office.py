"""Office documents as LibreTranslate offers them: .docx (WordprocessingML) and .pptx (PresentationML: each slide
and its speaker notes), each paragraph translated whole, its runs' formatting around the words of the translation
and its hyperlinks around theirs (service/files/runs.py; a paragraph with text elsewhere too, in a tracked change, is
written into its first run, keeping the paragraph's style and that run's formatting); .odt and .odp (OpenDocument
text and presentation, one content.xml): each paragraph and heading, its spans around the words of the translation,
its spaces, tabs and line breaks kept. Every other entry of the archive is copied as it was (archive.py)."""

from __future__ import annotations

import re
from typing import Any

from lxml import etree

from service.files import runs
from service.files.archive import XmlParts
from service.files.catalogue import Item
from service.files.runs import XML_SPACE
from service.files.segments import Segment, fill_element, of_element
from service.files.xml import local

TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_SLIDE = re.compile(r"ppt/(?:slides/slide|notesSlides/notesSlide)(\d+)\.xml")


class _Paragraphs(XmlParts):
    """Office Open XML: each paragraph of the parts read as runs (`dialect`), else its own texts joined, translated
    whole and written into the first."""

    dialect = runs.WORD

    def _items_of(self, root: Any) -> list[Item]:
        items = []
        for paragraph in root.iter(self.dialect.tag("p")):
            read = runs.read(paragraph, self.dialect)
            if read is not None:
                items.append(Item([read.segment], read))
                continue
            texts = runs.own_texts(paragraph, paragraph, self.dialect)
            if "".join(t.text or "" for t in texts).strip():
                items.append(Item([Segment.of_text("".join(t.text or "" for t in texts))], texts))
        return items

    def put(self, item: Item, translations: list[str]) -> None:
        if isinstance(item.at, runs.Runs):
            runs.write(item.at, translations[0])
            return
        first, *rest = item.at
        first.text = item.sources[0].text(translations[0])
        if self.dialect is runs.WORD:
            first.set(XML_SPACE, "preserve")
        for text in rest:
            text.text = ""


class Docx(_Paragraphs):
    name, suffixes = "docx", (".docx",)
    media_type = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"

    def parts(self) -> list[str]:
        return ["word/document.xml"]


class Pptx(_Paragraphs):
    name, suffixes = "pptx", (".pptx",)
    media_type = "application/vnd.openxmlformats-officedocument.presentationml.presentation"
    dialect = runs.DRAWING

    def parts(self) -> list[str]:
        """The slides, then their notes, in the order of their numbers; FileError 400 without a presentation."""
        self.read("ppt/presentation.xml")
        names = [name for name in self.archive.namelist() if _SLIDE.fullmatch(name)]
        return sorted(names, key=lambda name: (name.startswith("ppt/notes"), int(_SLIDE.fullmatch(name).group(1))))


class Odt(XmlParts):
    name, suffixes = "odt", (".odt",)
    media_type = "application/vnd.oasis.opendocument.text"

    def parts(self) -> list[str]:
        return ["content.xml"]

    def _items_of(self, root: Any) -> list[Item]:
        items = []
        for element in root.iter(f"{{{TEXT}}}p", f"{{{TEXT}}}h"):
            if any(local(a) in ("p", "h") for a in element.iterancestors() if etree.QName(a).namespace == TEXT):
                continue  # a paragraph inside another's note: translated with it
            if "".join(element.itertext()).strip():
                items.append(Item([of_element(element, _paired)], element))
        return items

    def put(self, item: Item, translations: list[str]) -> None:
        fill_element(item.at, item.sources[0], translations[0])


class Odp(Odt):
    """A presentation: its slides' frames and its speaker notes hold the same text:p and text:span as a text."""

    name, suffixes = "odp", (".odp",)
    media_type = "application/vnd.oasis.opendocument.presentation"


def _paired(element: Any) -> bool:
    return local(element) in ("span", "a")
