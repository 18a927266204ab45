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
