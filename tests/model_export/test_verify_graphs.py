"""verify runs every step graph of each variant it checks (step, ragged, one-row) against PyTorch and names the one
that fails; a nan fails it; the tokenizer must be the checkpoint's; an int8 default variant passes on its own
tolerance while --tolerance still holds fp32 graphs to theirs."""

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

from model_export import reference
from model_export.__main__ import EXIT_BAD_INPUT, main
from model_export.checkpoint import Checkpoint, load
from model_export.errors import ExportError
from model_export.export import file_entries, write_manifest
from model_export.verify import random_sources, verify_folder
from service.errors import ModelFolderError
from service.model.folder import MANIFEST
from tests.factories import tiny_checkpoint, train_sentencepiece


def alter_weight(folder: Path, graph: str, name: str, change: Callable[[np.ndarray], None]) -> None:
    """One initializer of one graph changed in place, the manifest's checksum updated to match (so only the
    comparison with PyTorch can tell)."""
    model = onnx.load(folder / graph)
    [tensor] = [t for t in model.graph.initializer if t.name == name]
    array = numpy_helper.to_array(tensor).copy()
    change(array)
    tensor.CopyFrom(numpy_helper.from_array(array, name))
    onnx.save(model, folder / graph)
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"].update(file_entries(folder, [graph]))
    write_manifest(folder, manifest)


def shifted(array: np.ndarray) -> None:
    array += 0.5 * np.arange(array.size, dtype=array.dtype).reshape(array.shape)


def nan_at_10(array: np.ndarray) -> None:
    array.reshape(-1)[10] = np.nan


@pytest.mark.parametrize(
    ("graph", "weight", "change"),
    [
        ("decoder_step_ragged.onnx", "generator.bias", shifted),
        ("decoder_step_ragged.onnx", "generator.bias", nan_at_10),
        ("decoder_step.onnx", "generator.bias", nan_at_10),
    ],
    ids=["ragged shifted", "ragged nan", "step nan"],
)
def test_a_broken_step_graph_fails_and_is_named(
    graph: str,
    weight: str,
    change: Callable[[np.ndarray], None],
    model_dir: Path,
    checkpoint_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = Path(shutil.copytree(model_dir, tmp_path / "f"))
    alter_weight(folder, graph, weight, change)
    assert main(["verify", "--checkpoint", str(checkpoint_path), "--model-dir", str(folder)]) == EXIT_BAD_INPUT
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1
    assert f"FAILED: fp32 {graph.removesuffix('.onnx')};" in error
    if change is nan_at_10:
        assert "= nan (tolerance" in error  # not the 0.00e+00 that max(worst, nan) printed


def test_a_nan_is_the_reports_difference(model_dir: Path, checkpoint: Checkpoint, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(model_dir, tmp_path / "f"))
    alter_weight(folder, "decoder_step.onnx", "generator.bias", nan_at_10)
    report = verify_folder(folder, checkpoint)
    assert math.isnan(report.max_abs_diff) and not report.ok
    assert report.failed() == ["fp32 decoder_step"]


def test_every_step_graph_of_every_variant_is_run(quantized: Path, checkpoint: Checkpoint) -> None:
    report = verify_folder(quantized, checkpoint)
    checked = [(g.variant, g.graph) for g in report.graphs]
    assert checked == [
        ("fp32", "decoder_step"), ("fp32", "decoder_step_ragged"),
        ("int8", "decoder_step"), ("int8", "decoder_step_ragged"), ("int8", "decoder_step_single"),
        ("int8", "decoder_step_dense"),
    ]  # fmt: skip
    assert report.ok and report.max_abs_diff < 1e-4 and report.failed() == []
    int8 = [g for g in report.graphs if g.variant == "int8"]
    assert all(g.tolerance is not None and 1e-4 < g.max_abs_diff <= g.tolerance for g in int8)  # really quantized
    fp32 = verify_folder(quantized, checkpoint, "fp32")
    assert [g.graph for g in fp32.graphs] == ["decoder_step", "decoder_step_ragged"]


def test_a_broken_dense_step_graph_fails_and_is_named(quantized: Path, checkpoint: Checkpoint, tmp_path: Path) -> None:
    """The dense step graph (format 10) runs in a runtime of its own, pinned to it: a fault in it is
    its own, not the step graph's."""
    folder = Path(shutil.copytree(quantized, tmp_path / "q"))
    alter_weight(folder, "decoder_step_dense.int8.onnx", "generator.bias", shifted)
    report = verify_folder(folder, checkpoint, "int8")
    assert report.failed() == ["int8 decoder_step_dense"]


def test_a_broken_one_row_graph_fails_and_is_named(quantized: Path, checkpoint: Checkpoint, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(quantized, tmp_path / "q"))
    alter_weight(folder, "decoder_step_single.int8.onnx", "generator.bias", shifted)
    report = verify_folder(folder, checkpoint, "int8")
    assert report.failed() == ["int8 decoder_step_single"] and not report.ok


def test_an_int8_default_variant_passes_a_plain_verify(
    quantized: Path, checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After `quantize --make-default`: int8 is held to its own tolerance and its ids to close_decodings, fp32
    still to --tolerance (whose default is 1e-4), which keeps overriding it."""
    folder = Path(shutil.copytree(quantized, tmp_path / "q"))
    manifest = json.loads((folder / MANIFEST).read_text())
    write_manifest(folder, {**manifest, "default_variant": "int8"})
    args = ["verify", "--checkpoint", str(checkpoint_path), "--model-dir", str(folder)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("6 step graphs reproduce the checkpoint") and "int8 decoder_step_single: " in out
    assert "int8 decoder_step_dense: " in out
    assert main([*args, "--variant", "int8"]) == 0
    assert main([*args, "--tolerance", "1e-12"]) == EXIT_BAD_INPUT
    capsys.readouterr()
    assert main([*args, "--variant", "int8", "--tolerance", "1e-3"]) == EXIT_BAD_INPUT  # int8's own 1.0 overridden
    assert "(tolerance 0.001, int8's)" in capsys.readouterr().err


def test_a_replaced_tokenizer_fails(model_dir: Path, checkpoint_path: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(model_dir, tmp_path / "f"))
    (folder / "spm.model").write_bytes(train_sentencepiece(vocab_size=60))
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["files"].update(file_entries(folder, ["spm.model"]))
    write_manifest(folder, manifest)
    with pytest.raises(ExportError, match=r"spm\.model: not the checkpoint's spm\.model \(the bytes differ\)"):
        verify_folder(folder, load(checkpoint_path))


def test_more_pieces_than_the_vocabulary_fails(spm_model: bytes, model_dir: Path, tmp_path: Path) -> None:
    """A folder whose manifest was given fewer ids than its tokenizer has pieces (export refuses to write one), checked
    against a checkpoint of that config: only the piece count can tell."""
    folder = Path(shutil.copytree(model_dir, tmp_path / "f"))
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["config"].update(src_vocab_size=64, tgt_vocab_size=64)
    write_manifest(folder, manifest)
    small = tiny_checkpoint(spm_model, src_vocab_size=64, tgt_vocab_size=64)
    with pytest.raises(ModelFolderError, match=r"spm\.model: 96 pieces, more than the model's 64 source ids"):
        verify_folder(folder, small)


def test_a_one_row_graph_of_4_bits_is_held_to_its_own_tolerance(
    model_dir: Path, checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`quantize --single-row-bits 4`: the one-row graph's products over 4-bit weights in blocks of 32, the other
    int8 graphs as at 8 bits; verify reads the bits from the graph and holds it to 4 bits' tolerance (2.5), not to
    8 bits' (1.0), which it exceeds on the tiny model."""
    folder = Path(shutil.copytree(model_dir, tmp_path / "q4"))
    assert main(["quantize", "--model-dir", str(folder), "--single-row-bits", "4"]) == 0
    single = onnx.load(folder / "decoder_step_single.int8.onnx", load_external_data=False)
    products = [n for n in single.graph.node if n.op_type == "MatMulNBits"]
    assert products and all(
        {a.name: a.i for a in n.attribute if a.name in ("bits", "block_size")} == {"bits": 4, "block_size": 32}
        for n in products
    )
    args = ["verify", "--checkpoint", str(checkpoint_path), "--model-dir", str(folder), "--variant", "int8"]
    assert main(args) == 0
    assert "int8 decoder_step_single: " in capsys.readouterr().out
    assert main([*args, "--tolerance", "1.0"]) == EXIT_BAD_INPUT  # 8 bits' tolerance: too tight for 4
    assert "int8 decoder_step_single FAILED" in capsys.readouterr().err


def test_the_shortlist_step_graphs_are_held_to_the_reference_over_each_sentences_candidates(
    shortlisted: Path, checkpoint: Checkpoint, tmp_path: Path
) -> None:
    """Each variant's shortlist step graph is run, pinned, against PyTorch restricted to each sentence's candidates
    (and normalised over them): fp32 to fp32's tolerance with ids equal, int8 to its own; a fault in it is its own."""
    folder = Path(shutil.copytree(shortlisted, tmp_path / "s"))
    report = verify_folder(folder, checkpoint)
    shortlist = [g for g in report.graphs if g.graph == "decoder_step_shortlist"]
    assert [g.variant for g in shortlist] == ["fp32", "int8"]
    assert report.ok and report.failed() == [], report.summary(1e-4)
    assert shortlist[0].max_abs_diff < 1e-4 and shortlist[0].greedy_equal and shortlist[0].beam_equal
    alter_weight(folder, "decoder_step_shortlist.onnx", "generator.bias", shifted)
    assert verify_folder(folder, checkpoint, "fp32").failed() == ["fp32 decoder_step_shortlist"]


def test_the_reference_restricted_to_candidates_chooses_only_among_them(checkpoint: Checkpoint) -> None:
    """reference.restricted renormalises over each row's allowed ids; greedy and beam search restricted to a set
    emit only its ids, and a set of every id changes nothing."""
    model = checkpoint.build_model()
    cfg = model.cfg
    src_ids, src_mask = random_sources(cfg, 3, 7, np.random.default_rng(1))
    allowed = torch.zeros((3, cfg.tgt_vocab_size), dtype=torch.bool)
    allowed[:, [cfg.eos_id, *range(20, 30)]] = True
    log_probs = torch.log_softmax(torch.randn(3, cfg.tgt_vocab_size), dim=-1)
    kept = reference.restricted(log_probs, allowed)
    assert torch.allclose(kept.exp().sum(dim=-1), torch.ones(3)) and torch.isinf(kept[~allowed]).all()
    for decoded in (
        reference.greedy(model, src_ids, src_mask, 6, allowed),
        reference.beam_search(model, src_ids, src_mask, 3, 6, allowed=allowed),
    ):
        assert all(set(ids) <= {cfg.eos_id, *range(20, 30)} for ids in decoded)
    every = torch.ones_like(allowed)
    assert reference.greedy(model, src_ids, src_mask, 6, every) == reference.greedy(model, src_ids, src_mask, 6)
