"""Cleaning rules for gettext pairs: small pure functions from raw (msgid, msgstr) to clean one-line segments.

Knows gettext/GTK/Qt/LibreOffice conventions (accelerators, placeholders, --help); not archives.
"""

from __future__ import annotations

import html
import re
import unicodedata
from collections.abc import Iterable

MAX_SOURCE_CHARS = 400
MAX_LENGTH_RATIO = 3.0
LENGTH_FLOOR = 6

#: Placeholders the model must carry over verbatim. Order matters: the first alternative that matches wins.
PLACEHOLDER_RE = re.compile(
    r"%[A-Z][A-Z0-9_]{2,}\b"  # LibreOffice %PRODUCTNAME
    r"|\$\([A-Za-z_]\w*\)"  # LibreOffice $(ARG1)
    r"|%\d+\$[-+#0']*\d*(?:\.\d+)?(?:hh|h|ll|l|L|z|j|t|q)?[diouxXeEfFgGaAcsSp]"  # positional printf %1$s
    r"|%\([A-Za-z_][\w.]*\)[-+#0]*\d*(?:\.\d+)?[diouxXeEfFgGcrsa]"  # python %(name)s
    r"|%[-+#0']*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|z|j|t|q|I64|I32)?[diouxXeEfFgGaAcsSpnm]"  # printf
    r"|%%"
    r"|%[<>']"  # GCC quoting directives
    r"|%\d+"  # Qt / KDE %1
    r"|\{[A-Za-z_][\w.]*(?:![rsa])?(?::[^{}\s]*)?\}"  # python {name}
    r"|\{\d*(?::[^{}\s]*)?\}"  # python {0}, {}
    r"|~[as%](?![A-Za-z])"  # Lisp/Scheme format directives (Audacity, GnuCash)
)
_OPTION_RE = re.compile(r"(?<![\w-])--?[A-Za-z0-9?][\w-]*")
_HELP_LINE_RE = re.compile(r"^\s*--?[A-Za-z0-9]")
_CONTINUATION_RE = re.compile(r"^(?: {6,}|\t)(?!-)\S")
_SPACES_RE = re.compile(r"[ \t\u00a0\u202f\u2009\u2007\u200b\r\f\v]+")
_ENTITY_RE = re.compile(r"&(?:#\d+|#x[0-9a-fA-F]+|[A-Za-z][A-Za-z0-9]*);")
_WORD_RE = re.compile(r"[a-zà-ÿœæ]+")
_NORM_DROP_RE = re.compile(r"[^\w\s]|_")
_ENTITY_KEEP = frozenset({"&amp;", "&lt;", "&gt;", "&quot;", "&apos;", "&#38;", "&#60;", "&#62;"})
_CONTEXT_RES = (
    re.compile(r"^[A-Za-z][\w -]{0,40}\^(?=\S)"),  # Wesnoth: "female^Princess"
    re.compile(r"^\?[^:?\s][^:?]{0,40}:(?=\S)"),  # Freeciv: "?unit:Owned"
)
_SHORTCUT_RE = re.compile(r"(?<=\S)\|[^|\s]{1,2}$")  # LyX menu shortcut: "File|e"
_LISP_RE = re.compile(r"~[as%](?![A-Za-z])")
_PUNCT = ".,;:!?()[]\"'«»“”‘’"
ACCELERATORS = ("_", "&", "~", "^")
CREDIT_MSGIDS = frozenset(
    {
        "translator-credits",
        "translator_credits",
        "translator-credits\n",
        "NAME OF TRANSLATORS",
        "Your names",
        "EMAIL OF TRANSLATORS",
        "Your emails",
        "_: NAME OF TRANSLATORS\nYour names",
        "_: EMAIL OF TRANSLATORS\nYour emails",
        "CREDIT_FOR_TRANSLATORS",
        "translation-credits",
    }
)


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


EN_WORDS = _words(
    "the and of to is are with for this that you your from be not it by was will can have has which when all "
    "been should could would there their these those into"
)
FR_WORDS = _words(
    "le la les de des du et est une un pour avec dans ce cette vous votre vos pas sur au aux à être sont "
    "qui que ne il elle en par se sa son ses ou l d n s qu c j"
)


def entry_reason(source: str, target: str, fuzzy: bool) -> str | None:
    """Why a whole catalog entry is unusable (header, fuzzy, untranslated, credits), or None."""
    if source == "":
        return "header"
    if fuzzy:
        return "fuzzy"
    if not target.strip():
        return "untranslated"
    if source.strip() in CREDIT_MSGIDS:
        return "translator_credits"
    return None


def strip_context(source: str, target: str) -> tuple[str, str]:
    """Remove context markers some projects put in the msgid itself (and translators sometimes keep).

    `female^Princess` (Wesnoth), `?unit:Owned` (Freeciv), `File|e` (LyX shortcut), `person|Title` (Gramps).
    """
    for pattern in _CONTEXT_RES:
        if pattern.match(source):
            source, target = pattern.sub("", source, count=1), pattern.sub("", target, count=1)
    source, target = _SHORTCUT_RE.sub("", source), _SHORTCUT_RE.sub("", target)
    if "|" in source and "|" not in target and "\n" not in source:
        context, _, rest = source.rpartition("|")
        source = rest if len(context) <= 60 and rest.strip() else source
    return source, target


def decode_entities(text: str) -> str:
    """Decode typographic HTML entities (`&rsquo;`, `&nbsp;`, `&#8230;`), keeping markup ones like `&amp;`."""

    def decode(match: re.Match[str]) -> str:
        entity = match.group(0)
        return entity if entity in _ENTITY_KEEP else html.unescape(entity)

    return _ENTITY_RE.sub(decode, text) if "&" in text else text


def normalise_space(text: str) -> str:
    """One line, single ASCII spaces (no-break and thin spaces included), no outer whitespace."""
    return _SPACES_RE.sub(" ", text.replace("\n", " ")).strip()


def placeholders(text: str) -> list[str]:
    """The sorted multiset of format placeholders in a string."""
    return sorted(PLACEHOLDER_RE.findall(text))


def is_help_block(source: str) -> bool:
    """A multi-line msgid that lists command-line options, one or more per line (a `--help` text)."""
    lines = source.strip("\n").split("\n")
    return len(lines) > 1 and any(_HELP_LINE_RE.match(line) for line in lines)


def help_entries(text: str) -> list[str]:
    """Lines of a --help block, each deeply indented continuation line merged into the line above."""
    entries: list[str] = []
    for line in text.strip("\n").split("\n"):
        if entries and _CONTINUATION_RE.match(line):
            entries[-1] += " " + line.strip()
        else:
            entries.append(line)
    return entries


def _entries_align(source: str, target: str) -> bool:
    """Both blank, or both non-blank with the same options and the same placeholders."""
    if not source.strip() or not target.strip():
        return not source.strip() and not target.strip()
    same_options = sorted(_OPTION_RE.findall(source)) == sorted(_OPTION_RE.findall(target))
    return same_options and placeholders(source) == placeholders(target)


def split_help(source: str, target: str) -> list[tuple[str, str]] | None:
    """Line-aligned pairs of a --help block, or None when the two sides do not align line for line."""
    src, tgt = help_entries(source), help_entries(target)
    if len(src) != len(tgt) or not all(_entries_align(s, t) for s, t in zip(src, tgt, strict=True)):
        return None
    return [(s, t) for s, t in zip(src, tgt, strict=True) if s.strip()]


def segments(source: str, target: str) -> list[tuple[str, str]] | None:
    """One-line segment pairs of an entry: --help blocks by line (None if unaligned), others joined."""
    if "\n" not in source.strip("\n") and "\n" not in target.strip("\n"):
        return [(source, target)]
    if is_help_block(source):
        return split_help(source, target)
    return [(source, target)]


def _accelerator_positions(text: str, marker: str) -> list[int]:
    """Indexes of single accelerator markers: before a letter or digit, not doubled, not an &entity;."""
    if marker == "~" and "~%" in text or marker == "^" and not text.startswith("^"):
        return []  # a Lisp format string (`~a~%`); `^` marks accelerators only at the start (aptitude)
    found = []
    for i, char in enumerate(text):
        if char != marker or i + 1 >= len(text) or not text[i + 1].isalnum():
            continue
        before = text[i - 1] if i else " "
        if before == marker or not (before.isalpha() or before.isspace() or before in "(\"'«“[<>"):
            continue
        if marker == "&" and _ENTITY_RE.match(text, i) or marker == "~" and _LISP_RE.match(text, i):
            continue
        found.append(i)
    return found


def _token_at(text: str, index: int) -> str:
    """The word around `index`, without the punctuation at its ends."""
    start = text.rfind(" ", 0, index) + 1
    end = text.find(" ", index)
    return text[start : len(text) if end < 0 else end].strip(_PUNCT)


def _is_identifier(text: str, index: int, other: str) -> bool:
    """Whether the marker at `index` belongs to a name rather than an accelerator.

    `_` inside names (`LC_ALL`, `file_name`) is common: a name is a word found unchanged on the other side.
    `&` and `~` inside words are accelerators (`n&otifications`, `St~yles`) but in `R&D` or a path/URL.
    """
    token = _token_at(text, index)
    if text[index] == "_":
        return token in {w.strip(_PUNCT) for w in other.split(" ")}
    if any(c in token for c in "/=?@"):
        return True
    return text[index] == "&" and index > 0 and text[index - 1].isupper() and text[index + 1].isupper()


def strip_accelerator(text: str, other: str, marker: str) -> str:
    """Remove one keyboard-accelerator marker (`_File`, `E_xit`, `&Open`, `~Save`, `^Next`), not names."""
    positions = _accelerator_positions(text, marker)
    if len(positions) != 1 or _is_identifier(text, positions[0], other):
        return text
    return text[: positions[0]] + text[positions[0] + 1 :]


def strip_accelerators(source: str, target: str) -> tuple[str, str]:
    """Strip accelerator markers of every kind from both sides of a pair."""
    for marker in ACCELERATORS:
        source, target = strip_accelerator(source, target, marker), strip_accelerator(target, source, marker)
    return source, target


def fold(text: str) -> str:
    """Case-folded text without accents, for comparing a translation with its source."""
    decomposed = unicodedata.normalize("NFKD", text.casefold())
    return "".join(c for c in decomposed if not unicodedata.combining(c))


def looks_english(text: str) -> bool:
    """True when a would-be French string has English function words and no French ones."""
    words = _WORD_RE.findall(text.lower())
    english = sum(word in EN_WORDS for word in words)
    french = sum(word in FR_WORDS for word in words)
    return english >= 2 and french == 0


def length_ratio_ok(source: str, target: str) -> bool:
    """Lengths within MAX_LENGTH_RATIO of each other, short strings measured from LENGTH_FLOOR chars."""
    short, long = sorted((len(source), len(target)))
    return long <= MAX_LENGTH_RATIO * max(short, LENGTH_FLOOR)


def segment_reason(source: str, target: str) -> str | None:
    """Why a one-line, whitespace-normalised segment pair is dropped, or None to keep it."""
    if not source or not target:
        return "empty"
    if not any(c.isalpha() for c in source):
        return "no_letters"
    if len(source) > MAX_SOURCE_CHARS:
        return "too_long"
    if source == target:
        return "identical"
    if fold(source) == fold(target):
        return "identical_folded"
    if not length_ratio_ok(source, target):
        return "length_ratio"
    if placeholders(source) != placeholders(target):
        return "placeholder_mismatch"
    if looks_english(target):
        return "not_french"
    return None


def clean_entry(source: str, target: str, fuzzy: bool = False) -> tuple[list[tuple[str, str]], list[str]]:
    """Clean one catalog entry: the kept segment pairs and one drop reason per dropped segment (or entry)."""
    reason = entry_reason(source, target, fuzzy)
    if reason:
        return [], [reason]
    pairs = segments(*strip_context(source, target))
    if pairs is None:
        return [], ["help_unaligned"]
    kept: list[tuple[str, str]] = []
    reasons: list[str] = []
    for raw_source, raw_target in pairs:
        src, tgt = (normalise_space(decode_entities(text)) for text in (raw_source, raw_target))
        src, tgt = strip_accelerators(src, tgt)
        why = segment_reason(src, tgt)
        (reasons.append(why) if why else kept.append((src, tgt)))
    return kept, reasons


def normalised_key(source: str) -> str:
    """Grouping key for leak-free splits: lower case, placeholders as one token, no punctuation."""
    masked = PLACEHOLDER_RE.sub(" phx ", source.lower())
    return " ".join(_NORM_DROP_RE.sub(" ", masked).split())


def count_reasons(reasons: Iterable[str], into: dict[str, int]) -> None:
    """Add drop reasons to a running count."""
    for reason in reasons:
        into[reason] = into.get(reason, 0) + 1
