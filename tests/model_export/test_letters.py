"""Rare letters: the letters of a tokenizer's pieces that a model's training sources held too seldom for it to read,
counted (`rare_letters`) and written into a model folder's manifest (`letters`), which the server then gives the
model as placeholders; bad input is one line on stderr."""

import json
import shutil
from pathlib import Path

import pytest
import sentencepiece as spm

from model_export.__main__ import EXIT_BAD_INPUT, main
from model_export.corpus.tokenizer import RARE_FEWER_THAN, rare_letters
from service.model.folder import FORMAT_VERSION, MANIFEST, load_model_folder
from service.model.tokenizer import Tokenizer


class Pieces:
    """A tokenizer's pieces, as much of a SentencePieceProcessor as rare_letters reads."""

    def __init__(self, *pieces: str) -> None:
        self.pieces = pieces

    def get_piece_size(self) -> int:
        return len(self.pieces)

    def id_to_piece(self, i: int) -> str:
        return self.pieces[i]


def test_the_letters_of_the_pieces_the_sources_hold_seldom() -> None:
    pieces = Pieces("<unk>", "▁a", "é", "ø", "ü", "ʼ", "%s", "1", "▁café")
    sources = ["The café, the über café.", "A naïve café."]  # 37 characters: é 3 times, ü once, ø never
    assert rare_letters(sources, pieces, 2, 1) == "øü"  # sorted; ï is no piece, the server masks it already
    assert rare_letters(sources, pieces, 4, 1) == "éøü" and rare_letters(sources, pieces, 0, 1) == ""
    assert "a" not in rare_letters(["é"], pieces, 100, 1)  # never ASCII: the server reads it always
    assert "ʼ" not in rare_letters(sources, pieces, 100, 1)  # a modifier letter: the apostrophe of "donʼt"
    # and less often than a share of the characters: é, 3 of 37, is rare below 3 / 37 (0.081), not at it
    assert "é" in rare_letters(sources, pieces, 100, 0.1) and "é" not in rare_letters(sources, pieces, 100, 0.08)
    assert rare_letters(sources, pieces) == "ø"  # the defaults' share (less than once in 100,000): the unseen


def test_the_sources_are_counted_as_sentencepiece_reads_them() -> None:
    """NFKC: the micro sign µ is μ, the Greek letter."""
    assert rare_letters(["5 µs"], Pieces("μ", "ß"), 1, 1) == "ß"
    assert rare_letters(["5 µs"], Pieces("μ", "ß"), 2, 1) == "ßμ"


@pytest.fixture()
def folder(model_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model_dir, tmp_path / "model"))


@pytest.fixture()
def sources(tmp_path: Path) -> Path:
    path = tmp_path / "train.en"
    path.write_text("Open the file.\n" * 3 + "Save the café menu.\n", encoding="utf-8")
    return path


def test_letters_lists_them_in_the_manifest(
    folder: Path, sources: Path, spm_model: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    expected = rare_letters(sources.read_text(encoding="utf-8").splitlines(), processor, 2, 0.5)
    assert "é" in expected and "è" in expected and "e" not in expected  # é once, è never; never ASCII
    args = ["letters", "--model-dir", str(folder), "--sources", str(sources)]
    assert main([*args, "--fewer-than", "2", "--share", "0.5"]) == 0
    out = capsys.readouterr().out
    held = "held fewer than 2 times and less often than 0.5 of the characters"
    assert f"{len(expected)} rare letters: {expected} ({held} in {sources})" in out
    manifest = load_model_folder(folder).manifest
    assert manifest.tokenizer.rare_letters == expected and manifest.format_version == FORMAT_VERSION == 13
    record = {"sources": str(sources), "lines": 4, "fewer_than": 2, "share": 0.5}
    assert manifest.provenance["rare_letters"] == record
    tokenizer = Tokenizer.from_folder(load_model_folder(folder))
    assert not tokenizer.readable("é") and tokenizer.readable("e")
    assert not list(folder.glob(".*"))  # the manifest written beside and renamed: nothing left over
    assert main([*args, "--fewer-than", "0", "--share", "0.5"]) == 0
    assert "no rare letters (held fewer than 0 times" in capsys.readouterr().out
    assert load_model_folder(folder).manifest.tokenizer.rare_letters == ""
    assert main([*args, "--fewer-than", "1000"]) == 0  # the default share: in 4 lines, only the letters never seen
    assert f"(held fewer than {RARE_FEWER_THAN:,} times and less often than 1e-05 of" in capsys.readouterr().out
    rare = load_model_folder(folder).manifest.tokenizer.rare_letters
    assert "è" in rare and "é" not in rare


def edit_manifest(folder: Path, change) -> None:  # noqa: ANN001
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    change(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")


def test_letters_refuses_what_it_cannot_use_in_one_line(
    folder: Path, sources: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = (folder / MANIFEST).read_bytes()
    empty = tmp_path / "empty.en"
    empty.write_text("", encoding="utf-8")
    cases = [
        (["--model-dir", str(folder), "--sources", str(tmp_path / "none.en")], "none.en: no such file"),
        (["--model-dir", str(folder), "--sources", str(empty)], "empty.en: empty; give the sources the model"),
        (["--model-dir", str(tmp_path / "none"), "--sources", str(sources)], "none"),
    ]
    for args, message in cases:
        assert main(["letters", *args]) == EXIT_BAD_INPUT
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and len(err.splitlines()) == 1, err
    for flag, value in (("--fewer-than", "-1"), ("--share", "1")):
        with pytest.raises(SystemExit) as exited:  # argparse's own line
            main(["letters", "--model-dir", str(folder), "--sources", str(sources), flag, value])
        assert exited.value.code == EXIT_BAD_INPUT and flag in capsys.readouterr().err
    assert (folder / MANIFEST).read_bytes() == before
    edit_manifest(folder, lambda m: m.update(format_version=7))
    assert main(["letters", "--model-dir", str(folder), "--sources", str(sources)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "format_version 7; rare letters need format 8 or later: export" in err
