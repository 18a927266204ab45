"""Office documents as LibreTranslate offers them: .docx (WordprocessingML: each paragraph's text translated whole,
written into its first run, so the paragraph keeps its style and its first run's formatting) and .odt
(OpenDocument: each paragraph and heading, its spans around the words of the translation, its spaces, tabs and
line breaks kept). A document is a zip archive: its entry count and uncompressed size are checked before anything
is read (zip bombs), and every entry but the text is copied as it was."""

from __future__ import annotations

import io
import zipfile
from typing import Any

from lxml import etree

from service.files.catalogue import FileError, FileOptions, Item
from service.files.segments import Segment, fill_element, of_element
from service.files.xml import local, parsed

MAX_ENTRIES = 2_000  # entries of an archive
MAX_UNPACKED_BYTES = 200_000_000  # all its entries, uncompressed
W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"
TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
XML_SPACE = "{http://www.w3.org/XML/1998/namespace}space"


class _Archive:
    name, suffixes, media_type, entry = "", (), "", ""

    def __init__(self, data: bytes, filename: str, target: str, options: FileOptions) -> None:
        self.filename = filename
        try:
            self.archive = zipfile.ZipFile(io.BytesIO(data))
            entries = self.archive.infolist()
        except (zipfile.BadZipFile, ValueError, OSError) as error:
            raise FileError(400, f"{filename}: not a {self.name} document (a zip archive): {error}") from None
        unpacked = sum(entry.file_size for entry in entries)
        if len(entries) > MAX_ENTRIES or unpacked > MAX_UNPACKED_BYTES:
            raise FileError(413, f"{filename}: an archive of {len(entries)} entries, {unpacked} bytes unpacked: over "
                                 f"the limits ({MAX_ENTRIES} entries, {MAX_UNPACKED_BYTES} bytes)")
        try:
            document = self.archive.read(self.entry)
        except KeyError:
            raise FileError(400, f"{filename}: no {self.entry} in the archive: not a {self.name} document") from None
        except (zipfile.BadZipFile, ValueError, OSError, EOFError) as error:
            raise FileError(400, f"{filename}: a damaged archive: {error}") from None
        self.root = parsed(document, f"{filename}:{self.entry}", "a document")
        self.items = self._items()
        self.units, self.kept = len(self.items), 0

    def _items(self) -> list[Item]:
        raise NotImplementedError

    def dump(self) -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as written:
            for entry in self.archive.infolist():
                if entry.filename == self.entry:
                    content = etree.tostring(self.root.getroottree(), xml_declaration=True, encoding="UTF-8",
                                             standalone=True)
                else:
                    content = self.archive.read(entry)
                written.writestr(entry, content)  # each entry's own compression (ODF's mimetype stays stored)
        return out.getvalue()


class Docx(_Archive):
    name, suffixes, entry = "docx", (".docx",), "word/document.xml"
    media_type = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"

    def _items(self) -> list[Item]:
        items = []
        for paragraph in self.root.iter(f"{{{W}}}p"):
            texts = [t for t in paragraph.iter(f"{{{W}}}t")]
            if "".join(t.text or "" for t in texts).strip():
                items.append(Item([Segment.of_text("".join(t.text or "" for t in texts))], texts))
        return items

    def put(self, item: Item, translations: list[str]) -> None:
        first, *rest = item.at
        first.text = item.sources[0].text(translations[0])
        first.set(XML_SPACE, "preserve")
        for text in rest:
            text.text = ""


class Odt(_Archive):
    name, suffixes, entry = "odt", (".odt",), "content.xml"
    media_type = "application/vnd.oasis.opendocument.text"

    def _items(self) -> list[Item]:
        items = []
        for element in self.root.iter(f"{{{TEXT}}}p", f"{{{TEXT}}}h"):
            if any(local(a) in ("p", "h") for a in element.iterancestors() if etree.QName(a).namespace == TEXT):
                continue  # a paragraph inside another's note: translated with it
            if "".join(element.itertext()).strip():
                items.append(Item([of_element(element, _paired)], element))
        return items

    def put(self, item: Item, translations: list[str]) -> None:
        fill_element(item.at, item.sources[0], translations[0])


def _paired(element: Any) -> bool:
    return local(element) in ("span", "a")
