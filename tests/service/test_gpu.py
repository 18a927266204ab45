"""The fp16 variant on CUDA with the decoder cache in GPU memory (CuPy), and fp32 on CUDA beside a host cache.
Skipped where there is no CUDA build of ONNX Runtime, no GPU or no CuPy: CI has none. Last run on an H200
(onnxruntime-gpu 1.31.1 without its kernels for other GPUs, docs/performance.md "GPU"), at format 7: all passed but two
teacher-forced comparisons at head size 64, over the tolerances of then (fp16 0.024 > 0.02, fp32 0.018 > 0.01; now
ON_CUDA_TOLERANCE, not yet rerun on a GPU). Before, two faults made every CUDA translation wrong, which these tests
now catch: inputs bound from host memory are copied to the GPU when bound, not at each run (service/engine/runtime.py,
step), and a step graph that computed GroupQueryAttention's lengths itself (format 6 and older) wrote every row at
slot 0 on CUDA, as for a prompt's first step."""

import importlib.util
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from model_export.checkpoint import Checkpoint
from model_export.export import export_folder
from model_export.half import add_fp16_variant
from model_export.verify import same_decodings, teacher_forced_diff
from service.engine.runtime import OnnxRuntime, SessionSettings
from service.model.folder import load_model_folder
from tests.factories import add_tiny_shortlist, tiny_checkpoint

pytestmark = pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers() or importlib.util.find_spec("cupy") is None,
    reason="needs onnxruntime-gpu, a GPU and CuPy",
)
CUDA = SessionSettings(("CUDAExecutionProvider",))
# |log p| against float32 PyTorch, measured on the H200 at head size 64 (shape 4 x 11 x 5, where the check
# stopped): fp16 0.024, fp32 0.018 (ONNX Runtime's CUDA provider runs float32 products as TF32 by default); the
# faults above gave 4-8
ON_CUDA_TOLERANCE = 5e-2


# GroupQueryAttention's CUDA kernels are chosen by head size: the tiny model's 8 and the paper's 64
HEAD_SIZES = {"head size 8": {}, "head size 64": {"d_model": 128, "n_heads": 2, "d_ff": 256}}


@pytest.fixture(scope="module", params=list(HEAD_SIZES))
def halved(
    request: pytest.FixtureRequest, spm_model: bytes, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Checkpoint, Path]:
    checkpoint = tiny_checkpoint(spm_model, **HEAD_SIZES[request.param])
    folder = export_folder(checkpoint, tmp_path_factory.mktemp("g") / "m", "tiny", "0")
    add_fp16_variant(folder)
    return checkpoint, folder


def test_fp16_on_cuda_matches_pytorch_with_the_cache_in_gpu_memory(halved: tuple[Checkpoint, Path]) -> None:
    checkpoint, folder = halved
    runtime = OnnxRuntime(load_model_folder(folder), "fp16", CUDA)
    assert runtime.providers[0] == "CUDAExecutionProvider" and runtime.new_cache().on_gpu
    model = checkpoint.build_model()
    for seed, shape in enumerate([(1, 1, 3), (4, 11, 5), (3, 6, 40)]):
        assert teacher_forced_diff(model, runtime, shape, seed) < ON_CUDA_TOLERANCE
    assert same_decodings(model, runtime, 1, seed=0) and same_decodings(model, runtime, 4, seed=0)


def test_the_fp16_shortlist_step_on_cuda_matches_pytorch_restricted_to_the_candidates(
    halved: tuple[Checkpoint, Path], tmp_path: Path
) -> None:
    """The float16 shortlist step graph (the fp32 one converted) with the cache in GPU memory: each row's
    log-probs over its sentence's candidates and its greedy and beam-4 ids, against PyTorch restricted to them."""
    checkpoint, folder = halved
    copy = Path(shutil.copytree(folder, tmp_path / "shortlisted"))
    (tmp_path / "corpus").mkdir()
    add_tiny_shortlist(copy, tmp_path / "corpus")
    runtime = OnnxRuntime(load_model_folder(copy), "fp16", replace(CUDA, shortlist=True))
    assert runtime.new_cache().on_gpu
    model = checkpoint.build_model()
    for seed, shape in enumerate([(1, 1, 3), (4, 11, 5)]):
        assert teacher_forced_diff(model, runtime, shape, seed) < ON_CUDA_TOLERANCE
    assert same_decodings(model, runtime, 1, seed=0) and same_decodings(model, runtime, 4, seed=0)


def test_the_step_writes_each_row_in_place_in_gpu_memory(halved: tuple[Checkpoint, Path]) -> None:
    runtime = OnnxRuntime(load_model_folder(halved[1]), "fp16", CUDA)
    cache = runtime.new_cache()
    src_ids = np.array([[5, 9, 14, 3], [7, 3, 0, 0]], np.int64)
    memory = runtime.encode(src_ids, src_ids != 0)
    cache.add(memory.keys, memory.values, src_ids != 0)
    cache.select(np.array([0, 0, 1]))  # two beams of sentence 0, one of sentence 1
    runtime.step(np.array([2, 2, 2]), cache)
    cache.lengths[:] = [1, 3, 2]  # rows at different steps: each writes at its own slot
    cache.make_room()
    pointer, before = cache.self_keys[0].data.ptr, cache.self_keys[0].get()  # (B, H, T, Dh) on the host
    runtime.step(np.array([20, 21, 22]), cache)
    after = cache.self_keys[0].get()
    assert cache.self_keys[0].data.ptr == pointer  # the same GPU memory, written by the graph
    same = (after == before) | (np.isnan(after) & np.isnan(before))  # unwritten slots hold NaN (conftest)
    changed = sorted({(int(r), int(t)) for r, _, t, _ in zip(*np.nonzero(~same), strict=True)})
    assert changed == [(0, 1), (1, 3), (2, 2)], f"(row, slot)s the step wrote: {changed}"


def test_float32_on_cuda_keeps_a_host_cache_and_matches_pytorch(halved: tuple[Checkpoint, Path]) -> None:
    """GroupQueryAttention has no float32 CUDA kernel: it runs on the CPU provider, so the cache stays on the host;
    the rest (cross-attention's MultiHeadAttention among it) runs on CUDA."""
    checkpoint, folder = halved
    runtime = OnnxRuntime(load_model_folder(folder), "fp32", CUDA)
    assert runtime.providers[0] == "CUDAExecutionProvider" and not runtime.new_cache().on_gpu
    model = checkpoint.build_model()
    for seed, shape in enumerate([(1, 1, 3), (4, 11, 5), (3, 6, 40)]):
        assert teacher_forced_diff(model, runtime, shape, seed) < ON_CUDA_TOLERANCE
    assert same_decodings(model, runtime, 1, seed=0) and same_decodings(model, runtime, 4, seed=0)


def test_continuous_batching_on_the_gpu_cache_gives_each_sentence_its_solo_result(
    halved: tuple[Checkpoint, Path],
) -> None:
    """Sentences join a running batch every iteration (greedy and beam mixed), so rows join, follow their beams
    and leave the CuPy buffers in place; each sentence's tokens are those it gets decoded alone."""
    from service.engine.batches import TokenRules, decode_batch
    from service.engine.decoding import SearchOptions
    from service.metrics import Metrics
    from service.scheduling.jobs import BatchLimits, SentenceJob, Ticket
    from service.scheduling.scheduler import Scheduler

    folder = load_model_folder(halved[1])
    runtime = OnnxRuntime(folder, "fp16", CUDA)
    ids = folder.manifest.special_ids
    rules = TokenRules(ids.decoder_start, ids.eos, ids.pad)
    scheduler = Scheduler(runtime, rules, BatchLimits(), Metrics(), "gpu")
    rng = np.random.default_rng(3)
    sources = [[int(t) for t in rng.integers(4, 90, size=int(rng.integers(2, 14)))] + [ids.eos] for _ in range(12)]
    options = [SearchOptions(beam_size=3 if i % 3 == 0 else 1, max_new_tokens=16) for i in range(len(sources))]
    tickets = []
    for i, source in enumerate(sources):
        tickets.append(Ticket(1, 1e18, lambda ticket: None))
        scheduler.submit([SentenceJob(source, options[i], tickets[-1], 0)])
        scheduler.run_once()
    while not scheduler.idle:
        scheduler.run_once()
    assert scheduler.cache.on_gpu
    for source, option, ticket in zip(sources, options, tickets, strict=True):
        assert ticket.finished and ticket.error is None
        alone = decode_batch(runtime, [source], [option], rules)[0]  # scores differ in float16's last digits
        assert [h.tokens for h in ticket.results[0]] == [h.tokens for h in alone]


def one_attention_graph(heads: int, head_dim: int, dtype: int) -> bytes:
    """A step graph of GroupQueryAttention alone, fed as ours feeds it: Q, K and V packed (B, 1, 3D), the cache as
    past and present, seqlens_k (B,) the row's cached steps, total_sequence_length () the longest row with this step."""
    from onnx import TensorProto, helper

    d = heads * head_dim
    cache = ["B", heads, "T", head_dim]
    node = helper.make_node(
        "GroupQueryAttention",
        ["qkv", "", "", "past_key", "past_value", "seqlens_k", "total_sequence_length"],
        ["context", "present_key", "present_value"],
        domain="com.microsoft",
        num_heads=heads,
        kv_num_heads=heads,
        scale=1.0,
    )
    graph = helper.make_graph(
        [node],
        "gqa",
        [
            helper.make_tensor_value_info("qkv", dtype, ["B", 1, 3 * d]),
            helper.make_tensor_value_info("past_key", dtype, cache),
            helper.make_tensor_value_info("past_value", dtype, cache),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["B"]),
            helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
        ],
        [
            helper.make_tensor_value_info("context", dtype, ["B", 1, d]),
            helper.make_tensor_value_info("present_key", dtype, cache),
            helper.make_tensor_value_info("present_value", dtype, cache),
        ],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10).SerializeToString()


@pytest.mark.parametrize("head_dim", [8, 64])
def test_group_query_attention_alone_writes_the_bound_cache_in_place(head_dim: int) -> None:
    """The smallest case of what the in-place test checks: one float16 GroupQueryAttention node on CUDA, its past and
    present bound to the same CuPy buffers. Each row's new key and value land at slot seqlens_k[b] and nowhere else,
    and its output is softmax(q k^T) v over slots 0..seqlens_k[b] (numpy, float64)."""
    import cupy as cp
    from onnx import TensorProto

    heads, rows, slots = 2, 3, 8
    d = heads * head_dim
    session = ort.InferenceSession(one_attention_graph(heads, head_dim, TensorProto.FLOAT16), providers=CUDA.providers)
    rng = np.random.default_rng(head_dim)
    positions = np.array([1, 3, 2], np.int32)  # (B,) cached steps: each row writes at its own slot
    qkv = rng.standard_normal((rows, 1, 3 * d)).astype(np.float16)  # (B, 1, 3D)
    past = {role: rng.standard_normal((rows, heads, slots, head_dim)).astype(np.float16) for role in ("key", "value")}
    cache = {role: cp.asarray(array) for role, array in past.items()}  # (B, H, T, Dh) in GPU memory
    binding = session.io_binding()
    binding.bind_cpu_input("qkv", qkv)
    binding.bind_cpu_input("seqlens_k", positions)
    binding.bind_cpu_input("total_sequence_length", np.array(positions.max() + 1, np.int32))
    binding.bind_output("context")  # ONNX Runtime allocates it: the first output
    for role, buffer in cache.items():
        shape = list(buffer.shape)
        binding.bind_input(f"past_{role}", "cuda", 0, np.float16, shape, buffer.data.ptr)
        binding.bind_output(f"present_{role}", "cuda", 0, np.float16, shape, buffer.data.ptr)
    session.run_with_iobinding(binding)
    after = {role: buffer.get() for role, buffer in cache.items()}  # (B, H, T, Dh) each
    assert_written_in_place(qkv, positions, past, after, binding.copy_outputs_to_cpu()[0], heads, atol=2e-2)


def assert_written_in_place(
    qkv: np.ndarray, positions: np.ndarray, past: dict, after: dict, context: np.ndarray, heads: int, atol: float
) -> None:
    """What one GroupQueryAttention step (one_attention_graph) over a cache bound in place must leave: each row's new
    key and value at slot positions[b] of `after` (role -> (B, H, T, Dh), the cache after the step; `past` before it)
    and nowhere else, and its output `context` (B, 1, D) softmax(q k^T) v over slots 0..positions[b] (numpy,
    float64)."""
    rows, _, three_d = qkv.shape
    d = three_d // 3
    head_dim, slots = d // heads, past["key"].shape[2]
    context = context.astype(np.float64)  # (B, 1, D)
    q, k, v = (qkv[:, 0, i * d : (i + 1) * d].reshape(rows, heads, head_dim).astype(np.float64) for i in range(3))
    for row, slot in enumerate(positions):
        for role, new in (("key", k[row]), ("value", v[row])):
            others = np.arange(slots) != slot
            moved = after[role][row][:, others]  # (H, T - 1, Dh)
            assert np.array_equal(moved, past[role][row][:, others]), f"row {row}: other slots moved"
            assert np.allclose(after[role][row][:, slot], new, atol=1e-3), f"row {row}: the {role} not at slot {slot}"
        keys = after["key"][row][:, : slot + 1].astype(np.float64)  # (H, t, Dh)
        values = after["value"][row][:, : slot + 1].astype(np.float64)  # (H, t, Dh)
        scores = np.einsum("hd,htd->ht", q[row], keys)  # (H, t)
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights /= weights.sum(-1, keepdims=True)  # (H, t)
        expected = np.einsum("ht,htd->hd", weights, values).reshape(d)  # (D,)
        assert np.allclose(context[row, 0], expected, atol=atol), f"row {row}: the attention output"
