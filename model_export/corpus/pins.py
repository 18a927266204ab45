"""Reads the pinned source list (`packages.txt`): debs as `name=version`, wheels as `name==version`.

A `# [group] description` comment starts a group; knows nothing of downloading.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from model_export.corpus import CorpusError

DEFAULT_PINS = Path(__file__).with_name("packages.txt")
_GROUP_RE = re.compile(r"^#\s*\[([\w-]+)\]")
_PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9.+_-]*)(==?)(\S+)$")


@dataclass(frozen=True)
class Pin:
    """One pinned source archive."""

    kind: str  # "deb" or "wheel"
    name: str
    version: str
    group: str


def parse_pins(text: str) -> list[Pin]:
    """Pins in file order; a line that is neither a pin, a comment nor blank is an error."""
    pins: list[Pin] = []
    group = "other"
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        group_match = _GROUP_RE.match(line)
        if group_match:
            group = group_match.group(1)
        if not line or line.startswith("#"):
            continue
        match = _PIN_RE.match(line)
        if not match:
            raise CorpusError(
                f"packages list line {number}: expected name=version or name==version, got {line!r}"
            )
        name, sign, version = match.groups()
        pins.append(Pin("wheel" if sign == "==" else "deb", name, version, group))
    return pins


def load_pins(path: Path = DEFAULT_PINS) -> list[Pin]:
    """Parse a packages list file."""
    try:
        return parse_pins(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CorpusError(f"cannot read packages list {path}: {exc.strerror}") from exc
