"""bench.names translates sentences whose copied name is written with rare letters three ways and prints how many
names came back as written, with what each way scored and cost."""

import random
import re
from pathlib import Path

import pytest

from bench import names
from service.metrics import Metrics
from service.settings import Settings
from service.translation.registry import load_translators

SOURCES = "Start Konsole in fullscreen mode.\nOpen the file.\nAsk Bob to call Bob.\nThe Okular viewer, now.\n"
REFERENCES = "Démarrer Konsole en plein écran.\nOuvrir le fichier.\nDemander à Bob d'appeler Bob.\nOkular, là.\n"


def test_a_name_the_reference_copied_once_is_renamed_in_both() -> None:
    pairs = names.named_pairs(SOURCES.splitlines(), REFERENCES.splitlines())
    assert [word for _, _, word in pairs] == ["Konsole", "Okular"]  # Bob twice; "Open" begins its sentence
    renamed = names.renamed(pairs, random.Random(0))
    for (source, reference, name), (old_source, old_reference, word) in zip(renamed, pairs, strict=True):
        assert name in names.NAMES and not name.isascii()
        assert source == old_source.replace(word, name) and reference == old_reference.replace(word, name)


def test_the_three_ways_are_counted_scored_and_timed(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for split in ("test", "dev"):
        (tmp_path / f"{split}.en").write_text(SOURCES)
        (tmp_path / f"{split}.fr").write_text(REFERENCES)
    assert names.main(["--model", str(model_dir), "--corpus", str(tmp_path), "--clients", "2"]) == 0
    out = capsys.readouterr().out
    assert "4 test and dev sentences with a name the reference copied" in out and "0 rare letters" in out
    rows = re.findall(r"^\| ([a-zA-Z' (),]+) \| (\d+) of 4 \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \|$", out, re.M)
    ways = ["rare letters masked (the server's way)", "rare letters read by the model (before)"]
    assert [r[0] for r in rows] == [*ways, "the names as they were (ASCII)", "the ASCII names, a glossary keeping them"]
    assert all(0 <= int(intact) <= 4 and float(seconds) > 0 for _, intact, _, _, seconds in rows)
    terms = re.findall(r"^\| (\w+) -> (\w+) \| (\d+) \| (\d+) \|$", out, re.M)
    held = [("file", "document", 2), ("files", "documents", 0), ("window", "panneau", 0), ("server", "serveur", 0)]
    assert [(t, d, int(n)) for t, d, n, _ in terms] == held  # "Open the file." in test and in dev
    assert all(0 <= int(kept) <= int(n) for _, _, n, kept in terms)


def test_the_letters_are_read_within_the_block_only(model_dir: Path) -> None:
    settings = Settings(models_dir=model_dir.parent, models=[model_dir.name], engine_process=False)
    [translator] = load_translators(settings, Metrics())
    kept = translator.tokenizer = names.replace(translator.tokenizer, rare_letters=frozenset("é"))
    assert not kept.readable("é")
    with names.letters_read(translator):
        assert translator.tokenizer.readable("é") and not translator.tokenizer.rare_letters
    assert translator.tokenizer is kept
