"""Argument types and error lines for every command line (the server's, model_export's, the benchmarks'): a number
out of range is refused by argparse, which names the option and exits with status 2 before any work starts, rather
than running with a meaning of its own (a batch size of 0, a negative limit), ending in a traceback (a beam size of
0) or binding another port (asyncio takes a port modulo 65,536: --port 70000 would bind 4464)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable


def _number(parse: Callable[[str], float], noun: str, test: Callable[[float], bool], bound: str) -> Callable:
    """An argparse type: `parse` the text as a `noun`, then hold it to `test` (`bound` says what passes)."""

    def convert(text: str) -> float:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not test(value):
            raise argparse.ArgumentTypeError(f"must be {noun} {bound}, not {text}")
        return value

    return convert


positive_int = _number(int, "a whole number", lambda v: v >= 1, "of at least 1")
non_negative_int = _number(int, "a whole number", lambda v: v >= 0, "of at least 0")
non_negative_float = _number(float, "a number", lambda v: v >= 0, "of at least 0")
positive_float = _number(float, "a number", lambda v: v > 0, "above 0")
fraction = _number(float, "a number", lambda v: 0 <= v < 1, "from 0 up to, not including, 1")
port = _number(int, "a port", lambda v: 0 <= v <= 65535, "from 0 to 65535")  # 0: one the system picks


def int_between(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number from `low` to `high` (evaluate's --beam-size 100000 would take 5.6 GB)."""
    return _number(int, "a whole number", lambda v: low <= v <= high, f"from {low} to {high}")


def positive_ints(text: str) -> list[int]:
    """An argparse type: comma-separated whole numbers of at least 1 ("32,16,32"), e.g. one size per column."""
    try:
        return [positive_int(part) for part in text.split(",")]
    except argparse.ArgumentTypeError:
        message = f"must be comma-separated whole numbers of at least 1, e.g. 1,4, not {text!r}"
        raise argparse.ArgumentTypeError(message) from None


def description_of(doc: str | None) -> str:
    """A module docstring's first sentence, as a command's --help description (its first line cut one mid-phrase)."""
    paragraph = " ".join((doc or "").strip().split("\n\n")[0].split())
    return re.split(r"(?<=[.:])\s(?=[A-Z])", paragraph, maxsplit=1)[0]


def os_error_line(error: OSError) -> str:
    """An OSError as one line for a command line or a log: `path: reason` (both paths of a rename), or the error's
    own text where it names no file."""
    if error.filename is None:
        return str(error)
    paths = f"{error.filename} -> {error.filename2}" if error.filename2 is not None else str(error.filename)
    return f"{paths}: {error.strerror or error}"
