"""JSON message files: nested objects of strings (i18next, vue-i18n, Chrome's messages.json), every string value
translated where it stands, keys and structure kept. An ICU MessageFormat argument (`{count, plural, one {# file}
other {# files}}`, select, selectordinal) keeps its structure: each of its messages is translated, `#` kept."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from service.files.catalogue import FileError, FileOptions, Item, decoded, plural_categories
from service.files.segments import Segment

_ICU_START = re.compile(r"\{\s*([A-Za-z0-9_]+)\s*,\s*(plural|select|selectordinal)\s*,")
_SKIPPED_KEYS = frozenset({"description", "placeholders"})  # Chrome's messages.json: notes for translators


class JsonMessages:
    name, suffixes, media_type = "json", (".json",), "application/json"

    def __init__(self, data: bytes, filename: str, target: str, options: FileOptions) -> None:
        try:
            self.tree = json.loads(decoded(data, filename))
        except json.JSONDecodeError as error:
            raise FileError(400, f"{filename}: not valid JSON: {error.msg} (line {error.lineno})") from None
        if not isinstance(self.tree, dict):
            kind = type(self.tree).__name__
            raise FileError(400, f"{filename}: a message file is a JSON object of strings, not a {kind}")
        self.items: list[Item] = []
        self.target = target
        self._collect(self.tree)
        self.units, self.kept = len(self.items), 0

    def _collect(self, node: Any) -> None:
        if isinstance(node, dict):
            _add_plural_keys(node, self.target)
        entries = list(node.items()) if isinstance(node, dict) else list(enumerate(node))
        for key, value in entries:
            if isinstance(value, str) and value.strip() and key not in _SKIPPED_KEYS:
                template, arguments = icu_parts(value)
                messages = [message for argument in arguments for message in argument.messages]
                segments = [Segment.of_text(text) for text in [template, *messages]]
                self.items.append(Item(segments, (node, key), {"arguments": arguments}))
            elif isinstance(value, dict | list) and key not in _SKIPPED_KEYS:
                self._collect(value)

    def put(self, item: Item, translations: list[str]) -> None:
        node, key = item.at
        texts = [segment.text(t) for segment, t in zip(item.sources, translations, strict=True)]
        node[key] = icu_joined(texts[0], item.extra["arguments"], texts[1:])

    def dump(self) -> bytes:
        return (json.dumps(self.tree, ensure_ascii=False, indent=2) + "\n").encode("utf-8")


def _add_plural_keys(node: dict, target: str) -> None:
    """i18next's plural keys (`item_one`, `item_other`): those the target language uses and the object lacks, each
    from its `_other` (French wants `item_many` too), placed after it."""
    categories = plural_categories(target)
    bases = [key[: -len("_other")] for key in node if isinstance(key, str) and key.endswith("_other")]
    for base in bases:
        missing = [c for c in categories if f"{base}_{c}" not in node]
        if not missing or not isinstance(node[f"{base}_other"], str):
            continue
        items = list(node.items())
        at = next(i for i, (key, _) in enumerate(items) if key == f"{base}_other")
        added = [(f"{base}_{c}", node[f"{base}_other"]) for c in missing]
        node.clear()
        node.update(items[:at] + added + items[at:])


@dataclass(frozen=True)
class Argument:
    """An ICU plural/select argument: its head (`{count, plural,`), each case's selector (`one `, `=0 `) and message."""

    head: str
    selectors: list[str]
    messages: list[str]

    def joined(self, messages: list[str]) -> str:
        cases = "".join(f"{selector}{{{message}}}" for selector, message in zip(self.selectors, messages, strict=True))
        return f"{self.head}{cases}}}"


def icu_parts(text: str) -> tuple[str, list[Argument]]:
    """A string as a template, each top-level plural/select argument in it replaced by `{__icuN}` (a placeholder
    the engine keeps as written), and those arguments."""
    arguments: list[Argument] = []
    template, at = [], 0
    for match in _ICU_START.finditer(text):
        if match.start() < at:
            continue  # inside an argument already taken
        end = _closing(text, match.start())
        if end is None:
            break
        selectors, messages = _cases(text[match.end() : end - 1])
        template += [text[at : match.start()], f"{{__icu{len(arguments)}}}"]
        arguments.append(Argument(match.group(0), selectors, messages))
        at = end
    template.append(text[at:])
    return "".join(template), arguments


def icu_joined(template: str, arguments: list[Argument], messages: list[str]) -> str:
    """icu_parts undone on translations: each argument rebuilt around its translated messages, put where its
    placeholder went (at the end, if the translation lost it)."""
    at = 0
    for i, argument in enumerate(arguments):
        rebuilt = argument.joined(messages[at : at + len(argument.messages)])
        at += len(argument.messages)
        marker = f"{{__icu{i}}}"
        template = template.replace(marker, rebuilt, 1) if marker in template else f"{template} {rebuilt}"
    return template


def _closing(text: str, start: int) -> int | None:
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _cases(body: str) -> tuple[list[str], list[str]]:
    """A plural/select argument's body after its type: the selectors (`one `, `=0 `, `offset:1 other `) and
    the messages in braces after each."""
    selectors, messages, at = [], [], 0
    while (opening := body.find("{", at)) >= 0 and (end := _closing(body, opening)) is not None:
        selectors.append(body[at:opening])
        messages.append(body[opening + 1 : end - 1])
        at = end
    return selectors, messages
