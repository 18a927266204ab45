"""The int8 variant and the evaluation command, on the tiny test model."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import sacrebleu
from fastapi.testclient import TestClient
from onnx import numpy_helper

from model_export.evaluate import StaticBatches, evaluate, same_placeholders, translate_all
from model_export.export import export_folder
from model_export.onnx_graphs import names_read
from model_export.quantize import add_int8_variant, blockwise
from service.api.app import create_app
from service.engine.batches import TokenRules, decode_batch
from service.engine.decoding import SearchOptions, output_cap
from service.engine.runtime import CPU_DISABLED_FUSIONS, OnnxRuntime
from service.errors import ModelFolderError
from service.model.folder import load_model_folder
from service.model.tokenizer import Tokenizer
from service.settings import Settings
from tests.factories import DYNAMIC_INT8_GRAPHS, SENTENCES, product_weights, tiny_checkpoint


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


def test_the_int8_products_weights_fit_in_7_bits_so_no_cpu_saturates_them(quantized: Path) -> None:
    """Every product's int8 weights lie in [-64, 64] (REDUCED_RANGE): on a CPU without VNNI ONNX Runtime adds pairs
    of u8 x s8 products in 16 bits, which 255 x 127 x 2 overflows and 255 x 64 x 2 does not. The embedding table,
    gathered rather than multiplied, keeps its 8 bits. The manifest says 7 (format 11), which the server checks."""
    folder = load_model_folder(quantized)
    variant = folder.variant("int8")
    assert variant.weight_bits == 7 and folder.variant("fp32").weight_bits is None
    for graph in DYNAMIC_INT8_GRAPHS:
        weights = product_weights(quantized / getattr(variant, graph).file)
        assert len(weights) >= 7, graph  # q, k, v (or fused), o and the FFN's two in every layer at least
        for name, codes in weights.items():  # (K, N) int8 each
            assert codes.dtype == np.int8 and codes.min() >= -64 and codes.max() <= 64, (graph, name)
            assert codes.max() == 64 or codes.min() == -64, (graph, name)  # the 7 bits used, not fewer
    [shared] = variant.shared_initializers
    table = np.fromfile(quantized / shared.file, dtype=shared.dtype)
    assert table.max() - table.min() > 128  # 8 bits


def test_the_shared_embedding_table_is_stored_once_and_held_once(quantized: Path) -> None:
    folder = load_model_folder(quantized)
    variant = folder.variant("int8")
    [shared] = variant.shared_initializers
    assert shared.file in folder.manifest.files and (quantized / shared.file).stat().st_size == np.prod(shared.shape)
    for graph in ("encoder", "decoder_step"):  # the graphs reference the file, they hold no copy
        model = onnx.load(quantized / getattr(variant, graph).file, load_external_data=False)
        tensor = next(t for t in model.graph.initializer if t.name == shared.names[graph])
        assert tensor.data_location == onnx.TensorProto.EXTERNAL and not tensor.raw_data
    runtime = OnnxRuntime(folder, "int8")
    encoder_table = runtime.shared["encoder"][shared.names["encoder"]]
    assert encoder_table is runtime.shared["decoder_step"][shared.names["decoder_step"]]  # one buffer for both
    ids = folder.manifest.special_ids
    rules, options = TokenRules(ids.decoder_start, ids.eos, ids.pad), [SearchOptions(beam_size=2)] * 2
    sources = [[5, 9, 14, 3], [7, 3]]
    with_shared = decode_batch(runtime, sources, options, rules)
    # plain sessions (the same graph optimisations), which read the external data themselves, give the same output
    plain = {"disabled_optimizers": CPU_DISABLED_FUSIONS}
    runtime.encoder = ort.InferenceSession(str(quantized / variant.encoder.file), **plain)
    runtime.decoder = ort.InferenceSession(str(quantized / variant.decoder_step.file), **plain)
    assert decode_batch(runtime, sources, options, rules) == with_shared


def test_a_shared_table_that_does_not_match_its_manifest_entry_stops_the_load(quantized: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(quantized, tmp_path / "s"))
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["variants"]["int8"]["shared_initializers"][0]["shape"][0] += 1
    (folder / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ModelFolderError, match="embeddings.int8.bin: does not hold a uint8 tensor of shape"):
        OnnxRuntime(load_model_folder(folder), "int8")


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
    assert report.groups == {}  # no origin file: a user's own test set has no groups


def test_evaluate_scores_each_corpus_group_as_the_subset_of_its_split(model_dir: Path, tmp_path: Path) -> None:
    english, french = SENTENCES[:6], SENTENCES[6:12]
    (tmp_path / "test.en").write_text("\n".join(english) + "\n")
    (tmp_path / "test.fr").write_text("\n".join(french) + "\n")
    (tmp_path / "test.origin").write_text("\n".join(["coreutils"] * 4 + ["wesnoth"] * 2) + "\n")
    packages = {"coreutils": {"group": "system"}, "wesnoth": {"group": "games"}}
    (tmp_path / "stats.json").write_text(json.dumps({"packages": packages}))
    report = evaluate(model_dir, tmp_path, threads=1)
    assert list(report.groups) == ["system", "games"] and report.groups["games"]["sentences"] == 2
    hypotheses = [e["translation"] for e in sorted(report.examples, key=lambda e: english.index(e["source"]))]
    games = sacrebleu.corpus_chrf(hypotheses[4:], [french[4:]]).score
    assert report.groups["games"]["chrf"] == pytest.approx(games)
    (tmp_path / "test.origin").write_text("coreutils\n")  # another build's origin file: no groups, no error
    assert evaluate(model_dir, tmp_path, threads=1).groups == {}


def test_translate_all_in_two_streams_gives_the_same_translations(model_dir: Path) -> None:
    sources = SENTENCES * 3
    one, tokens, _ = translate_all(model_dir, sources, "fp32", 1, 8, 2)
    two, tokens_two, _ = translate_all(model_dir, sources, "fp32", 1, 8, 2, streams=2)  # sub-batches of 4 at once
    assert two == one and tokens_two == tokens and all(one)


def test_static_batches_open_the_graphs_once_and_translate_again_alike(model_dir: Path) -> None:
    engine = StaticBatches(model_dir, "fp32", threads=1)
    first, tokens, _ = engine.translate(SENTENCES, 1, 4)
    again, tokens_again, _ = engine.translate(SENTENCES, 1, 4)
    assert again == first == translate_all(model_dir, SENTENCES, "fp32", 1, 4, 1)[0] and tokens_again == tokens



def test_the_engine_caps_each_sentence_as_the_server_does(spm_model: bytes, tmp_path: Path) -> None:
    """bench.server measures the engine (StaticBatches) beside the server on the same sentences: each sentence may
    generate what the server lets it at its defaults (MT_MAX_OUTPUT_RATIO x its tokens + 10, at most
    MT_MAX_OUTPUT_TOKENS and the model's positions), so both do the same work. A model of 40 positions that never
    ends a sentence: the short one stops at its ratio cap, the long one (past 40 by its ratio) at the positions,
    where the engine used to go on to min(256, 2n + 10) and fail."""
    checkpoint = tiny_checkpoint(spm_model, eos_bias=-50.0, max_positions=40)
    folder = export_folder(checkpoint, tmp_path / "never-ends", "never-ends", "0.0.1")
    texts = ["Hi", "open the file and save the document as a copy"]  # one sentence each, as the server splits
    tokenizer = Tokenizer.from_folder(load_model_folder(folder))
    lengths = [len(tokenizer.encode(t, "fr")) for t in texts]
    assert lengths[0] < 15 < lengths[1] < 40  # 2n + 10 within the positions, then past them
    translations, tokens, _ = translate_all(folder, texts, "fp32", 1, 8, 1)
    assert tokens == sum(output_cap(n, 40, 2.0) for n in lengths) == 2 * lengths[0] + 10 + 40
    settings = Settings(models_dir=folder.parent, models=[folder.name], intra_op_threads=1)
    with TestClient(create_app(settings)) as client:
        body = client.post("/translate", json={"q": texts, "source": "en", "target": "fr"}).json()
    assert body["translatedText"] == translations

@pytest.mark.parametrize(("bits", "block"), [(8, 128), (4, 32)])
def test_blockwise_codes_reproduce_the_weights_and_run_in_matmulnbits(bits: int, block: int) -> None:
    """MatMulNBits' form: a scale per column and block of K, codes around its default zero point for `bits` (128,
    8; none stored), two 4-bit codes a byte, the first in the low nibble. K = 200 pads to whole blocks; an all-zero
    column stays zero. The node's one-row product matches numpy's over the dequantized weights, and the fp32
    weights within the codes' error."""
    rng = np.random.default_rng(3)
    weight = rng.standard_normal((200, 24)).astype(np.float32)  # (K, N)
    weight[:, 5] = 0.0
    codes, scales = blockwise(weight, block, bits)
    blocks, zero = -(-200 // block), 2 ** (bits - 1)
    assert codes.shape == (24, blocks, block * bits // 8) and codes.dtype == np.uint8 and scales.shape == (24 * blocks,)
    nibbles = np.stack([codes & 0x0F, codes >> 4], axis=-1)  # (N, blocks, block / 2, 2) the low nibble first
    codes_each = nibbles.reshape(24, blocks, block) if bits == 4 else codes  # (N, blocks, block)
    dequantized = ((codes_each.astype(np.float32) - zero) * scales.reshape(24, blocks, 1)).reshape(24, -1).T  # (K', N)
    assert np.all(dequantized[200:] == 0) and np.all(dequantized[:, 5] == 0)
    half_step = np.repeat(scales.reshape(24, blocks), block, axis=1).T[:200] / 2  # (K, N)
    assert np.all(np.abs(dequantized[:200] - weight) <= half_step + 1e-7)
    bias = rng.standard_normal(24).astype(np.float32)
    node = onnx.helper.make_node(
        "MatMulNBits",
        ["x", "codes", "scales", "", "", "bias"],
        ["y"],
        domain="com.microsoft",
        K=200,
        N=24,
        bits=bits,
        block_size=block,
        accuracy_level=4,
    )
    graph = onnx.helper.make_graph(
        [node],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 200])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 24])],
        initializer=[numpy_helper.from_array(a, n) for a, n in ((codes, "codes"), (scales, "scales"), (bias, "bias"))],
    )
    opsets = [onnx.helper.make_opsetid("", 17), onnx.helper.make_opsetid("com.microsoft", 1)]
    session = ort.InferenceSession(
        onnx.helper.make_model(graph, ir_version=10, opset_imports=opsets).SerializeToString()
    )
    x = rng.standard_normal((1, 200)).astype(np.float32)
    [got] = session.run(None, {"x": x})
    scale = np.abs(x @ weight).max()
    np.testing.assert_allclose(got, x @ dequantized[:200] + bias, atol=0.05 * scale)
    np.testing.assert_allclose(got, x @ weight + bias, atol=(0.05 if bits == 8 else 0.2) * scale)


def test_the_int8_variant_has_a_step_graph_for_one_row(quantized: Path) -> None:
    """Format 6: the int8 variant's decoder_step_single is the step graph (the same inputs and outputs) with every
    product by a weight a MatMulNBits node over 8-bit blocks of 128, the bias Add taken in as its bias input, and
    the embedding table the other graphs share; the fp32 variant has none."""
    folder = load_model_folder(quantized)
    assert folder.manifest.format_version >= 6
    int8, fp32 = folder.variant("int8"), folder.variant("fp32")
    assert fp32.decoder_step_single is None and int8.decoder_step_single is not None
    single = int8.decoder_step_single
    assert single.file == "decoder_step_single.int8.onnx" and single.file in folder.manifest.files
    assert (single.inputs, single.outputs) == (int8.decoder_step.inputs, int8.decoder_step.outputs)
    model = onnx.load(quantized / single.file, load_external_data=False)
    constants = {t.name for t in model.graph.initializer}
    products = [n for n in model.graph.node if n.op_type == "MatMulNBits"]
    cfg = folder.manifest.config
    assert len(products) == cfg.n_decoder_layers * 6 + 1  # qkv, self w_o, cross q and w_o, FFN 2; vocabulary
    assert all(not (n.op_type == "MatMul" and n.input[1] in constants) for n in model.graph.node)
    assert not any(n.op_type.startswith(("DynamicQuantize", "MatMulInteger")) for n in model.graph.node)
    for node in products:
        attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert (attributes["bits"], attributes["block_size"], attributes["accuracy_level"]) == (8, 128, 4)
        assert len(node.input) == 6 and node.input[5] in constants  # every product of this model has a bias
    [shared] = int8.shared_initializers
    table = next(t for t in model.graph.initializer if t.name == shared.names["decoder_step_single"])
    assert table.data_location == onnx.TensorProto.EXTERNAL and not table.raw_data
    runtime = OnnxRuntime(folder, "int8")
    assert (
        runtime.shared["decoder_step_single"][shared.names["decoder_step_single"]]
        is runtime.shared["encoder"][shared.names["encoder"]]
    )  # one buffer for all four graphs


def test_the_model_cards_variant_size_counts_every_graph_and_shared_table(quantized: Path) -> None:
    """The card's size of a variant is what its sessions open: for int8 the encoder, the step, ragged and one-row
    step graphs and the shared embedding table (every `.int8.` file), not only the encoder and the step graph."""
    from model_export.card import variant_bytes

    variants = json.loads((quantized / "manifest.json").read_text(encoding="utf-8"))["variants"]
    int8_files = [path for path in quantized.iterdir() if ".int8." in path.name]
    assert {"decoder_step_single.int8.onnx", "embeddings.int8.bin"} <= {path.name for path in int8_files}
    assert variant_bytes(quantized, variants["int8"]) == sum(path.stat().st_size for path in int8_files)


def test_quantizing_again_without_the_shared_table_drops_it(quantized: Path, tmp_path: Path) -> None:
    """`quantize --fp32-embeddings` after `quantize`: the int8 table nothing reads any more leaves the manifest and
    the folder, so that the folder's loading no longer depends on it."""
    folder = Path(shutil.copytree(quantized, tmp_path / "q"))
    shared = load_model_folder(folder).manifest.variants["int8"].shared_initializers
    assert shared, "the fixture's int8 variant shares its embedding table"
    table = shared[0].file
    add_int8_variant(folder, embeddings=False)
    manifest = load_model_folder(folder).manifest
    assert table not in manifest.files and not (folder / table).exists()
    assert not manifest.variants["int8"].shared_initializers and "decoder_step.onnx" in manifest.files


def test_the_logits_scale_is_applied_after_the_top_k_with_the_same_results(
    spm_model: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """quantize.defer_logit_scale, on a model without a logits bias (the default model's kind): the output
    projection runs unscaled (its a_scale the constant 1) and each row's scale is applied to its top-K values, or to
    its whole row before the log-softmax; every step's top ids and values, and log-probs, are those of the graph
    that scales all logits in the product, bit for bit. A model with a logits bias keeps the scale in the product."""
    checkpoint = tiny_checkpoint(spm_model, seed=5, output_bias=False)
    folders = {}
    for name in ("deferred", "in the product"):
        folder = export_folder(checkpoint, tmp_path / name, "tiny-en-fr", "0.0.1")
        if name == "in the product":
            monkeypatch.setattr("model_export.quantize.defer_logit_scale", lambda model: False)
        add_int8_variant(folder)
        folders[name] = load_model_folder(folder)
    step = onnx.load(folders["deferred"].path / "decoder_step.int8.onnx", load_external_data=False)
    [product] = [n for n in step.graph.node if n.op_type == "MatMulIntegerToFloat" and "generator" in n.input[1]]
    assert product.input[2] == "row.one"
    cfg = folders["deferred"].manifest.config
    outputs = {}
    for name, folder in folders.items():
        runtime = OnnxRuntime(folder, "int8")
        rng = np.random.default_rng(2)
        src_ids = rng.integers(4, cfg.src_vocab_size, (6, 9))  # (B, S)
        src_mask = np.arange(9)[None, :] < rng.integers(1, 10, (6, 1))  # (B, S) ragged
        memory = runtime.encode(src_ids, src_mask)
        cache = runtime.new_cache()
        cache.add(memory.keys, memory.values, src_mask)
        steps = []
        for t in range(6):
            out = runtime.step(rng.integers(4, cfg.tgt_vocab_size, 6), cache, candidates=5, log_softmax=t % 2 == 1)
            steps.append((out.top_ids, out.top_log_probs))
        steps.append(runtime.step(rng.integers(4, cfg.tgt_vocab_size, 6), cache, full=True).log_probs)
        outputs[name] = steps
    for deferred, scaled in zip(outputs["deferred"], outputs["in the product"], strict=True):
        assert all(np.array_equal(a, b) for a, b in zip(deferred, scaled, strict=True))
    monkeypatch.undo()
    biased = export_folder(tiny_checkpoint(spm_model, seed=5), tmp_path / "biased", "tiny-en-fr", "0.0.1")
    add_int8_variant(biased)
    step = onnx.load(biased / "decoder_step.int8.onnx", load_external_data=False)
    assert "row.one" not in {n.input[2] for n in step.graph.node if n.op_type == "MatMulIntegerToFloat"}


def test_zero_biases_whose_add_the_int8_products_drop_leave_the_files(spm_model: bytes, tmp_path: Path) -> None:
    """A product followed by an all-zero bias Add (a Marian model's final_logits_bias; here every bias) runs
    without the Add, and the bias leaves the int8 graph too: every initializer of every int8 graph is read by a
    node (ONNX Runtime would log one warning per unread one, at every start)."""
    checkpoint = tiny_checkpoint(spm_model, seed=5, output_bias=False)
    zeroed = {k: v.zero_() if k.endswith("bias") else v for k, v in checkpoint.state_dict.items()}
    folder = export_folder(replace(checkpoint, state_dict=zeroed), tmp_path / "zero", "tiny-en-fr", "0.0.1")
    add_int8_variant(folder)
    for name in DYNAMIC_INT8_GRAPHS:
        graph = onnx.load(folder / f"{name}.int8.onnx", load_external_data=False).graph
        constants = {t.name for t in graph.initializer}
        unread = constants - names_read(list(graph.node))
        assert not unread, f"{name}: {sorted(unread)[:4]}"
        assert not any(n.op_type == "Add" and n.input[1] in constants for n in graph.node)
    fp32 = onnx.load(folder / "decoder_step.onnx", load_external_data=False).graph
    assert any(t.name.endswith("bias") for t in fp32.initializer)  # the fp32 graphs keep theirs
    assert OnnxRuntime(load_model_folder(folder), "int8").new_cache() is not None
