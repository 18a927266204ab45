"""The offline commands: export and verify succeed on a good checkpoint; bad input ends with one line
on stderr and a non-zero exit status, never a traceback."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from model_export.__main__ import EXIT_BAD_INPUT, main


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "model_export", *args], capture_output=True, text=True, timeout=300)


def test_export_then_verify(checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "folder"
    assert main(["export", "--checkpoint", str(checkpoint_path), "--out", str(out), "--name", "x"]) == 0
    assert json.loads((out / "manifest.json").read_text())["name"] == "x"
    assert main(["verify", "--checkpoint", str(checkpoint_path), "--model-dir", str(out)]) == 0
    assert "greedy ids equal; beam-4 ids equal" in capsys.readouterr().out


def test_params_of_the_paper_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["params"]) == 0
    assert "44,138,496" in capsys.readouterr().out


def test_missing_checkpoint_is_one_line(tmp_path: Path) -> None:
    result = run_cli("export", "--checkpoint", str(tmp_path / "none.pt"), "--out", str(tmp_path / "o"))
    assert result.returncode == EXIT_BAD_INPUT
    assert result.stderr.strip() == f"error: checkpoint not found: {tmp_path / 'none.pt'}"


def test_not_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bogus = tmp_path / "bogus.pt"
    bogus.write_bytes(b"\x00" * 100)
    assert main(["export", "--checkpoint", str(bogus), "--out", str(tmp_path / "o")]) == EXIT_BAD_INPUT
    assert "is not a readable checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: (f / "encoder.onnx").unlink(), "encoder.onnx: missing"),
        (lambda f: (f / "decoder_step.onnx").write_bytes(b"corrupt"), "decoder_step.onnx: 7 bytes, the manifest says"),
        (
            lambda f: (f / "manifest.json").write_text(
                (f / "manifest.json").read_text().replace('"d_ff": 64', '"d_ff": 128')
            ),
            "manifest config differs from the checkpoint in: d_ff",
        ),
    ],
)
def test_verify_refuses_a_damaged_folder(
    damage, message: str, checkpoint_path: Path, model_dir: Path, tmp_path: Path  # noqa: ANN001
) -> None:
    folder = Path(shutil.copytree(model_dir, tmp_path / "f"))
    damage(folder)
    result = run_cli("verify", "--checkpoint", str(checkpoint_path), "--model-dir", str(folder))
    assert result.returncode == EXIT_BAD_INPUT
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert message in result.stderr
