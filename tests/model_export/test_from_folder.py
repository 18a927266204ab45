"""from-folder: a model folder's fp32 graphs give back the checkpoint they were exported from, every weight
within 1e-6 (relative) for every kind of config, a model that computes what the original computes; a folder
without its fp32 graphs, or whose graphs lack a weight, or of a format too old, is one line on stderr. The
shipped default model rebuilds too."""

import json
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from model_export import checkpoint as ckpt_io
from model_export.__main__ import EXIT_BAD_INPUT, main
from model_export.export import export_folder, file_entries, write_manifest
from model_export.from_folder import checkpoint_from_folder
from model_export.verify import random_sources, teacher_forced_diff, verify_folder
from service.engine.runtime import OnnxRuntime
from service.model.folder import MANIFEST, load_model_folder
from tests.factories import tiny_checkpoint

# tiny_checkpoint's own defaults: post-norm, relu, shared embeddings, untied output with a logits bias, attention
# biases; d_model 32 over 4 heads (head_dim 8: 1/sqrt(8) is not a power of two, so undoing it rounds)
CONFIGS = {
    "post-norm, logits bias": {},
    "pre-norm, gelu, no attention bias": {"norm_position": "pre", "activation": "gelu", "attention_bias": False},
    "tied output, swish": {"tie_output": True, "output_bias": False, "activation": "swish", "layer_norm_eps": 1e-5},
    "separate vocabularies, 2 heads": {"share_embeddings": False, "tgt_vocab_size": 90, "n_heads": 2},
}
DEFAULT = Path(__file__).resolve().parents[2] / "models" / "en-fr"


@pytest.fixture(scope="module", params=list(CONFIGS))
def exported(request: pytest.FixtureRequest, spm_model: bytes, tmp_path_factory: pytest.TempPathFactory):
    original = tiny_checkpoint(spm_model, **CONFIGS[request.param])
    original.tokenizer = replace(original.tokenizer, rare_letters="èé")  # written by export, read back
    folder = export_folder(original, tmp_path_factory.mktemp("from-folder") / "m", "tiny", "0.0.3")
    return original, folder, checkpoint_from_folder(folder)


def test_every_weight_comes_back(exported) -> None:
    original, _, rebuilt = exported
    assert rebuilt.config == original.config
    assert set(rebuilt.state_dict) == set(original.state_dict)
    for name, tensor in original.state_dict.items():
        torch.testing.assert_close(rebuilt.state_dict[name], tensor, rtol=1e-6, atol=0.0, msg=name)
    rebuilt.build_model()  # strict


def test_tokenizer_languages_and_provenance(exported) -> None:
    original, folder, rebuilt = exported
    assert rebuilt.tokenizer == original.tokenizer and rebuilt.tokenizer.rare_letters == "èé"
    assert load_model_folder(folder).manifest.tokenizer.rare_letters == "èé"
    assert (rebuilt.source_language, rebuilt.target_languages) == (original.source_language, original.target_languages)
    assert rebuilt.provenance["origin"] == original.provenance["origin"]  # the manifest's own provenance kept
    rebuilt_from = rebuilt.provenance["rebuilt_from"]
    assert (rebuilt_from["folder"], rebuilt_from["version"], rebuilt_from["path"]) == ("tiny", "0.0.3", str(folder))
    assert "exported_at" in rebuilt_from and "exported_at" not in rebuilt.provenance
    assert rebuilt.training == {}


def test_the_rebuilt_model_computes_what_the_original_does(exported, tmp_path: Path) -> None:
    original, folder, rebuilt = exported
    src_ids, src_mask = random_sources(original.config, 3, 7, np.random.default_rng(2))
    tgt = torch.randint(4, original.config.tgt_vocab_size, (3, 5))
    with torch.no_grad():
        before, after = (c.build_model()(src_ids, src_mask, tgt) for c in (original, rebuilt))
    torch.testing.assert_close(after, before, rtol=0.0, atol=1e-5)
    assert verify_folder(folder, rebuilt).ok  # the original's folder, against the rebuilt checkpoint
    again = export_folder(rebuilt, tmp_path / "again", "tiny", "0.0.3")
    report = verify_folder(again, rebuilt)  # and the rebuilt checkpoint's own folder
    assert report.ok and report.max_abs_diff < 1e-4


def test_cli_writes_a_checkpoint(model_dir: Path, checkpoint, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "ck.pt"
    assert main(["from-folder", "--model-dir", str(model_dir), "--out", str(out)]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    loaded = ckpt_io.load(out)
    assert loaded.config == checkpoint.config and loaded.provenance["name"] == "tiny-en-fr"


def _drop_initializer(folder: Path) -> None:
    """encoder.onnx without the first encoder layer's FFN bias, the manifest's checksums updated to match."""
    graph = onnx.load(folder / "encoder.onnx")
    kept = [i for i in graph.graph.initializer if i.name != "encoder.0.w_1.bias"]
    del graph.graph.initializer[:]
    graph.graph.initializer.extend(kept)
    onnx.save(graph, folder / "encoder.onnx")
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"].update(file_entries(folder, ["encoder.onnx"]))
    write_manifest(folder, manifest)


def _edit_manifest(folder: Path, change: Callable[[dict], object]) -> None:
    manifest = json.loads((folder / MANIFEST).read_text())
    change(manifest)
    write_manifest(folder, manifest)


def test_a_format_version_written_as_the_server_reads_it_is_read(model_dir: Path, tmp_path: Path) -> None:
    """The server's loader reads "8" and 8.0 as 8: so does from-folder."""
    for written in (str, float):
        folder = Path(shutil.copytree(model_dir, tmp_path / written.__name__))
        _edit_manifest(folder, lambda m, w=written: m.update(format_version=w(m["format_version"])))
        assert main(["from-folder", "--model-dir", str(folder), "--out", str(folder.with_suffix(".pt"))]) == 0


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: (f / "encoder.onnx").unlink(), "encoder.onnx: missing (listed in manifest.json)"),
        (lambda f: (f / "decoder_step.onnx").write_bytes(b"corrupt"), "decoder_step.onnx: 7 bytes, the manifest says"),
        (_drop_initializer, "encoder.onnx: no initializer 'encoder.0.w_1.bias', a weight of the config"),
        (lambda f: _edit_manifest(f, lambda m: m["variants"].pop("fp32")), "is not among variants"),
        (
            lambda f: _edit_manifest(f, lambda m: m.update(format_version=2)),
            "format_version 2 is older than 3, the oldest this server reads",
        ),
        (lambda f: (f / MANIFEST).unlink(), "is not a model folder"),
        (lambda f: _edit_manifest(f, lambda m: m.update(variants="fp32")), "variants: Input should be a valid dict"),
        (lambda f: _edit_manifest(f, lambda m: m["variants"]["fp32"].pop("encoder")), "variants.fp32.encoder: Field"),
        (lambda f: _edit_manifest(f, lambda m: m.update(format_version=True)), "must be a whole number, not true"),
    ],
    ids=[
        "no encoder.onnx",
        "truncated graph",
        "missing weight",
        "is not among variants",
        "format 2",
        "no manifest",
        "variants a string",
        "no encoder entry",
        "format True",
    ],
)
def test_a_folder_it_cannot_read_is_one_line(
    damage: Callable[[Path], None], message: str, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = Path(shutil.copytree(model_dir, tmp_path / "f"))
    damage(folder)
    assert main(["from-folder", "--model-dir", str(folder), "--out", str(tmp_path / "ck.pt")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert message in err
    assert not (tmp_path / "ck.pt").exists()


def test_the_shipped_default_model_rebuilds() -> None:
    rebuilt = checkpoint_from_folder(DEFAULT)
    model = rebuilt.build_model()  # strict
    assert sum(p.numel() for p in model.parameters()) == 8_367_360
    assert rebuilt.provenance["rebuilt_from"]["folder"] == "en-fr" and "averaged" in rebuilt.provenance
    runtime = OnnxRuntime(load_model_folder(DEFAULT), "fp32")
    assert teacher_forced_diff(model, runtime, (2, 6, 4), seed=0) < 1e-4
