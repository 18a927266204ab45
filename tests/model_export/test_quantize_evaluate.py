"""The int8 variant and the evaluation command, on the tiny test model."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from model_export.evaluate import evaluate, same_placeholders
from model_export.quantize import add_int8_variant
from service.model_folder import load_model_folder
from service.runtime import OnnxRuntime
from tests.factories import SENTENCES


@pytest.fixture(scope="module")
def quantized(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(shutil.copytree(model_dir, tmp_path_factory.mktemp("q") / "m"))
    add_int8_variant(folder)
    return folder


def test_int8_variant_is_listed_checksummed_and_runs_close_to_fp32(quantized: Path) -> None:
    folder = load_model_folder(quantized)
    assert set(folder.manifest.variants) == {"fp32", "int8"} and folder.manifest.default_variant == "fp32"
    assert folder.variant("int8").decoder_step.file == "decoder_step.int8.onnx"
    assert (quantized / "decoder_step.int8.onnx").stat().st_size < (quantized / "decoder_step.onnx").stat().st_size
    src_ids = np.array([[5, 9, 14, 3]], dtype=np.int64)
    mask = np.ones_like(src_ids, dtype=np.bool_)
    fp32, int8 = OnnxRuntime(folder, "fp32").encode(src_ids, mask), OnnxRuntime(folder, "int8").encode(src_ids, mask)
    assert np.abs(fp32.keys - int8.keys).max() < 0.25 * np.abs(fp32.keys).max()
    assert not np.array_equal(fp32.keys, int8.keys)  # really quantized


def test_make_default(quantized: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(quantized, tmp_path / "d"))
    add_int8_variant(folder, make_default=True)
    assert json.loads((folder / "manifest.json").read_text())["default_variant"] == "int8"


def test_placeholder_rule() -> None:
    assert same_placeholders("Delete %d files in %s?", "Supprimer %d fichiers dans %s ?")
    assert same_placeholders("{name} and {0}", "{0} et {name}")
    assert not same_placeholders("Delete %d files?", "Supprimer des fichiers ?")
    assert not same_placeholders("%1$s of %2$s", "%1$s sur %1$s")


def test_evaluate_reports_scores_placeholders_and_examples(model_dir: Path, tmp_path: Path) -> None:
    english, french = SENTENCES[:6], SENTENCES[6:12]
    (tmp_path / "test.en").write_text("\n".join(english) + "\n")
    (tmp_path / "test.fr").write_text("\n".join(french) + "\n")
    report = evaluate(model_dir, tmp_path, threads=1)
    assert report.sentences == 6 and report.placeholder_sentences == 2
    assert 0 <= report.bleu <= 100 and 0 <= report.chrf <= 100 and report.target_tokens > 0
    assert len(report.examples) == 6 and {"source", "reference", "translation", "chrf"} <= set(report.examples[0])
    perfect = evaluate(model_dir, tmp_path, limit=2, threads=1)
    assert perfect.sentences == 2
