"""What the model cannot read, kept out of its way: inside a sentence, each run of symbols (emoji, €, °, ™,
arrows) and each word with a letter outside the model's vocabulary (Greek, Cyrillic or CJK in a Latin sentence), or
one its training sources hardly held (the manifest's `rare_letters`: "Søren", "Dvořák" for the default model) is
given to the model as a placeholder, %1, %2, ..., which it copies (its training data is full of them: gettext's
and Qt's), and put back into its translation. Read as they are, such characters derailed the default model's whole
sentence: "Price: 5 € per month." came back as "Prix : 5 juille par mois.", with the mask as "Prix : 5 € par mois.".

`{0}`-style placeholders were tried first: after a digit ("20{2}") the model ran on with digits ("202}") in 3 of 6
test sentences where %k held in 6 of 6. A translation whose placeholders did not come back exactly once each is not
unmasked (`Masked.restore` gives None): the translator translates that sentence again, unmasked.

Knows characters and sentences; what the model can read is the tokenizer's to say (`readable`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass

from service.text.glossary import Glossary

ZWJ = "\u200d"  # joins the emoji of a sequence (👨‍👩‍👧)
KEYCAP = "\u20e3"  # encloses a keycap's base: 1️⃣ is "1", U+FE0F, U+20E3
KEYCAP_BASES = "0123456789#*"
_PLACEHOLDER = re.compile(r"%(\d+)")


@dataclass(frozen=True)
class Run:
    """A run of the sentence and its placeholder; `spaced`: a digit followed it, so the placeholder has a space
    after it (%1 5 for €5: %15 would be another placeholder), which goes when the run comes back before a digit;
    `target`: what the translation gets in its place, where that is not the run as written (a glossary term's
    translation)."""

    placeholder: str
    text: str
    spaced: bool = False
    target: str | None = None

    @property
    def pattern(self) -> re.Pattern[str]:
        return re.compile(re.escape(self.placeholder) + (r"(?!\d)(?: (?=\d))?" if self.spaced else r"(?!\d)"))

    def put(self, translation: str, source: bool = False) -> str:
        """The placeholder in `translation` replaced by the run's target, or with `source` by its text."""
        text = self.text if source or self.target is None else self.target
        return self.pattern.sub(lambda _: text, translation)


@dataclass(frozen=True)
class Masked:
    """A sentence as the model reads it, and the runs its placeholders stand for."""

    text: str
    runs: tuple[Run, ...] = ()  # in order
    own: int = 0  # %-numbers the sentence holds itself (%1, %2$s, %d's are not numbers), which the model keeps too

    def restore(self, translation: str) -> str | None:
        """The translation with each placeholder replaced by its run; None unless every placeholder came back
        exactly once and no other %-number than the sentence's own appeared (the model ran a digit into one)."""
        if not self.runs:
            return translation
        if len(_PLACEHOLDER.findall(translation)) != len(self.runs) + self.own:
            return None
        for run in self.runs:
            if len(run.pattern.findall(translation)) != 1:
                return None
            translation = run.put(translation)
        return translation

    def unmask(self, translation: str) -> str:
        """`restore`, or for a translation it refuses (an alternative of a beam whose best restored), each
        placeholder found replaced and the runs of those not found put at the end: no symbol is lost."""
        restored = self.restore(translation)
        if restored is not None:
            return restored
        missing = []
        for run in self.runs:
            if run.pattern.search(translation):
                translation = run.put(translation)
            else:
                missing.append(run.text)
        return " ".join([translation, *missing]) if missing else translation

    @property
    def sentence(self) -> str:
        """The sentence before masking (a glossary term as written, not its translation)."""
        text = self.text
        for run in self.runs:
            text = run.put(text, source=True)
        return text


def mask(sentence: str, readable: Callable[[str], bool], glossary: Glossary | None = None) -> Masked:
    """`sentence` with each run (`runs`) and each of the glossary's terms replaced by a placeholder %k that the
    sentence does not hold already, a space between it and a digit that follows (%1 5 for €5: %15 would be
    another placeholder); unchanged, with no runs, when it has none. A run that overlaps a term gives way to it."""
    spans: list[tuple[int, int, str | None]] = [(start, end, None) for start, end in runs(sentence, readable)]
    terms = glossary.spans(sentence) if glossary is not None else []
    if terms:
        kept = (s for s in spans if not any(s[0] < end and start < s[1] for start, end, _ in terms))
        spans = sorted([*terms, *kept], key=lambda span: span[0])
    if not spans:
        return Masked(sentence)
    names = _free_placeholders(sentence, len(spans))
    parts, done, found = [], 0, []
    for (start, end, target), name in zip(spans, names, strict=True):
        spaced = sentence[end : end + 1].isdigit()
        parts += [sentence[done:start], name + (" " if spaced else "")]
        found.append(Run(name, sentence[start:end], spaced, target))
        done = end
    parts.append(sentence[done:])
    text = "".join(parts)
    own = len(_PLACEHOLDER.findall(text)) - len(found)  # the sentence's own outside the runs (a term may hold one)
    return Masked(text, tuple(found), own)


def runs(sentence: str, readable: Callable[[str], bool]) -> list[tuple[int, int]]:
    """(start, end) of each run the model is not given: protected characters (`protected`); the whole word around
    a protected letter (λόγος, not λό + γος split at the letters the vocabulary happens to have); a keycap's base
    (the 1 of 1️⃣); and the marks, joiners and tag characters that follow one (a variation selector, the joiner of
    an emoji sequence, a subdivision flag's tags)."""
    inside = [protected(char, readable) for char in sentence]
    i = 0
    while i < len(sentence):  # whole words: each character is looked at a bounded number of times
        if inside[i] and sentence[i].isalpha():
            start, end = i, i + 1
            while start > 0 and _in_word(sentence[start - 1]):
                start -= 1
            while end < len(sentence) and _in_word(sentence[end]):
                end += 1
            inside[start:end] = [True] * (end - start)
            i = end
        else:
            i += 1
    for i, char in enumerate(sentence):
        keycap = char in KEYCAP_BASES and KEYCAP in sentence[i + 1 : i + 3]
        inside[i] = inside[i] or keycap or (i > 0 and inside[i - 1] and _joins(char))
    found, start = [], None
    for i, flag in enumerate(inside + [False]):
        if flag and start is None:
            start = i
        elif not flag and start is not None:
            found.append((start, i))
            start = None
    return found


def protected(char: str, readable: Callable[[str], bool]) -> bool:
    """A character given to the model as a placeholder: a symbol beyond ASCII (ASCII's + < = > | ^ ~ $ stay: the
    model reads them), a number that is no digit (², ½, ①: the tokenizer reads ² as 2, and "5 m²" came back as
    "52"), or one the model's vocabulary lacks. Never a space, a control or a format character: those
    are the text path's to keep or drop (`text.model_input`)."""
    category = unicodedata.category(char)
    if char.isascii() or category[0] in "ZC":
        return False
    return category[0] == "S" or category == "No" or not readable(char)


def _in_word(char: str) -> bool:
    return char.isalpha() or unicodedata.category(char)[0] == "M"


def _joins(char: str) -> bool:
    return unicodedata.category(char)[0] == "M" or char == ZWJ or "\U000e0020" <= char <= "\U000e007f"


def _free_placeholders(sentence: str, count: int) -> list[str]:
    """`count` placeholders %k, lowest k from 1 first, none that the sentence holds (its own %1 stays its own)."""
    taken = {int(k) for k in _PLACEHOLDER.findall(sentence) if len(k) < 6}
    names, k = [], 1
    while len(names) < count:
        if k not in taken:
            names.append(f"%{k}")
        k += 1
    return names
