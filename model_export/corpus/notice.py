"""Licence summaries for the NOTICE: from a Debian `copyright` file (DEP-5 or free text) or wheel METADATA.

A summary is a best effort (licence names found in the text); the full texts ship beside it for the record.
"""

from __future__ import annotations

import re

_FREE_TEXT_LICENCES = (
    ("GNU Lesser General Public License", "LGPL"),
    ("GNU Library General Public License", "LGPL"),
    ("GNU General Public License", "GPL"),
    ("GNU Free Documentation License", "GFDL"),
    ("Apache License", "Apache"),
    ("Mozilla Public License", "MPL"),
    ("Creative Commons", "CC"),
    ("MIT License", "MIT"),
    ("Permission is hereby granted, free of charge", "MIT/Expat"),
    ("Redistribution and use in source and binary forms", "BSD"),
    ("public domain", "public-domain"),
)


def _unique(items: list[str]) -> list[str]:
    return list(dict.fromkeys(i for i in items if i))


def debian_licence(copyright_text: str) -> str:
    """Licence names of a Debian copyright file: DEP-5 `License:` fields, else well-known licence phrases."""
    pointer = re.match(r"See the package that owns (\S+)", copyright_text)
    if pointer:
        return f"see {pointer.group(1)}/copyright (documentation directory of another package)"
    fields = re.findall(r"^License:[ \t]*(\S[^\n]*)$", copyright_text, flags=re.MULTILINE)
    names = _unique([f.strip() for f in fields])
    if not names:
        lowered = copyright_text.lower()
        names = _unique([short for phrase, short in _FREE_TEXT_LICENCES if phrase.lower() in lowered])
    return ", ".join(names) if names else "see the copyright file"


def wheel_licence(metadata: str) -> str:
    """Licence of a wheel: License-Expression, else licence classifiers, else the License field."""
    headers = metadata.split("\n\n", 1)[0]
    expression = re.search(r"^License-Expression:\s*(.+)$", headers, flags=re.MULTILINE)
    if expression:
        return expression.group(1).strip()
    pattern = r"^Classifier: License :: (?:OSI Approved :: )?(.+)$"
    classifiers = _unique([c.strip() for c in re.findall(pattern, headers, flags=re.MULTILINE)])
    if classifiers:
        return ", ".join(classifiers)
    field = re.search(r"^License:[ \t]*(\S.*(?:\n {8}.*)*)", headers, flags=re.MULTILINE)
    if not field:
        return "see the wheel's METADATA"
    text = field.group(1).strip()
    return debian_licence(text) if "\n" in text else text  # a whole licence text: name it from its wording


def notice_text(rows: list[tuple[str, str, str, str]], gettext_only: bool = True) -> str:
    """The NOTICE body: one `name version (kind): licence` line per source archive; the opening names what was
    read of them (gettext catalogs only, or also dictionaries and documentation)."""
    if gettext_only:
        lines = [
            "Training data of the default EN->FR model: translation pairs taken from the French gettext catalogs",
            "of the following packages (Debian bookworm binary packages and PyPI wheels). Their full copyright",
            "texts are in licenses/ beside this file.",
        ]
    else:
        lines = [
            "EN->FR training data: translation pairs taken from the French gettext catalogs, dictionaries,",
            "documentation built in both languages and translated package metadata of the following packages",
            "and files (Debian bookworm binary packages, PyPI wheels and index files of the Debian archive).",
            "Their full copyright texts are in licenses/ beside this file.",
        ]
    lines.append("")
    lines += [f"{name} {version} ({kind}): {licence}" for name, version, kind, licence in rows]
    return "\n".join(lines) + "\n"
