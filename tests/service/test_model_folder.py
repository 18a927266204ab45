"""A model folder that is missing, truncated, altered or inconsistent is refused with a message that
names the file and the problem."""

import json
import math
import shutil
from pathlib import Path

import pytest

from service.engine.runtime import OnnxRuntime
from service.errors import ModelFolderError
from service.model.folder import FORMAT_VERSION, MANIFEST, load_model_folder


@pytest.fixture()
def folder(model_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model_dir, tmp_path / "copy"))


def edit_manifest(folder: Path, change) -> None:  # noqa: ANN001
    manifest = json.loads((folder / MANIFEST).read_text())
    change(manifest)
    (folder / MANIFEST).write_text(json.dumps(manifest))


def test_a_good_folder_loads(model_dir: Path) -> None:
    folder = load_model_folder(model_dir)
    assert folder.manifest.name == "tiny-en-fr"
    assert folder.manifest.default_variant == "fp32"
    assert folder.variant().decoder_step.one("log_probs") == "log_probs"
    assert set(folder.manifest.files) == {"encoder.onnx", "decoder_step.onnx", "decoder_step_ragged.onnx", "spm.model"}


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ModelFolderError, match="model folder not found"):
        load_model_folder(tmp_path / "nope")


def test_missing_manifest(folder: Path) -> None:
    (folder / MANIFEST).unlink()
    with pytest.raises(ModelFolderError, match="manifest.json: missing: .* is not a model folder"):
        load_model_folder(folder)


def test_manifest_not_json(folder: Path) -> None:
    (folder / MANIFEST).write_text("{not json")
    with pytest.raises(ModelFolderError, match="not valid JSON"):
        load_model_folder(folder)


def test_missing_graph(folder: Path) -> None:
    (folder / "decoder_step.onnx").unlink()
    with pytest.raises(ModelFolderError, match=r"decoder_step.onnx: missing \(listed in manifest.json\)"):
        load_model_folder(folder)


def test_truncated_graph(folder: Path) -> None:
    data = (folder / "encoder.onnx").read_bytes()
    (folder / "encoder.onnx").write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFolderError, match=r"encoder.onnx: \d+ bytes, the manifest says \d+ \(truncated"):
        load_model_folder(folder)


def test_altered_graph(folder: Path) -> None:
    data = bytearray((folder / "encoder.onnx").read_bytes())
    data[-10] ^= 0xFF
    (folder / "encoder.onnx").write_bytes(bytes(data))
    with pytest.raises(ModelFolderError, match="encoder.onnx: checksum mismatch"):
        load_model_folder(folder)


def test_manifest_field_missing(folder: Path) -> None:
    edit_manifest(folder, lambda m: m.pop("special_ids"))
    with pytest.raises(ModelFolderError, match="special_ids: Field required"):
        load_model_folder(folder)


def test_a_manifest_without_a_target_language_is_refused(folder: Path) -> None:
    """A folder with no target (or an empty source) language could translate nothing: refused at load, not an
    IndexError in `evaluate` or a model no request can pick."""
    edit_manifest(folder, lambda m: m.update(target_languages=[]))
    with pytest.raises(ModelFolderError, match="target_languages: List should have at least 1 item"):
        load_model_folder(folder)
    edit_manifest(folder, lambda m: m.update(target_languages=["fr"], source_language=""))
    with pytest.raises(ModelFolderError, match="source_language: String should have at least 1 character"):
        load_model_folder(folder)


def test_rare_letters_must_be_letters(folder: Path) -> None:
    """format 9's `tokenizer.rare_letters`: a digit or a mark there would mask what the model reads well."""
    edit_manifest(folder, lambda m: m["tokenizer"].update(rare_letters="éø1 -"))
    with pytest.raises(ModelFolderError, match="rare_letters holds characters that are not letters: ' -1'"):
        load_model_folder(folder)
    edit_manifest(folder, lambda m: m["tokenizer"].update(rare_letters="éø"))
    assert load_model_folder(folder).manifest.tokenizer.rare_letters == "éø"


CALIBRATION = {"method": "platt", "feature": "mean_token_logprob", "a": 4.0, "b": 2.0, "label": "chrF >= 50"}


def test_a_manifest_without_calibration_gives_the_uncalibrated_confidence(model_dir: Path) -> None:
    """No `confidence` (a folder exported before format 13, or never calibrated): exp of the mean log-probability."""
    manifest = load_model_folder(model_dir).manifest
    assert manifest.confidence is None
    assert manifest.confidence_of(math.log(0.3)) == pytest.approx(0.3)
    assert manifest.confidence_of(0.0) == 1.0


def test_a_calibrated_manifest_gives_its_sigmoid(folder: Path) -> None:
    """format 13's `confidence`: sigmoid(a m + b), in [0, 1] at either end without overflow."""
    edit_manifest(folder, lambda m: m.update(format_version=13, confidence=CALIBRATION))
    manifest = load_model_folder(folder).manifest
    assert manifest.confidence is not None and manifest.confidence.label == "chrF >= 50"
    assert manifest.confidence_of(-0.5) == pytest.approx(0.5)  # 4 (-0.5) + 2 = 0
    assert manifest.confidence_of(-1.0) == pytest.approx(1 / (1 + math.exp(2.0)))
    assert manifest.confidence_of(-1e6) == 0.0 and manifest.confidence_of(1e6) == 1.0


def test_a_calibration_is_a_field_of_format_13(folder: Path) -> None:
    """A format 12 manifest with the field is refused (a server of format 12 would refuse it too, as an extra
    field: format 13 tells it to run a newer server instead)."""
    edit_manifest(folder, lambda m: m.update(format_version=12, confidence=CALIBRATION))
    with pytest.raises(ModelFolderError, match="confidence is a field of format 13, not of format_version 12"):
        load_model_folder(folder)
    edit_manifest(folder, lambda m: m.update(format_version=13, confidence={**CALIBRATION, "method": "isotonic"}))
    with pytest.raises(ModelFolderError, match="confidence.method: Input should be 'platt'"):
        load_model_folder(folder)


def test_newer_format_version(folder: Path) -> None:
    edit_manifest(folder, lambda m: m.update(format_version=FORMAT_VERSION + 1))
    newer = f"format_version {FORMAT_VERSION + 1} is newer than {FORMAT_VERSION}.*run a server as new"
    with pytest.raises(ModelFolderError, match=newer):
        load_model_folder(folder)


def test_older_format_version_says_to_export_again(folder: Path) -> None:
    edit_manifest(folder, lambda m: m.update(format_version=2))  # step keys/values returned for the caller to append
    with pytest.raises(ModelFolderError, match="format_version 2 is older than 3, the oldest.*export the model folder"):
        load_model_folder(folder)


def test_file_outside_the_folder(folder: Path) -> None:
    def escape(m: dict) -> None:
        m["files"]["../secret"] = {"sha256": "0" * 64, "bytes": 1}

    edit_manifest(folder, escape)
    with pytest.raises(ModelFolderError, match="leaves the model folder"):
        load_model_folder(folder)


def test_manifest_that_does_not_match_its_graphs(folder: Path) -> None:
    def rename(m: dict) -> None:
        m["variants"]["fp32"]["decoder_step"]["inputs"][0]["name"] = "token_ids"

    edit_manifest(folder, rename)
    with pytest.raises(ModelFolderError, match=r"decoder_step.onnx: inputs do not match the manifest .*token_ids"):
        OnnxRuntime(load_model_folder(folder))


def test_manifest_dtype_that_does_not_match(folder: Path) -> None:
    def retype(m: dict) -> None:
        m["variants"]["fp32"]["encoder"]["inputs"][1]["dtype"] = "float32"

    edit_manifest(folder, retype)
    with pytest.raises(ModelFolderError, match="input src_mask is tensor\\(bool\\) .* float32 .* in the manifest"):
        OnnxRuntime(load_model_folder(folder))


def test_graph_file_that_is_not_onnx(folder: Path) -> None:
    (folder / "encoder.onnx").write_bytes(b"garbage")

    def rehash(m: dict) -> None:
        import hashlib

        m["files"]["encoder.onnx"] = {"sha256": hashlib.sha256(b"garbage").hexdigest(), "bytes": 7}

    edit_manifest(folder, rehash)
    with pytest.raises(ModelFolderError, match="encoder.onnx: ONNX Runtime cannot load it"):
        OnnxRuntime(load_model_folder(folder))
