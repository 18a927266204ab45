"""A model folder's vocabulary shortlist: each sentence's candidate target ids, built once from that sentence's
source ids alone, which the shortlist step graph scores in place of the whole vocabulary.

The file (the manifest's `shortlist.file`, numpy's .npz) holds `always` (A,): target ids every sentence's set
holds, and each source id s's target ids, best first, as `targets[offsets[s]:offsets[s + 1]]`. A sentence's set
is the special ids (pad, the decoder start, eos, unk: the first two are in the distribution, as they are in the whole
vocabulary's, and no search takes them), the always ids, its source ids when `copy_source`, then its source ids'
lists taken rank by rank, until C are chosen; sorted, then padded with more pad ids, which the step graph masks (all
but a set's first). Knows nothing of sessions or searches.
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from service.errors import ModelFolderError
from service.model.folder import ModelFolder

ARRAYS = ("always", "offsets", "targets")


@dataclass(frozen=True)
class Shortlist:
    always: np.ndarray  # (A,) int64 target ids in every sentence's set, the first chosen
    offsets: np.ndarray  # (V_src + 1,) int64: source id s's targets are targets[offsets[s]:offsets[s + 1]]
    targets: np.ndarray  # (E,) int64 target ids, each source id's best first
    size: int  # C: candidates per sentence
    pad_id: int  # what fills a set of fewer than C (after the one a set holds)
    copy_source: bool  # a sentence's own source ids are among its candidates

    def candidates(self, src_ids: np.ndarray, src_mask: np.ndarray) -> np.ndarray:
        """(b, S) padded sources and their mask -> (b, C) int64 candidate ids, each row from its own source."""
        rows = [self.sentence(ids[mask]) for ids, mask in zip(src_ids, src_mask, strict=True)]
        return np.stack(rows) if rows else np.zeros((0, self.size), np.int64)  # (b, C)

    def sentence(self, ids: np.ndarray) -> np.ndarray:
        """One source's ids (S,) -> its (C,) candidate ids, ascending, padded with pad_id."""
        distinct = np.unique(ids[(ids >= 0) & (ids < len(self.offsets) - 1)])  # (s,)
        starts, ends = self.offsets[distinct], self.offsets[distinct + 1]  # (s,) each
        ranks = np.concatenate([np.arange(end - start) for start, end in zip(starts, ends, strict=True)] or [[]])
        listed = np.concatenate([self.targets[start:end] for start, end in zip(starts, ends, strict=True)] or [[]])
        by_rank = listed[np.argsort(ranks, kind="stable")].astype(np.int64)  # (E_s,) every list's first, seconds...
        copies = distinct if self.copy_source else np.zeros(0, np.int64)
        ordered = np.concatenate([self.always, copies, by_rank])  # (n,) in the order they are chosen
        _, first = np.unique(ordered, return_index=True)  # each id's first place
        chosen = np.sort(ordered[np.sort(first)[: self.size]])  # (<= C,)
        return np.concatenate([chosen, np.full(self.size - len(chosen), self.pad_id, np.int64)])  # (C,)


def load_shortlist(folder: ModelFolder) -> Shortlist:
    """The folder's shortlist; ModelFolderError names the file and what is wrong with it."""
    spec = folder.manifest.shortlist
    if spec is None:
        raise ModelFolderError(
            f"{folder.path}: the model folder has no shortlist (`python -m model_export shortlist` adds one)"
        )
    cfg, ids = folder.manifest.config, folder.manifest.special_ids
    arrays = read_arrays(folder.file(spec.file))
    check_arrays(folder.file(spec.file), arrays, cfg.src_vocab_size, cfg.tgt_vocab_size)
    special = [ids.pad, ids.decoder_start, ids.eos, ids.unk]
    always = np.concatenate([special, arrays["always"]]).astype(np.int64)
    return Shortlist(
        always, arrays["offsets"].astype(np.int64), arrays["targets"].astype(np.int64), spec.candidates, ids.pad,
        spec.copy_source,
    )


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            missing = [name for name in ARRAYS if name not in data.files]
            if missing:
                raise ModelFolderError(f"{path}: not a shortlist: it has no array {', '.join(missing)}")
            return {name: data[name] for name in ARRAYS}
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise ModelFolderError(f"{path}: not a shortlist (numpy .npz) file ({error})") from None


def check_arrays(path: Path, arrays: dict[str, np.ndarray], src_vocab: int, tgt_vocab: int) -> None:
    """Each array one-dimensional of integers, the offsets one per source id and never decreasing, the ids in
    the target vocabulary."""
    for name, array in arrays.items():
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise ModelFolderError(f"{path}: {name} must be a one-dimensional integer array, not {array.dtype}")
    offsets, targets = arrays["offsets"], arrays["targets"]
    if len(offsets) != src_vocab + 1 or offsets[0] != 0 or offsets[-1] != len(targets):
        raise ModelFolderError(
            f"{path}: offsets must hold {src_vocab + 1} values (one per source id, and the end) from 0 to "
            f"{len(targets)}; it holds {len(offsets)}"
        )
    if np.any(np.diff(offsets) < 0):
        raise ModelFolderError(f"{path}: offsets decrease: each source id's targets must follow the one before's")
    for name in ("always", "targets"):
        ids = arrays[name]
        if ids.size and (ids.min() < 0 or ids.max() >= tgt_vocab):
            raise ModelFolderError(f"{path}: {name} holds ids outside the target vocabulary (0..{tgt_vocab - 1})")
