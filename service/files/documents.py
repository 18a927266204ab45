"""Documents as LibreTranslate offers them: plain text (.txt: each paragraph a string, its line breaks kept),
subtitles (.srt: each cue's text, its number and timings kept, its lines re-broken at the source's proportions),
HTML (.html, .htm: the page through the translator's HTML mode, in pieces cut after block elements) and EPUB (.epub:
each XHTML content document as an HTML page, every other entry of the book as it was)."""

from __future__ import annotations

import posixpath
import re
from urllib.parse import unquote

from service.files.archive import Archive
from service.files.catalogue import FileError, FileOptions, Item, decoded
from service.files.segments import Segment
from service.files.xml import parsed

_PARAGRAPH_BREAK = re.compile(r"(\n[ \t]*\n+)")
_TIMING = re.compile(r"\d\d:\d\d:\d\d[,.]\d{3} --> \d\d:\d\d:\d\d[,.]\d{3}")
_BLOCK_END = re.compile(r"</(?:p|div|li|h[1-6]|tr|table|ul|ol|section|article|header|footer|blockquote|pre)\s*>", re.I)
HTML_PIECE_CHARS = 8_000  # a page goes to the translator in pieces of about this size, each cut after a block
CONTAINER = "urn:oasis:names:tc:opendocument:xmlns:container"
OPF = "http://www.idpf.org/2007/opf"
XHTML = "application/xhtml+xml"


class PlainText:
    name, suffixes, media_type = "txt", (".txt",), "text/plain; charset=utf-8"

    def __init__(self, data: bytes, filename: str, target: str, options: FileOptions) -> None:
        self.parts = _PARAGRAPH_BREAK.split(decoded(data, filename).replace("\r\n", "\n"))
        self.items = [Item([Segment.of_text(p)], i) for i, p in enumerate(self.parts) if i % 2 == 0 and p.strip()]
        self.units, self.kept = len(self.items), 0

    def put(self, item: Item, translations: list[str]) -> None:
        self.parts[item.at] = item.sources[0].text(translations[0])

    def dump(self) -> bytes:
        return "".join(self.parts).encode("utf-8")


class Subtitles:
    name, suffixes, media_type = "srt", (".srt",), "application/x-subrip"

    def __init__(self, data: bytes, filename: str, target: str, options: FileOptions) -> None:
        text = decoded(data, filename, ("utf-8", "cp1252")).replace("\r\n", "\n")
        self.cues: list[list[str]] = []  # [number, timing, text]
        line = 1
        for block in re.split(r"\n[ \t]*\n", text.strip("\n")):
            lines = block.split("\n")
            if len(lines) < 2 or not lines[0].strip().isdigit() or not _TIMING.match(lines[1]):
                raise FileError(400, f"{filename}: not a SubRip cue at line {line}: a number, then a timing "
                                     "such as 00:00:01,000 --> 00:00:02,500, then the text")
            self.cues.append([lines[0].strip(), lines[1], "\n".join(lines[2:])])
            line += len(lines) + 1
        spoken = [(i, " ".join(cue[2].split())) for i, cue in enumerate(self.cues)]  # a cue's lines as one text
        self.items = [Item([Segment.of_text(text)], i) for i, text in spoken if text]
        self.units, self.kept = len(self.items), 0

    def put(self, item: Item, translations: list[str]) -> None:
        cue = self.cues[item.at]
        cue[2] = _rebroken(item.sources[0].text(translations[0]), cue[2].split("\n"))

    def dump(self) -> bytes:
        return "\n".join(f"{n}\n{timing}\n{text}\n" for n, timing, text in self.cues).encode("utf-8")


def _rebroken(text: str, source_lines: list[str]) -> str:
    """`text` on as many lines as the source cue had, each break at the space nearest the source's proportion."""
    if len(source_lines) < 2:
        return text
    total, breaks, at = sum(len(line) for line in source_lines), [], 0
    for line in source_lines[:-1]:
        at += len(line)
        want = round(at / max(1, total) * len(text))
        spaces = [i for i, char in enumerate(text) if char == " " and (not breaks or i > breaks[-1])]
        if spaces:
            breaks.append(min(spaces, key=lambda i: abs(i - want)))
    chars = list(text)
    for i in breaks:
        chars[i] = "\n"
    return "".join(chars)


class Html:
    name, suffixes, media_type = "html", (".html", ".htm"), "text/html; charset=utf-8"

    def __init__(self, data: bytes, filename: str, target: str, options: FileOptions) -> None:
        page = decoded(data, filename, ("utf-8", "cp1252"))
        self.pieces = _pieces(page)
        self.items = [Item([Segment(piece)], i) for i, piece in enumerate(self.pieces) if piece.strip()]
        self.units, self.kept = len(self.items), 0

    def put(self, item: Item, translations: list[str]) -> None:
        self.pieces[item.at] = translations[0]  # HTML in, HTML out: the translator kept the markup

    def dump(self) -> bytes:
        return "".join(self.pieces).encode("utf-8")


def _pieces(page: str) -> list[str]:
    pieces, start, last_cut = [], 0, 0
    for match in _BLOCK_END.finditer(page):
        if match.end() - start >= HTML_PIECE_CHARS:
            pieces.append(page[start : match.end()])
            start = match.end()
        last_cut = match.end()
    pieces.append(page[start:])
    return [piece for piece in pieces if piece] or [page] if last_cut >= 0 else [page]


class Epub(Archive):
    """An EPUB 2 or 3 book: each XHTML content document its package lists (the manifest's application/xhtml+xml
    items: chapters, EPUB 3's navigation document) translated as an HTML page is; the package document, the NCX,
    styles, images and fonts kept byte for byte."""

    name, suffixes, media_type = "epub", (".epub",), "application/epub+zip"

    def _items(self) -> list[Item]:
        self.pages: dict[str, list[str]] = {}
        items = []
        for entry in self._content_documents():
            self.pages[entry] = _pieces(decoded(self.read(entry), f"{self.filename}:{entry}", ("utf-8",)))
            items += [Item([Segment(piece)], (entry, i)) for i, piece in enumerate(self.pages[entry]) if piece.strip()]
        return items

    def _content_documents(self) -> list[str]:
        """The entries of the manifest's XHTML items, from the package document META-INF/container.xml names."""
        where = f"{self.filename}:META-INF/container.xml"
        rootfile = parsed(self.read("META-INF/container.xml"), where, "an EPUB container").find(
            f".//{{{CONTAINER}}}rootfile"
        )
        package_path = rootfile.get("full-path") if rootfile is not None else None
        if not package_path:
            raise FileError(400, f"{where}: no <rootfile full-path=...>: it must name the package document (.opf)")
        package = parsed(self.read(package_path), f"{self.filename}:{package_path}", "an EPUB package document")
        base = posixpath.dirname(package_path)
        hrefs = [item.get("href") for item in package.iter(f"{{{OPF}}}item") if item.get("media-type") == XHTML]
        return list(dict.fromkeys(posixpath.normpath(posixpath.join(base, unquote(h))) for h in hrefs if h))

    def put(self, item: Item, translations: list[str]) -> None:
        entry, index = item.at
        self.pages[entry][index] = translations[0]  # HTML in, HTML out: the translator kept the markup

    def written(self) -> dict[str, bytes]:
        translated = {entry for entry, _ in (item.at for item in self.items)}
        return {entry: "".join(self.pages[entry]).encode("utf-8") for entry in translated}
