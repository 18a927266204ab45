"""A vocabulary shortlist for a model folder: learned from a parallel corpus's training split, or read from a
CTranslate2 vocabulary map (vmap.txt), written as the folder's `shortlist.npz` with, for each variant, its shortlist
step graph (shortlist_step.py) and the manifest's entries.

Learning: for each source token id s, the target ids t it co-occurs with in a sentence pair, ranked by
p(t | s) = pairs holding both / pairs holding s, the pairs seen fewer than `min_count` times pruned, the `per_source`
best kept; the `always` most frequent target ids (and the pieces of the placeholders %1..%20) are every sentence's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import sentencepiece as spm

from model_export import graph_io
from model_export.errors import ExportError
from model_export.export import file_entries, write_manifest
from model_export.shortlist_step import CANDIDATES, half_shortlist_step_graph, shortlist_step_graph
from service.engine import check_arrays
from service.model import MANIFEST, ModelFolder, ModelFolderError, Tokenizer, load_model_folder

SHORTLIST_FILE = "shortlist.npz"
STEP_FILES = {"fp32": "decoder_step_shortlist.onnx"}  # others: decoder_step_shortlist.<precision>.onnx
PLACEHOLDERS = 20  # %1 .. %20, the text path's placeholders (service/text/placeholders.py)
CHUNK = 4096  # sentence pairs counted at once


@dataclass(frozen=True)
class Lists:
    """A shortlist's arrays (the file's): see service/engine/shortlist.py."""

    always: np.ndarray  # (A,) int64
    offsets: np.ndarray  # (V_src + 1,) int64
    targets: np.ndarray  # (E,) int64

    def arrays(self) -> dict[str, np.ndarray]:
        return {"always": self.always, "offsets": self.offsets, "targets": self.targets}


def _pair_keys(source: list[int], target: list[int], tgt_vocab: int) -> np.ndarray:
    """Each (source id, target id) pair of one sentence pair, each distinct id once: (s x t,) s * V_tgt + t."""
    s, t = np.unique(np.asarray(source, np.int64)), np.unique(np.asarray(target, np.int64))
    return (s[:, None] * tgt_vocab + t[None, :]).ravel()


def _merge(keys: np.ndarray, counts: np.ndarray, new: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, ...]:
    """Sorted distinct keys and their counts, with new keys (and their counts) added."""
    merged, inverse = np.unique(np.concatenate([keys, new]), return_inverse=True)
    return merged, np.bincount(inverse, weights=np.concatenate([counts, weights])).astype(np.int64)


def count_pairs(
    pairs: Iterable[tuple[list[int], list[int]]], src_vocab: int, tgt_vocab: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Sentence-level counts: (K,) distinct pair keys s * V_tgt + t and (K,) how many sentence pairs hold both, (V_src,)
    how many hold each source id, (V_tgt,) each target id."""
    keys, counts = np.zeros(0, np.int64), np.zeros(0, np.int64)
    sources, targets = np.zeros(src_vocab, np.int64), np.zeros(tgt_vocab, np.int64)
    chunk: list[np.ndarray] = []
    for source, target in pairs:
        chunk.append(_pair_keys(source, target, tgt_vocab))
        sources[np.unique(np.asarray(source, np.int64))] += 1
        targets[np.unique(np.asarray(target, np.int64))] += 1
        if len(chunk) == CHUNK:
            new, weights = np.unique(np.concatenate(chunk), return_counts=True)
            keys, counts = _merge(keys, counts, new, weights)
            chunk = []
    if chunk:
        new, weights = np.unique(np.concatenate(chunk), return_counts=True)
        keys, counts = _merge(keys, counts, new, weights)
    return keys, counts, sources, targets


def learn(
    pairs: Iterable[tuple[list[int], list[int]]],
    src_vocab: int,
    tgt_vocab: int,
    per_source: int,
    always: int,
    min_count: int = 2,
    extra_always: Iterable[int] = (),
    never: Iterable[int] = (),
) -> Lists:
    """The shortlist of a corpus of (source ids, target ids) pairs (see the module docstring). `never`: ids no list
    holds (pad, the decoder start)."""
    keys, counts, source_counts, target_counts = count_pairs(pairs, src_vocab, tgt_vocab)
    banned = np.zeros(tgt_vocab, np.bool_)  # (V_tgt,)
    banned[list(never)] = True
    frequent = [int(t) for t in np.argsort(-target_counts, kind="stable") if target_counts[t] and not banned[t]]
    chosen = list(dict.fromkeys([*(int(t) for t in extra_always if not banned[t]), *frequent[:always]]))
    common = banned.copy()
    common[chosen] = True
    s, t = keys // tgt_vocab, keys % tgt_vocab  # (K,) each
    kept = (counts >= min_count) & ~common[t]
    s, t, counts = s[kept], t[kept], counts[kept]
    p = counts / np.maximum(source_counts[s], 1)  # (K,) p(t | s)
    order = np.lexsort((t, -p, s))  # by source, then the likeliest first (ties: the lower id)
    s, t = s[order], t[order]
    start = np.searchsorted(s, np.arange(src_vocab))  # (V_src,) each source id's first
    rank = np.arange(len(s)) - start[s]  # (K',) its place in its source id's list
    s, t = s[rank < per_source], t[rank < per_source]
    offsets = np.concatenate([[0], np.cumsum(np.bincount(s, minlength=src_vocab))]).astype(np.int64)
    return Lists(np.asarray(chosen, np.int64), offsets, t.astype(np.int64))


def placeholder_ids(target: spm.SentencePieceProcessor) -> list[int]:
    """The target pieces of the text path's placeholders %1 .. %20, as it puts them in a sentence."""
    return sorted({i for n in range(1, PLACEHOLDERS + 1) for i in target.encode(f"%{n}")})


def corpus_pairs(
    corpus: Path, source_language: str, target_language: str, tokenizer: Tokenizer, most: int | None
) -> Iterator[tuple[list[int], list[int]]]:
    """The training split's sentence pairs (train.<src>, train.<tgt>), as the model reads the source and writes
    the target: ids."""
    paths = [corpus / f"train.{language}" for language in (source_language, target_language)]
    for path in paths:
        if not path.is_file():
            raise ExportError(f"{path}: missing; --corpus must be a folder of `model_export corpus build`")
    with paths[0].open(encoding="utf-8") as sources, paths[1].open(encoding="utf-8") as targets:
        for n, (source, target) in enumerate(zip(sources, targets, strict=False)):
            if most is not None and n >= most:
                return
            yield tokenizer.encode(source.strip(), target_language), target_ids(tokenizer, target.strip())


def target_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """The model's target ids of a text: the target SentencePiece model's, through the vocabulary where it has one."""
    if tokenizer.vocabulary is None:
        return tokenizer.target.encode(text)
    unk = tokenizer.special.unk
    return [tokenizer.vocabulary.get(piece, unk) for piece in tokenizer.target.encode(text, out_type=str)]


# -- CTranslate2's vocabulary map: "<source n-gram>\t<target token> <target token> ..."; an empty n-gram: always --


def write_vmap(lists: Lists, source_pieces: list[str], target_pieces: list[str], path: Path) -> None:
    """The shortlist as a CTranslate2 vmap.txt (one-token n-grams): the always line first, then each source token
    with targets."""
    lines = ["\t" + " ".join(target_pieces[t] for t in lists.always)]
    for s in range(len(lists.offsets) - 1):
        targets = lists.targets[lists.offsets[s] : lists.offsets[s + 1]]
        if targets.size:
            lines.append(source_pieces[s] + "\t" + " ".join(target_pieces[t] for t in targets))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def read_vmap(path: Path, source_ids: dict[str, int], target_ids: dict[str, int]) -> tuple[Lists, int]:
    """A CTranslate2 vmap.txt -> the shortlist of its one-token rules and its always line; a rule's targets keep
    their order, a token outside the vocabularies is skipped. Returns also how many rules were skipped (n-grams of
    two or more tokens, which a shortlist of source ids cannot hold, and unknown source tokens)."""
    rules: dict[int, list[int]] = {}
    always: list[int] = []
    skipped = 0
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        if "\t" not in line:
            raise ExportError(f"{path}:{number}: not a vocabulary map line (<source n-gram> TAB <target tokens>)")
        key, _, values = line.partition("\t")
        targets = [target_ids[v] for v in values.split(" ") if v in target_ids]
        if not key:
            always += targets
        elif " " in key or key not in source_ids:
            skipped += 1
        else:
            rules.setdefault(source_ids[key], []).extend(targets)
    size = len(source_ids)
    lengths = np.array([len(rules.get(s, [])) for s in range(size)], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    targets = np.array([t for s in range(size) for t in rules.get(s, [])], np.int64)
    return Lists(np.array(list(dict.fromkeys(always)), np.int64), offsets, targets), skipped


def pieces_of(folder: ModelFolder, side: str) -> list[str]:
    """The model's ids' pieces on one side (index = id), through its vocabulary (vocab.json) where it has one."""
    spec = folder.manifest.tokenizer
    if spec.vocabulary:
        vocabulary = json.loads(folder.file(spec.vocabulary).read_text(encoding="utf-8"))
        pieces = [""] * (max(vocabulary.values()) + 1)
        for piece, i in vocabulary.items():
            pieces[i] = piece
        return pieces
    model = spm.SentencePieceProcessor(
        model_file=str(folder.file(spec.source_model if side == "source" else spec.target_model))
    )
    return [model.id_to_piece(i) for i in range(model.get_piece_size())]


# -- the model folder --------------------------------------------------------------------------------------------


def step_file(precision: str) -> str:
    return STEP_FILES.get(precision, f"decoder_step_shortlist.{precision}.onnx")


def shortlist_graph_entry(step: dict, candidates: int) -> dict:
    """The manifest's decoder_step_shortlist for a variant's decoder_step entry (as JSON)."""
    inputs = step["inputs"] + [
        graph_io.TensorSpec(CANDIDATES, "candidate_ids", "int64", ("sentences", candidates)).to_dict()
    ]
    outputs = [
        {**o, "shape": ["batch", candidates]} if o["role"] == "log_probs" else o for o in step["outputs"]
    ]
    return {"file": "", "inputs": inputs, "outputs": outputs}


def add_variant_step(
    folder_path: Path, variant: dict, candidates: int, pad_id: int, fp32_step: str | None = None
) -> list[str]:
    """Writes a variant's shortlist step graph and records it in the variant (its manifest JSON, changed in place):
    an fp32 or int8 variant's from its own step graph, the float16 variant's from the fp32 variant's (`fp32_step`,
    its file), converted as its step graph was. The file written, or none (a float16 variant without an fp32 one)."""
    precision = variant["precision"]
    if precision not in ("fp32", "int8", "fp16") or (precision == "fp16" and fp32_step is None):
        return []
    entry = shortlist_graph_entry(variant["decoder_step"], candidates)
    entry["file"] = step_file(precision)
    if precision == "fp16":
        keep = {o["name"] for o in entry["outputs"] if o["dtype"] == "float32"}  # the log-probabilities
        half_shortlist_step_graph(folder_path / str(fp32_step), folder_path / entry["file"], candidates, pad_id, keep)
    else:
        shortlist_step_graph(
            folder_path / variant["decoder_step"]["file"], folder_path / entry["file"], candidates, pad_id
        )
    variant["decoder_step_shortlist"] = entry
    for initializer in variant.get("shared_initializers", []):
        if "decoder_step" in initializer["names"]:
            initializer["names"]["decoder_step_shortlist"] = initializer["names"]["decoder_step"]
    return [entry["file"]]


def fp32_step_file(manifest: dict) -> str | None:
    """The fp32 variant's step graph file (what the float16 variant's shortlist step is made from), if any."""
    fp32 = manifest["variants"].get("fp32")
    return fp32["decoder_step"]["file"] if fp32 else None


def add_shortlist(folder_path: Path, lists: Lists, candidates: int, how: dict) -> dict:
    """Writes shortlist.npz and each fp32 and int8 variant's shortlist step graph into the folder, and records them
    in the manifest (`shortlist`, each variant's `decoder_step_shortlist`, the files); the folder must still load.
    `how`: recorded in the manifest's provenance."""
    folder = load_model_folder(folder_path)
    cfg = folder.manifest.config
    check_arrays(folder_path / SHORTLIST_FILE, lists.arrays(), cfg.src_vocab_size, cfg.tgt_vocab_size)
    np.savez(folder_path / SHORTLIST_FILE, **lists.arrays())
    manifest = json.loads((folder_path / MANIFEST).read_text(encoding="utf-8"))
    tok = folder.manifest.tokenizer
    shared = tok.source_model == tok.target_model and cfg.src_vocab_size == cfg.tgt_vocab_size
    manifest["shortlist"] = {"file": SHORTLIST_FILE, "candidates": candidates, "copy_source": shared}
    written = [SHORTLIST_FILE]
    fp32_step = fp32_step_file(manifest)
    for variant in manifest["variants"].values():
        written += add_variant_step(folder_path, variant, candidates, cfg.pad_id, fp32_step)
    manifest["files"].update(file_entries(folder_path, written))
    manifest["provenance"]["shortlist"] = how
    write_manifest(folder_path, manifest)
    try:
        load_model_folder(folder_path)
    except ModelFolderError as error:
        raise ExportError(f"the folder with its shortlist would not load in the server: {error}") from None
    return manifest


def learn_from_corpus(
    folder_path: Path, corpus: Path, per_source: int, always: int, min_count: int, most: int | None
) -> Lists:
    """The folder's shortlist learned from the corpus's training split in its languages (the first target's)."""
    folder = load_model_folder(folder_path)
    tokenizer = Tokenizer.from_folder(folder)
    cfg, ids = folder.manifest.config, folder.manifest.special_ids
    target_language = folder.manifest.target_languages[0]
    pairs = corpus_pairs(corpus, folder.manifest.source_language, target_language, tokenizer, most)
    return learn(
        pairs, cfg.src_vocab_size, cfg.tgt_vocab_size, per_source, always, min_count,
        extra_always=[i for i in placeholder_ids(tokenizer.target) if i < cfg.tgt_vocab_size],
        never=sorted({ids.pad, ids.decoder_start}),
    )


def vmap_of_folder(folder_path: Path, path: Path) -> Lists:
    """A CTranslate2 vmap.txt read in the folder's vocabularies; ExportError when it holds no rule at all."""
    folder = load_model_folder(folder_path)
    source = {piece: i for i, piece in enumerate(pieces_of(folder, "source")) if piece}
    target = {piece: i for i, piece in enumerate(pieces_of(folder, "target")) if piece}
    lists, _ = read_vmap(path, source, target)
    if not lists.targets.size and not lists.always.size:
        raise ExportError(f"{path}: no rule whose tokens are in the model's vocabularies")
    return lists
