"""Checks a model folder against its checkpoint: the server's own loader (checksums, graph inputs and
outputs), the config, ONNX Runtime vs PyTorch log-probabilities on several shapes, and identical
greedy and beam-search token ids from the PyTorch reference and the decoding loop over the graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from model_export import reference
from model_export.checkpoint import Checkpoint
from model_export.errors import ExportError
from model_export.model import Transformer
from service.decoding import SearchOptions
from service.engine import TokenRules, decode_batch
from service.model_folder import load_model_folder
from service.runtime import OnnxRuntime

SHAPES = ((1, 1, 4), (3, 7, 6), (5, 12, 9))  # (batch, longest source, decoder steps)


@dataclass(frozen=True)
class VerifyReport:
    max_abs_diff: float
    shapes: int
    greedy_equal: bool
    beam_equal: bool

    @property
    def ok(self) -> bool:
        return self.greedy_equal and self.beam_equal

    def summary(self, tolerance: float) -> str:
        greedy, beam = ("equal" if same else "DIFFER" for same in (self.greedy_equal, self.beam_equal))
        return (
            f"log-prob max |onnx - torch| = {self.max_abs_diff:.2e} over {self.shapes} shapes "
            f"(tolerance {tolerance:g}); greedy ids {greedy}; beam-4 ids {beam}"
        )


def random_sources(cfg, batch: int, longest: int, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded random sources ending in EOS; row 0 has the longest length, the others shorter."""
    lengths = [longest] + list(rng.integers(1, longest + 1, size=batch - 1))
    special = {cfg.pad_id, cfg.eos_id, cfg.decoder_start_id, cfg.unk_id}
    ordinary = np.array([i for i in range(cfg.src_vocab_size) if i not in special])
    src_ids = torch.full((batch, longest), cfg.pad_id, dtype=torch.long)  # (B, S)
    src_mask = torch.zeros((batch, longest), dtype=torch.bool)  # (B, S)
    for row, length in enumerate(lengths):
        src_ids[row, :length] = torch.from_numpy(rng.choice(ordinary, size=length))
        src_ids[row, length - 1] = cfg.eos_id
        src_mask[row, :length] = True
    return src_ids, src_mask


def teacher_forced_diff(model: Transformer, runtime: OnnxRuntime, shape: tuple[int, int, int], seed: int) -> float:
    """Largest |log p| difference between torch `decode` and the ONNX step graph fed the same tokens."""
    batch, longest, steps = shape
    rng = np.random.default_rng(seed)
    src_ids, src_mask = random_sources(model.cfg, batch, longest, rng)
    tgt = torch.from_numpy(rng.integers(4, model.cfg.tgt_vocab_size, size=(batch, steps)))  # (B, T)
    tgt[:, 0] = model.cfg.decoder_start_id
    with torch.no_grad():
        expected = model(src_ids, src_mask, tgt).numpy()  # (B, T, V)
    memory = runtime.encode(src_ids.numpy(), src_mask.numpy())
    cache = runtime.new_cache()
    cache.add(memory.keys, memory.values, src_mask.numpy())
    worst = 0.0
    for t in range(steps):
        out = runtime.step(tgt[:, t].numpy(), cache, full=True)
        worst = max(worst, float(np.abs(out.log_probs - expected[:, t]).max()))
    return worst


def same_decodings(model: Transformer, runtime: OnnxRuntime, beam_size: int, seed: int, max_new: int = 12) -> bool:
    cfg = model.cfg
    src_ids, src_mask = random_sources(cfg, 4, 9, np.random.default_rng(seed))
    if beam_size == 1:
        expected = reference.greedy(model, src_ids, src_mask, max_new)
    else:
        expected = reference.beam_search(model, src_ids, src_mask, beam_size, max_new)
    sources = [row[mask].tolist() for row, mask in zip(src_ids, src_mask, strict=True)]
    options = [SearchOptions(beam_size=beam_size, max_new_tokens=max_new)] * len(sources)
    rules = TokenRules(cfg.decoder_start_id, cfg.eos_id, cfg.pad_id)
    got = [hyps[0].tokens for hyps in decode_batch(runtime, sources, options, rules)]
    return [list(g) for g in got] == expected


def verify_folder(folder_path: Path, checkpoint: Checkpoint, variant: str | None = None, seed: int = 0) -> VerifyReport:
    folder = load_model_folder(folder_path)
    declared = folder.manifest.config.model_dump()
    differing = sorted(k for k, v in checkpoint.config.to_dict().items() if declared.get(k) != v)
    if differing:
        raise ExportError(f"{folder_path}: manifest config differs from the checkpoint in: {', '.join(differing)}")
    model = checkpoint.build_model()
    runtime = OnnxRuntime(folder, variant)
    diff = max(teacher_forced_diff(model, runtime, shape, seed + i) for i, shape in enumerate(SHAPES))
    greedy, beam = same_decodings(model, runtime, 1, seed), same_decodings(model, runtime, 4, seed)
    return VerifyReport(diff, len(SHAPES), greedy, beam)
