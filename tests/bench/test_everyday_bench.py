"""bench.everyday translates its everyday sentences through the server's text path and prints each folder's BLEU,
chrF and confidences side by side."""

import re
from pathlib import Path

import pytest

from bench import everyday


def test_the_shipped_sentences_are_sixty_pairs_and_a_bad_line_is_named(tmp_path: Path) -> None:
    pairs = everyday.read_pairs()
    assert len(pairs) == 60 and len({english for english, _ in pairs}) == 60
    (tmp_path / "bad.tsv").write_text("One.\tUn.\nNo tab here\n", encoding="utf-8")
    with pytest.raises(ValueError, match="bad.tsv line 2: expected English<TAB>French"):
        everyday.read_pairs(tmp_path / "bad.tsv")


def test_each_folder_is_scored_and_the_first_ones_translations_shown(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sentences = tmp_path / "s.tsv"
    sentences.write_text("Open the file.\tOuvrir le fichier.\nSave the file.\tEnregistrer le fichier.\n")
    argv = ["--model", str(model_dir), "--model", str(model_dir), "--sentences", str(sentences), "--clients", "2"]
    assert everyday.main(argv) == 0
    out = capsys.readouterr().out
    scores = re.findall(r": 2 sentences, BLEU ([\d.]+), chrF ([\d.]+), mean confidence ([\d.]+), (\d) under 0.5", out)
    assert len(scores) == 2 and scores[0] == scores[1]  # the same folder twice: the same translations
    shown = re.findall(r"^  ([\d.]+)  (Open|Save) the file\.  ->  ", out, re.M)
    assert [word for _, word in shown] == ["Open", "Save"] and all(0 <= float(c) <= 1 for c, _ in shown)
