"""bench.server's rounds: each server run is set against the engine measured warm before and after it in its own
round, and the summary counts the rounds that meet the issue's targets (90 % of the engine's one batch of 32; p99
at most 3x p50)."""

import math
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench.server import (
    bracketed,
    engine_throughput,
    print_stages,
    print_summary,
    print_usage,
    sentences,
    server_usage,
    usage_figures,
)
from model_export.evaluate import StaticBatches


def test_the_load_is_the_whole_test_set_unless_a_prefix_is_asked_for(tmp_path: Path) -> None:
    (tmp_path / "test.en").write_text("one\n\ntwo\n  \nthree\n", encoding="utf-8")
    assert sentences(tmp_path) == ["one", "two", "three"]  # every non-blank line: the test set runs project by project
    assert sentences(tmp_path, 2) == ["one", "two"]
    with pytest.raises(SystemExit, match="build the corpus"):
        sentences(tmp_path / "missing")


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


def test_the_stages_table_gives_the_server_time_left_after_the_engines_stages(
    capsys: pytest.CaptureFixture[str],
) -> None:
    stages = {"mean_ms": 52.0, "server_ms": 49.5, "queue_ms": 1.5, "join_ms": 8.0, "decoding_ms": 30.0}
    print_stages([{**row(1, 7_200, 8_000, 50, 160), **stages}])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == "| 1 | int8 | continuous | 32 | 52.0 | 49.5 | 1.5 | 8.0 | 30.0 | 10.0 |"  # 49.5 - 1.5 - 8 - 30


def test_the_usage_table_gives_the_http_process_cpu_per_request(capsys: pytest.CaptureFixture[str]) -> None:
    usage = {"decoder_busy": 0.91, "rows_per_step": 20.1, "server_cores": 1.73, "loadgen_cores": 0.08}
    print_usage([{**row(1, 7_200, 8_000, 50, 160), **usage, "http_us_per_request": 569.4}])
    header, _, last = capsys.readouterr().out.strip().splitlines()
    assert header.split(" | ")[7] == "HTTP process µs per request"
    assert last == "| 1 | int8 | continuous | 32 | 0.91 | 20.1 | 1.73 | 569 | 0.08 |"


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


METRICS = """# HELP mt_decoder_step_duration_seconds Duration of one decoder step (graph run and search).
# TYPE mt_decoder_step_duration_seconds histogram
mt_decoder_step_duration_seconds_bucket{model="a",le="+Inf"} 100.0
mt_decoder_step_duration_seconds_count{model="a"} 100.0
mt_decoder_step_duration_seconds_sum{model="a"} 0.25
mt_decoder_step_duration_seconds_count{model="b"} 50.0
mt_decoder_step_duration_seconds_sum{model="b"} 0.5
# HELP mt_decoder_step_rows Rows in one decoder step.
# TYPE mt_decoder_step_rows histogram
mt_decoder_step_rows_count{model="a"} 100.0
mt_decoder_step_rows_sum{model="a"} 2000.0
mt_decoder_step_rows_count{model="b"} 50.0
mt_decoder_step_rows_sum{model="b"} 100.0
# HELP mt_http_request_duration_seconds Time from request received to response sent.
# TYPE mt_http_request_duration_seconds histogram
mt_http_request_duration_seconds_count{route="/translate"} 10.0
mt_http_request_duration_seconds_sum{route="/translate"} 0.5
mt_http_request_duration_seconds_count{route="/metrics"} 3.0
mt_http_request_duration_seconds_sum{route="/metrics"} 0.03
# HELP mt_decoding_seconds Time a sentence spent in the decoder batch.
# TYPE mt_decoding_seconds histogram
mt_decoding_seconds_count{model="a"} 6.0
mt_decoding_seconds_sum{model="a"} 0.18
mt_decoding_seconds_count{model="b"} 4.0
mt_decoding_seconds_sum{model="b"} 0.12
"""


def test_a_servers_usage_is_read_from_its_metrics_and_its_processes() -> None:
    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = METRICS.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        usage = server_usage(server.server_address[1], os.getpid())
    finally:
        server.shutdown()
    assert (usage["steps"], usage["step_seconds"], usage["rows"]) == (150.0, 0.75, 2100.0)  # both models
    assert (usage["server_count"], usage["server_sum"]) == (10.0, 0.5)  # translations only, not /metrics
    assert (usage["decoding_count"], usage["decoding_sum"]) == (10.0, 0.3)  # both models
    assert (usage["queue_count"], usage["join_count"]) == (0.0, 0.0)  # not in this server's metrics
    assert 0 < usage["cpu_seconds"] <= time.process_time() + 1  # this process's (and its children's) CPU time
    assert 0 < usage["http_cpu_seconds"] <= usage["cpu_seconds"]  # this process's alone


def test_usage_figures_are_shares_of_the_run_and_means_of_its_stages() -> None:
    stages = {f"{stage}_{part}": 0.0 for stage in ("server", "queue", "join", "decoding") for part in ("count", "sum")}
    cpu = {"cpu_seconds": 10.0, "http_cpu_seconds": 4.0}
    before = {**cpu, "steps": 100.0, "step_seconds": 1.0, "rows": 2_000.0, **stages}
    after = {"cpu_seconds": 46.0, "http_cpu_seconds": 4.06, "steps": 4_100.0, "step_seconds": 19.0, "rows": 82_000.0}
    after |= stages | {"server_count": 100.0, "server_sum": 5.0, "decoding_count": 100.0, "decoding_sum": 3.0}
    figures = usage_figures(before, after, loadgen_cpu=1.6, elapsed=20.0)
    assert {key: figures[key] for key in ("decoder_busy", "rows_per_step", "server_cores", "loadgen_cores")} == {
        "decoder_busy": 0.9, "rows_per_step": 20.0, "server_cores": 1.8, "loadgen_cores": 0.08,
    }  # fmt: skip
    assert figures["http_us_per_request"] == pytest.approx(600.0)  # the HTTP process's 0.06 s over 100 requests
    assert (figures["server_ms"], figures["decoding_ms"]) == (50.0, 30.0)  # per request, in the run only
    assert math.isnan(figures["queue_ms"])  # nothing timed in the run
    idle = usage_figures(before, before, 0.0, 1.0)
    assert idle["rows_per_step"] == 0.0 and math.isnan(idle["http_us_per_request"])  # no step, no request
