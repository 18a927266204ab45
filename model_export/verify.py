"""Checks a model folder against its checkpoint: the server's own loader (checksums, graph inputs and
outputs), the config, the tokenizer files, and for every step graph of each variant checked (the step graph, the
ragged one, the one-row one, the dense one, the shortlist one) ONNX Runtime vs PyTorch log-probabilities on several
shapes and the greedy and beam-search token ids of the decoding loop over that graph against the PyTorch
reference's. The shortlist step graph is held to the reference restricted to each sentence's candidates
(reference.restricted), its log-probs compared at the candidates its top-K returns.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch

from model_export import reference
from model_export.checkpoint import Checkpoint
from model_export.errors import ExportError
from model_export.model import Transformer
from service.engine import DecoderCache, OnnxRuntime, SearchOptions, SessionSettings, TokenRules, decode_batch
from service.model import ModelFolder, Tokenizer, load_model_folder

SHAPES = ((1, 1, 4), (3, 7, 6), (5, 12, 9))  # (batch, longest source, decoder steps)
# the VariantSpec fields verify runs (the dense one in a runtime of its own, whose caches are dense)
STEP_GRAPHS = (
    "decoder_step", "decoder_step_ragged", "decoder_step_single", "decoder_step_dense", "decoder_step_shortlist"
)
SHORTLIST_TOP = 8  # the shortlist step's candidates compared per row (its graph returns no whole distribution)
DEFAULT_TOLERANCE = 1e-4  # |log p| of an fp32 graph against PyTorch: summation order only (the CLI's --tolerance)
# A variant of lower precision is held to its own tolerance, |log p| against PyTorch in float32 over the whole
# vocabulary (its least likely tokens move most), and its greedy choices to within twice that of the reference's best
# (close_decodings: no token's log-prob moved more than the tolerance, so no choice can lose more than twice it).
OWN_TOLERANCE = {
    "fp16": 2e-2,  # float16 keeps ~3 significant digits per activation: tiny test model 0.005-0.009
    "int8": 1.0,  # dynamic quantization, int8 weights and activations per tensor: tiny model 0.19, default model 0.59
}
# The one-row graph's products are MatMulNBits over 8-bit weights in blocks of 128 along K, a scale per column and
# block, its activations quantized to int8 per block too (accuracy_level 4): finer than the step graph's weights, but
# it reads the step graph's own int8 embedding table, so its error is of the same order (tiny model 0.23, default
# model 0.60), and so is its tolerance. At 4 bits in blocks of 32 (`quantize --single-row-bits 4`) its least likely
# tokens move more (tiny model 1.58, default model 1.88; the default model's test set scored as at 8 bits).
SINGLE_ROW_TOLERANCE = {8: 1.0, 4: 2.5}


@dataclass(frozen=True)
class GraphReport:
    """One step graph of one variant against the PyTorch reference. `tolerance` None: the caller's (fp32 graphs);
    `beam_equal` None: the runtime never runs this graph for beams (the ragged one: one row per sentence)."""

    variant: str
    graph: str
    max_abs_diff: float  # nan if any log-prob was nan
    greedy_equal: bool
    beam_equal: bool | None
    tolerance: float | None

    def ok(self, tolerance: float) -> bool:
        within = self.max_abs_diff <= (self.tolerance if self.tolerance is not None else tolerance)  # False for nan
        return within and self.greedy_equal and self.beam_equal is not False

    def summary(self, tolerance: float) -> str:
        """One graph's results, e.g. 'fp32 decoder_step: log-prob max |onnx - torch| = 4.8e-06 (tolerance 0.0001);
        greedy ids equal; beam-4 ids equal'; a failed one says FAILED after its name."""
        own = f"{self.tolerance:g}, {self.variant}'s" if self.tolerance is not None else f"{tolerance:g}"
        ids = {True: "equal", False: "DIFFER", None: "not run (one row per sentence only)"}
        if self.tolerance is not None:  # close_decodings: within the tolerance, not equal
            ids = {**ids, True: "close"}
        verdict = "" if self.ok(tolerance) else " FAILED"
        return (
            f"{self.variant} {self.graph}{verdict}: log-prob max |onnx - torch| = {self.max_abs_diff:.2e} "
            f"(tolerance {own}); greedy ids {ids[self.greedy_equal]}; beam-4 ids {ids[self.beam_equal]}"
        )


@dataclass(frozen=True)
class VerifyReport:
    graphs: tuple[GraphReport, ...]
    shapes: int

    @property
    def max_abs_diff(self) -> float:
        """The largest difference among the graphs judged by the caller's tolerance (fp32); nan if any graph's
        log-probs held a nan. Graphs with a tolerance of their own are judged in `ok`."""
        if any(math.isnan(g.max_abs_diff) for g in self.graphs):
            return math.nan
        return max((g.max_abs_diff for g in self.graphs if g.tolerance is None), default=0.0)

    @property
    def ok(self) -> bool:
        """Ids equal everywhere, no nan, and every graph with its own tolerance within it."""
        return all(g.ok(math.inf) for g in self.graphs) and not math.isnan(self.max_abs_diff)

    def failed(self, tolerance: float = DEFAULT_TOLERANCE) -> list[str]:
        """The variant and graph of each failing check, e.g. 'fp32 decoder_step_ragged'."""
        return [f"{g.variant} {g.graph}" for g in self.graphs if not g.ok(tolerance)]

    def summary(self, tolerance: float) -> str:
        """One line (the CLI's error repeats it): each graph's results, then which failed."""
        failed = self.failed(tolerance)
        verdict = (
            f"FAILED: {', '.join(failed)}" if failed else f"{len(self.graphs)} step graphs reproduce the checkpoint"
        )
        graphs = " | ".join(g.summary(tolerance) for g in self.graphs)
        return f"{verdict}; over {self.shapes} shapes: {graphs}"


class PinnedRuntime(OnnxRuntime):
    """The server's runtime with every step on the step graph `pin` chose, whatever the rows and sources, so that
    each graph is checked on its own (the server picks among them per step: OnnxRuntime._step_graph). One runtime,
    its sessions opened once, serves every graph of its variant."""

    def __init__(self, folder: ModelFolder, variant: str, dense: bool = False, shortlist: bool = False) -> None:
        super().__init__(folder, variant, SessionSettings(dense_step=dense, shortlist=shortlist))
        self.folder, self.variant, self.pinned = folder, variant, "decoder_step"

    def pin(self, graph: str) -> None:
        if self.steps[graph] is None:
            raise ExportError(f"{self.folder.path}: variant {self.variant} has no {graph} session to run")
        self.pinned = graph

    def _step_graph(self, cache: DecoderCache, candidates: int) -> str:
        return self.pinned


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
    """Largest |log p| difference between torch `decode` and the ONNX step graph fed the same tokens; nan if
    either side has a nan anywhere. With a shortlist: at the SHORTLIST_TOP candidates the step returns per row,
    against torch's restricted to the row's sentence's candidates (an id outside them: inf)."""
    batch, longest, steps = shape
    rng = np.random.default_rng(seed)
    src_ids, src_mask = random_sources(model.cfg, batch, longest, rng)
    tgt = torch.from_numpy(rng.integers(4, model.cfg.tgt_vocab_size, size=(batch, steps)))  # (B, T)
    tgt[:, 0] = model.cfg.decoder_start_id
    with torch.no_grad():
        expected = model(src_ids, src_mask, tgt).numpy()  # (B, T, V)
    memory = runtime.encode(src_ids.numpy(), src_mask.numpy())
    cache = runtime.new_cache()
    cache.add(memory.keys, memory.values, src_mask.numpy(), candidates=memory.candidates)
    if runtime.shortlist is None:
        full = [runtime.step(tgt[:, t].numpy(), cache, full=True).log_probs for t in range(steps)]  # (B, V) each
        diffs = [np.abs(log_probs - expected[:, t]) for t, log_probs in enumerate(full)]
        return float(np.max(diffs))  # np.max keeps a nan, where max() would drop it
    allowed = allowed_ids(runtime, src_ids, src_mask, model.cfg.tgt_vocab_size)  # (B, V)
    expected = reference.restricted(torch.from_numpy(expected), allowed[:, None, :]).numpy()  # (B, T, V)
    diffs = []
    for t in range(steps):
        out = runtime.step(tgt[:, t].numpy(), cache, candidates=SHORTLIST_TOP)  # (B, K) twice, best first
        at = np.take_along_axis(expected[:, t], out.top_ids, axis=1)  # (B, K) torch's at the ids returned
        diffs.append(np.abs(out.top_log_probs - at))  # inf where an id is not a candidate
    return float(np.max(diffs))


def allowed_ids(
    runtime: OnnxRuntime, src_ids: torch.Tensor, src_mask: torch.Tensor, vocab: int
) -> torch.Tensor | None:
    """(B, V) each sentence's shortlist candidates (the runtime's own sets) among the `vocab` target ids, or None
    without a shortlist."""
    if runtime.shortlist is None:
        return None
    sets = runtime.shortlist.candidates(src_ids.numpy(), src_mask.numpy())  # (B, C)
    allowed = torch.zeros((len(sets), vocab), dtype=torch.bool)  # (B, V)
    allowed[torch.arange(len(sets))[:, None], torch.from_numpy(sets)] = True
    return allowed


def same_decodings(
    model: Transformer, runtime: OnnxRuntime, beam_size: int, seed: int, max_new: int = 12, scored: bool = True
) -> bool:
    """The decoding loop over the runtime gives the reference search's ids. `scored` False: greedy rows that ask no
    score, whose steps may skip the log-softmax (format 8), as the server's greedy requests by default."""
    cfg = model.cfg
    src_ids, src_mask = random_sources(cfg, 4, 9, np.random.default_rng(seed))
    allowed = allowed_ids(runtime, src_ids, src_mask, cfg.tgt_vocab_size)  # (B, V) or None
    if beam_size == 1:
        expected = reference.greedy(model, src_ids, src_mask, max_new, allowed)
    else:
        expected = reference.beam_search(model, src_ids, src_mask, beam_size, max_new, allowed=allowed)
    sources = [row[mask].tolist() for row, mask in zip(src_ids, src_mask, strict=True)]
    options = [SearchOptions(beam_size=beam_size, max_new_tokens=max_new, scored=scored)] * len(sources)
    rules = TokenRules(cfg.decoder_start_id, cfg.eos_id, cfg.pad_id)
    got = [hyps[0].tokens for hyps in decode_batch(runtime, sources, options, rules)]
    return [list(g) for g in got] == expected


def close_decodings(
    model: Transformer, runtime: OnnxRuntime, beam_size: int, seed: int, tolerance: float, scored: bool = True
) -> bool:
    """For a graph of lower precision, whose ids may part from the reference's where two candidates are closer than
    its error: greedy, every token the loop chose is within 2 x `tolerance` of the reference's best candidate at its
    step (given the same prefix); beam, the best hypothesis's log-prob is the reference's for the same tokens within
    `tolerance` per token."""
    cfg, max_new = model.cfg, 12
    src_ids, src_mask = random_sources(cfg, 4, 9, np.random.default_rng(seed))
    sources = [row[mask].tolist() for row, mask in zip(src_ids, src_mask, strict=True)]
    options = [SearchOptions(beam_size=beam_size, max_new_tokens=max_new, scored=scored)] * len(sources)
    rules = TokenRules(cfg.decoder_start_id, cfg.eos_id, cfg.pad_id)
    best = [hyps[0] for hyps in decode_batch(runtime, sources, options, rules)]
    allowed = allowed_ids(runtime, src_ids, src_mask, cfg.tgt_vocab_size)  # (B, V) or None
    for row, hyp in enumerate(best):
        tgt = torch.tensor([[cfg.decoder_start_id, *hyp.tokens[:-1]]])  # (1, T)
        with torch.no_grad():
            expected = model(src_ids[row : row + 1], src_mask[row : row + 1], tgt)[0]  # (T, V)
        expected = reference.restricted(expected, None if allowed is None else allowed[row : row + 1]).numpy()
        expected[:, reference.banned_tokens(model)] = -np.inf
        chosen = expected[np.arange(len(hyp.tokens)), list(hyp.tokens)]  # (T,)
        if beam_size == 1 and not np.all(chosen >= expected.max(axis=1) - 2 * tolerance):
            return False
        if beam_size > 1 and not abs(hyp.log_prob - chosen.sum()) <= tolerance * len(hyp.tokens):
            return False
    return True


def check_tokenizer(folder: ModelFolder, checkpoint: Checkpoint) -> None:
    """The folder's tokenizer is the checkpoint's: the same files, byte for byte, in the same roles, and no more
    pieces than the model has ids (Tokenizer.from_folder, the server's loader, checks that too)."""
    spec, tok = folder.manifest.tokenizer, checkpoint.tokenizer
    roles = {"source_model": spec.source_model, "target_model": spec.target_model, "vocabulary": spec.vocabulary}
    differing = sorted(role for role, name in roles.items() if getattr(tok, role) != name)
    if differing:
        names = ", ".join(differing)
        raise ExportError(f"{folder.path}: the manifest's tokenizer differs from the checkpoint's in: {names}")
    for name in sorted({name for name in roles.values() if name is not None}):
        if folder.file(name).read_bytes() != tok.files.get(name):
            raise ExportError(f"{folder.file(name)}: not the checkpoint's {name} (the bytes differ)")
    Tokenizer.from_folder(folder)


def single_row_bits(path: Path) -> int:
    """The bits of the one-row graph's weights (its MatMulNBits nodes' `bits`)."""
    model = onnx.load(path, load_external_data=False)
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    return next(a.i for a in node.attribute if a.name == "bits")


def check_graph(
    model: Transformer, runtime: PinnedRuntime, variant: str, graph: str, seed: int, override: float | None = None
) -> GraphReport:
    """One step graph, run for every step (runtime.pin): teacher-forced log-probs on SHAPES, greedy ids (unscored,
    the server's default path) and beam-4 ids, except on the ragged graph, which the server never runs for beams.
    A graph of lower precision is held to its own tolerance (`override` given: that one instead), and its ids to
    close_decodings."""
    runtime.pin(graph)
    diff = float(np.max([teacher_forced_diff(model, runtime, shape, seed + i) for i, shape in enumerate(SHAPES)]))
    spec = runtime.folder.variant(variant)
    if graph == "decoder_step_single":
        tolerance = SINGLE_ROW_TOLERANCE[single_row_bits(runtime.folder.file(spec.decoder_step_single.file))]
    else:
        tolerance = OWN_TOLERANCE.get(spec.precision)
    if tolerance is not None and override is not None:
        tolerance = override
    beams = (1,) if graph == "decoder_step_ragged" else (1, 4)
    if tolerance is None:
        same = [same_decodings(model, runtime, beam, seed, scored=beam > 1) for beam in beams]
    else:
        same = [close_decodings(model, runtime, beam, seed, tolerance, scored=beam > 1) for beam in beams]
    return GraphReport(variant, graph, diff, same[0], same[1] if len(same) > 1 else None, tolerance)


def verify_folder(
    folder_path: Path, checkpoint: Checkpoint, variant: str | None = None, seed: int = 0, tolerance: float | None = None
) -> VerifyReport:
    """`variant` None: every variant of the folder, each graph by its precision's tolerance (fp32's the caller's);
    `tolerance` given (the CLI's --tolerance): the lower precisions' too."""
    folder = load_model_folder(folder_path)
    declared = folder.manifest.config.model_dump()
    differing = sorted(k for k, v in checkpoint.config.to_dict().items() if declared.get(k) != v)
    if differing:
        raise ExportError(f"{folder_path}: manifest config differs from the checkpoint in: {', '.join(differing)}")
    check_tokenizer(folder, checkpoint)
    model = checkpoint.build_model()
    variants = [variant] if variant is not None else list(folder.manifest.variants)
    reports = []
    for name in variants:
        spec, runtime = folder.variant(name), PinnedRuntime(folder, name)
        graphs = [graph for graph in STEP_GRAPHS if getattr(spec, graph) is not None]
        for graph in graphs:
            checked = runtime
            if graph == "decoder_step_dense":
                checked = PinnedRuntime(folder, name, dense=True)
            elif graph == "decoder_step_shortlist":
                checked = PinnedRuntime(folder, name, shortlist=True)
            reports.append(check_graph(model, checked, name, graph, seed, tolerance))
    return VerifyReport(tuple(reports), len(SHAPES))
