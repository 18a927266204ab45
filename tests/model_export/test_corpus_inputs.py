"""evaluate and train read a split as lines split at "\\n" only, and refuse in one line a split whose two sides
differ in length, an empty or non-UTF-8 split, a --json it could not write, numbers past their bounds; train
refuses a corpus its length cap filters out entirely, a device it cannot use and a folder that is not a run's."""

import re
from pathlib import Path

import pytest

from model_export.__main__ import EXIT_BAD_INPUT, main
from model_export.errors import ExportError
from model_export.evaluate import read_lines, read_split
from model_export.train import TrainOptions, train
from tests.factories import SENTENCES, train_sentencepiece


def write_split(folder: Path, english: list[str], french: list[str], split: str = "test") -> Path:
    folder.mkdir(exist_ok=True)
    (folder / f"{split}.en").write_text("".join(line + "\n" for line in english), encoding="utf-8")
    (folder / f"{split}.fr").write_text("".join(line + "\n" for line in french), encoding="utf-8")
    return folder


def test_lines_split_at_newline_only(tmp_path: Path) -> None:
    separators = "a\u2028b", "c\x85d", "e\x1cf\x1dg\x1eh", "i\x0bj\x0ck"
    corpus = write_split(tmp_path, list(separators), ["1", "2", "3", "4"])
    assert read_split(corpus, "test", "en", "fr") == (list(separators), ["1", "2", "3", "4"])
    (tmp_path / "crlf").write_bytes(b"x\r\ny\r\n")
    assert read_lines(tmp_path / "crlf") == ["x", "y"]


@pytest.mark.parametrize(
    ("english", "french", "message"),
    [
        (["a", "b", "c"], ["1", "2"], r"test\.en has 3 lines, .*test\.fr 2: a split's source and reference"),
        ([], [], r"test\.en and .*test\.fr are empty"),
    ],
    ids=["counts differ", "empty"],
)
def test_a_split_that_cannot_pair_is_one_line(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], english: list, french: list, message: str
) -> None:
    corpus = write_split(tmp_path / "c", english, french)
    assert main(["evaluate", "--model-dir", str(model_dir), "--corpus", str(corpus), "--threads", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert re.search(message, err), err


def test_a_split_not_in_utf8_is_one_line(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    corpus = write_split(tmp_path / "c", ["a"], ["b"])
    (corpus / "test.en").write_bytes(b"caf\xe9\n")
    assert main(["evaluate", "--model-dir", str(model_dir), "--corpus", str(corpus), "--threads", "1"]) == 2
    assert capsys.readouterr().err == f"error: {corpus / 'test.en'}: not UTF-8 text (byte 3); convert it to UTF-8\n"


def test_json_into_a_new_folder_is_written(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    corpus = write_split(tmp_path / "c", SENTENCES[:2], SENTENCES[6:8])
    report = tmp_path / "new" / "dir" / "r.json"
    args = ["evaluate", "--model-dir", str(model_dir), "--corpus", str(corpus), "--threads", "1"]
    assert main([*args, "--json", str(report)]) == 0 and report.is_file()
    capsys.readouterr()
    assert main([*args, "--json", str(tmp_path)]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == f"error: --json {tmp_path} is a folder; name the report's file\n"


def test_json_that_cannot_be_written_is_refused_before_the_evaluation(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A report path nobody may write (here /proc, which refuses even root) fails in one line before any
    translation: after it, a finished evaluation was lost."""
    import model_export.evaluate

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("evaluated before the report's path was checked")

    monkeypatch.setattr(model_export.evaluate, "evaluate", never)
    corpus = write_split(tmp_path / "c", SENTENCES[:2], SENTENCES[6:8])
    args = ["evaluate", "--model-dir", str(model_dir), "--corpus", str(corpus), "--threads", "1"]
    assert main([*args, "--json", "/proc/report.json"]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith("error: /proc/report.json: ") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--beam-size", "100000", "must be a whole number from 1 to 16, not 100000"),
        ("--threads", "100000", "must be a whole number from 1 to 256, not 100000"),
        ("--beam-size", "0", "must be a whole number from 1 to 16, not 0"),
    ],
)
def test_evaluate_numbers_have_bounds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["evaluate", "--model-dir", str(tmp_path), option, value])
    assert exit_.value.code == 2 and f"argument {option}: {message}" in capsys.readouterr().err


@pytest.fixture()
def run_args(tmp_path: Path) -> list[str]:
    corpus = tmp_path / "corpus"
    for split in ("train", "dev"):
        write_split(corpus, SENTENCES[:6], SENTENCES[6:12], split)
    (tmp_path / "spm.model").write_bytes(train_sentencepiece())
    return ["train", "--corpus", str(corpus), "--tokenizer", str(tmp_path / "spm.model"),
            "--out", str(tmp_path / "run"), "--d-model", "32", "--n-heads", "4", "--d-ff", "64",
            "--max-steps", "1", "--threads", "1"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--max-tokens-per-side", "1"], r"no train pair has 1 to 0 tokens on each side; raise --max-tokens-per-side"),
        (["--device", "foo"], r"--device 'foo' is not cpu or cuda"),
        (["--device", "meta"], r"--device 'meta' is not cpu or cuda"),
    ],
)
def test_train_refuses_in_one_line(
    run_args: list[str], capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    assert main([*run_args, *extra]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert re.search(message, err), err


def test_train_on_cuda_without_cuda_is_one_line(
    run_args: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert main([*run_args, "--device", "cuda"]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err == "error: --device cuda: torch sees no CUDA device here; use --device cpu\n"


def test_train_never_takes_over_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    kept = tmp_path / "mine" / "notes.txt"
    kept.parent.mkdir()
    kept.write_text("my notes")
    spm = tmp_path / "spm.model"
    spm.write_bytes(b"x")
    with pytest.raises(ExportError, match="holds files but no step-\\*.pt checkpoint"):
        train(TrainOptions(corpus=tmp_path, tokenizer=spm, out=kept.parent))
    assert [p.name for p in kept.parent.iterdir()] == ["notes.txt"]
