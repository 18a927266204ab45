"""Where a stretch of text's sentences start and end (terminal punctuation, abbreviations, numbered lines), and
where a sentence too long for the model is best cut."""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable, Iterator

from service.errors import TooLarge

Count = Callable[[str], int]  # text -> the number of tokens it would take
_LINE = re.compile(r"[^\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029]+")  # str.splitlines' line breaks
# Unicode's format characters (category Cf: soft hyphen, bidi marks, word joiner, ...) but the zero-width
# (non-)joiners, which shape the letters around them: invisible, and out of the model's vocabulary (a leading
# U+2060 or a pair of bidi embedding marks derailed the default model's whole sentence)
FORMAT_CHARS = (
    "\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890-\u0891\u08e2\u180e\u200b\u200e-\u200f\u202a-\u202e"
    "\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U00013438"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)
_TOKEN = re.compile(rf"[^\s{FORMAT_CHARS}]+")  # a word: format characters alone are not one (kept verbatim)
_SPACE = re.compile(r"\s+")
TERMINALS = ".!?…‽"  # end a sentence when followed by whitespace and a sentence start
CLOSERS = "\"'”’»›)]}"  # may follow the terminal punctuation: `done.")`
OPENERS = "\"'“‘„«‹([{¿¡"  # may precede the first letter of a sentence: `"Yes`
_ABBREVIATED = """
    Mr Mrs Ms Mx Dr Prof Sr Jr St Mt Rev Hon Gen Col Capt Lt Sgt Gov Sen Rep Pres Fr Mme Mlle Messrs
    vs etc al cf ca approx esp incl excl resp viz Fig Figs fig figs Vol vol Vols pp Ch Sec Art Eq
    Ref Dept Inc Ltd Co Corp Bros Ave Blvd Rd Jan Feb Mar Apr Jun Jul Aug Sep Sept Oct Nov Dec
    bzw usw vgl ggf Hr Hrn Abs Bd Mio Mrd
"""
ABBREVIATIONS = frozenset(_ABBREVIATED.split())  # words a period follows without ending the sentence, as written
# abbreviations only before a number: "see no. 5", "ext. 42", but "Are you sure? No. Cancel it."
BEFORE_NUMBER = frozenset(["No", "Nos", "Nr", "no", "nos", "nr", "Ext", "ext", "Tel", "tel"])
_DOTTED = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]")  # e.g, i.e, U.S (the final period stripped)
_CLAUSE_END = re.compile(r"[;:,.!?…]+(?=\s)|[，；：、。！？]+")  # where a long sentence is best cut


def sentence_spans(text: str, hard_lines: bool) -> Iterator[tuple[int, int]]:
    """(start, end) of each sentence, without surrounding whitespace or marks (`_words_of`); with hard_lines never
    across a line."""
    lines = [(0, len(text))] if not hard_lines else [line.span() for line in _LINE.finditer(text)]
    for pos, endpos in lines:
        for start, end in _spans_in(text, pos, endpos):
            words = _words_of(text, start, end)
            if words is not None:
                yield words


def _words_of(text: str, start: int, end: int) -> tuple[int, int] | None:
    """The span of text[start:end] the model is given: without the leading tokens that hold no letter or digit
    (list bullets, "##", "|", "<<", "⚠️") and the trailing ones made of symbols alone ("🙂", "✓", "€", "|"), which
    stay as written; None when no letter is left ("•", "10:00", "★★★★☆", "??"): kept as written, as the
    model, trained on sentences with letters, turned such text into words ("•" -> "gramme")."""
    tokens = [token.span() for token in _TOKEN.finditer(text, start, end)]
    first, last = 0, len(tokens)
    while first < last and not any(c.isalnum() for c in text[slice(*tokens[first])]):
        first += 1
    while first < last and all(_is_symbol(c) for c in text[slice(*tokens[last - 1])]):
        last -= 1
    if not any(c.isalpha() for a, b in tokens[first:last] for c in text[a:b]):
        return None
    return tokens[first][0], tokens[last - 1][1]


def _is_symbol(char: str) -> bool:
    """A symbol (math, currency, modifier, other: emoji), or what joins one (a combining mark, a variation
    selector, the zero-width joiner)."""
    return unicodedata.category(char)[0] in "SM" or char == "\u200d"


def _spans_in(text: str, pos: int, endpos: int) -> Iterator[tuple[int, int]]:
    first = last = None  # the current sentence's first token, the previous token
    for token in _TOKEN.finditer(text, pos, endpos):
        if first is None:
            first = token
        elif (
            last is not None
            and _ends_sentence(last.group(), first is last, token.group())
            and _starts_sentence(token.group())
        ):
            yield first.start(), last.end()
            first = token
        last = token
    if first is not None and last is not None:
        yield first.start(), last.end()


def _ends_sentence(token: str, alone: bool, following: str) -> bool:
    """Whether a sentence may end with this whitespace-free token (`alone`: it would be the whole sentence) before
    the token `following`."""
    core = token.rstrip(CLOSERS)
    if not core or core[-1] not in TERMINALS:
        return False
    if core[-1] != "." or core.endswith(".."):
        return True
    word = core[:-1].lstrip(OPENERS)
    if alone and word.isdigit() and len(word) <= 3:  # "1. Open the file." is a numbered line
        return False
    initial = len(word) == 1 and word.isupper() and word != "I"  # "J. R. Tolkien", not "So did I."
    numbered = word in BEFORE_NUMBER and following[:1].isdigit()
    return not (initial or numbered or word in ABBREVIATIONS or _DOTTED.fullmatch(word))


def _starts_sentence(token: str) -> bool:
    """An opening quote or bracket, a capital, a digit, or a letter of a script without case."""
    first = token[0]
    return first in OPENERS or first.isdigit() or (first.isalpha() and not first.islower())


def limit_spans(sentence: str, count: Count, limit: int, can_cut: Callable[[int], bool]) -> list[tuple[int, int]]:
    """Spans of sentence, each within the limit, covering all of it but the whitespace at the cuts."""
    if count(sentence) <= limit:
        return [(0, len(sentence))]
    start, end = len(sentence) - len(sentence.lstrip()), len(sentence.rstrip())
    spans: list[tuple[int, int]] = []
    while start < end:
        window = _window(sentence, start, end, count, limit)
        if window == end and count(sentence[start:end]) <= limit:
            spans.append((start, end))
            break
        cut = _cut(sentence, start, window, count, limit, can_cut)
        spans.append((start, cut))
        start = _skip_space(sentence, cut)
    return spans


def _skip_space(text: str, offset: int) -> int:
    space = _SPACE.match(text, offset)
    return space.end() if space else offset


def _window(sentence: str, start: int, end: int, count: Count, limit: int) -> int:
    """An offset past which no piece from start fits, found by doubling: the pieces tried stay near the
    piece's own length, so that cutting is linear in the sentence."""
    size = max(limit, 1)
    while start + size < end and count(sentence[start : start + size]) <= limit:
        size *= 2
    return min(end, start + size)


def _cut(sentence: str, start: int, window: int, count: Count, limit: int, can_cut: Callable[[int], bool]) -> int:
    """The end of the longest piece from start that fits, at the best kind of cut that gives one."""

    def fits(cut: int) -> bool:
        return count(sentence[start:cut]) <= limit

    for cuts in _candidate_cuts(sentence, start, window, can_cut):
        best = _last_fitting(cuts, fits)
        if best is not None:
            return best
    raise TooLarge(
        f"a sentence cannot be cut into pieces of at most {limit} tokens: the character {sentence[start]!r} "
        f"alone counts more; raise the limit"
    )


def _candidate_cuts(sentence: str, start: int, window: int, can_cut: Callable[[int], bool]) -> Iterator[list[int]]:
    """Cut offsets in (start, window], ascending, best kind first: after a clause, at whitespace, in a word."""
    yield [m.end() for m in _CLAUSE_END.finditer(sentence, start, window)]
    yield [m.start() for m in _SPACE.finditer(sentence, start, window)]
    in_words = [cut for cut in range(start + 1, window + 1) if not sentence[cut - 1].isspace()]
    yield [cut for cut in in_words if can_cut(cut)]
    yield in_words


def _last_fitting(cuts: list[int], fits: Callable[[int], bool]) -> int | None:
    """The last cut that fits, by bisection (a longer piece never counts fewer tokens, nearly always)."""
    low, high, best = 0, len(cuts) - 1, None
    while low <= high:
        middle = (low + high) // 2
        if fits(cuts[middle]):
            best, low = cuts[middle], middle + 1
        else:
            high = middle - 1
    return best
