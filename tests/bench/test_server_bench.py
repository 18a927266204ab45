"""bench.server's rounds: each server run is set against the engine measured in its own round, and the summary
counts the rounds that meet the issue's targets (90 % of the engine's one batch of 32; p99 at most 3x p50)."""

import pytest

from bench.server import print_summary


def row(round_: int, tokens: float, one: float, p50: float, p99: float, errors: int = 0) -> dict:
    return {
        "round": round_, "variant": "int8", "mode": "continuous", "clients": 32, "tokens_per_s": tokens,
        "of_1x32": tokens / one, "p50_ms": p50, "p99_ms": p99, "errors": errors,
    }  # fmt: skip


def test_the_summary_takes_medians_and_counts_the_rounds_that_meet_each_target(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rows = [
        row(1, 7_200, 8_000, 50, 160),  # 90 %, 3.2
        row(2, 7_000, 8_000, 50, 150),  # 87.5 %, 3.0
        row(3, 7_600, 7_600, 40, 100, errors=2),  # 100 %, 2.5
    ]
    print_summary(rows)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "| int8 | continuous | 32 | 3 | 7,200 | 90% (88-100) | 2 | 3.00 (2.50-3.20) | 2 | 2 |"
