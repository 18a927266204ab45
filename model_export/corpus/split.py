"""Deduplicates clean pairs and holds out dev/test, leak-free by normalised source, spread across packages.

Knows only (source, target, package) triples; nothing of catalogs, archives or cleaning rules.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from model_export.corpus.clean import normalised_key

MAX_PACKAGE_SHARE = 0.2


@dataclass(frozen=True)
class Pair:
    """A clean parallel segment and the package it came from."""

    source: str
    target: str
    package: str


def deduplicate(pairs: Iterable[Pair]) -> list[Pair]:
    """One pair per source: its most frequent translation (ties: first seen), from its first package."""
    counts: dict[str, dict[str, int]] = {}
    origin: dict[tuple[str, str], str] = {}
    for pair in pairs:
        targets = counts.setdefault(pair.source, {})
        targets[pair.target] = targets.get(pair.target, 0) + 1
        origin.setdefault((pair.source, pair.target), pair.package)
    kept = []
    for source, targets in counts.items():
        best = max(targets, key=lambda t: targets[t])  # max() keeps the first of equal counts
        kept.append(Pair(source, best, origin[(source, best)]))
    return kept


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
