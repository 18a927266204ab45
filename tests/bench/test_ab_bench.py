"""bench.ab: two arms served in turn, A first in even pairs and B first in odd ones; the summary's means, ratios and
the pairs each arm won, lower being better for costs and latencies; and one real pair of servers on loopback."""

from pathlib import Path

import pytest

from bench.ab import FIGURES, alternate, environment, main, sign_test, summary

ROOT = Path(__file__).resolve().parents[2]


def figures(tokens: float, http_us: float, p99: float) -> dict[str, float]:
    return {
        "tokens_per_s": tokens, "http_us_per_request": http_us, "rows_per_step": 20.0, "join_ms": 8.0,
        "p50_ms": 40.0, "p99_ms": p99,
    }  # fmt: skip


def test_the_arms_alternate_which_goes_first_from_pair_to_pair() -> None:
    order: list[str] = []
    results = alternate(3, lambda arm: order.append(arm) or figures(len(order), 1.0, 1.0))
    assert order == ["A", "B", "B", "A", "A", "B"]
    assert [r["tokens_per_s"] for r in results["A"]] == [1, 4, 5]


def test_the_summary_gives_means_ratios_and_the_pairs_b_did_better_in_each_way_round() -> None:
    a = [figures(100, 700, 200), figures(120, 800, 220)]
    b = [figures(110, 650, 210), figures(100, 700, 200)]  # more tokens in one pair; less CPU in both; p99 once lower
    rows = {row.label: row for row in summary(a, b)}
    assert [label for _, label, _ in FIGURES] == list(rows)
    tokens, http = rows["target tok/s"], rows["HTTP process µs per request"]
    assert (tokens.a, tokens.b, tokens.better, tokens.decided) == (110.0, 105.0, 1, 2)
    assert tokens.ratio == pytest.approx(105 / 110) and tokens.pair_ratio == pytest.approx((1.1 + 100 / 120) / 2)
    assert (http.a, http.b, http.better) == (750.0, 675.0, 2) and http.ratio == pytest.approx(0.9)  # lower is better
    assert rows["p99 ms"].better == 1
    assert rows["rows per step"].better == rows["rows per step"].decided == 0  # ties count for neither...
    assert rows["rows per step"].p == 1.0  # ...nor as evidence
    assert http.p == 0.5 and tokens.p == 1.0  # two pairs won of two: as likely as not by chance


def test_the_sign_test_is_exact_and_two_sided() -> None:
    assert sign_test(4, 4) == sign_test(0, 4) == 0.125  # the least four pairs can give
    assert sign_test(6, 6) == pytest.approx(0.03125) and sign_test(5, 6) == pytest.approx(14 / 64)
    assert sign_test(3, 6) == 1.0 and sign_test(0, 0) == 1.0


def test_settings_are_name_value_pairs() -> None:
    assert environment(["MT_PIN_CORES=false", "X=a=b"]) == {"MT_PIN_CORES": "false", "X": "a=b"}
    with pytest.raises(SystemExit, match="NAME=VALUE"):
        environment(["MT_PIN_CORES"])


def test_the_same_arm_twice_is_refused() -> None:
    with pytest.raises(SystemExit, match="same checkout"):
        main(["--a", str(ROOT), "--b", str(ROOT)])


def test_a_pair_of_real_servers_on_the_shipped_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "test.en").write_text("Open the file.\nSave your changes before closing.\nPrint the page.\n")
    args = ["--b-env", "MT_BATCHING=static", "--pairs", "1", "--clients", "2", "--seconds", "1"]
    log = tmp_path / "servers.log"
    assert main([*args, "--corpus", str(tmp_path), "--server-log", str(log)]) == 0
    out = capsys.readouterr().out
    # the servers ran with their own log level (INFO: a line a request, part of what is measured), into the file
    assert log.read_text().count("POST /translate 200") >= 2 and "Application startup complete" in log.read_text()
    runs = [line for line in out.splitlines() if line.startswith(("  A: ", "  B: "))]
    assert [line[2] for line in runs] == ["A", "B"] and all("errors 0" in line for line in runs)
    table = out[out.index("| figure |") :].splitlines()
    assert len(table) == 2 + len(FIGURES) and all(" of 1 | " in line for line in table[2:])
