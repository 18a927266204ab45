"""Zip-based documents (.docx, .pptx, .odt, .odp, .epub): the archive's entry count and uncompressed size checked
before anything is read (zip bombs), its entries read with every failure a FileError 400, and the archive written
back with the translated entries replaced and every other entry's bytes as they were, `mimetype` (OpenDocument's,
EPUB's) first and stored uncompressed, as both formats require."""

from __future__ import annotations

import io
import lzma
import struct
import zipfile
import zlib
from typing import Any

from lxml import etree

from service.files.catalogue import FileError, FileOptions, Item
from service.files.xml import parsed

MAX_ENTRIES = 2_000  # entries of an archive
MAX_UNPACKED_BYTES = 200_000_000  # all its entries, uncompressed
MIMETYPE = "mimetype"
_READ_ERRORS = (  # what a damaged archive raises as it is opened or read: RuntimeError encrypted, NotImplementedError
    # an unknown compression or zip version, zlib.error and lzma.LZMAError damaged data, BadZipFile a bad CRC or header
    zipfile.BadZipFile, ValueError, OSError, EOFError, RuntimeError, NotImplementedError, zlib.error, lzma.LZMAError,
    struct.error,
)


class Archive:
    """A document that is a zip archive; a format says which entries hold its text (`_items`, reading them with
    `read`) and gives them back translated (`written`)."""

    name, suffixes, media_type = "", (), ""

    def __init__(self, data: bytes, filename: str, target: str, options: FileOptions) -> None:
        self.filename = filename
        self.archive = opened(data, filename, self.name)
        self.items = self._items()
        self.units, self.kept = len(self.items), 0

    def _items(self) -> list[Item]:
        raise NotImplementedError

    def written(self) -> dict[str, bytes]:
        """The entries the translation changed, by name, as they are to be written."""
        raise NotImplementedError

    def read(self, entry: str) -> bytes:
        """An entry's bytes; FileError 400 where the archive lacks it (not this format) or cannot give it."""
        try:
            return self.archive.read(entry)
        except KeyError:
            raise FileError(400, f"{self.filename}: no {entry} in the archive: not a {self.name} document") from None
        except _READ_ERRORS as error:
            raise FileError(400, f"{self.filename}: a damaged archive ({entry}): {error}") from None

    def dump(self) -> bytes:
        changed = self.written()
        entries = sorted(self.archive.infolist(), key=lambda entry: entry.filename != MIMETYPE)  # stable
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as archive:
            for entry in entries:
                content = changed[entry.filename] if entry.filename in changed else self.read(entry.filename)
                if entry.filename == MIMETYPE:
                    entry.compress_type = zipfile.ZIP_STORED
                archive.writestr(entry, content)  # each entry's own name, date and compression
        return out.getvalue()


class XmlParts(Archive):
    """An archive whose text lies in XML entries (`parts`), each parsed safely (service/files/xml.py), its text
    found by `_items_of`; those with text to translate written back serialised, the others left as they were."""

    def parts(self) -> list[str]:
        raise NotImplementedError

    def _items(self) -> list[Item]:
        roots = {part: parsed(self.read(part), f"{self.filename}:{part}", "a document") for part in self.parts()}
        found = {part: self._items_of(root) for part, root in roots.items()}
        self.roots = {part: roots[part] for part, items in found.items() if items}  # those written back
        return [item for items in found.values() for item in items]

    def _items_of(self, root: Any) -> list[Item]:
        raise NotImplementedError

    def written(self) -> dict[str, bytes]:
        return {
            part: etree.tostring(root.getroottree(), xml_declaration=True, encoding="UTF-8", standalone=True)
            for part, root in self.roots.items()
        }


def opened(data: bytes, filename: str, name: str) -> zipfile.ZipFile:
    """The archive, its entries counted and their declared sizes summed first (a read stops at the declared size:
    an entry cannot unpack to more); FileError 400 for what is no zip archive, 413 over MAX_ENTRIES or
    MAX_UNPACKED_BYTES."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        entries = archive.infolist()
    except _READ_ERRORS as error:
        raise FileError(400, f"{filename}: not a {name} document (a zip archive): {error}") from None
    unpacked = sum(entry.file_size for entry in entries)
    if len(entries) > MAX_ENTRIES or unpacked > MAX_UNPACKED_BYTES:
        raise FileError(413, f"{filename}: an archive of {len(entries)} entries, {unpacked} bytes unpacked: over "
                             f"the limits ({MAX_ENTRIES} entries, {MAX_UNPACKED_BYTES} bytes)")
    return archive
