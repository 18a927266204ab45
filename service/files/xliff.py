"""XLIFF 1.2 and 2.0: every unit's source translated into its target, ids, groups, notes and the rest kept; units
already translated, and those marked translate="no", left alone; inline elements (1.2: <g>, <mrk> around words,
<x/>, <bx/>, <ex/>, <ph>, <bpt>, <ept>, <it> kept whole; 2.0: <pc>, <mrk> around words, <ph/>, <sc/>, <ec/>, <cp/>
kept whole) where the translation puts them. A machine translation is marked for review: 1.2's target
state="needs-review-translation" state-qualifier="mt-suggestion", 2.0's segment state="translated"
subState="mt:machine-translated"; with fuzzy off, "translated" alone, except for a low-confidence one (1.2:
"needs-review-translation", 2.0: "initial", its first state, the one before a translation is taken). Its confidence,
where the translator gave one, goes in a note on its target (1.2: the unit's <note from="mt-confidence"
annotates="target">, 2.0: the unit's <notes>, <note category="mt-confidence" appliesTo="target">)."""

from __future__ import annotations

from typing import Any

from lxml import etree

from service.files.catalogue import FileError, FileOptions, Item, needs_review
from service.files.segments import fill_element, of_element
from service.files.xml import local, parsed, serialised

XLIFF_1, XLIFF_2 = "urn:oasis:names:tc:xliff:document:1.2", "urn:oasis:names:tc:xliff:document:2.0"
PAIRED = frozenset({"g", "mrk", "pc"})  # inline elements whose content is text to translate
UNTRANSLATED_STATES = frozenset({"new", "needs-translation", "initial"})
CONFIDENCE_NOTE = "mt-confidence"  # the note's `from` (1.2) or `category` (2.0)


class Xliff:
    name, suffixes, media_type = "xliff", (".xlf", ".xliff"), "application/xliff+xml"

    def __init__(self, data: bytes, filename: str, target: str, options: FileOptions) -> None:
        self.root = parsed(data, filename, "an XLIFF file")
        self.options, self.target = options, target
        self.namespace = etree.QName(self.root).namespace
        if local(self.root) != "xliff" or self.namespace not in (XLIFF_1, XLIFF_2):
            raise FileError(400, f"{filename}: not XLIFF 1.2 or 2.0 (the root is {self.root.tag})")
        pairs = self._pairs_1() if self.namespace == XLIFF_1 else self._pairs_2()
        todo = [(holder, source) for holder, source, done in pairs if not (done and options.only_untranslated)]
        self.units, self.kept = len(pairs), len(pairs) - len(todo)
        self.items = [Item([of_element(source, _paired)], (holder, source)) for holder, source in todo]

    def _q(self, name: str) -> str:
        return f"{{{self.namespace}}}{name}"

    def _pairs_1(self) -> list[tuple[Any, Any, bool]]:
        """(trans-unit, its source, translated already) for each unit to translate."""
        for file in self.root.iter(self._q("file")):
            file.set("target-language", file.get("target-language") or self.target)
        found = []
        for unit in self.root.iter(self._q("trans-unit")):
            source = unit.find(self._q("source"))
            if unit.get("translate") == "no" or source is None or not "".join(source.itertext()).strip():
                continue
            target = unit.find(self._q("target"))
            done = target is not None and bool("".join(target.itertext()).strip())
            found.append((unit, source, done and target.get("state") not in UNTRANSLATED_STATES))
        return found

    def _pairs_2(self) -> list[tuple[Any, Any, bool]]:
        """(segment, its source, translated already) for each segment of a unit to translate."""
        self.root.set("trgLang", self.root.get("trgLang") or self.target)
        found = []
        for unit in self.root.iter(self._q("unit")):
            if unit.get("translate") == "no":
                continue
            for segment in unit.iter(self._q("segment")):
                source = segment.find(self._q("source"))
                if source is None or not "".join(source.itertext()).strip():
                    continue
                target = segment.find(self._q("target"))
                done = target is not None and bool("".join(target.itertext()).strip())
                found.append((segment, source, done and segment.get("state") not in UNTRANSLATED_STATES))
        return found

    def put(self, item: Item, translations: list[str]) -> None:
        holder, source = item.at
        target = holder.find(self._q("target"))
        if target is None:
            target = etree.Element(self._q("target"))
            source.addnext(target)
            target.tail = source.tail
        fill_element(target, item.sources[0], translations[0])
        if self.namespace == XLIFF_1:
            target.set("state", "needs-review-translation" if needs_review(item, self.options) else "translated")
            if self.options.fuzzy:
                target.set("state-qualifier", "mt-suggestion")
            else:
                target.attrib.pop("state-qualifier", None)
        else:
            holder.set("state", "initial" if self._low(item) else "translated")
            if self.options.fuzzy:
                holder.set("subState", "mt:machine-translated")
            else:
                holder.attrib.pop("subState", None)
        if item.confidence is not None:
            self._note(holder, f"{item.confidence:.2f}")

    def _low(self, item: Item) -> bool:
        return item.confidence is not None and item.confidence < self.options.low_confidence

    def _note(self, holder: Any, confidence: str) -> None:
        """The confidence note of the unit (1.2) or of the segment's unit (2.0), replaced when translated again."""
        if self.namespace == XLIFF_1:
            for old in holder.findall(self._q("note")):
                if old.get("from") == CONFIDENCE_NOTE:
                    holder.remove(old)
            note = etree.SubElement(holder, self._q("note"), {"from": CONFIDENCE_NOTE, "annotates": "target"})
            note.text = confidence
            return
        unit, segment_id = holder.getparent(), holder.get("id")
        notes = unit.find(self._q("notes"))
        if notes is None:
            notes = etree.Element(self._q("notes"))
            later = ("originalData", "segment", "ignorable")  # what follows <notes> in a unit
            first = next((i for i, child in enumerate(unit) if local(child) in later), len(unit))
            unit.insert(first, notes)
        for old in notes.findall(self._q("note")):
            if old.get("category") == CONFIDENCE_NOTE and old.get("id") == _note_id(segment_id):
                notes.remove(old)
        note = etree.SubElement(notes, self._q("note"), {"category": CONFIDENCE_NOTE, "appliesTo": "target"})
        if segment_id:
            note.set("id", _note_id(segment_id))
        note.text = confidence

    def dump(self) -> bytes:
        return serialised(self.root)


def _note_id(segment_id: str | None) -> str | None:
    return f"{CONFIDENCE_NOTE}-{segment_id}" if segment_id else None


def _paired(element: Any) -> bool:
    return local(element) in PAIRED
