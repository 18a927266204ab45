"""Downloads pinned archives into a cache: debs with `apt-get download`, wheels with `pip download`, index files of
the Debian archive (translated package descriptions, AppStream data) with `apt-get update` into the cache's own
lists, checked against their pinned SHA-256.

A cached archive is never fetched again, so a rebuild works offline; knows nothing of what is inside them.
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from model_export.corpus import CorpusError
from model_export.corpus.pins import Pin
from service.model import sha256_of

log = logging.getLogger(__name__)

APT_LISTS = Path("/var/lib/apt/lists")
APT_HELPER = Path("/usr/lib/apt/apt-helper")
BATCH = 10
_COMPRESSED = ("", ".gz", ".xz", ".bz2", ".lz4", ".zst")  # the suffixes apt may keep a lists file under


class FetchError(CorpusError):
    """A pinned archive could not be downloaded."""


def deb_glob(pin: Pin) -> str:
    """The file name pattern `apt-get download name=version` writes (epoch colon escaped as %3a)."""
    return f"{pin.name}_{pin.version.replace(':', '%3a')}_*.deb"


def wheel_prefix(pin: Pin) -> str:
    """The normalised `name-version-` prefix of a wheel file name, lower case."""
    return f"{re.sub(r'[-_.]+', '_', pin.name).lower()}-{pin.version.lower()}-"


def index_path(pin: Pin, cache: Path) -> Path:
    """Where the cache keeps an index pin's file, uncompressed."""
    return cache / "indexes" / pin.location.replace("/", "_")


def cached_archive(pin: Pin, cache: Path) -> Path | None:
    """The archive of a pin already in the cache, if any."""
    if pin.kind == "index":
        path = index_path(pin, cache)
        return path if path.is_file() else None
    if pin.kind == "deb":
        return next(iter(sorted((cache / "debs").glob(deb_glob(pin)))), None)
    wheels = sorted((cache / "wheels").glob("*.whl"))
    return next((w for w in wheels if w.name.lower().startswith(wheel_prefix(pin))), None)


def apt_lists_present(lists: Path = APT_LISTS) -> bool:
    """Whether apt has package lists to resolve `name=version` from."""
    return any(lists.glob("*_Packages*"))


def _run(command: Sequence[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    log.debug("running %s", " ".join(command))
    try:
        return subprocess.run(list(command), cwd=cwd, capture_output=True, text=True, check=False)
    except FileNotFoundError as exc:
        raise FetchError(f"{command[0]} is not installed (needed to fetch packages)") from exc


def apt_update(cwd: Path, options: Sequence[str] = ()) -> None:
    """Refresh apt's package lists (needs root), or with `options` the lists they name."""
    result = _run(["apt-get", "update", *options], cwd)
    if result.returncode != 0:
        raise FetchError(f"apt-get update failed: {result.stderr.strip().splitlines()[-1:]}")


def _apt_download(pins: Sequence[Pin], dest: Path) -> bool:
    return _run(["apt-get", "download", *[f"{p.name}={p.version}" for p in pins]], dest).returncode == 0


def fetch_debs(pins: Sequence[Pin], cache: Path) -> None:
    """Download Debian packages in one apt-get call, updating the lists once if they are missing or stale."""
    dest = cache / "debs"
    dest.mkdir(parents=True, exist_ok=True)
    if not apt_lists_present():
        apt_update(dest)
    if _apt_download(pins, dest):
        return
    apt_update(dest)
    missing = [p for p in pins if not _apt_download([p], dest)]
    if missing:
        names = ", ".join(f"{p.name}={p.version}" for p in missing)
        raise FetchError(
            f"apt-get download failed for {names} (version gone from the archive? update packages.txt)"
        )


def fetch_wheel(pin: Pin, cache: Path) -> None:
    """Download one wheel, without its dependencies."""
    dest = (cache / "wheels").resolve()
    dest.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--quiet",
        "--dest",
        str(dest),
        f"{pin.name}=={pin.version}",
    ]
    result = _run(command, dest)
    if result.returncode != 0:
        raise FetchError(f"pip download {pin.name}=={pin.version} failed: {result.stderr.strip()[-300:]}")


def index_update_options(pins: Sequence[Pin], lists: Path) -> list[str]:
    """`apt-get update` options that fetch the index pins' files (one index target each, by path under the suite)
    into `lists`, and no translations or AppStream data beyond them."""
    options = [f"Dir::State::Lists={lists}", f"Dir::Cache={lists.parent / 'cache'}", "Acquire::Languages=none"]
    options.append("Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false")
    for number, pin in enumerate(pins):
        target, key = f"Acquire::IndexTargets::deb::mt-corpus-{number}", pin.location.split("/", 1)[1]
        options += [f"{target}::MetaKey={key}", f"{target}::ShortDescription={pin.name}"]
        options.append(f"{target}::Description=$(RELEASE) {key}")
    return [part for option in options for part in ("-o", option)]


def lists_file(pin: Pin, lists: Path) -> Path | None:
    """The file apt wrote for an index pin in `lists` (named after the mirror, the suite and the path, compressed
    or not), if any."""
    suite, key = pin.location.split("/", 1)
    stem = f"_dists_{suite}_{key.replace('/', '_')}"
    for path in sorted(lists.iterdir()) if lists.is_dir() else []:
        before, found, suffix = path.name.partition(stem)
        if found and before and suffix in _COMPRESSED:
            return path
    return None


def store_index(pin: Pin, found: Path, cache: Path) -> None:
    """Decompress an index file apt fetched into the cache, if its SHA-256 is the pinned one."""
    path = index_path(pin, cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("wb") as out:
        result = subprocess.run([str(APT_HELPER), "cat-file", str(found)], stdout=out, stderr=subprocess.PIPE)
    if result.returncode != 0:
        partial.unlink()
        raise FetchError(f"apt-helper cat-file {found} failed: {result.stderr.decode(errors='replace').strip()}")
    digest = sha256_of(partial)
    if digest != pin.version:
        partial.unlink()
        raise FetchError(
            f"{pin.location} from the archive has SHA-256 {digest}, packages.txt pins {pin.version}: the archive "
            f"has changed it (a point release?); check the suite's InRelease and update the pin"
        )
    partial.rename(path)


def fetch_indexes(pins: Sequence[Pin], cache: Path) -> None:
    """Fetch index files with `apt-get update` (needs root; the InRelease signature checked by apt) into the
    cache's own lists, leaving the system's as they were, then keep each one whose hash is pinned."""
    lists = (cache / "apt" / "lists").resolve()
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    apt_update(cache, index_update_options(pins, lists))
    for pin in pins:
        found = lists_file(pin, lists)
        if found is None:
            raise FetchError(f"apt-get update did not fetch {pin.location} (no such suite or file in the archive?)")
        store_index(pin, found, cache)


def fetch_all(
    pins: Sequence[Pin], cache: Path, advance: Callable[[int], None]
) -> tuple[dict[Pin, Path], int]:
    """Every pin's archive path, downloading what the cache lacks; also the bytes downloaded by this call."""
    missing = [p for p in pins if cached_archive(p, cache) is None]
    advance(len(pins) - len(missing))
    downloaded = 0
    debs = [p for p in missing if p.kind == "deb"]
    for start in range(0, len(debs), BATCH):
        fetch_debs(debs[start : start + BATCH], cache)
        advance(len(debs[start : start + BATCH]))
    for pin in (p for p in missing if p.kind == "wheel"):
        fetch_wheel(pin, cache)
        advance(1)
    indexes = [p for p in missing if p.kind == "index"]
    if indexes:
        fetch_indexes(indexes, cache)
        advance(len(indexes))
    archives: dict[Pin, Path] = {}
    for pin in pins:
        path = cached_archive(pin, cache)
        if path is None:
            raise FetchError(
                f"{pin.name} {pin.version} was downloaded but is not in {cache} under the expected name"
            )
        archives[pin] = path
        downloaded += path.stat().st_size if pin in missing else 0
    return archives, downloaded
