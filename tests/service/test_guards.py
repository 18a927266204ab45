"""The guards against degenerate output (service/engine/guards.py) on crafted token strings and texts."""

from __future__ import annotations

import pytest

from service.engine.guards import GuardLimits, degenerate, tandem_repeats

LIMITS = GuardLimits()
EOS = 3
SOURCE = [10, 11, 12, 13, 14, 15, EOS]  # seven tokens


@pytest.mark.parametrize(
    ("ids", "repeats"),
    [
        ([], 1),
        ([5, 6, 7], 1),
        ([5, 5, 5, 5], 4),
        ([5, 6, 5, 6, 5, 6, 9], 3),
        ([1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3], 4),
        ([1, 2, 3, 4, 1, 2, 3, 4, 9], 2),
        ([1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5], 1),  # a 5-gram: longer than the guard looks
    ],
)
def test_tandem_repeats_counts_an_ngram_repeated_in_a_row(ids: list[int], repeats: int) -> None:
    assert tandem_repeats(ids) == repeats


def test_a_loop_is_degenerate_unless_the_source_repeats_as_much() -> None:
    loop = [20, 21, 20, 21, 20, 21, 20, 21, EOS]
    assert degenerate(SOURCE, loop, True, None, LIMITS) == "repetition"
    assert degenerate(SOURCE, loop[:6] + [EOS], True, None, LIMITS) is None  # three times: a reference may
    echo = [10, 10, 10, 11, 12, EOS]  # "Yes, yes, yes"
    assert degenerate(echo, [20, 20, 20, 20, EOS], True, None, LIMITS) is None  # no more than the source's + 1


def test_a_length_far_from_the_sources_is_degenerate() -> None:
    assert degenerate(SOURCE, [20, EOS], True, None, LIMITS) is None  # 2/7 = 0.29: short, not too short
    assert degenerate(SOURCE * 4, [20, EOS], True, None, LIMITS) == "length"  # 2/28
    assert degenerate(SOURCE * 4, [20, 21], False, None, LIMITS) is None  # cut by a length cap, not the model's end
    assert degenerate(SOURCE, list(range(30, 52)) + [EOS], False, None, LIMITS) == "length"  # 23/7 > 3
    assert degenerate([10, 11, EOS], list(range(30, 45)), False, None, LIMITS) is None  # a short source: no ratio


def test_a_copy_of_a_source_of_three_words_is_degenerate() -> None:
    out = [20, 21, 22, EOS]
    assert degenerate(SOURCE, out, True, ("Open the  file", "open the file"), LIMITS) == "copy"
    assert degenerate(SOURCE, out, True, ("Open file", "Open file"), LIMITS) is None  # a name, a short label
    assert degenerate(SOURCE, out, True, ("Open the file", "Ouvrir le fichier"), LIMITS) is None
    assert degenerate(SOURCE, out, True, None, LIMITS) is None  # the same language on both sides: no copy guard
