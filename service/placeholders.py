"""What the model cannot read, kept out of its way: inside a sentence, each run of symbols (emoji, €, °, ™,
arrows) or of characters outside the model's vocabulary (CJK or Greek in a Latin sentence) is given to the model as
a placeholder, {0}, {1}, ..., which it copies (its training data is full of them), and put back into its
translation. Read as they are, such characters derailed the default model's whole sentence: "Price: 5 € per
month." came back as "Prix : 5 juille par mois.", with the mask as "Prix : 5 € par mois.".

Knows characters and sentences; what the model can read is the tokenizer's to say (`readable`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

_JOINERS = frozenset("\u200d")  # the zero-width joiner inside an emoji sequence; marks are joined by category


@dataclass(frozen=True)
class Masked:
    """A sentence as the model reads it, and the runs its placeholders stand for."""

    text: str
    runs: tuple[tuple[str, str], ...] = ()  # (placeholder, the run it stands for), in order

    def unmask(self, translation: str) -> str:
        """The translation with each placeholder replaced by its run. A placeholder the model dropped has its run
        put at the end (a symbol out of place rather than lost); one it repeated has its run at each place."""
        missing = []
        for placeholder, run in self.runs:
            if placeholder in translation:
                translation = translation.replace(placeholder, run)
            else:
                missing.append(run)
        return " ".join([translation, *missing]) if missing else translation


def mask(sentence: str, readable: Callable[[str], bool]) -> Masked:
    """`sentence` with each run of protected characters (`protected`) replaced by a placeholder that the sentence
    does not hold already; unchanged, with no runs, when it has none."""
    runs = _runs(sentence, readable)
    if not runs:
        return Masked(sentence)
    names = _placeholders(sentence, len(runs))
    parts, done, found = [], 0, []
    for (start, end), name in zip(runs, names, strict=True):
        parts += [sentence[done:start], name]
        found.append((name, sentence[start:end]))
        done = end
    parts.append(sentence[done:])
    return Masked("".join(parts), tuple(found))


def protected(char: str, readable: Callable[[str], bool]) -> bool:
    """A character given to the model as a placeholder: a symbol beyond ASCII (ASCII's + < = > | ^ ~ $ stay: the
    model reads them), or one the model's vocabulary lacks."""
    return not char.isascii() and (unicodedata.category(char)[0] == "S" or not readable(char))


def _runs(sentence: str, readable: Callable[[str], bool]) -> list[tuple[int, int]]:
    """(start, end) of each maximal run of protected characters, the marks and joiners that follow one included
    (a variation selector, a skin tone's combining part, the joiner of an emoji sequence)."""
    runs: list[tuple[int, int]] = []
    start = None
    for i, char in enumerate(sentence):
        if protected(char, readable) or (start is not None and _joins(char)):
            start = i if start is None else start
        elif start is not None:
            runs.append((start, i))
            start = None
    if start is not None:
        runs.append((start, len(sentence)))
    return runs


def _joins(char: str) -> bool:
    return char in _JOINERS or unicodedata.category(char)[0] == "M"


_PLACEHOLDER = re.compile(r"\{(\d+)\}")


def _placeholders(sentence: str, count: int) -> list[str]:
    """`count` placeholders {k}, lowest k first, none that the sentence holds (its own {0} stays its own)."""
    taken = {int(k) for k in _PLACEHOLDER.findall(sentence) if len(k) < 6}
    names, k = [], 0
    while len(names) < count:
        if k not in taken:
            names.append(f"{{{k}}}")
        k += 1
    return names
