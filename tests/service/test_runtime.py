"""Execution providers: CUDA when asked and present, CPU with a warning when it is not; thread counts."""

import json
import logging
import shutil
import sys
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

from service.engine import kv_cache
from service.engine import runtime as runtime_module
from service.engine.batches import TokenRules, decode_batch
from service.engine.decoding import SearchOptions
from service.engine.kv_cache import MIN_CAPACITY, DecoderCache
from service.engine.runtime import (
    DENSE_STEP_ROWS,
    OnnxRuntime,
    SessionSettings,
    StepBinding,
    _warn_missing,
    gpu_array_module,
    host_device,
    usable_providers,
)
from service.engine.sessions import (
    SHARED_STEP_MACS,
    chosen_variant,
    decoder_macs_per_token,
    decoder_streams,
    intra_op_threads,
    open_runtime,
    ragged_graph_bytes,
    ragged_step,
    single_row_rows,
    step_graph_options,
    step_graphs,
)
from service.errors import ModelFolderError
from service.metrics import Metrics
from service.model.folder import MANIFEST, load_model_folder, sha256_of
from service.settings import SHIPPED_MODELS, Settings, available_cores
from service.translation.registry import load_translators
from service.translation.translator import TranslateOptions, Translator
from tests.fakes import PatientSteps
from tests.service.test_gpu import assert_written_in_place, one_attention_graph


def fast(**fields: object) -> Settings:
    """Settings that also open the faster step graphs (MT_BATCH_INVARIANT=false), which these tests exercise."""
    return Settings(batch_invariant=False, **fields)


def test_cpu_is_always_the_fallback() -> None:
    assert usable_providers(("CPUExecutionProvider",)) == ["CPUExecutionProvider"]
    assert usable_providers(()) == ["CPUExecutionProvider"]


@pytest.mark.skipif("CUDAExecutionProvider" in ort.get_available_providers(), reason="this build has CUDA")
def test_cuda_requested_without_cuda_falls_back_to_cpu_with_a_warning(
    model_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="service.engine.runtime"):
        runtime = OnnxRuntime(
            load_model_folder(model_dir), settings=SessionSettings(("CUDAExecutionProvider", "CPUExecutionProvider"))
        )
    assert runtime.providers == ["CPUExecutionProvider"]
    assert "execution provider CUDAExecutionProvider is not available" in caplog.text


def test_the_cache_lives_in_gpu_memory_only_beside_a_cuda_float16_step(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda, where = ["CUDAExecutionProvider", "CPUExecutionProvider"], Path("m")
    fake_cupy = types.ModuleType("cupy")
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    assert gpu_array_module(cuda, "float16", True, where) is fake_cupy
    assert gpu_array_module(cuda, "float32", True, where) is None  # float32 GroupQueryAttention runs on the CPU
    assert gpu_array_module(cuda, "float32", False, where) is None  # ... so an older graph's lengths are read right
    assert gpu_array_module(["CPUExecutionProvider"], "float16", False, where) is None


def test_a_float16_variant_on_cuda_needs_a_format_7_step_graph_and_cupy(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda, where = ["CUDAExecutionProvider", "CPUExecutionProvider"], Path("m")
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    with pytest.raises(ModelFolderError, match="m: this float16 step graph .* export the model folder again"):
        gpu_array_module(cuda, "float16", False, where)
    monkeypatch.setitem(sys.modules, "cupy", None)  # not installed: the import fails
    with pytest.raises(ModelFolderError, match="keeps the decoder cache in GPU memory, through CuPy: install"):
        gpu_array_module(cuda, "float16", True, where)


@pytest.mark.parametrize(("batching", "encoder_threads"), [("continuous", 1), ("static", 2)])
def test_the_encoder_runs_on_one_thread_beside_continuous_decoder_steps(
    model_dir: Path, batching: str, encoder_threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MT_MODELS_DIR", str(model_dir.parent))
    monkeypatch.setenv("MT_MODELS", model_dir.name)
    settings = Settings(batching=batching, intra_op_threads=2, engine_process=False)  # to reach the sessions
    [translator] = load_translators(settings, Metrics())
    runtime = translator.runtime
    assert runtime.encoder.get_session_options().intra_op_num_threads == encoder_threads
    assert runtime.decoder.get_session_options().intra_op_num_threads == 2
    assert (translator.scheduler._encoder is not None) == (batching == "continuous")
    translator.scheduler.stop()


@pytest.mark.parametrize(("threads", "mode"), [(1, "ORT_SEQUENTIAL"), (2, "ORT_PARALLEL")])
def test_inter_op_threads_run_nodes_side_by_side(model_dir: Path, threads: int, mode: str) -> None:
    """MT_INTER_OP_THREADS above 1 switches ONNX Runtime to parallel execution, the only mode that uses them."""
    runtime = OnnxRuntime(load_model_folder(model_dir), settings=SessionSettings(inter_op_threads=threads))
    for session in (runtime.encoder, runtime.decoder):
        options = session.get_session_options()
        assert (options.inter_op_num_threads, options.execution_mode.name) == (threads, mode)


def test_a_small_model_steps_on_one_thread_and_a_large_one_on_every_core(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = load_model_folder(SHIPPED_MODELS / "en-fr", verify_checksums=False).manifest.config
    assert decoder_macs_per_token(shipped) == 3 * (6 * 256**2 + 2 * 256 * 1024) + 256 * 8000  # 4.8 M
    paper = shipped.model_copy(update={"d_model": 512, "d_ff": 2048, "n_decoder_layers": 6, "tgt_vocab_size": 59514})
    assert decoder_macs_per_token(paper) > SHARED_STEP_MACS > decoder_macs_per_token(shipped)
    monkeypatch.setattr("service.engine.sessions.available_cores", lambda: 6)
    assert intra_op_threads(shipped, fast()) == 1
    assert intra_op_threads(shipped, fast(intra_op_threads=3)) == 3  # an explicit count wins
    assert decoder_streams(paper, fast()) == 2 and decoder_streams(shipped, fast()) == 1
    assert intra_op_threads(paper, fast()) == 3  # the cores split between the two streams
    assert intra_op_threads(paper, fast(decoder_streams=1)) == 6  # an explicit count wins
    assert decoder_streams(paper, fast(decoder_streams=3)) == 3
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert decoder_streams(paper, fast(providers=["cuda", "cpu"])) == 1  # measured on CPUs only
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert decoder_streams(paper, fast(providers=["cuda", "cpu"])) == 2  # no CUDA here: laid out as on the CPU
    assert intra_op_threads(shipped, fast(decoder_streams=2)) == 1
    monkeypatch.setattr("service.engine.sessions.available_cores", lambda: 1)
    assert decoder_streams(paper, fast()) == 1 and intra_op_threads(paper, fast()) == 1
    monkeypatch.setattr("service.engine.sessions.available_cores", lambda: 6)
    monkeypatch.setenv("MT_MODELS_DIR", str(model_dir.parent))
    monkeypatch.setenv("MT_MODELS", model_dir.name)
    [translator] = load_translators(fast(engine_process=False), Metrics())  # the tiny test model
    assert translator.runtime.decoder.get_session_options().intra_op_num_threads == 1
    assert translator.runtime.ragged is not None  # a small decoder: its ragged step graph too
    translator.scheduler.stop()
    monkeypatch.setattr("service.engine.sessions.this_cpu_has_int8_dot_products", lambda: True)  # VNNI, AMX, ARM
    assert single_row_rows(shipped) == 1 and single_row_rows(paper) == 4  # weights from memory: a few rows too
    monkeypatch.setattr("service.engine.sessions.this_cpu_has_int8_dot_products", lambda: False)  # AVX2 alone
    assert single_row_rows(shipped) == 1 and single_row_rows(paper) == 1  # MatMulNBits the slower from 2 rows


def test_the_ragged_step_graph_opens_unasked_where_its_copy_of_the_weights_is_small(model_dir: Path) -> None:
    shipped = load_model_folder(SHIPPED_MODELS / "en-fr", verify_checksums=False)
    assert ragged_graph_bytes(shipped, "int8") == shipped.manifest.files["decoder_step_ragged.int8.onnx"].bytes
    int8, fp32 = 53_727_736, 333_371_106  # the paper size's ragged graphs
    assert ragged_step(ragged_graph_bytes(shipped, "fp32"), fast()) and ragged_step(int8, fast())
    assert not ragged_step(fp32, fast()) and ragged_step(fp32, fast(ragged_step=True))  # as set
    assert not ragged_step(int8, fast(ragged_step=False)) and not ragged_step(None, fast(ragged_step=True))
    folder = load_model_folder(model_dir)
    assert step_graph_options(folder, "fp32", fast())["ragged_step"]  # the tiny model's: a few kB
    assert not step_graph_options(folder, "fp32", fast(ragged_step=False))["ragged_step"]


def env_allocators(session: ort.InferenceSession) -> str | None:
    try:
        return session.get_session_options().get_session_config_entry("session.use_env_allocators")
    except RuntimeError:  # never set
        return None


def test_the_cpu_sessions_draw_on_one_arena_for_the_process(model_dir: Path) -> None:
    """One arena for every session (the ragged step graph's arena of its own had kept 45-55 MB more after a long
    load, bench.soak); bench.soak measures the memory, this checks the sessions are opened to share it."""
    folder = load_model_folder(model_dir)
    shared, own = OnnxRuntime(folder), OnnxRuntime(folder, settings=SessionSettings(shared_arena=False))
    assert shared.ragged is not None and own.ragged is not None
    for runtime, entry in ((shared, "1"), (own, None)):
        for session in (runtime.encoder, runtime.decoder, runtime.ragged):
            assert env_allocators(session) == entry
    ids = folder.manifest.special_ids
    rules = TokenRules(ids.decoder_start, ids.eos, ids.pad)
    rng = np.random.default_rng(5)
    sources = [rng.integers(4, 90, n).tolist() + [ids.eos] for n in (2, 11, 3, 4)]  # ragged: the ragged graph runs
    options = [SearchOptions(beam_size=b, max_new_tokens=12) for b in (1, 1, 1, 3)]  # a beam: the step graph too
    for got, expected in zip(
        decode_batch(shared, sources, options, rules), decode_batch(own, sources, options, rules), strict=True
    ):
        assert [h.tokens for h in got] == [h.tokens for h in expected]


def test_available_cores_follow_a_cgroup_cpu_quota(tmp_path: Path) -> None:
    cores = available_cores(tmp_path / "absent")  # no cgroup files: the CPUs this process may run on
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # a container's cpus: 1.5
    assert available_cores(tmp_path) == min(cores, 2)
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert available_cores(tmp_path) == cores
    v1 = tmp_path / "v1" / "cpu"
    v1.mkdir(parents=True)
    (v1 / "cpu.cfs_quota_us").write_text("100000\n")
    (v1 / "cpu.cfs_period_us").write_text("100000\n")
    assert available_cores(tmp_path / "v1") == 1
    (v1 / "cpu.cfs_quota_us").write_text("-1\n")
    assert available_cores(tmp_path / "v1") == cores


@pytest.mark.parametrize("layout", ["reserved", "growing", "stacked"])
def test_a_kept_binding_steps_as_a_fresh_one_through_joins_beams_leaves_and_growth(
    model_dir: Path, layout: str
) -> None:
    """The runtime binds a cache's arrays once per layout and reuses the binding: every step must give what a
    binding made for that step alone gives (two caches in turn, sentences joining, beams reordering, rows leaving,
    a growing time axis growing). "stacked": the kept binding's caches laid out as a GPU cache's (each buffer's
    layers views of one array, which the graph writes in place), the fresh ones as growing host caches."""
    folder = load_model_folder(model_dir)
    kept, fresh = OnnxRuntime(folder, "fp32"), OnnxRuntime(folder, "fp32")
    reserved = layout == "reserved"
    if not reserved:
        kept._reserve = fresh._reserve = None
    if layout == "stacked":
        shape = (kept.n_layers, kept.n_heads, kept.head_dim, kept.cache_dtype)
        kept.new_cache = lambda: DecoderCache(*shape, stacked=True)
    rng = np.random.default_rng(0)
    vocab = folder.manifest.config.src_vocab_size

    def source(n: int, length: int) -> tuple:
        ids, mask = rng.integers(4, vocab, (n, length)), np.ones((n, length), np.bool_)
        return kept.encode(ids, mask), mask

    caches = {name: (kept.new_cache(), fresh.new_cache()) for name in ("a", "b")}
    for name, n in (("a", 2), ("b", 1)):
        memory, mask = source(n, 6)
        for cache in caches[name]:
            cache.add(memory.keys, memory.values, mask)
    for t in range(20):
        for name, (ours, theirs) in caches.items():
            tokens = rng.integers(4, vocab, ours.rows)
            got, expected = kept.step(tokens, ours), fresh.step(tokens, theirs)
            theirs.bound = None  # `fresh` binds anew at every step
            np.testing.assert_array_equal(got.top_ids, expected.top_ids)
            np.testing.assert_allclose(got.top_log_probs, expected.top_log_probs, rtol=0, atol=1e-6)
            within = np.arange(ours.rows)  # (B,) beams that change parents within their sentences
            for sentence in np.unique(ours.sentence):
                mine = np.flatnonzero(ours.sentence == sentence)
                within[mine] = rng.choice(mine, len(mine))
            rows = {3: np.repeat(np.arange(ours.rows), 2), 5: rng.permutation(ours.rows), 9: np.arange(ours.rows - 1)}
            rows |= {t: within for t in (4, 12, 13)}
            if t in rows:
                for cache in (ours, theirs):
                    cache.select(rows[t])
            if t == 7 and name == "a":
                memory, mask = source(1, 9)  # a longer source joins
                for cache in (ours, theirs):
                    cache.add(memory.keys, memory.values, mask)
    assert caches["a"][0].capacity == (folder.manifest.config.max_positions if reserved else 32)  # grew on the way
    assert caches["a"][0].stacked == (layout == "stacked") and not caches["a"][1].stacked


@pytest.mark.parametrize("reserved", [True, False], ids=["reserved", "growing"])
def test_a_step_reads_no_self_attention_slot_past_each_rows_length(model_dir: Path, reserved: bool) -> None:
    """The cache allocates grown self-attention buffers uninitialised (np.empty: a continuous batch regrows them
    often, and zeroing cost a third of a regrowth): the step graph must read only each row's written slots. Rows of
    different lengths, every slot past them NaN in one cache and zero in the other: the same, finite, results. On the
    CPU the runtime's caches reserve the time axis (as long as the model's positions); a growing one (CUDA's) too."""
    folder = load_model_folder(model_dir)
    runtime = OnnxRuntime(folder, "fp32")
    if not reserved:
        runtime._reserve = None
    rng = np.random.default_rng(1)
    vocab = folder.manifest.config.src_vocab_size
    clean, dirty = runtime.new_cache(), runtime.new_cache()
    for t in range(24):
        if t in (0, 5, 17):  # sentences join at different steps: ragged lengths, a growing time axis grows
            ids, mask = rng.integers(4, vocab, (1, 7)), np.ones((1, 7), np.bool_)
            memory = runtime.encode(ids, mask)
            for cache in (clean, dirty):
                cache.add(memory.keys, memory.values, mask)
        dirty.make_room()
        for layer in (*dirty.self_keys, *dirty.self_values):  # (B, H, T, Dh)
            for row, length in enumerate(dirty.lengths):
                layer[row, :, length:] = np.nan  # the slot this step writes, and every one after it
        tokens = rng.integers(4, vocab, clean.rows)
        got, expected = runtime.step(tokens, dirty), runtime.step(tokens, clean)
        assert np.isfinite(got.top_log_probs).all()
        np.testing.assert_array_equal(got.top_ids, expected.top_ids)
        np.testing.assert_array_equal(got.top_log_probs, expected.top_log_probs)
    assert dirty.lengths.tolist() == [24, 19, 7] and dirty.reserved == reserved
    assert dirty.capacity == (folder.manifest.config.max_positions if reserved else 2 * MIN_CAPACITY)


def as_format_3(folder: Path, dest: Path, width: int = 19) -> Path:
    """A copy of `folder` as format 3 wrote it: the step graph's TopK fixed at `width` candidates per row (17 and
    the two banned ids), no `top_k` input, no ragged step graph."""
    shutil.copytree(folder, dest)
    manifest = json.loads((dest / MANIFEST).read_text())
    for variant in manifest["variants"].values():
        ragged = variant.pop("decoder_step_ragged", None)  # format 5's
        if ragged:
            (dest / ragged["file"]).unlink()
            del manifest["files"][ragged["file"]]
        step = variant["decoder_step"]
        step["inputs"] = [spec for spec in step["inputs"] if spec["role"] != "top_k"]
        for spec in step["outputs"]:
            if spec["role"] in ("top_log_probs", "top_ids"):
                spec["shape"] = ["batch", width]
        path = dest / step["file"]
        graph = onnx.load(path, load_external_data=False)
        graph.graph.input.remove(next(i for i in graph.graph.input if i.name == "top_k"))
        graph.graph.initializer.append(numpy_helper.from_array(np.array([width], np.int64), "top_k"))
        onnx.save(graph, path)
        manifest["files"][step["file"]] = {"sha256": sha256_of(path), "bytes": path.stat().st_size}
    manifest["format_version"] = 3
    (dest / MANIFEST).write_text(json.dumps(manifest))
    return dest


def test_the_step_returns_the_candidates_its_searches_take(model_dir: Path) -> None:
    """Format 4: the graph's top-K keeps as many candidates as the runtime asks for (its cost grows with them), the
    banned ids dropped; each width is the best of the whole distribution in order, so a wider one starts with a
    narrower one. The binding is made anew when the width changes."""
    folder = load_model_folder(model_dir)
    runtime = OnnxRuntime(folder, "fp32")
    assert runtime.candidates.chosen and runtime.candidates.most == folder.manifest.config.tgt_vocab_size - 2
    rng = np.random.default_rng(2)
    ids, mask = rng.integers(4, folder.manifest.config.src_vocab_size, (3, 7)), np.ones((3, 7), np.bool_)
    memory = runtime.encode(ids, mask)
    caches = [runtime.new_cache() for _ in range(3)]
    for cache in caches:
        cache.add(memory.keys, memory.values, mask)
    for t in range(4):
        tokens = rng.integers(4, folder.manifest.config.tgt_vocab_size, 3)
        full = runtime.step(tokens, caches[0], full=True)
        narrow = runtime.step(tokens, caches[1], candidates=2)
        wide = runtime.step(tokens, caches[2], candidates=9 if t < 2 else 5)
        allowed = full.log_probs.copy()  # (B, V) the reference: numpy's order of the whole distribution
        allowed[:, runtime.candidates.banned] = -np.inf
        best = np.argsort(-allowed, axis=1, kind="stable")  # (B, V)
        assert narrow.top_ids.shape == (3, 2) and wide.top_ids.shape == (3, 9 if t < 2 else 5)
        np.testing.assert_array_equal(narrow.top_ids, best[:, :2])
        np.testing.assert_array_equal(wide.top_ids, best[:, : wide.top_ids.shape[1]])
        np.testing.assert_allclose(wide.top_log_probs, np.take_along_axis(allowed, wide.top_ids, 1), atol=1e-5)
        assert caches[1].bound.width == 2 + 2 and caches[2].bound.width == wide.top_ids.shape[1] + 2


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_the_encoder_writes_every_layers_memory_into_one_array_that_a_static_batch_takes(
    quantized: Path, variant: str
) -> None:
    """On the CPU the encoder's outputs are bound into one (2, L, b, H, S, Dh) array: the same values as the
    session's own outputs, stacked; a static batch's fresh cache takes its layers as its buffers (no copy) and
    decodes as from a copy (the decoding's reference: the same sources through a cache that copied them)."""
    folder = load_model_folder(quantized)  # fp32 and int8
    runtime, spec = OnnxRuntime(folder, variant), folder.variant(variant)
    rng, cfg = np.random.default_rng(8), folder.manifest.config
    mask = np.arange(9)[None] < np.array([9, 4, 6])[:, None]  # (3, 9) ragged sources
    ids = np.where(mask, rng.integers(4, cfg.src_vocab_size, mask.shape), cfg.pad_id)  # (3, 9)
    memory = runtime.encode(ids, mask)
    outputs = runtime.encoder.run(None, {spec.encoder.one("src_ids"): ids, spec.encoder.one("src_mask"): mask})
    by_name = dict(zip([o.name for o in runtime.encoder.get_outputs()], outputs, strict=True))
    for got, role in ((memory.keys, "cross_key"), (memory.values, "cross_value")):
        np.testing.assert_array_equal(got, np.stack([by_name[name] for name in spec.encoder.named(role)]))
    assert memory.keys.base is not None and memory.keys.base is memory.values.base  # one array
    taker, copier = runtime.new_cache(), runtime.new_cache()
    taker.add(memory.keys, memory.values, mask, owned=True)
    copier.add(memory.keys.copy(), memory.values.copy(), mask)
    assert all(np.shares_memory(layer, memory.keys) for layer in taker.cross_keys)
    for _ in range(5):
        tokens = rng.integers(4, cfg.tgt_vocab_size, 3)
        got, expected = runtime.step(tokens, taker, candidates=3), runtime.step(tokens, copier, candidates=3)
        np.testing.assert_array_equal(got.top_ids, expected.top_ids)
        np.testing.assert_array_equal(got.top_log_probs, expected.top_log_probs)


def test_a_format_3_folder_is_served_with_its_fixed_top_k(model_dir: Path, tmp_path: Path) -> None:
    """Folders exported before format 4 keep working: the same translations, greedy and beam, from a TopK that
    always returns 19 candidates per row; the beams such a folder can serve stay bounded by them."""
    old = as_format_3(model_dir, tmp_path / "format-3")
    assert load_model_folder(old).manifest.format_version == 3
    ours, theirs = OnnxRuntime(load_model_folder(old), "fp32"), OnnxRuntime(load_model_folder(model_dir), "fp32")
    assert not ours.candidates.chosen and ours.candidates.most == 17 and ours.candidates.width(2) == 19
    ids = load_model_folder(old).manifest.special_ids
    rules = TokenRules(ids.decoder_start, ids.eos, ids.pad)
    rng = np.random.default_rng(4)
    sources = [rng.integers(4, 90, n).tolist() + [ids.eos] for n in (3, 7, 5, 9)]
    options = [SearchOptions(beam_size=b, max_new_tokens=12, n_best=b) for b in (1, 3, 1, 2)]
    for got, expected in zip(
        decode_batch(ours, sources, options, rules), decode_batch(theirs, sources, options, rules), strict=True
    ):
        assert [h.tokens for h in got] == [h.tokens for h in expected]
        np.testing.assert_allclose([h.score for h in got], [h.score for h in expected], atol=1e-5)
    assert Translator(load_model_folder(old), Settings(), Metrics(), runtime=ours).max_beam == 8


def test_the_ragged_step_reads_only_each_sentences_own_source(model_dir: Path) -> None:
    """Format 5: when every sentence has one row and at most half the source positions are real, the ragged step
    graph runs: its cross-attention reads each sentence's own source positions (GroupQueryAttention over the cached
    keys and values, bound in place), where the step graph's reads the widest live source, masked. Same outputs;
    NaN in every cached position past a sentence's source never reaches them, and the cross caches come back as
    they were. A beam sentence among the rows sends the step to the step graph, and its end back; so do sources
    of much the same length."""
    folder = load_model_folder(model_dir)
    ours, theirs = OnnxRuntime(folder, "fp32"), OnnxRuntime(folder, "fp32", SessionSettings(ragged_step=False))
    assert ours.ragged is not None and theirs.ragged is None
    rng = np.random.default_rng(5)
    cfg = folder.manifest.config
    mine, reference = ours.new_cache(), theirs.new_cache()
    for t in range(14):
        if t in (0, 4, 9):  # sentences of different lengths join: the source axis is the longest live one's
            lengths = {0: [2, 3, 14], 4: [5], 9: [2, 7]}[t]
            mask = np.arange(max(lengths))[None] < np.array(lengths)[:, None]  # (b, S') left-aligned
            memory = ours.encode(np.where(mask, rng.integers(4, cfg.src_vocab_size, mask.shape), cfg.pad_id), mask)
            for cache in (mine, reference):
                cache.add(memory.keys, memory.values, mask)
        if t == 6:  # a sentence's row becomes two beams: every step the step graph's until one leaves again
            for cache in (mine, reference):
                cache.select(np.array([0, 1, 1, 2, 3]))
        if t == 8:
            for cache in (mine, reference):
                cache.select(np.array([0, 1, 3, 4]))
        ragged = t not in (6, 7)
        padding = ~mine.src_mask[:, None, :, None]  # (N, 1, S, 1)
        for layer in (*mine.cross_keys, *mine.cross_values):  # (N, H, S, Dh): NaN for the ragged graph, else zeros
            layer[np.broadcast_to(padding, layer.shape)] = np.nan if ragged else 0.0  # (MultiHeadAttention reads it)
        before = [layer.copy() for layer in (*mine.cross_keys, *mine.cross_values)]
        tokens = rng.integers(4, cfg.tgt_vocab_size, mine.rows)
        got, expected = ours.step(tokens, mine, candidates=5), theirs.step(tokens, reference, candidates=5)
        assert mine.bound.ragged == ragged and not reference.bound.ragged
        assert np.isfinite(got.top_log_probs).all()
        np.testing.assert_array_equal(got.top_ids, expected.top_ids)
        np.testing.assert_allclose(got.top_log_probs, expected.top_log_probs, rtol=0, atol=1e-5)
        for layer, old in zip((*mine.cross_keys, *mine.cross_values), before, strict=True):
            np.testing.assert_array_equal(layer, old)  # NaN where it was: equal_nan by default for arrays
    assert mine.sentences == 6 and mine.src_mask.shape[1] == 14
    even = ours.new_cache()  # two sources of one length: nothing to skip, the step graph runs
    mask = np.ones((2, 9), np.bool_)
    memory = ours.encode(rng.integers(4, cfg.src_vocab_size, mask.shape), mask)
    even.add(memory.keys, memory.values, mask)
    ours.step(rng.integers(4, cfg.tgt_vocab_size, 2), even)
    assert not even.bound.ragged


def test_a_step_of_one_row_runs_the_step_graph_for_one_row(quantized: Path) -> None:
    """Format 6: while a cache has one row, the int8 variant's decoder_step_single runs (its products over 8-bit
    blocks); from two rows on, the step graph; back to one, the single-row graph again. Its log-probs are as close
    to fp32's as the step graph's are, on the same cache. MT_SINGLE_ROW_STEP=false (or a folder without it) opens
    no such session, and an fp32 variant has none."""
    folder = load_model_folder(quantized)
    single, plain, fp32 = (
        OnnxRuntime(folder, "int8"),
        OnnxRuntime(folder, "int8", SessionSettings(single_row_step=False)),
        OnnxRuntime(folder, "fp32"),
    )
    assert single.single is not None and plain.single is None and fp32.single is None
    cfg = folder.manifest.config
    rng = np.random.default_rng(11)
    caches = {name: runtime.new_cache() for name, runtime in (("single", single), ("plain", plain), ("fp32", fp32))}
    runtimes = {"single": single, "plain": plain, "fp32": fp32}
    for t in range(10):
        if t in (0, 4):  # a sentence joins: one row, then two
            mask = np.ones((1, 5 + t), np.bool_)
            src = rng.integers(4, cfg.src_vocab_size, mask.shape)
            for name, cache in caches.items():
                memory = runtimes[name].encode(src, mask)
                cache.add(memory.keys, memory.values, mask)
        if t == 7:  # the first sentence ends: one row again
            for cache in caches.values():
                cache.select(np.array([1]))
        tokens = rng.integers(4, cfg.tgt_vocab_size, caches["single"].rows)
        out = {name: runtimes[name].step(tokens, cache, full=True, candidates=2) for name, cache in caches.items()}
        one_row = caches["single"].rows == 1
        assert caches["single"].bound.graph == ("decoder_step_single" if one_row else "decoder_step")
        assert caches["plain"].bound.graph == "decoder_step"
        if t == 0:
            assert not np.array_equal(out["single"].log_probs, out["plain"].log_probs)  # another graph ran
        errors = [np.abs(out[name].log_probs - out["fp32"].log_probs).max() for name in ("single", "plain")]
        assert errors[0] < 0.5 and errors[0] < 3 * errors[1] + 0.05  # int8's error, not a wrong graph's
    off, on = fast(variant="int8", single_row_step=False), fast(variant="int8")  # the server's settings
    assert open_runtime(folder, off).single is None and open_runtime(folder, on).single is not None


def test_the_dense_step_graph_gives_the_step_graphs_results_over_a_cache_as_long_as_its_rows(quantized: Path) -> None:
    """Format 10: with dense_step (static batching) the int8 variant's decoder_step_dense runs in the step graph's
    place: its self-attention a ScatterND of each row's new key and value into the cache (in place) and a
    MultiHeadAttention over the whole time axis, the slots past each row's own masked. Rows at different lengths
    (sentences joining late, beams taking their parents' rows, a sentence leaving) give the step graph's ids and
    log-probs; the cache grows its time axis and holds no uninitialised slot (the NaN the test fixture puts in
    every unwritten slot of a grown buffer would reach the outputs through the masked scores); each row's new key
    is written at its own slot."""
    folder = load_model_folder(quantized)
    steps = {"single_row_step": False, "ragged_step": False}  # the step graph at every step, on both sides
    dense = OnnxRuntime(folder, "int8", SessionSettings(dense_step=True, dense_step_rows=1, **steps))
    plain = OnnxRuntime(folder, "int8", SessionSettings(**steps))
    assert dense.dense and dense.steps["decoder_step_dense"] is not None and dense.ragged is None and not plain.dense
    cfg = folder.manifest.config
    rng = np.random.default_rng(12)
    caches = {"dense": dense.new_cache(), "plain": plain.new_cache()}
    assert caches["dense"].dense and not caches["dense"].reserved and caches["plain"].reserved
    runtimes = {"dense": dense, "plain": plain}
    for t in range(MIN_CAPACITY + 6):  # past the first time axis: a regrowth, zeroed
        if t in (0, 3, 9):  # sentences join: rows at different lengths from here on
            mask = np.arange(7)[None] < np.array({0: [7, 4], 3: [5], 9: [6, 2]}[t])[:, None]  # (b, 7)
            src = np.where(mask, rng.integers(4, cfg.src_vocab_size, mask.shape), cfg.pad_id)
            for name, cache in caches.items():
                memory = runtimes[name].encode(src, mask)
                cache.add(memory.keys, memory.values, mask)
        if t == 5:  # the second sentence's row becomes two beams, the first's row moves
            for cache in caches.values():
                cache.select(np.array([0, 1, 1, 2]))
        if t == 11:  # the first sentence leaves
            for cache in caches.values():
                cache.select(np.array([1, 2, 3, 4, 5]))
        tokens = rng.integers(4, cfg.tgt_vocab_size, caches["dense"].rows)
        slots = caches["dense"].lengths.copy()  # (B,) where each row writes this step
        out = {name: runtimes[name].step(tokens, cache, full=True, candidates=4) for name, cache in caches.items()}
        assert caches["dense"].bound.graph == "decoder_step_dense"
        assert np.isfinite(out["dense"].log_probs).all()
        np.testing.assert_array_equal(out["dense"].top_ids, out["plain"].top_ids)
        np.testing.assert_allclose(out["dense"].log_probs, out["plain"].log_probs, rtol=0, atol=1e-4)
        rows = np.arange(len(slots))
        for mine, theirs in zip(caches["dense"].self_keys, caches["plain"].self_keys, strict=True):
            np.testing.assert_allclose(mine[rows, :, slots], theirs[rows, :, slots], rtol=0, atol=1e-5)
    assert caches["dense"].capacity > MIN_CAPACITY
    static = fast(variant="int8", batching="static")
    assert not open_runtime(folder, fast(variant="int8")).dense  # continuous batching: a reserved cache
    assert open_runtime(folder, static).dense
    assert step_graphs(folder, static) == ["step", "dense (static batches of 8 rows or more)", "one-row"]
    assert not OnnxRuntime(folder, "fp32", SessionSettings(dense_step=True)).dense  # fp32 has none: the step graph
    cuda = SessionSettings(("CUDAExecutionProvider", "CPUExecutionProvider"), dense_step=True)
    has_cuda = "CUDAExecutionProvider" in ort.get_available_providers()
    assert OnnxRuntime(folder, "int8", cuda).dense is not has_cuda  # measured on CPUs only: not beside CUDA ...
    on_cpu = fast(variant="int8", batching="static", providers=["cuda", "cpu"])  # ... but asked for and absent
    assert ("dense (static batches of 8 rows or more)" in step_graphs(folder, on_cpu)) is not has_cuda
    assert open_runtime(folder, on_cpu).dense is not has_cuda


def test_static_batches_on_the_dense_step_graph_decode_as_on_the_step_graph(quantized: Path) -> None:
    """decode_batch, greedy and beam, sources of different lengths: the same hypotheses and scores either way. The
    dense graph runs the steps of DENSE_STEP_ROWS rows or more (the beams' 16 rows, not the greedy batch's 4, which
    the step graph runs over the same dense cache)."""
    folder = load_model_folder(quantized)
    dense, plain = OnnxRuntime(folder, "int8", SessionSettings(dense_step=True)), OnnxRuntime(folder, "int8")
    ran = []
    bind = dense._bind
    dense._bind = lambda cache, full, width, graph: ran.append(graph) or bind(cache, full, width, graph)
    ids = folder.manifest.special_ids
    rules = TokenRules(ids.decoder_start, ids.eos, ids.pad)
    rng = np.random.default_rng(4)
    sources = [rng.integers(4, 90, n).tolist() + [ids.eos] for n in (3, 11, 6, 8)]
    for beam in (1, 4):
        options = [SearchOptions(beam_size=beam, max_new_tokens=24, n_best=beam)] * len(sources)
        got, expected = decode_batch(dense, sources, options, rules), decode_batch(plain, sources, options, rules)
        for mine, theirs in zip(got, expected, strict=True):
            assert [h.tokens for h in mine] == [h.tokens for h in theirs]
            np.testing.assert_allclose([h.score for h in mine], [h.score for h in theirs], atol=1e-4)
        assert ("decoder_step_dense" in ran) == (beam * len(sources) >= DENSE_STEP_ROWS)
        ran.clear()


def test_greedy_decoding_of_one_sentence_through_the_single_row_graph_stays_close_to_fp32(quantized: Path) -> None:
    """Whole searches of one sentence (every step one row) against fp32's: the same first tokens for most
    sentences of the tiny model, and each hypothesis's score within int8's error."""
    folder = load_model_folder(quantized)
    single, fp32 = OnnxRuntime(folder, "int8"), OnnxRuntime(folder, "fp32")
    ids = folder.manifest.special_ids
    rules = TokenRules(ids.decoder_start, ids.eos, ids.pad)
    rng = np.random.default_rng(2)
    same = 0
    for _ in range(8):
        source = rng.integers(4, 90, int(rng.integers(3, 12))).tolist() + [ids.eos]
        options = [SearchOptions(beam_size=1, max_new_tokens=10)]
        [[got]], [[expected]] = (
            decode_batch(single, [source], options, rules),
            decode_batch(fp32, [source], options, rules),
        )
        same += got.tokens[:3] == expected.tokens[:3]
        assert got.tokens and abs(got.score - expected.score) < 0.5
    assert same >= 5


def test_the_start_up_line_names_the_step_graphs_the_engine_opens(
    quantized: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An operator sees whether a folder's one-row graph (format 6) runs: int8 on CPU unless MT_SINGLE_ROW_STEP is
    false; not for fp32 (it has none) nor on CUDA."""
    folder = load_model_folder(quantized)
    assert step_graphs(folder, fast(variant="int8")) == ["step", "ragged", "one-row"]  # a small decoder: ragged
    assert step_graphs(folder, fast(variant="int8", single_row_step=False, ragged_step=False)) == ["step"]
    assert step_graphs(folder, fast(variant="fp32")) == ["step", "ragged"]
    with monkeypatch.context() as cuda:
        cuda.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
        assert step_graphs(folder, fast(variant="int8", providers=["cuda", "cpu"])) == ["step", "ragged"]
    with monkeypatch.context() as cpu_only:  # CUDA asked for, absent: the sessions run on the CPU, its graphs too
        cpu_only.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
        assert step_graphs(folder, fast(variant="int8", providers=["cuda", "cpu"])) == ["step", "ragged", "one-row"]
    monkeypatch.setenv("MT_MODELS_DIR", str(quantized.parent))
    monkeypatch.setenv("MT_MODELS", quantized.name)
    with caplog.at_level(logging.INFO, logger="service.translation.registry"):
        [translator] = load_translators(fast(engine_process=False, variant="int8", pin_cores=False), Metrics())
    translator.scheduler.stop()
    assert translator.runtime.single is not None
    assert "step graphs: step, ragged, one-row" in caplog.text


def test_an_int8_folder_without_the_one_row_graph_is_served_and_says_how_to_add_it(
    quantized: Path, tmp_path: Path
) -> None:
    """A format 5 int8 folder (no decoder_step_single) runs every step on the step graph; the start-up line names
    the command that adds the one-row graph."""
    old = Path(shutil.copytree(quantized, tmp_path / "old"))
    manifest = json.loads((old / MANIFEST).read_text())
    manifest["format_version"] = 5
    manifest["variants"]["int8"]["decoder_step_single"] = None
    (old / MANIFEST).write_text(json.dumps(manifest))
    folder = load_model_folder(old)
    runtime = OnnxRuntime(folder, "int8")
    assert runtime.single is None
    cache = runtime.new_cache()
    mask = np.ones((1, 4), np.bool_)
    memory = runtime.encode(np.array([[5, 9, 14, 3]]), mask)
    cache.add(memory.keys, memory.values, mask)
    runtime.step(np.array([folder.manifest.special_ids.decoder_start]), cache, candidates=2)
    assert cache.bound.graph == "decoder_step"
    [*_, hint] = step_graphs(folder, fast(variant="int8"))
    assert hint == f"no one-row graph in the folder (`python -m model_export quantize --model-dir {old}`)"


def test_a_decoder_whose_weights_stream_from_memory_runs_the_one_row_graph_for_a_few_rows(quantized: Path) -> None:
    """single_row_rows (4 for a decoder of the paper's size): steps of up to that many rows run the one-row graph,
    more rows the step graph; as rows leave, the one-row graph again."""
    folder = load_model_folder(quantized)
    runtime = OnnxRuntime(folder, "int8", SessionSettings(single_row_rows=2))
    cfg = folder.manifest.config
    rng = np.random.default_rng(4)
    cache = runtime.new_cache()
    graphs = []
    for t in range(6):
        if t in (0, 1, 2):  # a sentence joins at each of the first three steps: 1, 2, 3 rows
            mask = np.ones((1, 6), np.bool_)
            memory = runtime.encode(rng.integers(4, cfg.src_vocab_size, mask.shape), mask)
            cache.add(memory.keys, memory.values, mask)
        if t == 4:  # one leaves: 2 rows
            cache.select(np.array([0, 2]))
        runtime.step(rng.integers(4, cfg.tgt_vocab_size, cache.rows), cache, candidates=2)
        graphs.append((cache.rows, cache.bound.graph))
    single, step = "decoder_step_single", "decoder_step"
    assert graphs == [(1, single), (2, single), (3, step), (3, step), (2, single), (2, single)]


@pytest.mark.parametrize("single_rows", [1, 4])  # the default model's, the paper size's
def test_a_beam_takes_the_one_row_graph_only_where_its_next_steps_would(quantized: Path, single_rows: int) -> None:
    """A beam's first step has one row a sentence, its next ones k: it runs the step graph from the first step
    unless the one-row graph takes k rows too (its weights, brought in for one step, would push the step graph's
    out of the caches). Greedy rows keep the one-row graph. Whole searches decode as before either way."""
    folder = load_model_folder(quantized)
    runtime = OnnxRuntime(folder, "int8", SessionSettings(single_row_rows=single_rows))
    cfg, ids = folder.manifest.config, folder.manifest.special_ids
    graphs: list[tuple[int, str]] = []
    step = runtime.step

    def recorded(input_ids: np.ndarray, cache: DecoderCache, **kwargs: object) -> object:
        out = step(input_ids, cache, **kwargs)
        graphs.append((input_ids.shape[0], cache.bound.graph))
        return out

    runtime.step = recorded  # type: ignore[method-assign]
    rng = np.random.default_rng(9)
    rules = TokenRules(ids.decoder_start, ids.eos, ids.pad)
    single, step_graph = "decoder_step_single", "decoder_step"
    for beam, sentences in ((1, 1), (4, 1), (2, 2)):
        sources = [list(rng.integers(4, cfg.src_vocab_size, 5 + i)) for i in range(sentences)]
        options = [SearchOptions(beam, 6, min_new_tokens=6)] * sentences
        graphs.clear()
        decode_batch(runtime, sources, options, rules)
        most = beam * sentences  # rows from the second step on
        expected = single if most <= single_rows else step_graph
        assert graphs[0] == (sentences, expected)  # the first step: one row a sentence
        assert all(graph == expected for _, graph in graphs[1:]) and graphs[1][0] == most


@pytest.mark.parametrize("single_rows", [1, 4])
def test_the_warm_up_runs_the_one_row_graph_and_the_step_graph(quantized: Path, single_rows: int) -> None:
    """A server's warm-up translates through the encoder, the one-row graph (a greedy sentence: the default
    search) and the step graph (rows past what the one-row graph takes), whatever rows the one-row graph takes."""
    from service.scheduling.jobs import BatchLimits
    from service.scheduling.scheduler import Scheduler

    folder = load_model_folder(quantized)
    runtime = OnnxRuntime(folder, "int8", SessionSettings(single_row_rows=single_rows))
    ids = folder.manifest.special_ids
    bound: list[str] = []
    bind = runtime._bind

    def recorded(cache: DecoderCache, full: bool, width: int, graph: str) -> object:
        bound.append(graph)
        return bind(cache, full, width, graph)

    runtime._bind = recorded  # type: ignore[method-assign]
    scheduler = Scheduler(runtime, TokenRules(ids.decoder_start, ids.eos, ids.pad), BatchLimits(), Metrics(), "t")
    scheduler.warm_up([5, 6, 7, 8])
    assert {"decoder_step_single", "decoder_step"} <= set(bound)


def test_on_cuda_an_int8_default_gives_way_to_fp16_where_it_runs_else_fp32(
    quantized: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """int8's products have no CUDA kernel: with CUDA asked for and present, a folder whose default is int8 runs
    fp16 if it can run on CUDA (format 7, CuPy), else fp32; MT_VARIANT, CPU runs and a build without CUDA keep it."""
    from model_export.half import add_fp16_variant
    from service.engine import sessions

    path = Path(shutil.copytree(quantized, tmp_path / "m"))
    add_fp16_variant(path)
    manifest = json.loads((path / MANIFEST).read_text())
    (path / MANIFEST).write_text(json.dumps({**manifest, "default_variant": "int8"}))
    folder = load_model_folder(path, verify_checksums=False)
    cuda, cpu = Settings(providers=["cuda", "cpu"]), Settings(providers=["cpu"])
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CPUExecutionProvider"])
    assert chosen_variant(folder, cuda) == "int8"  # an onnxruntime build without CUDA
    monkeypatch.setattr(ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(sessions, "has_cupy", lambda: True)
    assert chosen_variant(folder, cuda) == "fp16"
    assert chosen_variant(folder, cpu) == "int8"
    assert chosen_variant(folder, Settings(providers=["cuda", "cpu"], variant="int8")) == "int8"
    monkeypatch.setattr(sessions, "has_cupy", lambda: False)
    assert chosen_variant(folder, cuda) == "fp32"
    monkeypatch.setattr(sessions, "has_cupy", lambda: True)
    fp16 = manifest["variants"]["fp16"]["decoder_step"]
    fp16["inputs"] = [s for s in fp16["inputs"] if s["role"] not in ("seqlens_k", "total_sequence_length")]
    (path / MANIFEST).write_text(json.dumps({**manifest, "default_variant": "int8"}))  # an fp16 step of format 6
    assert chosen_variant(load_model_folder(path, verify_checksums=False), cuda) == "fp32"
    (path / MANIFEST).write_text(json.dumps({**manifest, "default_variant": "fp32"}))
    assert chosen_variant(load_model_folder(path, verify_checksums=False), cuda) == "fp32"  # not int8: kept


def _scheduled(
    runtime: OnnxRuntime,
    rules: TokenRules,
    sources: list[list[int]],
    options: list[SearchOptions],
    hypotheses: bool = False,
) -> list[object]:
    """Each sentence's best tokens (or its error; `hypotheses`: its hypotheses, scores and all), the sentences
    joining a running continuous batch one per iteration."""
    from service.scheduling.jobs import BatchLimits, SentenceJob, Ticket
    from service.scheduling.scheduler import Scheduler

    scheduler = Scheduler(runtime, rules, BatchLimits(), Metrics(), "t")
    tickets = []
    for source, option in zip(sources, options, strict=True):
        tickets.append(Ticket(1, 1e18, lambda ticket: None))
        scheduler.submit([SentenceJob(source, option, tickets[-1], 0)])
        scheduler.run_once()
    while not scheduler.idle:
        scheduler.run_once()
    if hypotheses:
        return [ticket.results[0] if ticket.error is None else ticket.error for ticket in tickets]
    return [ticket.results[0][0].tokens if ticket.error is None else ticket.error for ticket in tickets]


def test_a_cache_bound_by_device_pointer_is_read_and_written_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """StepBinding.device_input binds a CUDA cache (CuPy) by its device pointer as a step's past and present
    (bind_gpu_cache). CI has no GPU, so here it binds host memory by pointer with the CPU's device in place of the
    GPU's: the same call into ONNX Runtime but for the device. One GroupQueryAttention step must write each row's key
    and value at its own slot of the very buffers bound, and read them."""
    monkeypatch.setattr(runtime_module, "gpu_device", lambda device: host_device())
    heads, head_dim, rows, slots = 2, 8, 3, 8
    graph = one_attention_graph(heads, head_dim, onnx.TensorProto.FLOAT)
    session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    positions = np.array([1, 3, 2], np.int32)  # (B,) cached steps
    qkv = rng.standard_normal((rows, 1, 3 * heads * head_dim)).astype(np.float32)  # (B, 1, 3D)
    past = {role: rng.standard_normal((rows, heads, slots, head_dim)).astype(np.float32) for role in ("key", "value")}
    cache = {role: array.copy() for role, array in past.items()}  # (B, H, T, Dh): the "device" buffers
    context = np.zeros((rows, 1, heads * head_dim), np.float32)  # (B, 1, D)
    binding = StepBinding(session)
    binding.host_input("qkv", qkv)
    binding.host_input("seqlens_k", positions)
    binding.host_input("total_sequence_length", np.array(positions.max() + 1, np.int32))
    binding.host_output("context", context)
    for role, array in cache.items():  # as CuPy arrays show themselves: dtype, shape and data.ptr
        pointer = types.SimpleNamespace(ptr=array.ctypes.data)
        by_pointer = types.SimpleNamespace(dtype=array.dtype, shape=array.shape, data=pointer)
        binding.device_input(f"past_{role}", 0, by_pointer, f"present_{role}")
    binding.run()
    assert_written_in_place(qkv, positions, past, cache, context, heads, atol=1e-4)


@pytest.mark.parametrize("variant", ["fp32", "int8"])  # int8: its one-row step graph too
def test_steps_are_right_where_host_inputs_are_copied_when_bound(
    quantized: Path, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On CUDA, ONNX Runtime copies an input bound from host memory to the GPU when it is bound, not at each run
    (docs/performance.md "GPU"). Here the CPU is made to do the same: with the runtime's rebinding on (as on CUDA), a
    continuous batch (greedy and beam rows joining, reordering and leaving) gives every sentence its result; with it
    off, as before the fix, it does not."""
    folder = load_model_folder(quantized)
    rng = np.random.default_rng(5)
    ids = folder.manifest.special_ids
    rules, eos = TokenRules(ids.decoder_start, ids.eos, ids.pad), ids.eos
    sources = [[int(t) for t in rng.integers(4, 90, size=int(rng.integers(2, 12)))] + [eos] for _ in range(8)]
    options = [SearchOptions(beam_size=3 if i % 3 == 0 else 1, max_new_tokens=12) for i in range(len(sources))]
    expected = _scheduled(OnnxRuntime(folder, variant), rules, sources, options)
    bind = StepBinding.host_input
    monkeypatch.setattr(StepBinding, "host_input", lambda self, name, array: bind(self, name, np.array(array)))
    copied = OnnxRuntime(folder, variant)
    stale = OnnxRuntime(folder, variant)
    copied._rebind_host_inputs = True  # what a CUDA session sets (OnnxRuntime.__init__)
    assert _scheduled(copied, rules, sources, options) == expected
    assert _scheduled(stale, rules, sources, options) != expected


class PatientRuntime(PatientSteps, OnnxRuntime):
    pass


def _passes_join_after_the_step(scheduler: Any) -> None:
    """A running batch's newcomers join after the step that follows their admission (PatientSteps waits for their
    passes), never before it when the encoder thread happens to be quick: int8 quantizes a step's activations with
    one scale over its rows, so the runs compared must step the same rows."""
    encode, join = scheduler._encode, scheduler._join
    fresh: list[int] = []  # ids of the passes started in this iteration

    def started(jobs: list[Any]) -> None:
        before = {id(encoding) for encoding in scheduler.encoding}
        encode(jobs)
        fresh[:] = [id(encoding) for encoding in scheduler.encoding if id(encoding) not in before]

    def joined(wait: bool) -> None:
        if wait:
            return join(True)
        held = [encoding for encoding in scheduler.encoding if id(encoding) in fresh]
        scheduler.encoding = [encoding for encoding in scheduler.encoding if id(encoding) not in fresh]
        join(False)
        scheduler.encoding += held

    scheduler._encode, scheduler._join = started, joined


def _refilled(folder, variant: str, sources: list[list[int]], copies: bool) -> tuple[list[object], int, int]:
    """Greedy sentences joining a running continuous batch (overlapped encoder passes) while others finish: each
    one's best tokens, the steps, and the bindings made."""
    from service.scheduling.jobs import BatchLimits, SentenceJob, Ticket
    from service.scheduling.scheduler import Scheduler

    ids = folder.manifest.special_ids
    runtime = PatientRuntime(folder, variant)
    runtime._rebind_host_inputs = copies  # what a CUDA session sets (OnnxRuntime.__init__)
    bindings, bind = [], runtime._bind
    runtime._bind = lambda *args: bindings.append(1) or bind(*args)
    limits = BatchLimits(overlap_encoder=True)
    scheduler = runtime.scheduler = Scheduler(
        runtime, TokenRules(ids.decoder_start, ids.eos, ids.pad), limits, Metrics(), "t"
    )
    _passes_join_after_the_step(scheduler)
    tickets = []
    for i, source in enumerate(sources):
        tickets.append(Ticket(1, 1e18, lambda ticket: None))
        scheduler.submit([SentenceJob(source, SearchOptions(max_new_tokens=10), tickets[-1], 0)])
        if i % 3:
            scheduler.run_once()
    while not scheduler.idle:
        scheduler.run_once()
    steps = int(scheduler.metrics.registry.get_sample_value("mt_decoder_step_rows_count", {"model": "t"}))
    scheduler.stop(0.0)
    assert all(ticket.error is None for ticket in tickets)
    return [ticket.results[0][0].tokens for ticket in tickets], steps, len(bindings)


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_newcomers_in_finished_rows_places_keep_the_binding_and_every_result(
    quantized: Path, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Greedy newcomers that take finished rows' places (DecoderCache.refill) give every sentence the tokens it
    gets when the last rows move into those places and newcomers join at the end (the same rows at every step, in
    another order), with fewer bindings: a step after as many joined as finished keeps its binding. Where host
    inputs are copied when bound (CUDA, simulated here), the cache binds anew instead, and the results hold."""
    import service.scheduling.encoder
    import service.scheduling.scheduler

    # one encoder pass per bucket the worker admits, none early or merged: int8 quantizes a pass's activations with
    # one scale over its sentences (README, "How the server runs a model"), so the three runs compared here must
    # encode each sentence with the same others, which the encoder thread's timing would otherwise decide
    monkeypatch.setattr(service.scheduling.scheduler, "EARLY_QUEUE", 0)
    monkeypatch.setattr(service.scheduling.encoder, "MERGED_PASS_SENTENCES", 1)
    folder = load_model_folder(quantized)
    rng = np.random.default_rng(11)
    eos = folder.manifest.special_ids.eos
    sources = [[int(t) for t in rng.integers(4, 90, size=int(rng.integers(2, 12)))] + [eos] for _ in range(24)]
    refilled, steps, bindings = _refilled(folder, variant, sources, copies=False)
    with monkeypatch.context() as patch:
        bind = StepBinding.host_input
        patch.setattr(StepBinding, "host_input", lambda self, name, array: bind(self, name, np.array(array)))
        copied, _, copied_bindings = _refilled(folder, variant, sources, copies=True)
    with monkeypatch.context() as patch:
        patch.setattr(DecoderCache, "refill", lambda *args: pytest.fail("refill when not in order"))
        patch.setattr(DecoderCache, "in_order", property(lambda cache: False))  # select, then add at the end
        selected, _, selected_bindings = _refilled(folder, variant, sources, copies=False)
    assert refilled == copied == selected
    assert bindings < selected_bindings <= copied_bindings <= steps


def as_format_7(folder: Path, dest: Path) -> Path:
    """A copy of `folder` as format 7 wrote it: every step graph normalises at every step, no `log_softmax` input
    (what the fp16 variant's step graph still is: model_export.half.always_normalised)."""
    from model_export.half import always_normalised

    shutil.copytree(folder, dest)
    manifest = json.loads((dest / MANIFEST).read_text())
    for variant in manifest["variants"].values():
        for graph in ("decoder_step", "decoder_step_ragged", "decoder_step_single"):
            if not variant.get(graph):
                continue
            spec = variant[graph]
            spec["inputs"] = [tensor for tensor in spec["inputs"] if tensor["role"] != "log_softmax"]
            path = dest / spec["file"]
            model = onnx.load(path, load_external_data=False)
            always_normalised(model.graph)
            onnx.save(model, path)
            manifest["files"][spec["file"]] = {"sha256": sha256_of(path), "bytes": path.stat().st_size}
    manifest["format_version"] = 7
    (dest / MANIFEST).write_text(json.dumps(manifest))
    return dest


@pytest.mark.parametrize("variant", ["fp32", "int8"])  # int8: its one-row step graph too
def test_a_step_asked_not_to_normalise_gives_the_same_candidates_as_logits(quantized: Path, variant: str) -> None:
    """Format 8: `log_softmax=False` skips the log-softmax. The candidates are the same ids in the same order, their
    values the logits: each row's differ from its log-probs by one constant, log-sum-exp over the vocabulary, which
    is above every logit. The flag is set at every step, on the binding the cache keeps (one row: the one-row graph;
    three: the step graph)."""
    folder = load_model_folder(quantized)
    runtime = OnnxRuntime(folder, variant)
    assert runtime._dec_log_softmax == "log_softmax"
    cfg = folder.manifest.config
    rng = np.random.default_rng(12)
    for sentences in (1, 3):
        mask = np.ones((sentences, 6), np.bool_)
        memory = runtime.encode(rng.integers(4, cfg.src_vocab_size, mask.shape), mask)
        caches = [runtime.new_cache() for _ in range(2)]
        for cache in caches:
            cache.add(memory.keys, memory.values, mask)
        for t in range(6):
            tokens = rng.integers(4, cfg.tgt_vocab_size, sentences)
            normalised = runtime.step(tokens, caches[0], candidates=2)  # greedy rows' (the one-row graph's)
            raw = runtime.step(tokens, caches[1], candidates=2, log_softmax=t % 2 == 1)  # one binding, both ways
            np.testing.assert_array_equal(raw.top_ids, normalised.top_ids)
            if t % 2 == 1:
                np.testing.assert_allclose(raw.top_log_probs, normalised.top_log_probs, atol=1e-6)
                continue
            shift = raw.top_log_probs - normalised.top_log_probs  # (B, K): log-sum-exp of each row's logits
            np.testing.assert_allclose(shift, shift[:, :1].repeat(shift.shape[1], 1), atol=1e-4)
            assert (shift[:, 0] > raw.top_log_probs[:, 0]).all() and (normalised.top_log_probs <= 0).all()
        graph = "decoder_step_single" if sentences == 1 and variant == "int8" else "decoder_step"
        assert caches[1].bound.graph == graph and caches[1].bound.log_softmax is not None


def test_greedy_searches_asking_no_scores_translate_the_same_without_the_log_softmax(
    quantized: Path, tmp_path: Path
) -> None:
    """Greedy searches not `scored` take the same tokens whether their steps normalise or not, format 8 or 7 (whose
    step graphs always normalise), and report no score (NaN); scored ones, and beams, keep their log-probs."""
    old = as_format_7(quantized, tmp_path / "format-7")
    assert load_model_folder(old).manifest.format_version == 7
    ids = load_model_folder(quantized).manifest.special_ids
    rules = TokenRules(ids.decoder_start, ids.eos, ids.pad)
    rng = np.random.default_rng(13)
    sources = [rng.integers(4, 90, n).tolist() + [ids.eos] for n in (3, 7, 5, 9)]
    unscored = [SearchOptions(max_new_tokens=12, scored=False)] * 4
    scored = [SearchOptions(max_new_tokens=12)] * 4
    mixed = [SearchOptions(max_new_tokens=12, scored=False), SearchOptions(beam_size=2, max_new_tokens=12)] * 2
    for variant in ("fp32", "int8"):
        new, before = OnnxRuntime(load_model_folder(quantized), variant), OnnxRuntime(load_model_folder(old), variant)
        assert new._dec_log_softmax is not None and before._dec_log_softmax is None
        reference = decode_batch(new, sources, scored, rules)
        for runtime in (new, before):
            got = decode_batch(runtime, sources, unscored, rules)
            assert [h[0].tokens for h in got] == [h[0].tokens for h in reference]
            assert all(np.isnan(h[0].score) for h in got) and all(np.isfinite(h[0].score) for h in reference)
            both = decode_batch(runtime, sources, mixed, rules)
            assert all(np.isfinite(h[0].score) for h in both[1::2]) and all(np.isnan(h[0].score) for h in both[::2])
            again = decode_batch(runtime, sources, scored, rules)
            np.testing.assert_allclose([h[0].score for h in again], [h[0].score for h in reference], atol=1e-5)


def test_outputs_are_capped_at_the_positions_the_model_has(model_dir: Path) -> None:
    """A sentence may generate as many tokens as the decoder has positions (the tiny model's 256), and no more,
    whatever MT_MAX_OUTPUT_TOKENS, the ratio or a request's max_length allow: past them the position table's
    Gather fails, and with it every sentence of the batch (a 500)."""
    folder = load_model_folder(model_dir)
    runtime = OnnxRuntime(folder, "fp32")
    positions = folder.manifest.config.max_positions  # 256
    settings = Settings(max_output_tokens=1000, max_output_ratio=100.0, max_sentence_tokens=1000)
    translator = Translator(folder, settings, Metrics(), runtime=runtime)
    assert translator.search_options(5, TranslateOptions(max_length=1000)).max_new_tokens == positions
    assert translator.search_options(5, TranslateOptions()).max_new_tokens == positions
    assert translator.search_options(5, TranslateOptions(max_length=40)).max_new_tokens == 40
    ids = folder.manifest.special_ids
    rules = TokenRules(ids.decoder_start, ids.eos, ids.pad)
    longest = SearchOptions(max_new_tokens=positions, min_new_tokens=positions)
    (best,) = decode_batch(runtime, [[5, 6, ids.eos]], [longest], rules)[0]
    assert len(best.tokens) == positions  # every position used, none past them
    with pytest.raises(Exception, match="out of data bounds|indices"):  # one more: what the cap prevents
        decode_batch(runtime, [[5, 6, ids.eos]], [replace(longest, max_new_tokens=positions + 1)], rules)


def test_a_missing_provider_is_warned_about_once_a_process(caplog: pytest.LogCaptureFixture) -> None:
    """A model opens four sessions: the warning came four times."""
    if "CUDAExecutionProvider" in __import__("onnxruntime").get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    _warn_missing.cache_clear()
    for _ in range(4):
        assert usable_providers(("CUDAExecutionProvider", "CPUExecutionProvider")) == ["CPUExecutionProvider"]
    assert caplog.text.count("execution provider CUDAExecutionProvider is not available") == 1


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_beams_that_copy_only_what_they_do_not_share_decode_bit_for_bit_as_whole_copies(
    quantized: Path, variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host cache records each row's input tokens, and a beam that takes a sibling's row copies only the slots
    after their common prefix (DecoderCache._shared): every hypothesis, log-probability and score must be the same,
    to the bit, as with whole rows copied, in static batches and in a continuous batch of beams and greedy rows."""
    folder = load_model_folder(quantized)
    rng = np.random.default_rng(11)
    ids = folder.manifest.special_ids
    rules, eos = TokenRules(ids.decoder_start, ids.eos, ids.pad), ids.eos
    sources = [[int(t) for t in rng.integers(4, 90, size=int(rng.integers(3, 14)))] + [eos] for _ in range(10)]
    options = [SearchOptions(beam_size=(4, 1, 2)[i % 3], max_new_tokens=20, n_best=2) for i in range(len(sources))]
    runtime = OnnxRuntime(folder, variant)

    def decoded() -> tuple[list, list]:
        static = [decode_batch(runtime, sources[i : i + 5], options[i : i + 5], rules) for i in (0, 5)]
        return static, _scheduled(runtime, rules, sources, options, hypotheses=True)

    advance = kv_cache.DecoderCache.advance
    with monkeypatch.context() as whole_rows:  # no record of tokens: every copy takes whole rows
        whole_rows.setattr(kv_cache.DecoderCache, "advance", lambda cache, tokens=None: advance(cache, None))
        expected = decoded()
    kept: list[int] = []
    groups = kv_cache.start_groups
    monkeypatch.setattr(kv_cache, "SHARE_BYTES", 0)  # the tiny model's rows are small: look at any size

    def counted(targets: np.ndarray, parents: np.ndarray, starts: np.ndarray, width: int) -> list:
        kept.append(int(starts.sum()))
        return groups(targets, parents, starts, width)

    monkeypatch.setattr(kv_cache, "start_groups", counted)
    assert decoded() == expected
    assert sum(kept) > 0  # slots were shared, not copied
