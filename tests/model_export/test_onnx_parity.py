"""ONNX Runtime runs the exported graphs like PyTorch runs the model: log-probs within 1e-4 over
several batch sizes, source lengths and cache lengths, with padding, rows at different steps in one
call, post-norm and pre-norm; and the decoding loop over the graphs gives the reference's token ids."""

from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

from model_export import reference
from model_export.export import export_folder
from model_export.graph_io import TensorSpec
from model_export.onnx_graphs import GraphBuilder, _top_k, vocabulary_chunks
from model_export.verify import random_sources, same_decodings, teacher_forced_diff
from service.engine.kv_cache import DecoderCache
from service.engine.runtime import OnnxRuntime
from service.model.folder import load_model_folder
from tests.factories import tiny_checkpoint

CONFIGS = {
    "post-norm": {"tie_output": True, "output_bias": False},
    "pre-norm": {"norm_position": "pre", "activation": "gelu", "sinusoid_layout": "half"},
    "marian-like": {
        "activation": "swish", "sinusoid_layout": "half", "output_bias": True, "layer_norm_eps": 1e-5,
        "pad_id": 3, "decoder_start_id": 3, "eos_id": 2,
    },
}


@pytest.fixture(scope="module", params=list(CONFIGS))
def exported(request: pytest.FixtureRequest, spm_model: bytes, tmp_path_factory: pytest.TempPathFactory):
    ckpt = tiny_checkpoint(spm_model, **CONFIGS[request.param])
    folder = export_folder(ckpt, tmp_path_factory.mktemp(request.param) / "m", request.param, "0")
    return ckpt.build_model(), OnnxRuntime(load_model_folder(folder))


@pytest.mark.parametrize("shape", [(1, 1, 3), (2, 5, 8), (4, 11, 5), (7, 16, 12), (3, 6, 40)])  # 40: grows twice
def test_step_graph_matches_teacher_forcing(exported, shape: tuple[int, int, int]) -> None:
    model, runtime = exported
    assert teacher_forced_diff(model, runtime, shape, seed=sum(shape)) < 1e-4


def test_rows_at_different_steps_share_one_call(exported) -> None:
    """Rows that joined later (shorter cache, earlier positions) run in the same step call."""
    model, runtime = exported
    cfg = model.cfg
    rng = np.random.default_rng(5)
    src_ids, src_mask = random_sources(cfg, 4, 10, rng)
    tgt = torch.from_numpy(rng.integers(4, cfg.tgt_vocab_size, size=(4, 9)))  # (B, T)
    tgt[:, 0] = cfg.decoder_start_id
    with torch.no_grad():
        expected = model(src_ids, src_mask, tgt).numpy()  # (B, T, V)
    cache = DecoderCache(runtime.n_layers, runtime.n_heads, runtime.head_dim)
    joins = {0: [0, 1], 3: [2], 5: [3]}  # at global step s, these sentences join
    rows: list[int] = []
    worst = 0.0
    for step in range(12):
        if step in joins:
            memory = runtime.encode(src_ids[joins[step]].numpy(), src_mask[joins[step]].numpy())
            cache.add(memory.keys, memory.values, src_mask[joins[step]].numpy())
            rows += joins[step]
        steps = cache.lengths.copy()  # each row's own position
        active = steps < tgt.size(1)
        cache.select(np.flatnonzero(active))
        rows = [r for r, a in zip(rows, active, strict=True) if a]
        if not rows:
            break
        out = runtime.step(tgt[rows, steps[active]].numpy(), cache, full=True)
        worst = max(worst, float(np.abs(out.log_probs - expected[rows, steps[active]]).max()))
    assert worst < 1e-4
    assert not rows or cache.lengths.max() == tgt.size(1)


def test_sentences_with_any_number_of_rows_share_their_source_in_one_call(exported) -> None:
    """Rows (beams) of three sentences, interleaved and unequal in number, each attending over its sentence's one
    copy of the source; then a sentence leaves and the last one's source moves into its place."""
    model, runtime = exported
    cfg = model.cfg
    rng = np.random.default_rng(9)
    src_ids, src_mask = random_sources(cfg, 3, 10, rng)
    row_sentence = np.array([1, 0, 2, 0, 2, 0])  # sentence 0 has three rows, 1 one, 2 two
    tgt = torch.from_numpy(rng.integers(4, cfg.tgt_vocab_size, size=(6, 7)))  # (B, T) a different target per row
    tgt[:, 0] = cfg.decoder_start_id
    with torch.no_grad():
        expected = model(src_ids[row_sentence], src_mask[row_sentence], tgt).numpy()  # (B, T, V)
    cache = DecoderCache(runtime.n_layers, runtime.n_heads, runtime.head_dim)
    memory = runtime.encode(src_ids.numpy(), src_mask.numpy())
    cache.add(memory.keys, memory.values, src_mask.numpy())
    cache.select(row_sentence)  # each sentence's one row branches into its rows
    assert cache.sentences == 3 and cache.sentence_rows.shape == (3, 3)
    rows = np.arange(6)  # which of tgt's rows each cache row is
    worst = 0.0
    for t in range(tgt.size(1)):
        if t == 3:
            rows = np.array([0, 2, 4])  # sentence 0's rows leave: sentence 2's source moves to its place
            cache.select(rows)
            assert cache.sentences == 2 and cache.sentence.tolist() == [1, 0, 0]
        out = runtime.step(tgt[rows, t].numpy(), cache, full=True)
        worst = max(worst, float(np.abs(out.log_probs - expected[rows, t]).max()))
    assert worst < 1e-4


def test_the_step_graph_writes_each_row_at_its_own_slot_in_the_cache_itself(exported) -> None:
    """Format 3: the graph's present_key_i/present_value_i are the cache buffers, bound as its inputs too; each row's
    new key lands at slot `positions[row]` and nothing else changes. Unbound, the same tensors come back as a copy."""
    model, runtime = exported
    rng = np.random.default_rng(3)
    src_ids, src_mask = random_sources(model.cfg, 3, 6, rng)
    memory = runtime.encode(src_ids.numpy(), src_mask.numpy())
    cache = DecoderCache(runtime.n_layers, runtime.n_heads, runtime.head_dim)
    cache.add(memory.keys, memory.values, src_mask.numpy())
    token = np.full(3, model.cfg.decoder_start_id, np.int64)  # (B,)
    runtime.step(token, cache)
    cache.select(np.array([0, 1, 1, 2]))
    cache.lengths[3] = 0  # a row that starts over: rows now at positions 1, 1, 1, 0
    for layer in cache.self_keys:
        layer[3] = 0.0
    before = [layer.copy() for layer in cache.self_keys]  # L x (B, H, T, Dh)
    buffers = list(cache.self_keys)
    feeds = {
        "input_ids": np.array([5, 6, 7, 8]), "positions": cache.lengths.copy(), "src_mask": cache.src_mask,
        "sentence_rows": cache.sentence_rows, "row_slots": cache.row_slots, "top_k": np.array([4]),
        "seqlens_k": cache.lengths.astype(np.int32),
        "total_sequence_length": np.array(cache.lengths.max() + 1, np.int32), "log_softmax": np.array(True),
        **{f"self_key_{i}": layer.copy() for i, layer in enumerate(cache.self_keys)},
        **{f"self_value_{i}": layer.copy() for i, layer in enumerate(cache.self_values)},
        **{f"cross_key_{i}": layer for i, layer in enumerate(cache.cross_keys)},
        **{f"cross_value_{i}": layer for i, layer in enumerate(cache.cross_values)},
    }
    unbound = runtime.decoder.run([f"present_key_{i}" for i in range(runtime.n_layers)], feeds)  # L x (B, H, T, Dh)
    runtime.step(feeds["input_ids"], cache)
    assert cache.lengths.tolist() == [2, 2, 2, 1]
    for layer, buffer, old, copy in zip(cache.self_keys, buffers, before, unbound, strict=True):
        assert np.shares_memory(layer, buffer)  # written in place
        written = np.zeros(layer.shape[::2], np.bool_)  # (B, T) per row and slot
        written[[0, 1, 2, 3], [1, 1, 1, 0]] = True
        assert np.abs(layer.transpose(0, 2, 1, 3)[written]).sum() > 0  # the new keys
        rest = (layer.transpose(0, 2, 1, 3)[~written], old.transpose(0, 2, 1, 3)[~written])  # NaN where unwritten
        assert np.array_equal(*rest, equal_nan=True)  # the rest
        had = np.arange(layer.shape[2]) < cache.lengths[:, None]  # (B, T) the slots each row has now
        np.testing.assert_allclose(copy.transpose(0, 2, 1, 3)[had], layer.transpose(0, 2, 1, 3)[had], atol=1e-6)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_onnx_loop_gives_the_reference_ids(exported, beam_size: int) -> None:
    model, runtime = exported
    assert same_decodings(model, runtime, beam_size, seed=11)


def test_reference_decoders_produce_eos_terminated_or_capped_output(exported) -> None:
    model, _ = exported
    src_ids, src_mask = random_sources(model.cfg, 3, 6, np.random.default_rng(0))
    for ids in reference.greedy(model, src_ids, src_mask, 7) + reference.beam_search(model, src_ids, src_mask, 3, 7):
        assert 1 <= len(ids) <= 7
        assert ids[-1] == model.cfg.eos_id or len(ids) == 7
        assert model.cfg.pad_id not in ids and model.cfg.eos_id not in ids[:-1]


def test_graphs_declare_the_opset_and_io_of_the_manifest(model_dir: Path) -> None:
    import onnx

    folder = load_model_folder(model_dir)
    variant = folder.variant()
    for spec in (variant.encoder, variant.decoder_step):
        graph = onnx.load(folder.file(spec.file))
        assert [o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")] == [folder.manifest.opset]
        assert [i.name for i in graph.graph.input] == [s.name for s in spec.inputs]
        assert [o.name for o in graph.graph.output] == [s.name for s in spec.outputs]


@pytest.mark.parametrize(("vocab", "length"), [(59514, 109), (8000, 125), (96, 12), (40, None), (97, None), (31, None)])
def test_the_vocabulary_is_cut_into_chunks_near_128_tokens_where_it_can(vocab: int, length: int | None) -> None:
    assert vocabulary_chunks(vocab) == length



def _top_k_graph(vocab: int) -> onnxruntime.InferenceSession:
    """The step graph's top-K alone: logits (B, vocab), top_k (1,) -> top (B, k) logits, ids (B, k)."""
    g = GraphBuilder()
    g.op("Identity", _top_k(g, "logits", vocab, "ids"), out="top")
    inputs = [TensorSpec("logits", "logits", "float32", ("batch", vocab)), TensorSpec("top_k", "top_k", "int64", (1,))]
    outputs = [TensorSpec("top", "top", "float32", ("batch", "k")), TensorSpec("ids", "ids", "int64", ("batch", "k"))]
    return onnxruntime.InferenceSession(g.model("top_k", inputs, outputs).SerializeToString())


@pytest.mark.parametrize("vocab", [8000, 96, 97])
@pytest.mark.parametrize("k", [1, 3, 11, 40])
def test_the_two_stage_top_k_is_exact_with_ties_broken_to_the_lower_id(vocab: int, k: int) -> None:
    rng = np.random.default_rng(vocab + k)
    logits = rng.integers(-6, 6, size=(9, vocab)).astype(np.float32)  # (9, V) few values: ties everywhere
    logits[0] = rng.standard_normal(vocab)  # one row without ties
    logits[1, :] = 0.0  # one row all ties
    logits[2, -3:] = 9.0  # the best in the last chunk
    top, ids = _top_k_graph(vocab).run(None, {"logits": logits, "top_k": np.array([k])})  # (9, k) each
    expected = np.argsort(-logits, axis=1, kind="stable")[:, :k]  # (9, k) best first, ties to the lower id
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_array_equal(top, np.take_along_axis(logits, expected, axis=1))
