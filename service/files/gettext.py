"""gettext catalogues (.po, .pot) through translate-toolkit: msgctxt, comments, references and flags kept; each
untranslated entry filled, a plural with as many forms as the target's Plural-Forms asks (its header's, or
translate-toolkit's table for the language); the header says the language and this generator; new translations
marked fuzzy unless told not to (and a low-confidence one even then), each with a translator comment that gives its
confidence; obsolete entries left as they are."""

from __future__ import annotations

from typing import Any

from translate.lang import data as languages
from translate.misc.multistring import multistring
from translate.storage import pypo

from service.files.catalogue import FileError, FileOptions, Item, needs_review
from service.files.segments import Segment

GENERATOR = "transformer-mt-server"
CONFIDENCE_COMMENT = "# machine translation, confidence "  # a translator comment, replaced when translated again


class Gettext:
    name, suffixes, media_type = "po", (".po", ".pot"), "text/x-gettext-translation"

    def __init__(self, data: bytes, filename: str, target: str, options: FileOptions) -> None:
        try:
            self.store = pypo.pofile.parsestring(data)
        except Exception as error:  # noqa: BLE001 - the parser's own errors name the line
            raise FileError(400, f"{filename}: not a valid gettext catalogue: {error}") from None
        self.options, self.target = options, target
        self.nplurals = self._plurals(target)
        entries = [u for u in self.store.units if not u.isheader() and not u.isobsolete() and u.source]
        todo = [u for u in entries if not (options.only_untranslated and u.istranslated())]
        self.units, self.kept = len(entries), len(entries) - len(todo)
        self.items = [Item([Segment.of_text(text) for text in _sources(u)], u) for u in todo]

    def _plurals(self, target: str) -> int:
        nplurals, plural = self.store.getheaderplural()
        if nplurals and plural:
            return int(nplurals)
        known = languages.languages.get(target) or languages.languages.get(target.split("_")[0].split("-")[0])
        nplurals, plural = (known[1], known[2]) if known else (2, "(n != 1)")
        self.store.updateheaderplural(nplurals, plural)
        return int(nplurals)

    def put(self, item: Item, translations: list[str]) -> None:
        unit: Any = item.at
        texts = [segment.text(t) for segment, t in zip(item.sources, translations, strict=True)]
        if unit.hasplural():
            singular, plural = texts[0], texts[-1]
            unit.target = multistring([singular] + [plural] * (self.nplurals - 1) if self.nplurals > 1 else [singular])
        else:
            unit.target = texts[0]
        if needs_review(item, self.options):
            unit.markfuzzy(True)
        if item.confidence is not None:
            kept = [line for line in unit.othercomments if not line.startswith(CONFIDENCE_COMMENT)]
            unit.othercomments = [*kept, f"{CONFIDENCE_COMMENT}{item.confidence:.2f}\n"]

    @staticmethod
    def output_name(filename: str, target: str) -> str:
        """A template comes back as the target's catalogue: messages.pot -> messages.fr.po; a .po keeps its name."""
        return f"{filename[:-4]}.{target}.po" if filename.lower().endswith(".pot") else filename

    def dump(self) -> bytes:
        self.store.updateheader(add=True, Language=self.target, X_Generator=GENERATOR)
        return bytes(self.store)


def _sources(unit: Any) -> list[str]:
    """An entry's source texts: msgid, and msgid_plural for a plural."""
    if unit.hasplural():
        return [str(text) for text in unit.source.strings[:2]]
    return [str(unit.source)]
