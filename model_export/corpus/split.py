"""Deduplicates clean pairs and holds out dev/test, leak-free by normalised source: sentences spread across
packages, or whole documents for the general-domain splits.

Knows only (source, target, package, document) records; nothing of catalogs, archives or cleaning rules.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from model_export.corpus.clean import normalised_key

MAX_PACKAGE_SHARE = 0.2


@dataclass(frozen=True)
class Pair:
    """A clean parallel segment, the package it came from and the document (catalog) inside it."""

    source: str
    target: str
    package: str
    document: str = ""


def deduplicate(pairs: Iterable[Pair]) -> list[Pair]:
    """One pair per source: its most frequent translation (ties: first seen), from its first package."""
    counts: dict[str, dict[str, int]] = {}
    origin: dict[tuple[str, str], Pair] = {}
    for pair in pairs:
        targets = counts.setdefault(pair.source, {})
        targets[pair.target] = targets.get(pair.target, 0) + 1
        origin.setdefault((pair.source, pair.target), pair)
    kept = []
    for source, targets in counts.items():
        best = max(targets, key=lambda t: targets[t])  # max() keeps the first of equal counts
        kept.append(origin[(source, best)])
    return kept


def cap_pairs(pairs: list[Pair], packages: set[str], cap: int, seed: int) -> list[Pair]:
    """At most `cap` of the pairs from `packages`, drawn with the seed; other pairs kept; order kept."""
    capped = [i for i, p in enumerate(pairs) if p.package in packages]
    if len(capped) <= cap:
        return pairs
    dropped = set(capped) - set(random.Random(seed).sample(capped, cap))
    return [p for i, p in enumerate(pairs) if i not in dropped]


def group_by_key(pairs: list[Pair]) -> dict[str, list[int]]:
    """Indexes of pairs whose normalised sources collide, in first-seen order."""
    groups: dict[str, list[int]] = defaultdict(list)
    for index, pair in enumerate(pairs):
        groups[normalised_key(pair.source)].append(index)
    return dict(groups)


def _package_queues(pairs: list[Pair], groups: dict[str, list[int]], seed: int) -> dict[str, list[str]]:
    """Group keys per package (a group belongs to its first pair's package), shuffled with the seed."""
    queues: dict[str, list[str]] = defaultdict(list)
    for key, members in groups.items():
        queues[pairs[members[0]].package].append(key)
    rng = random.Random(seed)
    for package in sorted(queues):
        rng.shuffle(queues[package])
    return dict(sorted(queues.items()))


def quotas(sizes: dict[str, int], total: int) -> dict[str, int]:
    """Pairs to hold out per package: proportional to sqrt(size), at most MAX_PACKAGE_SHARE of it."""
    weight = sum(math.sqrt(n) for n in sizes.values()) or 1.0
    return {
        p: min(math.ceil(total * math.sqrt(n) / weight), int(n * MAX_PACKAGE_SHARE)) for p, n in sizes.items()
    }


def _round_robin(
    queues: dict[str, list[str]], groups: dict[str, list[int]], size: int, limit: dict[str, int]
) -> list[int]:
    """Take one group per package per round while under its limit, until `size` pairs are taken."""
    taken: list[int] = []
    got = dict.fromkeys(queues, 0)
    progress = True
    while len(taken) < size and progress:
        progress = False
        for package, keys in queues.items():
            if keys and got[package] < limit[package] and len(taken) < size:
                members = groups[keys.pop()]
                taken += members
                got[package] += len(members)
                progress = True
    return taken


def _hold_out(queues: dict[str, list[str]], groups: dict[str, list[int]], size: int) -> list[int]:
    """Take whole groups off the package queues until `size` pairs are held out: quotas, then any package."""
    sizes = {p: sum(len(groups[k]) for k in keys) for p, keys in queues.items()}
    taken = _round_robin(queues, groups, size, quotas(sizes, size))
    taken += _round_robin(queues, groups, size - len(taken), sizes)
    return sorted(taken)


def split_pairs(pairs: list[Pair], dev_size: int, test_size: int, seed: int) -> dict[str, list[Pair]]:
    """train/dev/test lists; every group of colliding normalised sources lands whole in one split."""
    groups = group_by_key(pairs)
    queues = _package_queues(pairs, groups, seed)
    test = _hold_out(queues, groups, test_size)
    dev = _hold_out(queues, groups, dev_size)
    held = set(test) | set(dev)
    return {
        "train": [p for i, p in enumerate(pairs) if i not in held],
        "dev": [pairs[i] for i in dev],
        "test": [pairs[i] for i in test],
    }


def _document_queues(
    pairs: list[Pair], eligible: set[str], seed: int
) -> tuple[dict[str, list[tuple[str, str]]], dict[tuple[str, str], int]]:
    """Each eligible package's (package, document) keys, shuffled with the seed; and every document's size."""
    sizes: dict[tuple[str, str], int] = defaultdict(int)
    for pair in pairs:
        if pair.package in eligible:
            sizes[(pair.package, pair.document)] += 1
    queues: dict[str, list[tuple[str, str]]] = defaultdict(list)
    for document in sorted(sizes):
        queues[document[0]].append(document)
    rng = random.Random(seed)
    for package in sorted(queues):
        rng.shuffle(queues[package])
    return dict(sorted(queues.items())), dict(sizes)


def _choose_documents(
    queues: dict[str, list[tuple[str, str]]], sizes: dict[tuple[str, str], int], size: int
) -> set[tuple[str, str]]:
    """Whole documents, one per package per round, each the next in its queue that fits both the package's quota
    (sqrt-proportional, as for pairs) and `size`; then rounds without quotas, until nothing more fits."""
    package_sizes = {p: sum(sizes[d] for d in docs) for p, docs in queues.items()}
    got = dict.fromkeys(queues, 0)
    chosen: set[tuple[str, str]] = set()
    for limit in (quotas(package_sizes, size), package_sizes):
        progress = True
        while progress:
            progress = False
            for package, docs in queues.items():
                room = min(size - sum(got.values()), limit[package] - got[package])
                fitting = next((d for d in docs if sizes[d] <= room), None)
                if fitting is not None:
                    docs.remove(fitting)
                    chosen.add(fitting)
                    got[package] += sizes[fitting]
                    progress = True
    return chosen


def shares(total: int, parts: int) -> list[int]:
    """`total` cut into `parts` near-equal whole shares, the larger first."""
    return [total // parts + (i < total % parts) for i in range(parts)]


def group_shares(size: int, fixed: Sequence[int | None]) -> list[int]:
    """Each group's pairs in a general split: its own fixed size, else an equal share of `size` among the groups
    without one."""
    free = iter(shares(size, sum(f is None for f in fixed) or 1))
    return [f if f is not None else next(free) for f in fixed]


def take_documents(
    pairs: list[Pair], eligible: Sequence[set[str]], sizes: Sequence[int], seed: int
) -> tuple[list[Pair], list[Pair]]:
    """(held, rest): at most `sizes[i]` pairs of whole documents from each set of eligible packages (a group),
    spread across its packages; from the rest also every pair whose normalised source a held-out pair has. A
    group's documents are drawn from its own pairs alone, so another group's leave them as they are."""
    chosen: set[tuple[str, str]] = set()
    for packages, share in zip(eligible, sizes, strict=True):
        chosen |= _choose_documents(*_document_queues(pairs, packages, seed), share)
    held = [p for p in pairs if (p.package, p.document) in chosen]
    rest = without_keys([p for p in pairs if (p.package, p.document) not in chosen], held)
    return held, rest


def split_general(
    pairs: list[Pair],
    eligible: Sequence[set[str]],
    dev_size: int,
    test_size: int,
    seed: int,
    fixed: Sequence[int | None] | None = None,
) -> tuple[dict[str, list[Pair]], list[Pair]]:
    """The general-domain `test.general` and `dev.general` splits, of whole documents of the eligible packages (one
    set per group; a group's `fixed` size in each, else an equal share of the sizes with the other groups without
    one), and the pairs left for the other splits (none sharing a normalised source with a held-out pair)."""
    fixed = list(fixed) if fixed is not None else [None] * len(eligible)
    test, rest = take_documents(pairs, eligible, group_shares(test_size, fixed), seed)
    dev, rest = take_documents(rest, eligible, group_shares(dev_size, fixed), seed + 1)
    return {"dev.general": dev, "test.general": test}, rest


def without_keys(pairs: list[Pair], held: Iterable[Pair]) -> list[Pair]:
    """The pairs whose normalised source no `held` pair has."""
    keys = {normalised_key(p.source) for p in held}
    return [p for p in pairs if normalised_key(p.source) not in keys]
