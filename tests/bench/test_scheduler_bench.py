"""bench.scheduler drives the server's scheduler with closed-loop clients and prints what it delivered."""

import re
from pathlib import Path

import pytest

from bench import scheduler


def test_closed_loop_clients_keep_the_scheduler_busy_and_it_reports_their_tokens(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MT_VARIANT", "fp32")
    (tmp_path / "test.en").write_text("the cat sat on the mat\n\nhello world\na longer sentence for the model\n")
    args = ["--model", str(model_dir), "--corpus", str(tmp_path), "--clients", "1,3", "--seconds", "0.5"]
    assert scheduler.main(args) == 0
    out = capsys.readouterr().out
    assert "fp32, continuous, 1 stream(s)" in out
    rows = re.findall(r"^\| (\d+) \| ([\d,.]+) \| ([\d,]+) \| ([\d,.]+) \| ([\d.| ]+) \|$", out, re.MULTILINE)
    assert [r[0] for r in rows] == ["1", "3"]
    for clients, sentences, tokens, cpu, rest in rows:
        assert float(sentences.replace(",", "")) > 0 and int(tokens.replace(",", "")) > 0
        assert float(cpu.replace(",", "")) > 0
        rows_per_step, queue, to_first_step, decoding = (float(v) for v in rest.split(" | "))
        assert 0 < rows_per_step <= int(clients)  # one row a sentence (greedy), at most a sentence a client
        assert queue >= 0 and to_first_step > 0 and decoding > 0  # every sentence timed at each stage
    peak = re.search(r"^peak RSS of this process \(the model, its caches, the load\): ([\d,]+) MB$", out, re.MULTILINE)
    assert peak and int(peak.group(1).replace(",", "")) > 0


def test_stages_say_where_the_threads_time_went_per_row_step(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """--stages: the step graphs, the rest of the steps, the cache's resizes and the encoder passes, in µs a row-step
    over the rows the window stepped, and the threads' cores; the timed methods are the classes' own again after."""
    originals = [getattr(cls, name) for cls, name, _ in scheduler.TIMED]
    monkeypatch.setenv("MT_VARIANT", "fp32")
    (tmp_path / "test.en").write_text("the cat sat on the mat\nhello world\na longer sentence for the model\n")
    args = ["--model", str(model_dir), "--corpus", str(tmp_path), "--clients", "3", "--seconds", "0.5", "--stages"]
    assert scheduler.main(args) == 0
    out = capsys.readouterr().out
    steps = re.search(r"^3 clients, stages over ([\d,]+) row-steps", out, re.MULTILINE)
    assert steps and int(steps[1].replace(",", "")) > 0
    stages = dict(re.findall(r"^\| ([^|]+?) \| ([\d,.]+) \|$", out, re.MULTILINE))
    graphs = float(stages["the step graphs (ONNX Runtime's runs)"].replace(",", ""))
    assert graphs > 0 and float(stages["encoder passes"].replace(",", "")) > 0
    assert float(stages["the rest of the runtime's steps (binding, the cache's room)"].replace(",", "")) >= 0
    assert any(name.startswith("thread scheduler-") for name in stages)
    assert [getattr(cls, name) for cls, name, _ in scheduler.TIMED] == originals
