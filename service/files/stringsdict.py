"""Apple .stringsdict plurals (a property list, read and written with the standard library's plistlib): each
entry's NSStringLocalizedFormatKey text and each variable's plural forms translated, the target's CLDR categories
added from `other`, keys, types and format specifiers kept."""

from __future__ import annotations

import plistlib
import xml.parsers.expat
from typing import Any

from service.files.catalogue import FileError, FileOptions, Item, plural_categories
from service.files.segments import PLACEHOLDER, Segment

FORMS = ("zero", "one", "two", "few", "many", "other")


class StringsDict:
    name, suffixes, media_type = "stringsdict", (".stringsdict",), "application/x-plist"

    def __init__(self, data: bytes, filename: str, target: str, options: FileOptions) -> None:
        if b"<!ENTITY" in data:
            raise FileError(400, f"{filename}: a property list may not declare entities (they are not expanded here)")
        try:
            self.tree = plistlib.loads(data, fmt=plistlib.FMT_XML)
        except (plistlib.InvalidFileException, xml.parsers.expat.ExpatError, ValueError) as error:
            raise FileError(400, f"{filename}: not a valid .stringsdict property list: {error}") from None
        if not isinstance(self.tree, dict):
            raise FileError(400, f"{filename}: a .stringsdict is a dictionary of entries")
        self.items: list[Item] = []
        for entry in self.tree.values():
            if isinstance(entry, dict):
                self._collect(entry, target)
        self.units, self.kept = len(self.items), 0

    def _collect(self, entry: dict[str, Any], target: str) -> None:
        format_key = entry.get("NSStringLocalizedFormatKey")
        if isinstance(format_key, str) and PLACEHOLDER.sub("", format_key).strip():  # words, not %#@files@ alone
            self.items.append(Item([Segment.of_text(format_key)], (entry, "NSStringLocalizedFormatKey")))
        for variable in entry.values():
            if not isinstance(variable, dict) or variable.get("NSStringFormatSpecTypeKey") != "NSStringPluralRuleType":
                continue
            other = variable.get("other")
            for category in plural_categories(target):
                if category not in variable and isinstance(other, str):
                    variable[category] = other
            for form in FORMS:
                if isinstance(variable.get(form), str) and variable[form].strip():
                    self.items.append(Item([Segment.of_text(variable[form])], (variable, form)))

    def put(self, item: Item, translations: list[str]) -> None:
        holder, key = item.at
        holder[key] = item.sources[0].text(translations[0])

    def dump(self) -> bytes:
        return plistlib.dumps(self.tree, fmt=plistlib.FMT_XML, sort_keys=False)
