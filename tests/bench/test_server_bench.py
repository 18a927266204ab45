"""bench.server's rounds: each server run is set against the engine measured warm before and after it in its own
round, and the summary counts the rounds that meet the issue's targets (90 % of the engine's one batch of 32; p99
at most 3x p50)."""

from pathlib import Path

import pytest

from bench.server import bracketed, engine_throughput, print_summary
from model_export.evaluate import StaticBatches


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


def test_a_server_run_is_set_against_the_mean_of_the_engine_before_and_after_it() -> None:
    figures = bracketed(2, before=8_000, after=7_000, two=12_000, served=6_750)
    assert figures["engine_1x32"] == 7_500 and figures["of_1x32"] == 0.9 and figures["of_2x16"] == 6_750 / 12_000
    assert (figures["engine_1x32_before"], figures["engine_1x32_after"], figures["round"]) == (8_000, 7_000, 2)


def test_the_engine_alone_is_measured_warm_over_whole_passes(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    passes: list[float] = []
    translate = StaticBatches.translate

    def counted(self: StaticBatches, *args: object) -> tuple[list[str], int, float]:
        translations, tokens, _ = translate(self, *args)
        passes.append(len(passes))
        return translations, tokens, 0.5  # each pass "takes" half a second

    monkeypatch.setattr(StaticBatches, "translate", counted)
    texts = ["a b c", "d e f g", "h i"] * 4
    assert engine_throughput(model_dir, "fp32", texts, 1, seconds=1.2) > 0
    assert len(passes) == 1 + 3  # the warm-up, then passes until 1.2 s: 0.5, 1.0, 1.5
    passes.clear()
    engine_throughput(model_dir, "fp32", texts, 2, seconds=0)
    assert len(passes) == 2  # at least one measured pass
