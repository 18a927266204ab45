"""Reads MegaGlest's language files as raw pairs: `<name>_french.lng` against `<name>_english.lng` (or
`<name>_default.lng`, a tech tree's) in the same folder, one value of each for the same key.

Knows the `.lng` syntax: INI-style `key=value` lines without sections, `;` or `#` comment lines, `\\n` in a value
a line break. Not cleaning: that is clean.py's.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

from model_export.corpus.extract import RawPair

log = logging.getLogger(__name__)

_ROLE_RE = re.compile(r"^(?P<name>.*?)_?(?P<role>english|default|french)\.lng$")
_ENGLISH_ROLES = ("english", "default")


def is_lng_file(name: str) -> bool:
    """An English or French MegaGlest language file (`data/lang/french.lng`, `tutorials/x/x_english.lng`)."""
    return _ROLE_RE.match(name.rsplit("/", 1)[-1]) is not None


def read_lng(path: Path) -> dict[str, str]:
    """A language file's values by key (a repeated key: its last value), `\\n` turned into line breaks; an
    unreadable file gives none, with a warning."""
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("skipping unreadable language file %s: %s", path, exc)
        return {}
    values: dict[str, str] = {}
    for line in lines:
        if line.lstrip().startswith((";", "#")) or "=" not in line:
            continue
        key, value = line.split("=", 1)
        values[key.strip()] = value.replace("\\n", "\n")
    return values


def lng_pairs(files: Path, package: str) -> Iterator[RawPair]:
    """The pairs of every French language file under `files` with its English one, each English file a document
    named by its path; a French file without an English one gives none."""
    for french in sorted(files.rglob("*.lng")):
        match = _ROLE_RE.match(french.name)
        if match is None or match["role"] != "french":
            continue
        prefix = f"{match['name']}_" if match["name"] else ""
        english = next((e for r in _ENGLISH_ROLES if (e := french.with_name(f"{prefix}{r}.lng")).is_file()), None)
        if english is None:
            continue
        source, target = read_lng(english), read_lng(french)
        document = english.relative_to(files).as_posix().removesuffix(".lng")
        for key, text in source.items():
            if key in target:
                yield RawPair(text, target[key], package, document)
