"""Reads FreeOrion's string tables as raw pairs: `stringtables/fr.txt` against `stringtables/en.txt` in the same
folder, one value of each for the same key.

Knows the string table syntax (FreeOrion's StringTable.cpp): the first line names the language; then entries, a key
line (an identifier, maybe followed by a `#` comment) and its value, one line or a block between `'''` marks;
`#` comment lines and blank lines between entries. A value's `[[KEY]]` stands for the table's value of KEY, as the
game expands it when it loads the table; a value left with a reference the table cannot expand (a link to a game
object) gives no pair. Not cleaning: that is clean.py's.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

from model_export.corpus.extract import RawPair

log = logging.getLogger(__name__)

_KEY_RE = re.compile(r"^(\w+)\s*(?:#.*)?$")
_REFERENCE_RE = re.compile(r"\[\[(\w+)\]\]")
_QUOTES = "'''"
ENGLISH, FRENCH = "en.txt", "fr.txt"


def is_string_table(name: str) -> bool:
    """FreeOrion's English or French string table (`default/stringtables/fr.txt`)."""
    folder, _, file = name.rpartition("/")
    return folder.endswith("stringtables") and file in (ENGLISH, FRENCH)


def _value(lines: list[str], i: int) -> tuple[str, int]:
    """The value that starts at line `i` (one line, or a `'''` block) and the index of the line after it."""
    line = lines[i]
    if not line.startswith(_QUOTES):
        return line, i + 1
    rest = line[len(_QUOTES) :]
    if _QUOTES in rest:
        return rest.split(_QUOTES, 1)[0], i + 1
    block = [rest]
    for j in range(i + 1, len(lines)):
        if _QUOTES in lines[j]:
            return "\n".join([*block, lines[j].split(_QUOTES, 1)[0]]), j + 1
        block.append(lines[j])
    return "\n".join(block), len(lines)


def parse_table(text: str) -> dict[str, str]:
    """A string table's values by key (its first line, the language's name, skipped; a repeated key: its last)."""
    lines, values, i = text.splitlines()[1:], {}, 0
    while i < len(lines):
        match = _KEY_RE.match(lines[i].strip())
        if lines[i].lstrip().startswith("#") or match is None or i + 1 >= len(lines):
            i += 1
            continue
        values[match.group(1)], i = _value(lines, i + 1)
    return values


def expand(value: str, table: dict[str, str], depth: int = 0) -> str:
    """`value` with each `[[KEY]]` the table has replaced by its (expanded) value, as the game loads it."""
    if depth > 8:  # a reference cycle: leave the rest as written
        return value
    return _REFERENCE_RE.sub(lambda m: expand(table[m[1]], table, depth + 1) if m[1] in table else m[0], value)


def read_table(path: Path) -> dict[str, str]:
    """A string table file's values by key; an unreadable one gives none, with a warning."""
    try:
        return parse_table(path.read_text(encoding="utf-8-sig"))
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("skipping unreadable string table %s: %s", path, exc)
        return {}


def table_pairs(files: Path, package: str) -> Iterator[RawPair]:
    """The pairs of every French string table extracted under `files` with the English one beside it, references
    expanded; the English table's path (without `.txt`) is the document."""
    for french_path in sorted(files.rglob(FRENCH)):
        english_path = french_path.with_name(ENGLISH)
        if not english_path.is_file():
            continue
        english, french = read_table(english_path), read_table(french_path)
        document = english_path.relative_to(files).as_posix().removesuffix(".txt")
        for key, text in english.items():
            if key not in french:
                continue
            source, target = expand(text, english), expand(french[key], french)
            if "[[" not in source and "[[" not in target:
                yield RawPair(source, target, package, document)
