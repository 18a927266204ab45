"""The benchmarks refuse a count or a duration out of range before they start anything (no model built, no server
started), naming the option, as the offline commands do (service/arguments.py)."""

import argparse
import importlib

import pytest

from service.arguments import (
    fraction,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    positive_ints,
)


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [
        ("bench.engine", ["paper", "--rounds", "0"], "argument --rounds: must be a whole number of at least 1, not 0"),
        ("bench.shortlist", ["paper", "--candidates", "512,x"], "argument --candidates: must be comma-separated whole"),
        (
            "bench.engine",
            ["paper", "--alone-sentences", "-1"],
            "argument --alone-sentences: must be a whole number of at least 0",
        ),
        ("bench.server", ["--clients", "8", "--seconds", "0"], "argument --seconds: must be a number above 0, not 0"),
        ("bench.ab", ["--a", ".", "--pairs", "x"], "argument --pairs: 'x' is not a whole number"),
        ("bench.overload", ["--factor", "0"], "argument --factor: must be a number above 0"),
        ("bench.soak", ["--minutes=-1"], "argument --minutes: must be a number above 0, not -1"),
        ("bench.scheduler", ["--sentences", "0"], "argument --sentences: must be a whole number of at least 1"),
        ("bench.step", ["--steps", "0"], "argument --steps: must be a whole number of at least 1"),
        ("bench.step", ["--rows", "32,x"], "argument --rows: must be comma-separated whole numbers of at least 1"),
        ("bench.step", ["--model", "/nonexistent"], "--model /nonexistent: not a model folder (no manifest.json)"),
        ("bench.engine", ["paper", "--beams", "1,0"], "argument --beams: must be comma-separated whole numbers"),
        ("bench.engine", ["paper", "--batches", "32,"], "argument --batches: must be comma-separated whole numbers"),
    ],
)
def test_a_number_out_of_range_stops_a_benchmark_at_once(
    module: str, argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        importlib.import_module(module).main(argv)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err


def test_the_argument_types_hold_their_bounds() -> None:
    assert positive_int("1") == 1 and non_negative_int("0") == 0 and non_negative_float("0") == 0.0
    assert positive_float("1e-9") == 1e-9 and fraction("0") == 0.0 and fraction("0.999") == 0.999
    assert positive_ints("4") == [4] and positive_ints("32,1") == [32, 1]
    for convert, text in (
        (positive_int, "0"),
        (positive_int, "1.5"),
        (non_negative_int, "-1"),
        (positive_float, "0"),
        (positive_float, "nan?"),
        (non_negative_float, "-0.1"),
        (fraction, "1"),
        (fraction, "-0.1"),
        (positive_ints, ""),
        (positive_ints, "x"),
        (positive_ints, "4,"),
        (positive_ints, "0"),
        (positive_ints, "1,-2"),
    ):
        with pytest.raises(argparse.ArgumentTypeError):
            convert(text)
