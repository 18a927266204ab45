"""Reads Minetest's translation files (`<textdomain>.fr.tr`, what its mods ship) as raw pairs.

Knows the `.tr` syntax (Minetest's lua_api, "Translation file format"): `# ...` comment lines (the first names the
text domain), `source=translation` lines, `@` escaping the next character (`@=` a literal `=`, `@n` a newline,
`@@` an `@`), `@1`..`@9` the arguments, kept as written on both sides. Not cleaning: that is clean.py's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

from model_export.corpus.extract import RawPair, path_locale

log = logging.getLogger(__name__)

_ESCAPES = {"=": "=", "n": "\n", "@": "@"}


def is_tr_catalog(name: str) -> bool:
    """A French Minetest translation file (`mods/beds/locale/beds.fr.tr`)."""
    return path_locale(name, ".tr") is not None


def _unescape(text: str) -> str:
    """A side of a line with its escapes resolved; argument markers (`@1`) and unknown escapes stay as written."""
    out, i = [], 0
    while i < len(text):
        if text[i] == "@" and i + 1 < len(text) and text[i + 1] in _ESCAPES:
            out.append(_ESCAPES[text[i + 1]])
            i += 2
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def split_line(line: str) -> tuple[str, str] | None:
    """A `source=translation` line's two sides, split at the first `=` that no `@` escapes; None for a comment,
    a blank line or a line without `=`."""
    if not line.strip() or line.startswith("#"):
        return None
    i = 0
    while i < len(line):
        if line[i] == "@":
            i += 2
        elif line[i] == "=":
            return _unescape(line[:i]), _unescape(line[i + 1 :])
        else:
            i += 1
    return None


def read_tr(path: Path, package: str, catalog: str) -> Iterator[RawPair]:
    """Every `source=translation` pair of a `.tr` file (an empty translation is untranslated, for the cleaning to
    drop); an unreadable file is skipped with a warning, as a broken .mo is."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("skipping unreadable catalog %s: %s", path, exc)
        return
    for line in lines:
        sides = split_line(line)
        if sides is not None:
            yield RawPair(sides[0], sides[1], package, catalog)
