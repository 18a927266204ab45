"""Reads a manual page (roff, man macros) as a sequence of text blocks: headings, paragraphs, list tags and bodies.

Font macros (`.B`, `.BR`...) and escapes (`\\fB`, `\\-`, `\\(em`...) become plain text, so a page written with
`.BR open (2)` and its translation written with `\\fBopen\\fP(2)` give the same blocks; code and tables are one empty
block each; the TRADUCTION section a French page ends with (its translators' credits) is left out. Knows roff;
not archives or alignment.
"""

from __future__ import annotations

import re
import shlex

_HEADINGS = frozenset({"SH", "SS"})
_PARAGRAPHS = frozenset({"PP", "LP", "P", "HP"})
_ALTERNATING = frozenset({"BR", "RB", "IR", "RI", "BI", "IB"})
_FONTS = frozenset({"B", "I", "SM", "SB"})
_VERBATIM = {"nf": "fi", "EX": "EE", "TS": "TE"}
_NAMED = {  # \(xx and \[xx] characters; others are dropped
    "em": "—", "en": "–", "aq": "'", "dq": '"', "lq": "“", "rq": "”", "oq": "‘", "cq": "’", "bu": "•", "co": "©",
    "rg": "®", "mu": "×", "<=": "≤", ">=": "≥", "->": "→", "ga": "`", "ha": "^", "ti": "~",
}  # fmt: skip
_FONT_RE = re.compile(r"\\f(?:\[[^\]]*\]|\(..|.)")
_NAMED_RE = re.compile(r"\\(?:\((..)|\[([^\]]+)\]|\*\((..)|\*\[([^\]]+)\]|\*(.))")
_SIMPLE = (("\\-", "-"), ("\\e", "\\"), ("\\&", ""), ("\\~", " "), ("\\ ", " "), ("\\0", " "), ("\\|", ""),
           ("\\^", ""), ("\\c", ""), ("\\%", ""), ("\\:", ""))  # fmt: skip


def plain(text: str) -> str:
    """Roff text without font changes and with escapes as the characters they stand for."""
    text = _FONT_RE.sub("", text)
    text = _NAMED_RE.sub(lambda m: _NAMED.get(next(g for g in m.groups() if g), ""), text)
    for escape, char in _SIMPLE:
        text = text.replace(escape, char)
    return text


def _arguments(rest: str) -> list[str]:
    try:
        return shlex.split(rest, posix=True)
    except ValueError:
        return rest.split()


def macro_text(name: str, rest: str) -> str:
    """The text a font macro line prints: alternating macros join their arguments, the others space them."""
    arguments = _arguments(rest)
    return "".join(arguments) if name in _ALTERNATING else " ".join(arguments)


class _Blocks:
    """The blocks read so far and the one being filled."""

    def __init__(self) -> None:
        self.blocks: list[tuple[str, str]] = []
        self.tag: str | None = None
        self.lines: list[str] = []

    def close(self) -> None:
        if self.tag is not None:
            self.blocks.append((self.tag, " ".join(" ".join(plain(line) for line in self.lines).split())))
        self.tag, self.lines = None, []

    def start(self, tag: str) -> None:
        self.close()
        self.tag = tag

    def add(self, text: str) -> None:
        if self.tag is None:
            self.tag = "text"
        self.lines.append(text)
        if self.tag == "TP-tag":  # the line after .TP is the term; what follows is its description
            self.start("TP-body")


def roff_blocks(text: str) -> list[tuple[str, str]]:
    """(kind, text) of a manual page's blocks in order."""
    blocks = _Blocks()
    verbatim_end: str | None = None
    for line in text.split("\n"):
        if line.startswith((".\\\"", "'\\\"", '.\\"')):
            continue
        name, _, rest = line[1:].strip().partition(" ") if line.startswith((".", "'")) else ("", "", "")
        if verbatim_end is not None:
            verbatim_end = None if name == verbatim_end else verbatim_end
        elif name in _VERBATIM:
            blocks.start("verbatim")
            blocks.close()
            verbatim_end = _VERBATIM[name]
        elif name in _HEADINGS and macro_text("", rest).strip() == "TRADUCTION":
            break
        elif name in _HEADINGS:
            blocks.start(name)
            blocks.add(macro_text("", rest))
            blocks.close()
        elif name in _PARAGRAPHS:
            blocks.start("PP")
        elif name in ("TP", "TQ"):
            blocks.start("TP-tag")
        elif name == "IP":
            arguments = _arguments(rest)
            blocks.start("IP")
            if arguments and arguments[0]:
                blocks.lines.append(arguments[0])
                blocks.start("IP-body")
        elif name in _ALTERNATING or name in _FONTS:
            blocks.add(macro_text(name, rest))
        elif not line.startswith((".", "'")) and line.strip():
            blocks.add(line)
    blocks.close()
    return [(tag, body) for tag, body in blocks.blocks if body or tag == "verbatim"]
