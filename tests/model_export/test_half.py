"""The fp16 variant (`model_export half`): float16 graphs and cache, float32 log-probs, checked against the PyTorch
model in float32 (an independent reference). On a CPU here; tests/service/test_gpu.py runs it on CUDA."""

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from model_export.__main__ import main
from model_export.half import add_fp16_variant
from model_export.onnx_graphs import names_read
from model_export.verify import same_decodings, teacher_forced_diff
from service.engine.runtime import OnnxRuntime
from service.errors import ModelFolderError
from service.model.folder import load_model_folder

FP16_TOLERANCE = 2e-2  # |log p| against float32 PyTorch: float16 keeps ~3 significant digits per activation


@pytest.fixture(scope="module")
def halved(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = Path(shutil.copytree(model_dir, tmp_path_factory.mktemp("h") / "m"))
    assert main(["half", "--model-dir", str(folder)]) == 0
    return folder


def test_the_variant_declares_float16_tensors_except_the_distribution(halved: Path) -> None:
    folder = load_model_folder(halved)
    assert set(folder.manifest.variants) == {"fp32", "fp16"} and folder.manifest.default_variant == "fp32"
    variant = folder.variant("fp16")
    dtypes = {s.role: s.dtype for s in variant.decoder_step.inputs + variant.decoder_step.outputs}
    assert dtypes["self_key"] == dtypes["present_value"] == dtypes["cross_key"] == "float16"
    assert dtypes["log_probs"] == dtypes["top_log_probs"] == "float32" and dtypes["top_ids"] == "int64"
    assert {s.dtype for s in variant.encoder.outputs} == {"float16"}
    for graph in (variant.encoder, variant.decoder_step):
        model = onnx.load(halved / graph.file)
        kinds = {t.data_type for t in model.graph.initializer}
        assert onnx.TensorProto.FLOAT not in kinds and onnx.TensorProto.FLOAT16 in kinds  # every weight halved
        assert graph.file in folder.manifest.files  # checksummed
    assert (halved / variant.decoder_step.file).stat().st_size < 0.6 * (halved / "decoder_step.onnx").stat().st_size


def test_the_runtime_keeps_a_float16_cache_and_matches_pytorch(halved: Path, checkpoint) -> None:
    runtime = OnnxRuntime(load_model_folder(halved), "fp16")
    cache = runtime.new_cache()
    assert runtime.cache_dtype == "float16" and cache.self_keys[0].dtype == np.float16 and not cache.on_gpu
    model = checkpoint.build_model()
    for seed, shape in enumerate([(1, 1, 3), (4, 11, 5), (3, 6, 40)]):  # 40 steps: the cache grows twice
        assert teacher_forced_diff(model, runtime, shape, seed) < FP16_TOLERANCE
    assert same_decodings(model, runtime, 1, seed=0) and same_decodings(model, runtime, 4, seed=0)


def test_the_float16_step_always_normalises(halved: Path) -> None:
    """The fp32 step graph's If over `log_softmax` (format 8) is unfolded into its normalising branch and the input
    dropped: on GPUs the If's condition would be read in host memory. A step asked not to normalise still gives
    log-probs there, as the fp32 variant's asked to does."""
    folder = load_model_folder(halved)
    step = folder.variant("fp16").decoder_step
    assert not step.named("log_softmax") and folder.variant("fp32").decoder_step.named("log_softmax")
    graph = onnx.load(halved / step.file).graph
    ops = [node.op_type for node in graph.node]
    assert "If" not in ops and ops.count("LogSoftmax") == 1  # its top-K (two-stage, several TopK) reads the logits
    assert {t.name for t in graph.initializer} <= names_read(list(graph.node))  # the other branch's constants gone
    half, full = OnnxRuntime(folder, "fp16"), OnnxRuntime(folder, "fp32")
    ids, mask = np.arange(4, 10)[None], np.ones((1, 6), np.bool_)
    outputs = []
    for runtime, log_softmax in ((half, False), (full, True)):
        cache = runtime.new_cache()
        memory = runtime.encode(ids, mask)
        cache.add(memory.keys, memory.values, mask)
        outputs.append(runtime.step(np.array([5]), cache, candidates=4, log_softmax=log_softmax))
    np.testing.assert_allclose(outputs[0].top_log_probs, outputs[1].top_log_probs, atol=FP16_TOLERANCE)


def test_the_masking_constant_stays_finite(halved: Path) -> None:
    """The fp32 encoder masks with float32's minimum, which is -inf in float16: it must become -65504. (The step
    graph's cross-attention takes the source mask as MultiHeadAttention's key mask: no such constant.)"""
    variant = load_model_folder(halved).variant("fp16")
    lowest = {}
    for graph in (variant.encoder, variant.decoder_step):
        model = onnx.load(halved / graph.file)
        values = np.concatenate([onnx.numpy_helper.to_array(t).ravel() for t in model.graph.initializer
                                 if t.data_type == onnx.TensorProto.FLOAT16])
        assert np.isfinite(values).all()
        lowest[graph.file] = values.min()
    assert lowest[variant.encoder.file] == -65504


def test_make_default_and_a_folder_without_fp32(halved: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(halved, tmp_path / "d"))
    add_fp16_variant(folder, make_default=True)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["default_variant"] == "fp16"
    del manifest["variants"]["fp32"]
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(Exception, match="no fp32 variant to convert"):
        add_fp16_variant(folder)


def test_a_float16_graph_declared_float32_is_refused(halved: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(halved, tmp_path / "w"))
    manifest = json.loads((folder / "manifest.json").read_text())
    cache = next(s for s in manifest["variants"]["fp16"]["decoder_step"]["inputs"] if s["role"] == "self_key")
    cache["dtype"] = "float32"
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelFolderError, match="is tensor\\(float16\\) of rank 4 in the graph, float32"):
        OnnxRuntime(load_model_folder(folder, verify_checksums=False), "fp16")
