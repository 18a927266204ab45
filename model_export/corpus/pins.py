"""Reads the pinned source list (`packages.txt`): debs as `name=version`, wheels as `name==version`, index files of
the Debian archive as `@suite/path=sha256`, in groups.

A `# [group attribute...] description` comment starts a group; its attributes say whether the default build takes
it, how its pairs are read and held out. Knows nothing of downloading.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from model_export.corpus import CorpusError

DEFAULT_PINS = Path(__file__).with_name("packages.txt")
READERS = ("gettext", "po", "qm", "tr", "lng", "stringtable", "freedict", "pages", "descriptions", "appstream")
HOLDOUTS = ("pairs", "documents", "none")
_GROUP_RE = re.compile(r"^#\s*\[([\w-]+)((?:\s+[\w-]+(?:=[\w.-]+)?)*)\s*\]")
_PIN_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9.+_-]*)(==?)(\S+)$")
_INDEX_RE = re.compile(r"^@([a-z0-9-]+)/((?:[\w.-]+/)*([\w.-]+))=([0-9a-f]{64})$")


@dataclass(frozen=True)
class Pin:
    """One pinned source archive."""

    kind: str  # "deb", "wheel" or "index" (a file of the Debian archive, e.g. main/i18n/Translation-fr)
    name: str  # an index's file name
    version: str  # an index's SHA-256, as the suite's signed InRelease lists it
    group: str
    location: str = ""  # an index's suite and path: bookworm/main/i18n/Translation-fr


@dataclass(frozen=True)
class Group:
    """How a group's archives are read, held out and weighed.

    `extra`: only built when asked for by name (`--groups`); the default build is the other groups.
    `reader`: gettext catalogs (compiled, or `po` sources), Qt catalogs (`qm`), Minetest's translation files
    (`tr`), MegaGlest's language files (`lng`), FreeOrion's string tables (`stringtable`), a FreeDict dictionary,
    documentation pages built in both languages, or the archive's package descriptions or AppStream data.
    `holdout`: `pairs` feed the dev/test splits, `documents` whole catalogs or pages the general-domain dev/test
    splits, `none` training only.
    `cap`: at most this many of the group's pairs, drawn with the seed (only for `documents` and `none`, whose
    pairs are added after the dev/test of the others are drawn).
    `general`: pairs of whole documents this group puts in each of dev.general and test.general (only for
    `documents`); the groups without it share the build's general sizes equally, so adding a group with it leaves
    theirs as they were.
    `yields`: (only for `none`) the group's pairs are deduplicated after every other group's, without their
    sources, so it never outvotes the translation of a sentence that a held-out document has.
    """

    name: str
    extra: bool = False
    reader: str = "gettext"
    holdout: str = "pairs"
    cap: int | None = None
    general: int | None = None
    yields: bool = False


def _count(value: str | None, allowed: bool) -> bool:
    """Whether an optional count attribute is absent, or a number where the group's holdout allows it."""
    return value is None or (value.isdigit() and allowed)


def parse_group(name: str, attributes: str, number: int) -> Group:
    """A group from its header's attributes (`extra`, `reader=...`, `holdout=...`, `cap=N`, `general=N`,
    `yields`)."""
    values: dict[str, str] = {}
    for attribute in attributes.split():
        key, _, value = attribute.partition("=")
        values[key] = value
    unknown = set(values) - {"extra", "reader", "holdout", "cap", "general", "yields"}
    reader, holdout = values.get("reader", "gettext"), values.get("holdout", "pairs")
    cap, general = values.get("cap"), values.get("general")
    counts = _count(cap, holdout != "pairs") and _count(general, holdout == "documents")
    yields = "yields" in values
    if unknown or reader not in READERS or holdout not in HOLDOUTS or not counts or (yields and holdout != "none"):
        raise CorpusError(
            f"packages list line {number}: group [{name}] has bad attributes {attributes.strip()!r} (known: extra, "
            f"reader={'|'.join(READERS)}, holdout={'|'.join(HOLDOUTS)}, cap=N with holdout documents|none, "
            "general=N with holdout documents, yields with holdout none)"
        )
    number_or_none = {k: int(values[k]) if values.get(k) else None for k in ("cap", "general")}
    return Group(name, "extra" in values, reader, holdout, **number_or_none, yields=yields)


def parse_pin(line: str, group: str, number: int) -> Pin:
    """One pin line: `name=version` (a deb), `name==version` (a wheel) or `@suite/path=sha256` (an index file)."""
    index = _INDEX_RE.match(line)
    if index:
        suite, path, name, digest = index.groups()
        return Pin("index", name, digest, group, f"{suite}/{path}")
    match = _PIN_RE.match(line)
    if not match:
        raise CorpusError(
            f"packages list line {number}: expected name=version, name==version or @suite/path=sha256, "
            f"got {line!r}"
        )
    name, sign, version = match.groups()
    return Pin("wheel" if sign == "==" else "deb", name, version, group)


def parse_recipe(text: str) -> tuple[list[Pin], dict[str, Group]]:
    """Pins in file order and the groups they belong to; a line that is neither a pin, a comment nor blank is
    an error."""
    pins: list[Pin] = []
    groups: dict[str, Group] = {}
    group = "other"
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        group_match = _GROUP_RE.match(line)
        if group_match:
            group = group_match.group(1)
            if group in groups:  # e.g. a description's wrapped line that starts with "[name]"
                raise CorpusError(
                    f"packages list line {number}: group [{group}] starts a second time; give each group one "
                    "header (and start no comment line with `[name]`)"
                )
            groups[group] = parse_group(group, group_match.group(2), number)
        if not line or line.startswith("#"):
            continue
        groups.setdefault(group, Group(group))
        pins.append(parse_pin(line, group, number))
    return pins, groups


def select_groups(groups: dict[str, Group], wanted: Sequence[str] | None) -> dict[str, Group]:
    """The groups to build: the non-extra ones when `wanted` is None, every one for `all`, else those named."""
    if wanted is None:
        return {name: g for name, g in groups.items() if not g.extra}
    if list(wanted) == ["all"]:
        return dict(groups)
    unknown = [name for name in wanted if name not in groups]
    if unknown:
        raise CorpusError(f"unknown group(s) {', '.join(unknown)}; the packages list has {', '.join(groups)}")
    return {name: groups[name] for name in groups if name in wanted}


def load_recipe(path: Path = DEFAULT_PINS) -> tuple[list[Pin], dict[str, Group]]:
    """Parse a packages list file."""
    try:
        return parse_recipe(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise CorpusError(f"cannot read packages list {path}: {exc.strerror}") from exc
