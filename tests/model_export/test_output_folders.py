"""The commands that write a folder never replace or delete what a user keeps there: an --out that exists and is
not empty (or is a file) is one line before any work; a failure leaves nothing behind. export refuses tokenizer
file names that leave the folder, a tokenizer that is not SentencePiece or has more pieces than the model has
source ids, and a checkpoint whose fields are missing or of the wrong type, each in one line."""

import copy
import io
import re
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from model_export.__main__ import EXIT_BAD_INPUT, main
from model_export.checkpoint import Checkpoint
from model_export.errors import ExportError
from model_export.export import export_folder
from tests.factories import SENTENCES, tiny_checkpoint, write_checkpoint


@pytest.fixture(scope="module")
def marian_ready(spm_model: bytes, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A checkpoint every one of these commands can write (to-marian needs half sinusoids and eps 1e-5)."""
    ck = tiny_checkpoint(spm_model, sinusoid_layout="half", layer_norm_eps=1e-5)
    return write_checkpoint(ck, tmp_path_factory.mktemp("marian-ready") / "ck.pt")


COMMANDS = {
    "export": ["export", "--checkpoint", "{ck}"],
    "to-marian": ["to-marian", "--checkpoint", "{ck}"],
    "to-ctranslate2": ["to-ctranslate2", "--checkpoint", "{ck}"],
}


def run(args: list[str], ck: Path, out: Path) -> int:
    return main([a.replace("{ck}", str(ck)) for a in args] + ["--out", str(out)])


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_a_folder_with_files_is_refused_and_kept(
    command: list[str], marian_ready: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpoint_path = marian_ready
    if command[0] == "to-ctranslate2":
        pytest.importorskip("ctranslate2")
    kept = tmp_path / "mine" / "notes.txt"
    kept.parent.mkdir()
    kept.write_text("my notes")
    assert run(command, checkpoint_path, kept.parent) == EXIT_BAD_INPUT
    assert f"{kept.parent} is not empty" in capsys.readouterr().err
    assert kept.read_text() == "my notes"
    assert run(command, checkpoint_path, kept) == EXIT_BAD_INPUT  # a file
    assert "exists and is not a folder" in capsys.readouterr().err
    assert kept.read_text() == "my notes"
    assert run(command, checkpoint_path, tmp_path / "empty") == 0  # new or empty: written, nothing else beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "mine"]


def test_convert_marian_refuses_a_folder_with_files(
    marian_ready: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["to-marian", "--checkpoint", str(marian_ready), "--out", str(tmp_path / "hf")]) == 0
    kept = tmp_path / "mine" / "notes.txt"
    kept.parent.mkdir()
    kept.write_text("my notes")
    assert main(["convert-marian", "--hf-dir", str(tmp_path / "hf"), "--out", str(kept.parent)]) == EXIT_BAD_INPUT
    assert f"{kept.parent} is not empty" in capsys.readouterr().err and kept.read_text() == "my notes"
    assert main(["convert-marian", "--hf-dir", str(tmp_path / "hf"), "--out", str(tmp_path / "m")]) == 0


def test_a_failed_export_leaves_nothing(checkpoint: Checkpoint, tmp_path: Path) -> None:
    broken = copy.copy(checkpoint)
    broken.state_dict = {k: v for k, v in checkpoint.state_dict.items() if k != "generator.proj.weight"}
    with pytest.raises(ExportError, match="weights do not fit"):
        export_folder(broken, tmp_path / "new" / "deeper" / "out", "x", "0")
    assert list(tmp_path.iterdir()) == []


def evil(checkpoint: Checkpoint, tmp_path: Path, **tokenizer: object) -> Path:
    bad = copy.deepcopy(checkpoint)
    for key, value in tokenizer.items():
        setattr(bad.tokenizer, key, value)
    return write_checkpoint(bad, tmp_path / "bad.pt")


def bigger_tokenizer() -> bytes:
    model = io.BytesIO()
    text = SENTENCES * 4 + [f"word{i} token{i * 7} item{i * 13}" for i in range(300)]
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text), model_writer=model, vocab_size=200, model_type="unigram", pad_id=0, unk_id=1,
        bos_id=2, eos_id=3, character_coverage=1.0, hard_vocab_limit=False, minloglevel=2, num_threads=1,
    )
    return model.getvalue()


@pytest.mark.parametrize(
    ("tokenizer", "message"),
    [
        ({"files": {"../evil.model": b"x"}, "source_model": "../evil.model", "target_model": "../evil.model"},
         r"tokenizer file name '\.\./evil\.model' is not a plain file name"),
        ({"files": {"spm.model": b"x", "/tmp/outside.txt": b"x"}}, "'/tmp/outside.txt' is not a plain file name"),
        ({"files": {"manifest.json": b"x", "spm.model": b"x"}}, "'manifest.json' is a name the model folder uses"),
        ({"files": {}}, r"tokenizer file 'spm\.model' is named but not among its files"),
        ({"files": {"spm.model": b"garbage"}}, r"tokenizer file 'spm\.model' is not a SentencePiece model"),
        ({"files": {"spm.model": bigger_tokenizer()}}, r"'spm\.model' has \d+ pieces, more than the model's 96 source"),
    ],
    ids=["../", "absolute", "a graph's name", "no files", "not sentencepiece", "more pieces"],
)
def test_export_refuses_a_bad_tokenizer_in_one_line(
    checkpoint: Checkpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str], tokenizer: dict, message: str
) -> None:
    path = evil(checkpoint, tmp_path, **tokenizer)
    assert main(["export", "--checkpoint", str(path), "--out", str(tmp_path / "out")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {path}: ")
    assert re.search(message, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.pt"]  # nothing written, not even --out


def test_export_never_reports_a_folder_the_server_refuses(checkpoint: Checkpoint, tmp_path: Path) -> None:
    bad = copy.deepcopy(checkpoint)
    bad.tokenizer.target_model = "other.model"  # named, never written: the server refuses the manifest
    with pytest.raises(ExportError, match=r"would not load in the server: .*other\.model"):
        export_folder(bad, tmp_path / "out", "x", "0")
    assert list(tmp_path.iterdir()) == []


PAYLOAD_DAMAGE = {
    "no config": (lambda p: p.pop("config"), "missing field 'config'"),
    "no state_dict": (lambda p: p.pop("state_dict"), "missing field 'state_dict'"),
    "no tokenizer": (lambda p: p.pop("tokenizer"), "missing field 'tokenizer'"),
    "no source_language": (lambda p: p.pop("source_language"), "missing field 'source_language'"),
    "no target_languages": (lambda p: p.pop("target_languages"), "missing field 'target_languages'"),
    "tokenizer a string": (lambda p: p.update(tokenizer="x"), "field 'tokenizer' must be a mapping"),
    "tokenizer extra field": (lambda p: p["tokenizer"].update(bogus=1), "unknown tokenizer field"),
    "state_dict a string": (lambda p: p.update(state_dict="x"), "field 'state_dict' must be a mapping"),
    "provenance None": (lambda p: p.update(provenance=None), "field 'provenance' must be a mapping, got NoneType"),
    "targets a string": (lambda p: p.update(target_languages="fr"), "'target_languages' must be a list"),
    "d_model 32.0": (lambda p: p["config"].update(d_model=32.0), "bad config: d_model must be a whole number"),
    "dropout a string": (lambda p: p["config"].update(dropout="0.1"), "bad config: dropout must be a number"),
}


@pytest.mark.parametrize(("damage", "message"), PAYLOAD_DAMAGE.values(), ids=PAYLOAD_DAMAGE.keys())
def test_a_damaged_checkpoint_is_one_line_naming_the_field(
    checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage, message: str  # noqa: ANN001
) -> None:
    payload = torch.load(checkpoint_path, weights_only=True)
    damage(payload)
    torch.save(payload, tmp_path / "bad.pt")
    assert main(["export", "--checkpoint", str(tmp_path / "bad.pt"), "--out", str(tmp_path / "o")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_oserror_is_one_line(
    checkpoint_path: Path, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A destination under a file: the path and the reason, not a traceback."""
    assert main(["from-folder", "--model-dir", str(model_dir), "--out", str(checkpoint_path / "x.pt")]) == 2
    assert capsys.readouterr().err == f"error: {checkpoint_path}: File exists\n"
    assert main(["export", "--checkpoint", str(checkpoint_path), "--out", str(checkpoint_path / "sub")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {checkpoint_path}")


def test_from_folder_never_replaces_a_file(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = tmp_path / "mine.pt"
    kept.write_text("mine")
    for out in (kept, tmp_path):
        assert main(["from-folder", "--model-dir", str(model_dir), "--out", str(out)]) == EXIT_BAD_INPUT
        assert capsys.readouterr().err == f"error: {out} exists; pass a new path as --out\n"
    assert kept.read_text() == "mine"


def test_tiny_checkpoint_still_exports(spm_model: bytes, tmp_path: Path) -> None:
    """The separate-vocabularies case: a target side smaller than the shared tokenizer is fine (the decoder only
    reads ids the model produced)."""
    ck = tiny_checkpoint(spm_model, share_embeddings=False, tgt_vocab_size=90)
    path = write_checkpoint(ck, tmp_path / "ck.pt")
    assert main(["export", "--checkpoint", str(path), "--out", str(tmp_path / "o")]) == 0
