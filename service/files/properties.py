"""Java .properties and Apple .strings through translate-toolkit: keys, comments and order kept, escapes (`\\uXXXX`,
`\\n`, quotes) read and written by the format's rules; an entry whose value is empty is left alone."""

from __future__ import annotations

from io import BytesIO
from typing import Any

from translate.storage import properties

from service.files.catalogue import FileError, FileOptions, Item, decoded
from service.files.segments import Segment


class _KeyValues:
    name = ""
    suffixes: tuple[str, ...] = ()
    media_type = "text/plain"

    def __init__(self, data: bytes, filename: str, target: str, options: FileOptions) -> None:
        self.store = self._parsed(data, filename)
        entries = [u for u in self.store.units if getattr(u, "name", None) and u.source]
        # a catalogue of one language: its values are the source; translated means a target written (overwrite)
        self.units, self.kept = len(entries), 0
        self.items = [Item([Segment.of_text(str(u.source))], u) for u in entries]

    def _parsed(self, data: bytes, filename: str) -> Any:
        raise NotImplementedError

    def put(self, item: Item, translations: list[str]) -> None:
        item.at.target = item.sources[0].text(translations[0])

    def dump(self) -> bytes:
        return bytes(self.store)


class JavaProperties(_KeyValues):
    name, suffixes, media_type = "properties", (".properties",), "text/x-java-properties"

    def _parsed(self, data: bytes, filename: str) -> Any:
        try:
            data.decode("utf-8")
            kind = properties.javautf8file  # Java 9+ reads .properties as UTF-8
        except UnicodeDecodeError:
            kind = properties.javafile  # ISO-8859-1, other characters as \\uXXXX
        try:
            return kind(BytesIO(data))
        except Exception as error:  # noqa: BLE001 - the parser's own message
            raise FileError(400, f"{filename}: not a valid .properties file: {error}") from None


class AppleStrings(_KeyValues):
    name, suffixes, media_type = "strings", (".strings",), "text/plain"

    def _parsed(self, data: bytes, filename: str) -> Any:
        text = decoded(data, filename, ("utf-8", "utf-16"))
        try:
            return properties.stringsutf8file(BytesIO(text.encode("utf-8")))
        except Exception as error:  # noqa: BLE001 - the parser's own message
            raise FileError(400, f"{filename}: not a valid .strings file: {error}") from None
