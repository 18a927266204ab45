"""The corpus build: fetch pinned archives, extract French catalogs, clean, deduplicate, split, write files.

Owns the output layout (`{train,dev,test}.{en,fr,origin}`, stats.json, NOTICE, licenses/), not the rules.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from model_export.corpus.clean import clean_entry, count_reasons
from model_export.corpus.extract import catalog_files, extract_archive, read_catalog
from model_export.corpus.fetch import fetch_all
from model_export.corpus.notice import debian_licence, notice_text, wheel_licence
from model_export.corpus.pins import Pin
from model_export.corpus.split import Pair, deduplicate, split_pairs

log = logging.getLogger(__name__)

SPLITS = ("train", "dev", "test")


@dataclass(frozen=True)
class BuildOptions:
    """Where to read and write, and how to split."""

    out: Path
    cache: Path
    dev_size: int = 2000
    test_size: int = 2000
    seed: int = 1234


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
    return debian_licence(text) if pin.kind == "deb" else wheel_licence(text)


def harvest(archives: dict[Pin, Path], cache: Path, progress: Progress) -> Harvest:
    """Extract every archive's French catalogs and clean their entries (the one long loop of the build)."""
    found = Harvest()
    task = progress.add_task("extract", total=len(archives), note="")
    for pin, archive in archives.items():
        progress.update(task, note=pin.name)
        extracted = extract_archive(archive, pin.name, cache / "extract")
        copyright_text = (extracted / "LICENSE-SOURCE").read_text(encoding="utf-8", errors="replace")
        found.copyrights[pin.name] = copyright_text
        found.licences.append((pin.name, pin.version, pin.kind, _licence(pin, copyright_text)))
        for mo in catalog_files(extracted):
            for raw in read_catalog(mo, pin.name, mo.stem):
                found.entries[pin.name] += 1
                kept, reasons = clean_entry(raw.source, raw.target, raw.fuzzy)
                count_reasons(reasons, found.dropped)
                found.pairs += [Pair(src, tgt, pin.name) for src, tgt in kept]
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


def write_notice(out: Path, found: Harvest) -> None:
    """NOTICE (one line per package) and licenses/<package>.txt with each full copyright text."""
    (out / "NOTICE").write_text(notice_text(found.licences), encoding="utf-8")
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
    per_package = {
        p.name: {"group": p.group, "version": p.version, "entries": found.entries[p.name]}
        | {s: 0 for s in SPLITS}
        for p in pins
    }
    per_group: dict[str, dict[str, int]] = {}
    for split, pairs in splits.items():
        for pair in pairs:
            per_package[pair.package][split] += 1
            group = per_group.setdefault(group_of[pair.package], dict.fromkeys(SPLITS, 0))
            group[split] += 1
    totals = {s: len(v) for s, v in splits.items()}
    dropped = dict(sorted(found.dropped.items(), key=lambda kv: -kv[1]))
    return extra | {"pairs": totals, "groups": per_group, "dropped": dropped, "packages": per_package}


def build(pins: list[Pin], options: BuildOptions) -> dict:
    """Run the whole build and return its stats (also written to stats.json)."""
    started = time.monotonic()
    options.out.mkdir(parents=True, exist_ok=True)
    with _progress() as progress:
        task = progress.add_task("download", total=len(pins), note="apt-get / pip")
        archives, downloaded = fetch_all(pins, options.cache, lambda n: progress.advance(task, n))
        found = harvest(archives, options.cache, progress)
    unique = deduplicate(found.pairs)
    found.dropped |= _dedup_counts(found.pairs, unique)
    splits = split_pairs(unique, options.dev_size, options.test_size, options.seed)
    for name, pairs in splits.items():
        write_split(options.out, name, pairs)
    write_notice(options.out, found)
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
