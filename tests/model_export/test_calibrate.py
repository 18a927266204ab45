"""Calibration: the Platt fit recovers known parameters, the calibration error is measured as defined, and
`calibrate` writes the manifest's `confidence` (format 13) and the card's section from a folder's own decoding of a
dev and a test split; bad input is one line on stderr."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from model_export.__main__ import EXIT_BAD_INPUT, main
from model_export.calibrate import fit_platt, reliability
from model_export.errors import ExportError
from model_export.evaluate import StaticBatches
from service.model.folder import FORMAT_VERSION, MANIFEST, load_model_folder, platt

SOURCES = ["Open the file.", "Save the document.", "Print", "Could not connect to the server.", "Show hidden files",
           "Delete the selected items?", "Settings saved.", "Quit", "Undo", "The disk is full."]  # fmt: skip


@pytest.mark.parametrize(("a", "b"), [(4.4, 2.7), (1.5, -0.5)])
def test_the_fit_recovers_the_parameters_that_drew_the_labels(a: float, b: float) -> None:
    rng = np.random.default_rng(0)
    m = rng.uniform(-3.0, 0.0, 40_000)
    good = rng.random(m.size) < 1 / (1 + np.exp(-(a * m + b)))
    fitted_a, fitted_b = fit_platt(m, good)
    assert fitted_a == pytest.approx(a, abs=0.15) and fitted_b == pytest.approx(b, abs=0.1)
    confidence = np.array([platt(x, fitted_a, fitted_b) for x in m])
    ece, table = reliability(confidence, good)
    assert ece < 0.02 and sum(row["sentences"] for row in table) == m.size


def test_one_label_alone_cannot_be_calibrated_against() -> None:
    with pytest.raises(ExportError, match="every dev sentence is labelled poor"):
        fit_platt(np.array([-1.0, -2.0]), np.array([False, False]))


def test_the_calibration_error_weighs_each_bins_gap_by_its_sentences() -> None:
    confidence = np.array([0.05, 0.05, 0.95, 0.95])  # two bins: 0.0-0.1 and 0.9-1.0
    good = np.array([False, True, True, True])
    ece, table = reliability(confidence, good)
    assert ece == pytest.approx(0.5 * abs(0.05 - 0.5) + 0.5 * abs(0.95 - 1.0))
    assert [(row["from"], row["sentences"], row["good"]) for row in table] == [(0.0, 2, 0.5), (0.9, 2, 1.0)]


def half_good_corpus(folder: Path, tmp_path: Path) -> Path:
    """dev and test: the folder's own translations as the references of half the sentences, a French sentence as
    the rest's."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    own, _, _ = StaticBatches(folder, None, 1).translate(SOURCES, 1, 4)
    references = [t if i % 2 else "Le chat dort sur le tapis rouge." for i, t in enumerate(own)]
    for split in ("dev", "test"):
        (corpus / f"{split}.en").write_text("\n".join(SOURCES) + "\n")
        (corpus / f"{split}.fr").write_text("\n".join(references) + "\n")
    return corpus


def test_the_fit_can_pool_several_dev_sets(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = Path(shutil.copytree(model_dir, tmp_path / "folder"))
    corpus = half_good_corpus(folder, tmp_path)
    arguments = ["calibrate", "--model-dir", str(folder), "--corpus", str(corpus), "--threads", "1"]
    assert main([*arguments, "--splits", "dev", "test", "--fit-splits", "2"]) == 0
    fitted = load_model_folder(folder).manifest.confidence.fitted_on
    assert fitted["split"] == "dev+test" and fitted["sentences"] == 20 and fitted["good"] == 10
    capsys.readouterr()
    assert main([*arguments, "--splits", "dev", "--fit-splits", "2"]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.strip() == "error: --fit-splits must be 1 to 1 (the number of --splits), got 2"


def test_calibrate_writes_the_manifests_confidence_and_the_cards_section(model_dir: Path, tmp_path: Path) -> None:
    """The tiny random model's own translations as the references of half the sentences (good: chrF 100) and a
    French sentence as the rest's (poor): a fit the server then reads, and a card's section replaced, not added."""
    folder = Path(shutil.copytree(model_dir, tmp_path / "folder"))
    (folder / "README.md").write_text("# tiny\n\n## Evaluation\n\n## Data\n\nkept\n")
    corpus = half_good_corpus(folder, tmp_path)
    report = tmp_path / "calibration.json"
    arguments = ["calibrate", "--model-dir", str(folder), "--corpus", str(corpus), "--threads", "1"]
    arguments += ["--json", str(report)]
    assert main(arguments) == 0
    assert main(arguments) == 0  # again: the section replaced
    manifest = load_model_folder(folder).manifest
    assert manifest.format_version == FORMAT_VERSION == 13 and manifest.confidence is not None
    written = json.loads(report.read_text())
    assert manifest.confidence.a == pytest.approx(written["a"], abs=1e-5)
    assert [s["name"] for s in written["splits"]] == ["dev", "test"] and written["splits"][0]["good"] == 5
    card = (folder / "README.md").read_text()
    assert card.count("## Confidence and guards") == 1 and card.endswith("## Data\n\nkept\n")
    assert card.index("## Evaluation") < card.index("## Confidence and guards") < card.index("## Data")
    assert set(json.loads((folder / MANIFEST).read_text())["files"]) == set(manifest.files)  # no graph touched


def test_calibrate_without_a_split_is_one_line(model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    arguments = ["calibrate", "--model-dir", str(model_dir), "--corpus", str(tmp_path), "--threads", "1"]
    assert main(arguments) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.strip() == f"error: corpus file not found: {tmp_path / 'dev.en'}"
