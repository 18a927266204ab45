"""Calibrates a model folder's confidence on its dev set and measures its guards: every dev and test sentence
decoded greedy through the server's own path (evaluate.StaticBatches), labelled good when its sentence chrF reaches
a threshold, a Platt sigmoid over its mean token log-probability fitted on dev by Newton's method (numpy), the
expected calibration error and a reliability table on dev and test, the share of each split's translations (and of
its references) that each guard finds degenerate and how many of those 4 beams fix; the fit goes into the manifest's
`confidence` (format 13). Writes the manifest and its report; changes no graph.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import sacrebleu

from model_export.errors import ExportError
from model_export.evaluate import StaticBatches, read_split
from model_export.export import write_manifest
from service.engine import GuardLimits, Hypothesis, degenerate, ends
from service.model import FORMAT_VERSION, MANIFEST, load_model_folder, platt

CHRF_GOOD = 50.0  # a translation is good when its sentence chrF (sacrebleu's defaults) reaches this
BINS = 10  # the reliability table's and the ECE's bins of equal width over [0, 1]
RETRY_BEAM = 4  # the server's retry of a degenerate greedy sentence (service/translation/translator.py)


@dataclass
class Split:
    """One split's measures: calibration (with the fit of the dev set) and guards."""

    name: str
    sentences: int
    good: int  # translations labelled good
    ece: float
    brier: float
    reliability: list[dict[str, float]]  # per non-empty bin: lower edge, sentences, mean confidence, share good
    guards: dict[str, int]  # translations each guard found degenerate
    fixed: dict[str, int]  # ... of them, those whose search with RETRY_BEAM beams the guards pass
    reference_guards: dict[str, int]  # references each guard would find degenerate: its false alarms


@dataclass
class CalibrationReport:
    model: str
    variant: str
    a: float
    b: float
    threshold: float
    splits: list[Split] = field(default_factory=list)
    fit_splits: int = 1  # the first splits, pooled, that the fit was made on

    def field(self) -> dict[str, object]:
        """The manifest's `confidence` (service.model.Calibration)."""
        fitted = self.splits[: self.fit_splits]
        name = "+".join(s.name for s in fitted)
        return {
            "method": "platt",
            "feature": "mean_token_logprob",
            "a": round(self.a, 6),
            "b": round(self.b, 6),
            "label": f"sentence chrF >= {self.threshold:g} on the {name} set",
            "fitted_on": {"split": name, "sentences": sum(s.sentences for s in fitted),
                          "good": sum(s.good for s in fitted), "variant": self.variant,
                          "search": "greedy", **{f"ece_{s.name}": round(s.ece, 4) for s in self.splits}},
        }

    def summary(self) -> str:
        lines = [f"{self.model} [{self.variant}, greedy]: confidence = sigmoid({self.a:.4f} m + {self.b:.4f}), "
                 f"m the mean token log-probability, good = sentence chrF >= {self.threshold:g}"]
        for s in self.splits:
            found = ", ".join(f"{kind} {n}" for kind, n in s.guards.items()) or "none"
            lines.append(f"{s.name}: {s.sentences} sentences, {s.good} good, ECE {s.ece:.3f}, Brier {s.brier:.3f}; "
                         f"guards {sum(s.guards.values())} ({found}), {sum(s.fixed.values())} fixed by "
                         f"{RETRY_BEAM} beams; references flagged {sum(s.reference_guards.values())}")
        return "\n".join(lines)


def fit_platt(m: np.ndarray, good: np.ndarray, steps: int = 100) -> tuple[float, float]:
    """a, b maximising the likelihood of `good` under P(good) = sigmoid(a m + b) (Newton's method on the two
    parameters, from a = 0 and b the prior's log-odds); ExportError when one label is all there is."""
    y = good.astype(np.float64)
    if y.min() == y.max():
        raise ExportError(f"every dev sentence is labelled {'good' if y[0] else 'poor'}: nothing to calibrate against")
    x = np.stack([m.astype(np.float64), np.ones_like(y)], axis=1)  # (N, 2)
    w = np.array([0.0, math.log(y.mean() / (1 - y.mean()))])  # (2,)
    for _ in range(steps):
        p = 1.0 / (1.0 + np.exp(-(x @ w)))  # (N,)
        hessian = (x * (p * (1 - p))[:, None]).T @ x + 1e-9 * np.eye(2)  # (2, 2)
        move = np.linalg.solve(hessian, x.T @ (y - p))  # (2,)
        w += move
        if np.abs(move).max() < 1e-10:
            break
    return float(w[0]), float(w[1])


def reliability(confidence: np.ndarray, good: np.ndarray, bins: int = BINS) -> tuple[float, list[dict[str, float]]]:
    """The expected calibration error (each bin's |mean confidence - share good|, weighted by its sentences) and
    the table of non-empty bins."""
    which = np.minimum((confidence * bins).astype(int), bins - 1)
    ece, table = 0.0, []
    for b in range(bins):
        inside = which == b
        if inside.any():
            mean, share = float(confidence[inside].mean()), float(good[inside].mean())
            ece += inside.sum() / len(confidence) * abs(mean - share)
            table.append({"from": b / bins, "sentences": int(inside.sum()), "confidence": mean, "good": share})
    return ece, table


def mean_log_prob(hypothesis: Hypothesis) -> float:
    return hypothesis.log_prob / len(hypothesis.tokens)


@dataclass
class Decoded:
    """One split through the folder: sources, references, the greedy hypotheses and their texts."""

    name: str
    sources: list[str]
    references: list[str]
    best: list[Hypothesis]
    texts: list[str]
    good: np.ndarray  # (N,) bool


def decoded(batches: StaticBatches, corpus: Path, split: str, threshold: float, batch_size: int) -> Decoded:
    manifest = batches.manifest
    sources, references = read_split(corpus, split, manifest.source_language, manifest.target_languages[0])
    best = batches.best(sources, 1, batch_size)
    texts = [batches.tokenizer.decode(h.tokens) for h in best]
    chrf = [sacrebleu.sentence_chrf(t, [r]).score for t, r in zip(texts, references, strict=True)]
    return Decoded(split, sources, references, best, texts, np.array(chrf) >= threshold)


def guard_counts(batches: StaticBatches, split: Decoded, batch_size: int) -> tuple[dict, dict, dict]:
    """What the guards find in the split's translations and references, and how many of the translations they find
    degenerate a search with RETRY_BEAM beams fixes."""
    limits, tokenizer, target = GuardLimits(), batches.tokenizer, batches.target
    ids = [tokenizer.encode(s, target) for s in split.sources]
    kinds = [degenerate(i, h.tokens, ends(h, batches.rules), (s, t), limits)
             for i, h, s, t in zip(ids, split.best, split.sources, split.texts, strict=True)]
    flagged = [n for n, kind in enumerate(kinds) if kind]
    retried = batches.best([split.sources[n] for n in flagged], RETRY_BEAM, batch_size) if flagged else []
    fixed = Counter(
        kinds[n] for n, h in zip(flagged, retried, strict=True)
        if degenerate(ids[n], h.tokens, ends(h, batches.rules), (split.sources[n], tokenizer.decode(h.tokens)),
                      limits) is None
    )
    references = Counter(
        degenerate(i, tokenizer.encode(r, target), True, (s, r), limits)
        for i, s, r in zip(ids, split.sources, split.references, strict=True)
    )
    references.pop(None, None)
    return dict(Counter(k for k in kinds if k)), dict(fixed), dict(references)


def calibrate(
    folder_path: Path, corpus: Path, variant: str | None = None, threshold: float = CHRF_GOOD,
    splits: tuple[str, ...] = ("dev", "test"), batch_size: int = 32, threads: int = 2, fit_splits: int = 1,
) -> CalibrationReport:
    """Fits the confidence on the first `fit_splits` of `splits` pooled (a dev set per domain, so that one
    confidence means the same across them), measures it and the guards on each, and writes the fit into the
    folder's manifest."""
    if not 1 <= fit_splits <= len(splits):
        raise ExportError(f"--fit-splits must be 1 to {len(splits)} (the number of --splits), got {fit_splits}")
    folder = load_model_folder(folder_path)
    batches = StaticBatches(folder_path, variant, threads)
    runs = [decoded(batches, corpus, split, threshold, batch_size) for split in splits]
    fitted = runs[:fit_splits]
    m = np.array([mean_log_prob(h) for run in fitted for h in run.best])  # (N,)
    a, b = fit_platt(m, np.concatenate([run.good for run in fitted]))
    report = CalibrationReport(folder.manifest.name, variant or folder.manifest.default_variant, a, b, threshold,
                               fit_splits=fit_splits)
    for run in runs:
        confidence = np.array([platt(mean_log_prob(h), a, b) for h in run.best])
        ece, table = reliability(confidence, run.good)
        brier = float(np.mean((confidence - run.good) ** 2))
        found, fixed, references = guard_counts(batches, run, batch_size)
        report.splits.append(Split(run.name, len(run.best), int(run.good.sum()), ece, brier, table, found, fixed,
                                   references))
    manifest = json.loads((folder_path / MANIFEST).read_text(encoding="utf-8"))
    manifest["format_version"] = max(manifest["format_version"], FORMAT_VERSION)
    manifest["confidence"] = report.field()
    write_manifest(folder_path, manifest)
    load_model_folder(folder_path)  # the folder must still load
    return report


def report_dict(report: CalibrationReport) -> dict[str, object]:
    return {**asdict(report), "confidence": report.field(), "retry_beam": RETRY_BEAM,
            "guard_limits": asdict(GuardLimits())}
