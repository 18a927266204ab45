"""Glossaries: terms and their translations, a request's (`glossary`) and the server's for each language pair
(MT_GLOSSARY_FILE), checked, merged and compiled. `placeholders.mask` gives each occurrence of a term to the model
as a placeholder, which it copies, and puts the term's translation in its place.

Knows terms and files of terms; knows nothing of requests, models or the model's vocabulary.
"""

from __future__ import annotations

import functools
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

from service.errors import SettingsError

MAX_REQUEST_TERMS = 1000  # a request's glossary: 1,000 terms take 1.1 ms to compile, 12 µs a sentence to look for
MAX_FILE_TERMS = 10_000  # a pair's in MT_GLOSSARY_FILE: 13 ms to compile, at start and with each new request glossary
MAX_TERM_CHARS = 200  # a term, and its translation
_WORD = re.compile(r"\w+")  # a run of word characters (letters, digits, the underscore), as the regex module says
_WORD_CHAR = re.compile(r"\w")


@dataclass(frozen=True, eq=False)
class Glossary:
    """Terms and their translations: each occurrence of a term in a sentence, a whole word (no letter, digit or
    underscore on either side) in its case as written, goes to the model as a placeholder and comes back as the
    term's translation (the term itself keeps it as written: a product's name). A term that begins with a lower-case
    letter also matches with that letter upper case, as a sentence's first word has it, and its translation then
    begins upper case too, unless the glossary has that form itself. Where terms overlap, the first, then the
    longest, wins. Terms are found by their first word, looked up at each word of the sentence (a regex
    alternation of 10,000 terms took 588 µs a sentence of 113 characters; this, 11). Hashed by identity (the
    server's are made once; `merged` caches on them)."""

    given: dict[str, str]  # term -> its translation as given, both in NFC, as the model's input is
    terms: dict[str, str]  # ... and the upper-case forms of those that begin lower case: what is looked for
    by_start: dict[str, tuple[str, ...]]  # a term's first word (or first character, if no word character) -> terms
    starts: re.Pattern[str]  # where a term may begin: a word, or a character a term without one begins with

    @classmethod
    def of(cls, terms: dict[str, str]) -> Glossary:
        given = {unicodedata.normalize("NFC", t): unicodedata.normalize("NFC", v) for t, v in terms.items()}
        capitalised = {_capital(t): _capital(v) for t, v in given.items() if t[:1].islower()}
        looked_for = {**capitalised, **given}  # a form the glossary has itself wins
        by_start: dict[str, list[str]] = {}
        for term in sorted(looked_for, key=len, reverse=True):  # longest first
            word = _WORD.match(term)
            by_start.setdefault(word.group() if word else term[0], []).append(term)
        others = "".join(sorted(re.escape(k) for k in by_start if not _WORD_CHAR.match(k)))
        starts = re.compile(r"\w+" + (f"|[{others}]" if others else ""))
        return cls(given, looked_for, {k: tuple(v) for k, v in by_start.items()}, starts)

    def spans(self, sentence: str) -> list[tuple[int, int, str]]:
        """(start, end, translation) of each term in the sentence, in order."""
        found: list[tuple[int, int, str]] = []
        end = 0
        for start in self.starts.finditer(sentence):
            at, key = start.start(), start.group()
            if at < end or (at and not _WORD_CHAR.match(key) and _WORD_CHAR.match(sentence[at - 1])):
                continue  # inside the last term found, or a word's middle
            for term in self.by_start.get(key, ()):
                stop = at + len(term)
                if sentence.startswith(term, at) and not _WORD_CHAR.match(sentence[stop : stop + 1]):
                    found.append((at, stop, self.terms[term]))
                    end = stop
                    break
        return found


def _capital(text: str) -> str:
    """The text with its first letter upper case (str.capitalize would lower the rest: "iPhone" is no "Iphone")."""
    return text[:1].upper() + text[1:]


@functools.lru_cache(maxsize=64)
def merged(base: Glossary | None, terms: tuple[tuple[str, str], ...]) -> Glossary:
    """The server's glossary for a pair (`base`, if any) with a request's terms over it, compiled once for the
    requests that send the same terms (a client's every request)."""
    return Glossary.of({**(base.given if base is not None else {}), **dict(terms)})


def problem(term: str, translation: str) -> str | None:
    """What is wrong with a glossary entry, if anything: a term must be text the model would read as a word or
    words of a sentence, and its translation text to put in one."""
    if not term.strip():
        return "empty: a term is a word or words of the text"
    if term != term.strip():
        return "spaces around it: a term is matched as a whole word, without them"
    if not translation.strip():
        return "an empty translation: give the term itself to keep it as written"
    if max(len(term), len(translation)) > MAX_TERM_CHARS:
        return f"over {MAX_TERM_CHARS} characters, the term or its translation"
    if any(unicodedata.category(c) in ("Zl", "Zp") or unicodedata.category(c)[0] == "C" for c in term + translation):
        return "a control or format character or a line break: a term lies within one sentence"
    return None


def read_glossary_file(path: Path) -> dict[tuple[str, str], Glossary]:
    """MT_GLOSSARY_FILE: a JSON object of source languages, each an object of target languages, each an object of
    terms and their translations, {"en": {"fr": {"Files": "Files", "file": "fichier"}}}, compiled by language pair;
    SettingsError saying what to change."""
    where = f"MT_GLOSSARY_FILE={str(path)!r}"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise SettingsError(f"{where}: cannot be read ({error.strerror or error})") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise SettingsError(f"{where}: not a JSON file in UTF-8 ({error})") from None
    if not (isinstance(data, dict) and all(isinstance(t, dict) for t in data.values())) or not all(
        isinstance(terms, dict) for targets in data.values() for terms in targets.values()
    ):
        raise SettingsError(
            f"{where}: must be a JSON object of source languages, each an object of target languages, each an "
            'object of terms and their translations: {"en": {"fr": {"Files": "Files"}}}'
        )
    glossaries = {}
    for source, targets in data.items():
        for target, terms in targets.items():
            pair = f"{where}: {source}->{target}"
            if len(terms) > MAX_FILE_TERMS:
                raise SettingsError(f"{pair} has {len(terms)} terms; the limit is {MAX_FILE_TERMS:,}")
            for term, translation in terms.items():
                found = problem(term, translation) if isinstance(translation, str) else "its translation is not text"
                if found:
                    raise SettingsError(f"{pair}: term {term[:MAX_TERM_CHARS]!r}: {found}")
            if terms:
                glossaries[(source, target)] = Glossary.of(terms)
    return glossaries
