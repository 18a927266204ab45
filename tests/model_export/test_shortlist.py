"""The vocabulary shortlist on the offline side: learning it from sentence pairs, CTranslate2's vmap.txt both ways,
the shortlist step graph against the full step graph restricted to each row's candidates (an independent numpy
reference), the `shortlist` command."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from model_export.__main__ import main
from model_export.errors import ExportError
from model_export.onnx_graphs import names_read
from model_export.quantize import add_int8_variant
from model_export.shortlist import Lists, add_shortlist, learn, read_vmap, write_vmap
from service.engine.batches import TokenRules, decode_batch, pad_batch
from service.engine.decoding import SearchOptions
from service.engine.runtime import OnnxRuntime, SessionSettings
from service.model import MANIFEST, load_model_folder

PAIRS = [  # (source ids, target ids): target 9 in every pair, the one always there at always=1
    ([10, 11], [20, 21, 9]),
    ([10, 11], [20, 21, 9]),
    ([10, 12], [20, 22, 9]),
    ([10, 12], [20, 22, 9]),
    ([10, 13], [20, 23, 9]),
    ([12], [22, 9]),
]


def lists_by_source(lists: Lists, sources: int) -> dict[int, list[int]]:
    return {s: lists.targets[lists.offsets[s] : lists.offsets[s + 1]].tolist() for s in range(sources)}


def test_each_source_token_keeps_its_likeliest_targets_and_the_most_frequent_are_always() -> None:
    lists = learn(PAIRS, src_vocab=16, tgt_vocab=32, per_source=2, always=1, min_count=2, never=[0, 2])
    assert lists.always.tolist() == [9]  # in every pair, and so in no source's list
    targets = lists_by_source(lists, 16)
    assert targets[10] == [20, 21]  # p(20 | 10) = 5/5, then 21 and 22 at 2/5 (ties to the lower id); 23 once: pruned
    assert targets[11] == [20, 21]
    assert targets[12] == [22, 20]  # 3/3, 2/3
    assert targets[13] == [] and targets[14] == []
    assert lists.offsets[-1] == len(lists.targets) and np.all(np.diff(lists.offsets) >= 0)


def test_min_count_prunes_the_pairs_seen_too_seldom() -> None:
    targets = lists_by_source(learn(PAIRS, src_vocab=16, tgt_vocab=32, per_source=5, always=1, min_count=3), 16)
    assert targets[10] == [20] and targets[11] == [] and targets[12] == [22]


def test_a_vmap_written_reads_back_as_the_same_shortlist(tmp_path: Path) -> None:
    lists = Lists(np.array([5, 1]), np.array([0, 2, 2, 3]), np.array([4, 6, 7]))
    pieces = [f"p{i}" for i in range(8)]
    write_vmap(lists, pieces[:3], pieces, tmp_path / "vmap.txt")
    assert (tmp_path / "vmap.txt").read_text(encoding="utf-8").splitlines() == ["\tp5 p1", "p0\tp4 p6", "p2\tp7"]
    again, skipped = read_vmap(tmp_path / "vmap.txt", {p: i for i, p in enumerate(pieces[:3])},
                               {p: i for i, p in enumerate(pieces)})
    assert skipped == 0
    for name, array in lists.arrays().items():
        assert again.arrays()[name].tolist() == array.tolist(), name


def test_a_vmaps_n_grams_and_unknown_tokens_are_skipped_and_a_line_without_a_tab_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "vmap.txt"
    path.write_text("\tb\na\tb c zz\na a\tc\nqq\tb\n", encoding="utf-8")
    lists, skipped = read_vmap(path, {"a": 0}, {"b": 0, "c": 1})
    assert skipped == 2 and lists.always.tolist() == [0] and lists.targets.tolist() == [0, 1]
    path.write_text("a b c\n", encoding="utf-8")
    with pytest.raises(Exception, match=r"vmap.txt:1: not a vocabulary map line"):
        read_vmap(path, {"a": 0}, {"b": 0})


def restricted(log_probs: np.ndarray, candidates: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The reference: one row's full log-probs (V,) renormalised over its candidates (each id once), its k best
    ids and values, the banned ids (pad 0, start 2) left out as the runtime leaves them out."""
    ids = np.unique(candidates)  # (c,)
    kept = log_probs[ids] - np.logaddexp.reduce(log_probs[ids].astype(np.float64))  # (c,)
    allowed = ~np.isin(ids, [0, 2])
    ids, kept = ids[allowed], kept[allowed]
    order = np.argsort(-kept, kind="stable")[:k]
    return ids[order], kept[order]


@pytest.fixture(scope="module")
def halved_shortlisted(shortlisted: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The shortlisted tiny model with a float16 variant, made after the shortlist (`half` writes its shortlist
    step graph too)."""
    folder = Path(shutil.copytree(shortlisted, tmp_path_factory.mktemp("sl16") / "tiny-en-fr"))
    assert main(["half", "--model-dir", str(folder)]) == 0
    return folder


@pytest.mark.parametrize("variant", ["fp32", "int8", "fp16"])
def test_the_shortlist_step_is_the_full_step_restricted_to_each_rows_candidates(
    halved_shortlisted: Path, variant: str
) -> None:
    folder = load_model_folder(halved_shortlisted)
    settings = SessionSettings(intra_op_threads=1, single_row_step=False, ragged_step=False)
    full, short = (OnnxRuntime(folder, variant, replace(settings, shortlist=on)) for on in (False, True))
    sources = [[5, 6, 7, 8, 3], [9, 10, 3], [40, 41, 42, 43, 44, 45, 46, 3], [60, 61, 3]]
    src_ids, src_mask = pad_batch(sources, 0)
    caches = []
    for runtime in (full, short):
        memory = runtime.encode(src_ids, src_mask)
        cache = runtime.new_cache()
        cache.add(memory.keys, memory.values, src_mask, candidates=memory.candidates)
        caches.append(cache)
    candidates = caches[1].candidates.copy()  # (N, C) each sentence's
    assert len({tuple(c) for c in candidates}) == len(sources)  # each its own set
    tokens = np.full(len(sources), folder.manifest.special_ids.decoder_start)
    for _ in range(4):
        whole = full.step(tokens, caches[0], full=True, candidates=8)
        mine = short.step(tokens, caches[1], candidates=8)
        for row in range(len(sources)):
            ids, values = restricted(whole.log_probs[row], candidates[row], 8)
            assert mine.top_ids[row].tolist() == ids.tolist()
            tolerance = {"fp32": 1e-4, "int8": 2e-3, "fp16": 2e-2}[variant]  # fp16: ~3 digits an activation
            np.testing.assert_allclose(mine.top_log_probs[row], values, atol=tolerance)
            assert set(mine.top_ids[row].tolist()) <= set(candidates[row].tolist())
        tokens = mine.top_ids[:, 0]  # both caches take the same tokens


def every_token(folder_path: Path, tmp_path: Path) -> Path:
    """A copy of the folder whose shortlist holds every target id (C = the vocabulary)."""
    copy = Path(shutil.copytree(folder_path, tmp_path / folder_path.name))
    vocab = load_model_folder(copy).manifest.config.tgt_vocab_size
    add_shortlist(copy, Lists(np.arange(vocab), np.zeros(vocab + 1, np.int64), np.zeros(0, np.int64)), vocab, {})
    return copy


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_a_shortlist_of_every_token_gives_the_full_vocabularys_translations(
    quantized: Path, tmp_path: Path, variant: str
) -> None:
    folder = load_model_folder(every_token(quantized, tmp_path))
    ids = folder.manifest.special_ids
    rules = TokenRules(ids.decoder_start, ids.eos, ids.pad)
    full = OnnxRuntime(folder, variant, SessionSettings(intra_op_threads=1, single_row_step=False))
    short = OnnxRuntime(folder, variant, SessionSettings(intra_op_threads=1, shortlist=True))
    sources = [[5, 6, 7, 8, 3], [9, 10, 3], [11, 12, 13, 14, 15, 16, 3], [20, 3]]
    for options in (SearchOptions(max_new_tokens=20), SearchOptions(beam_size=4, n_best=2, max_new_tokens=20)):
        expected = decode_batch(full, sources, [options] * len(sources), rules)
        got = decode_batch(short, sources, [options] * len(sources), rules)
        for want, have in zip(expected, got, strict=True):
            assert [h.tokens for h in have] == [h.tokens for h in want]
            np.testing.assert_allclose([h.log_prob for h in have], [h.log_prob for h in want],
                                       atol=0 if variant == "fp32" else 1e-4)


def test_the_command_learns_a_shortlist_into_the_folder_and_writes_its_vmap(quantized: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(quantized, tmp_path / "tiny"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.en").write_text("Open the file.\nSave the document.\n" * 3, encoding="utf-8")
    (corpus / "train.fr").write_text("Ouvrir le fichier.\nEnregistrer le document.\n" * 3, encoding="utf-8")
    code = main(["shortlist", "--model-dir", str(folder), "--corpus", str(corpus), "--candidates", "64",
                 "--always", "4", "--write-vmap", str(tmp_path / "vmap.txt")])
    assert code == 0
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["shortlist"] == {"file": "shortlist.npz", "candidates": 64, "copy_source": True}
    assert {v["decoder_step_shortlist"]["file"] for v in manifest["variants"].values()} == {
        "decoder_step_shortlist.onnx", "decoder_step_shortlist.int8.onnx"
    }
    assert (tmp_path / "vmap.txt").read_text(encoding="utf-8").startswith("\t")
    imported = Path(shutil.copytree(quantized, tmp_path / "imported"))
    assert main(["shortlist", "--model-dir", str(imported), "--vmap", str(tmp_path / "vmap.txt"),
                 "--candidates", "64"]) == 0
    mine, theirs = (np.load(f / "shortlist.npz") for f in (folder, imported))
    assert mine["always"].tolist() == theirs["always"].tolist()
    assert mine["targets"].tolist() == theirs["targets"].tolist()


def test_quantizing_a_folder_with_a_shortlist_again_writes_the_new_int8_graphs_shortlist_step(
    quantized: Path, tmp_path: Path
) -> None:
    """`quantize` replaces the int8 variant's step graph; its shortlist step graph is rebuilt from the new one (and
    checksummed), not dropped, so the folder's int8 variant keeps its shortlist."""
    folder = Path(shutil.copytree(quantized, tmp_path / "tiny"))
    sources = load_model_folder(folder).manifest.config.src_vocab_size
    lists = Lists(np.arange(4, 12), np.zeros(sources + 1, np.int64), np.zeros(0, np.int64))  # 8 targets always
    add_shortlist(folder, lists, 64, {"test": True})
    before = (folder / "decoder_step_shortlist.int8.onnx").read_bytes()
    assert main(["quantize", "--model-dir", str(folder), "--per-tensor"]) == 0  # one weight scale per matrix
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    assert manifest["variants"]["int8"]["decoder_step_shortlist"]["file"] == "decoder_step_shortlist.int8.onnx"
    assert (folder / "decoder_step_shortlist.int8.onnx").read_bytes() != before  # the new weights' codes
    spec = load_model_folder(folder).variant("int8")  # checksums verified
    assert spec.decoder_step_shortlist is not None
    with pytest.raises(ExportError, match="per-row"):  # a per-tensor step graph has no shortlist step graph
        add_int8_variant(folder, activation_scales="per-tensor")
    assert load_model_folder(folder).variant("int8").decoder_step_shortlist is not None  # nothing was changed


def test_the_float16_variant_has_a_shortlist_step_graph_whichever_came_first(
    halved_shortlisted: Path, checkpoint_path: Path, tmp_path: Path
) -> None:
    """`half` on a shortlisted folder, or `shortlist` on a folder with a float16 variant: the float16 variant's
    shortlist step graph is the fp32 one's converted (float16 weights, inputs and cache; float32 log-probs), and
    `verify` holds it to PyTorch restricted to each sentence's candidates."""
    spec = load_model_folder(halved_shortlisted).variant("fp16").decoder_step_shortlist
    assert spec is not None and spec.file == "decoder_step_shortlist.fp16.onnx"
    dtypes = {t.role: t.dtype for t in spec.inputs + spec.outputs}
    assert dtypes["candidate_ids"] == "int64" and dtypes["log_probs"] == "float32"
    assert dtypes["self_key"] == "float16" and "log_softmax" not in dtypes  # the float16 step always normalises
    graph = onnx.load(halved_shortlisted / spec.file).graph
    assert {t.name for t in graph.initializer} <= names_read(list(graph.node))
    assert main(["verify", "--checkpoint", str(checkpoint_path), "--model-dir", str(halved_shortlisted)]) == 0
    later = Path(shutil.copytree(halved_shortlisted, tmp_path / "later"))
    manifest = json.loads((later / MANIFEST).read_text(encoding="utf-8"))
    del manifest["shortlist"]  # as if the shortlist came after `half`: `shortlist` adds every variant's step
    for variant in manifest["variants"].values():
        variant.pop("decoder_step_shortlist", None)
    (later / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    lists = Lists(np.arange(4, 12), np.zeros(load_model_folder(later).manifest.config.src_vocab_size + 1, np.int64),
                  np.zeros(0, np.int64))  # fmt: skip
    add_shortlist(later, lists, 64, {"test": True})
    assert load_model_folder(later).variant("fp16").decoder_step_shortlist is not None
