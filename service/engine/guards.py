"""Degenerate hypotheses: a loop of repeated n-grams, a length far outside the source's, a copy of the source.

Sees a sentence's source ids and a hypothesis's ids (EOS included on both sides, as the tokenizer and the searches
give them), and for a copy the two texts as the model read and wrote them; knows no batch, no request, no language.
The limits were read off the default model's dev set (models/en-fr/README.md, "Confidence and guards"): no reference
translation there repeats an n-gram four times in a row, and each has between 0.25 and 3 times its source's tokens;
the copies of shorter sources its model made there (identifiers, units, format strings, keyword lists) were right.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

KINDS = ("repetition", "length", "copy")  # what a guard found; mt_degenerate_outputs_total's `kind`
LONGEST_NGRAM = 4  # repetitions of 1- to 4-token n-grams are counted
_LETTERS = re.compile(r"[^\W\d_].*[^\W\d_]")  # two letters or more: a word, not a number, a symbol or %s
_TAG = re.compile(r"<[^>]*>")


@dataclass(frozen=True)
class GuardLimits:
    repeats: int = 4  # an n-gram this many times in a row, more often than in the source + 1, is a loop
    shortest: float = 0.25  # hypothesis tokens / source tokens below this ...
    longest: float = 3.0  # ... or above this is a length far outside the source's
    length_from: int = 5  # ... for sources of at least this many tokens (a short one's ratio says little)
    copy_words: int = 4  # a hypothesis equal to its source is a copy when the source has this many words or more


def tandem_repeats(ids: Sequence[int], longest: int = LONGEST_NGRAM) -> int:
    """The most times any n-gram of 1 to `longest` tokens stands repeated in a row (1: none is). A run of s tokens
    each equal to the one n before it is a stretch of period n, s + n tokens long: (s + n) // n times its n-gram."""
    best = 1
    for n in range(1, longest + 1):
        run = 0
        for i in range(n, len(ids)):
            run = run + 1 if ids[i] == ids[i - n] else 0
            best = max(best, (run + n) // n)
    return best


def repeated(source: Sequence[int], hypothesis: Sequence[int], limits: GuardLimits) -> bool:
    found = tandem_repeats(hypothesis)
    return found >= limits.repeats and found > tandem_repeats(source) + 1


def off_length(source: Sequence[int], hypothesis: Sequence[int], ended: bool, limits: GuardLimits) -> bool:
    """Too long, or too short where the model `ended` it (a hypothesis cut short by a length cap is the cap's)."""
    if len(source) < limits.length_from:
        return False
    ratio = len(hypothesis) / len(source)
    return (ended and ratio < limits.shortest) or ratio > limits.longest


def copied(source: str, translation: str, limits: GuardLimits) -> bool:
    """The translation is its source again (case and runs of spaces aside), for a source of `copy_words` words
    (runs without spaces of two letters or more) outside its tags: shorter ones (a name, a unit, an identifier, a
    format string, a list of keywords) are often right copied."""
    words = [word for word in _TAG.sub(" ", source).split() if _LETTERS.search(word)]
    if len(words) < limits.copy_words:
        return False
    return source.casefold().split() == translation.casefold().split()


def degenerate(
    source: Sequence[int],
    hypothesis: Sequence[int],
    ended: bool,
    texts: tuple[str, str] | None,
    limits: GuardLimits,
) -> str | None:
    """The first of KINDS the hypothesis shows, or None. `ended`: the model ended it (EOS), no length cap did.
    `texts`: (source, translation) as the model read and wrote them, for the copy guard; None where a copy is no
    fault (the same language on both sides)."""
    if repeated(source, hypothesis, limits):
        return "repetition"
    if off_length(source, hypothesis, ended, limits):
        return "length"
    if texts is not None and copied(*texts, limits):
        return "copy"
    return None
