"""EN→FR parallel corpus builder: pinned Debian packages and wheels → French gettext catalogs → clean splits.

Run `python -m model_export.corpus build --out data/corpus`; the pipeline lives in `build.py`. `read_lines` reads
back a split's file as training and evaluation do, `line_origins` where each of its lines came from.
"""

from __future__ import annotations

import json
from pathlib import Path

from model_export.errors import ExportError


class CorpusError(RuntimeError):
    """A corpus build or tokenizer step failed; the message is meant for the command line."""


def read_lines(path: Path) -> list[str]:
    """A corpus file's lines, split at "\\n" only: str.splitlines also splits at U+2028, \\x85 and \\x1c-\\x1e, so
    a sentence holding one would shift every later pair. A final newline ends the last line; "\\r\\n" is one."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ExportError(f"{path}: not UTF-8 text (byte {error.start}); convert it to UTF-8") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def line_origins(corpus: Path, split: str) -> tuple[list[str], dict[str, str]] | None:
    """Each line's package (`<split>.origin`) and every package's group (stats.json), as `corpus build` wrote
    them; None for a corpus without them (a user's own sets)."""
    origin, stats = corpus / f"{split}.origin", corpus / "stats.json"
    if not origin.is_file() or not stats.is_file():
        return None
    packages = json.loads(stats.read_text(encoding="utf-8")).get("packages", {})
    return read_lines(origin), {name: entry["group"] for name, entry in packages.items()}
