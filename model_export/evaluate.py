"""Scores a model folder on a held-out split through the server's own path (tokenizer, ONNX Runtime,
decoding loop): sacrebleu BLEU and chrF, and the share of sentences whose placeholders come out exactly
as in the source. Knows the corpus layout; writes nothing but its report.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import sacrebleu
from tqdm import tqdm

from model_export.corpus import line_origins, read_lines
from model_export.corpus.clean import placeholders
from model_export.errors import ExportError
from service.engine import (
    MAX_OUTPUT_RATIO,
    MAX_OUTPUT_TOKENS,
    Hypothesis,
    OnnxRuntime,
    SearchOptions,
    SessionSettings,
    TokenRules,
    decode_batches,
    output_cap,
)
from service.model import Tokenizer, load_model_folder

# Each sentence's output cap: the server's at its defaults (not the MT_* environment: an evaluation, and the engine
# bench.server measures beside the server, are the folder's own)


@dataclass
class EvalReport:
    model: str
    variant: str
    split: str
    beam_size: int
    sentences: int
    bleu: float
    chrf: float
    placeholder_sentences: int  # test sentences whose source has placeholders
    placeholder_exact: int  # ... whose translation has exactly the same multiset of placeholders
    seconds: float
    target_tokens: int
    examples: list[dict[str, object]] = field(default_factory=list)
    # group -> {"sentences", "bleu", "chrf"}, where the corpus says each line's package and each package's group
    groups: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def placeholder_accuracy(self) -> float:
        return 100.0 * self.placeholder_exact / max(self.placeholder_sentences, 1)

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "placeholder_accuracy": self.placeholder_accuracy}

    def summary(self) -> str:
        return (
            f"{self.model} [{self.variant}, beam {self.beam_size}] on {self.split} ({self.sentences} sentences): "
            f"BLEU {self.bleu:.1f}, chrF {self.chrf:.1f}, placeholders exact "
            f"{self.placeholder_exact}/{self.placeholder_sentences} ({self.placeholder_accuracy:.1f}%), "
            f"{self.target_tokens / self.seconds:,.0f} target tokens/s"
        )


def same_placeholders(source: str, translation: str) -> bool:
    return Counter(placeholders(source)) == Counter(placeholders(translation))


def read_split(corpus: Path, split: str, source: str, target: str) -> tuple[list[str], list[str]]:
    paths = corpus / f"{split}.{source}", corpus / f"{split}.{target}"
    for path in paths:
        if not path.is_file():
            raise ExportError(f"corpus file not found: {path}")
    sources, references = (read_lines(p) for p in paths)
    if len(sources) != len(references):
        raise ExportError(
            f"{paths[0]} has {len(sources)} lines, {paths[1]} {len(references)}: a split's source and reference "
            "files must pair line by line"
        )
    if not sources:
        raise ExportError(f"{paths[0]} and {paths[1]} are empty: no sentences to evaluate on")
    return sources, references


def line_groups(corpus: Path, split: str, lines: int) -> list[str] | None:
    """Each line's corpus group (`corpus build` writes `<split>.origin`, a package a line, and stats.json's
    package -> group); None for a corpus without them (a user's own test set)."""
    found = line_origins(corpus, split)
    if found is None:
        return None
    names, group_of = found
    if len(names) != lines or any(name not in group_of for name in names):
        return None  # not the build that wrote this split
    return [group_of[name] for name in names]


def group_scores(groups: list[str], hypotheses: list[str], references: list[str]) -> dict[str, dict[str, float]]:
    """BLEU and chrF of each group's subset of a split, largest group first."""
    scores = {}
    for group, size in Counter(groups).most_common():
        rows = [i for i, g in enumerate(groups) if g == group]
        hyps, refs = [hypotheses[i] for i in rows], [references[i] for i in rows]
        scores[group] = {
            "sentences": size,
            "bleu": sacrebleu.corpus_bleu(hyps, [refs]).score,
            "chrf": sacrebleu.corpus_chrf(hyps, [refs]).score,
        }
    return scores


class StaticBatches:
    """A folder's graphs opened once, translating lists of sentences in static batches of similar length through
    the served decoding loop (the engine alone: no server, no scheduler). With `streams` > 1, each batch's sentences
    go as that many sub-batches decoded at once, the threads split between them (the server's MT_DECODER_STREAMS).
    The step graph alone, as the server runs by default (MT_BATCH_INVARIANT); `fast`: also the folder's faster graphs
    for static batches, as a server with MT_BATCH_INVARIANT=false and MT_BATCHING=static runs them (dense, one-row)."""

    def __init__(
        self, folder_path: Path, variant: str | None, threads: int, streams: int = 1, fast: bool = False
    ) -> None:
        folder = load_model_folder(folder_path)
        settings = SessionSettings(
            intra_op_threads=max(1, threads // streams), ragged_step=False, single_row_step=fast, dense_step=fast
        )
        self.runtime = OnnxRuntime(folder, variant, settings)
        self.tokenizer, ids = Tokenizer.from_folder(folder), folder.manifest.special_ids
        self.rules = TokenRules(ids.decoder_start, ids.eos, ids.pad)
        self.manifest, self.target = folder.manifest, folder.manifest.target_languages[0]
        self.streams = streams
        self.most_output = min(MAX_OUTPUT_TOKENS, folder.manifest.config.max_positions)  # never past its positions

    def translate(self, sources: list[str], beam_size: int, batch_size: int) -> tuple[list[str], int, float]:
        """-> (translations, target tokens, seconds of decoding and detokenising)."""
        started = time.perf_counter()
        best = self.best(sources, beam_size, batch_size, scored=False)  # the texts only
        translations = [self.tokenizer.decode(h.tokens) for h in best]
        return translations, sum(len(h.tokens) for h in best), time.perf_counter() - started

    def best(self, sources: list[str], beam_size: int, batch_size: int, scored: bool = True) -> list[Hypothesis]:
        """Each source's best hypothesis, in order (`scored`: with its log-probability, as the server decodes)."""
        encoded = [self.tokenizer.encode(s, self.target) for s in sources]
        # longest first: the order decode_batches' streams take batches in (longest_first), so that its results,
        # yielded in the batches' order, come as they finish and the progress bar moves
        order = sorted(range(len(sources)), key=lambda i: -len(encoded[i]))
        size = max(1, batch_size // self.streams)
        batches = [order[start : start + size] for start in range(0, len(order), size)]
        cap = [output_cap(len(ids), self.most_output, MAX_OUTPUT_RATIO) for ids in encoded]
        options = [[SearchOptions(beam_size, cap[i], scored=scored) for i in b] for b in batches]
        best: list[Hypothesis | None] = [None] * len(sources)
        sentences = [[encoded[i] for i in b] for b in batches]
        decoded = decode_batches(self.runtime, sentences, options, self.rules, self.streams)
        pairs = zip(batches, decoded, strict=True)
        for batch, results in tqdm(pairs, total=len(batches), desc="translating", unit="batch", leave=False):
            for i, hyps in zip(batch, results, strict=True):
                best[i] = hyps[0]
        return [h for h in best if h is not None]


def translate_all(
    folder_path: Path,
    sources: list[str],
    variant: str | None,
    beam_size: int,
    batch_size: int,
    threads: int,
    streams: int = 1,
    fast: bool = False,
) -> tuple[list[str], int, float]:
    """Static batches of similar length through the served graphs, opened for this call -> (translations, target
    tokens, seconds)."""
    return StaticBatches(folder_path, variant, threads, streams, fast).translate(sources, beam_size, batch_size)


def pick_examples(sources: list[str], references: list[str], hypotheses: list[str], n: int = 20) -> list[dict]:
    """n examples, good and bad: a fixed random sample, best first by sentence chrF."""
    rng = random.Random(0)
    chosen = rng.sample(range(len(sources)), min(n, len(sources)))
    rows = [
        {"source": sources[i], "reference": references[i], "translation": hypotheses[i],
         "chrf": round(sacrebleu.sentence_chrf(hypotheses[i], [references[i]]).score, 1)}
        for i in chosen
    ]
    return sorted(rows, key=lambda r: -r["chrf"])


def evaluate(
    folder_path: Path, corpus: Path, split: str = "test", variant: str | None = None, beam_size: int = 1,
    batch_size: int = 32, threads: int = 2, limit: int | None = None, streams: int = 1, fast: bool = False,
) -> EvalReport:
    manifest = load_model_folder(folder_path, verify_checksums=False).manifest
    sources, references = read_split(corpus, split, manifest.source_language, manifest.target_languages[0])
    groups = line_groups(corpus, split, len(sources))
    sources, references = sources[:limit], references[:limit]
    hypotheses, tokens, seconds = translate_all(
        folder_path, sources, variant, beam_size, batch_size, threads, streams, fast
    )
    with_placeholders = [i for i, s in enumerate(sources) if placeholders(s)]
    return EvalReport(
        model=manifest.name, variant=variant or manifest.default_variant, split=split, beam_size=beam_size,
        sentences=len(sources),
        bleu=sacrebleu.corpus_bleu(hypotheses, [references]).score,
        chrf=sacrebleu.corpus_chrf(hypotheses, [references]).score,
        placeholder_sentences=len(with_placeholders),
        placeholder_exact=sum(same_placeholders(sources[i], hypotheses[i]) for i in with_placeholders),
        seconds=seconds, target_tokens=tokens,
        examples=pick_examples(sources, references, hypotheses),
        groups=group_scores(groups[: len(sources)], hypotheses, references) if groups else {},
    )
