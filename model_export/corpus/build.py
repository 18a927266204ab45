"""The corpus build: fetch pinned archives, extract French catalogs (gettext, Qt, games' own formats; or
dictionaries, bilingual documentation, translated package metadata), clean, deduplicate, split, write files.

Owns the output layout (`{train,dev,test}.{en,fr,origin}`, `{dev,test}.general.*` when a group is held out by
document, stats.json, NOTICE, licenses/), not the rules.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from model_export.corpus import CorpusError
from model_export.corpus.clean import clean_entry, count_reasons
from model_export.corpus.descriptions import APPSTREAM_LICENCE, DESCRIPTIONS_LICENCE, read_appstream, read_descriptions
from model_export.corpus.dictionary import is_dictionary_member, read_freedict
from model_export.corpus.documents import is_document_member, read_documents
from model_export.corpus.extract import (
    RawPair,
    catalog_files,
    choose_catalogs,
    extract_archive,
    extract_files,
    is_po_catalog,
    is_zip,
    read_catalog,
)
from model_export.corpus.fetch import fetch_all
from model_export.corpus.freeorion import is_string_table, table_pairs
from model_export.corpus.glest import is_lng_file, lng_pairs
from model_export.corpus.minetest import is_tr_catalog, read_tr
from model_export.corpus.notice import debian_licence, notice_text, wheel_licence
from model_export.corpus.pins import Group, Pin
from model_export.corpus.qt import is_qm_catalog, read_qm
from model_export.corpus.split import Pair, cap_pairs, deduplicate, split_general, split_pairs, without_keys

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")
GENERAL_SPLITS = ("dev.general", "test.general")


@dataclass(frozen=True)
class BuildOptions:
    """Where to read and write, and how to split."""

    out: Path
    cache: Path
    dev_size: int = 2000
    test_size: int = 2000
    seed: int = 1234
    general_dev_size: int = 1000
    general_test_size: int = 1000


@dataclass
class Harvest:
    """Everything the extraction loop gathers, before deduplication."""

    pairs: list[Pair] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    entries: Counter[str] = field(default_factory=Counter)
    licences: list[tuple[str, str, str, str]] = field(default_factory=list)
    copyrights: dict[str, str] = field(default_factory=dict)


def _progress() -> Progress:
    columns = (
        TextColumn("{task.description:<10}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}"),
    )
    return Progress(*columns, transient=False)


def _licence(pin: Pin, text: str) -> str:
    if pin.kind == "index":
        return text.split("\n", 1)[0]
    return debian_licence(text) if pin.kind == "deb" else wheel_licence(text)


def _pages(archive: Path, pin: Pin, cache: Path) -> Path:
    return extract_files(archive, pin.name, cache / "extract-pages", is_document_member)


def read_archive(
    archive: Path, pin: Pin, reader: str, cache: Path, others: list[Path]
) -> tuple[Iterator[RawPair], str]:
    """The raw pairs of an archive as its group's reader finds them, and its licence text; `others` are the
    extracted pages of the other archives of a `pages` group, where a French build may be, or the other files of
    a `descriptions` group, where the English descriptions are."""
    if reader == "descriptions":
        return _descriptions(archive, pin, others), DESCRIPTIONS_LICENCE
    if reader == "appstream":
        return read_appstream(archive, pin.name), APPSTREAM_LICENCE
    if reader == "freedict":
        extracted = extract_files(archive, pin.name, cache / "extract-freedict", is_dictionary_member)
        pairs = read_freedict(extracted / "files", pin.name)
    elif reader == "pages":
        extracted = _pages(archive, pin, cache)
        pairs = read_documents(extracted / "files", pin.name, [o / "files" for o in others if o != extracted])
    elif reader in MEMBER_READERS:
        wanted, read, zipped = MEMBER_READERS[reader]
        extracted = extract_files(archive, pin.name, cache / f"extract-{reader}", wanted, zipped)
        pairs = read(extracted / "files", pin.name)
    else:
        extracted = extract_archive(archive, pin.name, cache / "extract")
        pairs = (raw for mo in catalog_files(extracted) for raw in read_catalog(mo, pin.name, mo.stem))
    return pairs, (extracted / "LICENSE-SOURCE").read_text(encoding="utf-8", errors="replace")


def _catalogs(suffix: str, read: Callable[[Path, str, str], Iterator[RawPair]]) -> Callable[..., Iterator[RawPair]]:
    """A reader of an archive's extracted French catalogs of one format (plain French over regional variants),
    each catalog a document named by its path without the suffix (a SuperTux world's `levels/world1/fr`, 0 A.D.'s
    `mods/public/public.zip/l10n/fr.public-maps`, a Minetest mod's `locale/beds.fr`; a Qt catalog's contexts)."""

    def pairs(files: Path, package: str) -> Iterator[RawPair]:
        paths = choose_catalogs([p.relative_to(files).as_posix() for p in files.rglob(f"*{suffix}")], suffix)
        return (raw for path in paths for raw in read(files / path, package, path.removesuffix(suffix)))

    return pairs


# reader: which members of a .deb it extracts, how it reads them, which zips inside the .deb it opens
MEMBER_READERS: dict[str, tuple[Callable[[str], bool], Callable[[Path, str], Iterator[RawPair]], Callable | None]] = {
    "po": (is_po_catalog, _catalogs(".po", read_catalog), is_zip),
    "qm": (is_qm_catalog, _catalogs(".qm", read_qm), None),
    "tr": (is_tr_catalog, _catalogs(".tr", read_tr), None),
    "lng": (is_lng_file, lng_pairs, None),
    "stringtable": (is_string_table, table_pairs, None),
}


def _descriptions(archive: Path, pin: Pin, others: list[Path]) -> Iterator[RawPair]:
    """The pairs of a French `Translation-fr` against the group's `Translation-en`; none from the English file."""
    if not pin.name.endswith("-fr"):
        return iter(())
    english = next((o for o in others if o.name.endswith("-en")), None)
    if english is None:
        raise CorpusError(f"{pin.location} needs the English descriptions it translates: pin the suite's "
                          "Translation-en in the same group")  # fmt: skip
    return read_descriptions(archive, english, pin.name)


def _siblings(archives: dict[Pin, Path], groups: dict[str, Group], cache: Path) -> dict[str, list[Path]]:
    """Per group, the files its reader looks across: the extracted pages of a `pages` group, the index files of
    a `descriptions` group."""
    siblings: dict[str, list[Path]] = {}
    for pin, archive in archives.items():
        reader = groups[pin.group].reader
        if reader == "pages":
            siblings.setdefault(pin.group, []).append(_pages(archive, pin, cache))
        elif reader == "descriptions":
            siblings.setdefault(pin.group, []).append(archive)
    return siblings


def harvest(
    archives: dict[Pin, Path], groups: dict[str, Group], cache: Path, progress: Progress
) -> Harvest:
    """Extract every archive's French catalogs and clean their entries (the one long loop of the build)."""
    found = Harvest()
    siblings = _siblings(archives, groups, cache)
    task = progress.add_task("extract", total=len(archives), note="")
    for pin, archive in archives.items():
        progress.update(task, note=pin.name)
        reader = groups[pin.group].reader
        pairs, copyright_text = read_archive(archive, pin, reader, cache, siblings.get(pin.group, []))
        found.copyrights[pin.name] = copyright_text
        found.licences.append((pin.location or pin.name, pin.version, pin.kind, _licence(pin, copyright_text)))
        for raw in pairs:
            found.entries[pin.name] += 1
            kept, reasons = clean_entry(raw.source, raw.target, raw.fuzzy)
            count_reasons(reasons, found.dropped)
            found.pairs += [Pair(src, tgt, pin.name, raw.catalog) for src, tgt in kept]
        progress.advance(task)
    return found


def _dedup_counts(pairs: list[Pair], unique: list[Pair]) -> dict[str, int]:
    """Drops by deduplication: exact repeats, and less frequent translations of a source."""
    distinct = len({(p.source, p.target) for p in pairs})
    return {"duplicate_pair": len(pairs) - distinct, "minority_translation": distinct - len(unique)}


def write_split(out: Path, name: str, pairs: list[Pair]) -> None:
    """`name.en`, `name.fr` and `name.origin`, one segment per line."""
    for suffix, values in (
        ("en", [p.source for p in pairs]),
        ("fr", [p.target for p in pairs]),
        ("origin", [p.package for p in pairs]),
    ):
        (out / f"{name}.{suffix}").write_text("".join(v + "\n" for v in values), encoding="utf-8")


def write_notice(out: Path, found: Harvest, gettext_only: bool = True) -> None:
    """NOTICE (one line per package) and licenses/<package>.txt with each full copyright text."""
    (out / "NOTICE").write_text(notice_text(found.licences, gettext_only), encoding="utf-8")
    licenses = out / "licenses"
    shutil.rmtree(licenses, ignore_errors=True)
    licenses.mkdir()
    for name, text in found.copyrights.items():
        (licenses / f"{name}.txt").write_text(text, encoding="utf-8")


def stats_of(
    pins: list[Pin], found: Harvest, splits: dict[str, list[Pair]], extra: dict[str, object]
) -> dict:
    """stats.json content: pairs per package, group and split; catalog entries; drops by reason."""
    group_of = {p.name: p.group for p in pins}
    names = [s for s in (*SPLITS, *GENERAL_SPLITS) if s in splits]
    per_package = {
        p.name: {"group": p.group, "kind": p.kind, "version": p.version, "entries": found.entries[p.name]}
        | dict.fromkeys(names, 0)
        for p in pins
    }
    per_group: dict[str, dict[str, int]] = {}
    for split, pairs in splits.items():
        for pair in pairs:
            per_package[pair.package][split] += 1
            group = per_group.setdefault(group_of[pair.package], dict.fromkeys(names, 0))
            group[split] += 1
    totals = {s: len(v) for s, v in splits.items()}
    dropped = dict(sorted(found.dropped.items(), key=lambda kv: -kv[1]))
    documents = {
        name: sorted({f"{p.package}/{p.document}" for p in splits[name]}) for name in GENERAL_SPLITS if name in splits
    }
    general = {"general_documents": documents} if documents else {}
    return extra | {"pairs": totals, "groups": per_group, "dropped": dropped} | general | {"packages": per_package}


def _packages(pins: list[Pin], groups: dict[str, Group], wanted: Callable[[Group], bool]) -> set[str]:
    return {p.name for p in pins if wanted(groups[p.group])}


def apply_caps(pairs: list[Pair], pins: list[Pin], groups: dict[str, Group], seed: int) -> list[Pair]:
    """Each capped group's pairs cut down to its cap, drawn with the seed."""
    for name, group in groups.items():
        if group.cap is not None:
            pairs = cap_pairs(pairs, {p.name for p in pins if p.group == name}, group.cap, seed)
    return pairs


def layers(pairs: list[Pair], pins: list[Pin], groups: dict[str, Group]) -> tuple[list[Pair], list[Pair]]:
    """Deduplicated pairs of the groups held out by pair, and of the others without the sources the first have
    (the yielding groups' last, without the sources of any other): adding a group held out by document or not at
    all leaves the first layer, and so its dev/test, as it was; adding a yielding group leaves every split but
    train as it was."""
    yielding = _packages(pins, groups, lambda g: g.yields)
    others_packages = _packages(pins, groups, lambda g: g.holdout != "pairs") - yielding
    base = deduplicate([p for p in pairs if p.package not in others_packages | yielding])
    sources = {p.source for p in base}
    others = deduplicate([p for p in pairs if p.package in others_packages and p.source not in sources])
    sources |= {p.source for p in others}
    return base, others + deduplicate([p for p in pairs if p.package in yielding and p.source not in sources])


def make_splits(
    base: list[Pair], others: list[Pair], pins: list[Pin], groups: dict[str, Group], options: BuildOptions
) -> dict[str, list[Pair]]:
    """train/dev/test of the first layer; the general-domain splits of whole documents of the groups held out by
    document; every other pair to train unless it shares a normalised source with a held-out pair."""
    splits = split_pairs(base, options.dev_size, options.test_size, options.seed)
    if not others:
        return splits
    others = without_keys(others, splits["dev"] + splits["test"])
    eligible: list[set[str]] = []  # per group held out by document: its packages
    fixed: list[int | None] = []  # and its own general size
    for name, group in groups.items():
        packages = {p.name for p in pins if p.group == name}
        if group.holdout == "documents" and packages:
            eligible.append(packages)
            fixed.append(group.general)
    if eligible:
        sizes = (options.general_dev_size, options.general_test_size)
        general, others = split_general(others, eligible, *sizes, options.seed, fixed)
        splits |= general
        splits["train"] = without_keys(splits["train"], general["dev.general"] + general["test.general"])
    splits["train"] += others
    return splits


def build(pins: list[Pin], options: BuildOptions, groups: dict[str, Group] | None = None) -> dict:
    """Run the whole build of the pins (each group read, held out and capped as `groups` says; by default as
    gettext, held out by pair) and return its stats (also written to stats.json)."""
    started = time.monotonic()
    groups = {p.group: Group(p.group) for p in pins} | (groups or {})
    options.out.mkdir(parents=True, exist_ok=True)
    with _progress() as progress:
        task = progress.add_task("download", total=len(pins), note="apt-get / pip")
        archives, downloaded = fetch_all(pins, options.cache, lambda n: progress.advance(task, n))
        found = harvest(archives, groups, options.cache, progress)
    base, others = layers(found.pairs, pins, groups)
    found.dropped |= _dedup_counts(found.pairs, base + others)
    capped = apply_caps(others, pins, groups, options.seed)
    if len(capped) < len(others):
        found.dropped["over_cap"] = len(others) - len(capped)
    splits = make_splits(base, capped, pins, groups, options)
    leaked = len(base) + len(capped) - sum(len(v) for v in splits.values())
    if leaked:
        found.dropped["shares_held_out_source"] = leaked
    for name, pairs in splits.items():
        write_split(options.out, name, pairs)
    write_notice(options.out, found, all(groups[p.group].reader == "gettext" for p in pins))
    extra = {
        "seconds": round(time.monotonic() - started, 1),
        "mb_downloaded": round(downloaded / 1e6, 1),
        "mb_archives": round(sum(a.stat().st_size for a in archives.values()) / 1e6, 1),
        "seed": options.seed,
        "clean_pairs_before_dedup": len(found.pairs),
    }
    stats = stats_of(pins, found, splits, extra)
    (options.out / "stats.json").write_text(
        json.dumps(stats, indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return stats
