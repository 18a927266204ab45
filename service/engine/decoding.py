"""Search over next-token log-probabilities, one sentence at a time: greedy and beam search.

Sees each row's K best candidates (log-probabilities and token ids, best first; the step graph computes
them) and nothing else: no graphs, no batching, no text. The best 2k candidates over all of a sentence's
rows are always among each row's best 2k, so K >= 2k + 1 (one spare for a banned EOS) loses nothing.
Beam search follows Hugging Face transformers' `generate` (early_stopping=False): 2k candidates per step,
a hypothesis is scored sum(log p) / length ** length_penalty (length counts the generated tokens,
EOS included), and a sentence stops once no running beam can beat its k-th finished hypothesis.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np


@dataclass(frozen=True)
class SearchOptions:
    beam_size: int = 1  # 1 is greedy
    max_new_tokens: int = 256  # generated tokens, EOS included; reaching it finishes the hypothesis
    length_penalty: float = 1.0
    n_best: int = 1  # hypotheses returned, best first; at most beam_size
    min_new_tokens: int = 0  # EOS is banned until this many tokens exist (as HF generate; benchmarks force lengths)
    scored: bool = True  # the hypotheses' log-probabilities are read; a greedy search's are NaN without


BEAM_SIZE_LIMIT = 16  # the most beams one search may take: the bound of MT_MAX_BEAM_SIZE and of evaluate's --beam-size
MAX_OUTPUT_TOKENS = 512  # MT_MAX_OUTPUT_TOKENS' default: the most tokens a sentence's translation may take
MAX_OUTPUT_RATIO = 2.0  # MT_MAX_OUTPUT_RATIO's default: a translation's tokens at most ratio x the source's + 10


def output_cap(src_len: int, most: int, ratio: float) -> int:
    """The most tokens a sentence of `src_len` tokens may generate: `ratio` x src_len + 10, never past `most` (the
    server's MT_MAX_OUTPUT_RATIO and MT_MAX_OUTPUT_TOKENS; the engine measured beside it caps the same way)."""
    return min(most, int(ratio * src_len) + 10)


@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]  # generated ids, without the decoder start, with EOS if one was generated
    log_prob: float  # sum of the tokens' log-probabilities
    score: float  # log_prob / len(tokens) ** length_penalty (NaN for a greedy search not `scored`)


def _hypothesis(tokens: tuple[int, ...], log_prob: float, length_penalty: float) -> Hypothesis:
    return Hypothesis(tokens, log_prob, log_prob / len(tokens) ** length_penalty)


def needs_log_probs(options: SearchOptions) -> bool:
    """Whether a search reads its candidates' log-probabilities, not only their order: beams rank by them, a greedy
    search sums them only when `scored`. A step that no search needs them of may skip the log-softmax (its
    candidates' values are then logits)."""
    return options.beam_size > 1 or options.scored


def candidates(options: SearchOptions) -> int:
    """The candidates per row a search takes from each step: greedy the best two (the second for an EOS not
    allowed yet), beam k the best 2k of all its rows, plus one for an EOS not allowed yet."""
    return 2 if options.beam_size == 1 else 2 * options.beam_size + 1


def rows_per_sentence(candidates: int) -> int:
    """`candidates` read backwards: the most rows a sentence's search holds, from the candidates per row it takes
    from a step (greedy 2: one row; beam k 2k + 1: k rows). The runtime's choice of step graph looks ahead with it."""
    return max(1, candidates // 2)


@dataclass
class GreedySearch:
    """The most probable token at every step (beam size 1)."""

    start_id: int
    eos_id: int
    options: SearchOptions
    tokens: list[int] = field(default_factory=list)
    log_prob: float = 0.0
    done: bool = False

    @property
    def rows(self) -> int:
        return 0 if self.done else 1

    @property
    def last_token(self) -> int:
        return self.tokens[-1] if self.tokens else self.start_id

    def last_tokens(self) -> np.ndarray:
        return np.array([self.last_token], dtype=np.int64)  # (1,)

    def advance(self, top_log_probs: np.ndarray, top_ids: np.ndarray) -> np.ndarray:
        """The row's candidates (1, K), best first -> the rows to keep (indexes into this step's rows)."""
        self.take(top_ids[0, :2].tolist(), top_log_probs[0, :2].tolist())
        return np.zeros(0 if self.done else 1, dtype=np.int64)

    def take(self, ids: list[int], log_probs: list[float]) -> bool:
        """The row's two best candidates, as Python numbers -> whether the search is done. (`advance_all` hands a
        batch of greedy rows their candidates this way, in one conversion for all of them.)"""
        rank = 1 if len(self.tokens) < self.options.min_new_tokens and ids[0] == self.eos_id else 0  # EOS not yet
        self.tokens.append(ids[rank])
        self.log_prob += log_probs[rank]
        self.done = ids[rank] == self.eos_id or len(self.tokens) >= self.options.max_new_tokens
        return self.done

    def results(self) -> list[Hypothesis]:
        log_prob = self.log_prob if self.options.scored else math.nan  # its steps may have given it logits
        return [_hypothesis(tuple(self.tokens), log_prob, self.options.length_penalty)]


@dataclass
class BeamSearch:
    """k running beams; finished hypotheses kept while they are among the k best (HF semantics). Its state is
    Python lists, not arrays: a beam step handles 2k + 1 candidates per row, and for so few numpy's fixed cost per
    call dominated (4 beams: 33 -> 16 us per step alone, and the step's graph leaves the caches cold)."""

    start_id: int
    eos_id: int
    options: SearchOptions
    sequences: list[tuple[int, ...]] = field(init=False)  # generated ids of the running beams, one per cache row
    scores: list[float] = field(init=False)  # their summed log-probabilities, one per row
    ranked: list[int] = field(init=False)  # the rows, best beam first (the order HF keeps its beams in)
    finished: list[Hypothesis] = field(default_factory=list)
    done: bool = False

    def __post_init__(self) -> None:
        self.sequences, self.scores, self.ranked = [()], [0.0], [0]  # one beam until the first step has run

    @property
    def rows(self) -> int:
        return 0 if self.done else len(self.scores)

    def last_tokens(self) -> np.ndarray:
        return np.array([seq[-1] if seq else self.start_id for seq in self.sequences], dtype=np.int64)  # (rows,)

    def advance(self, top_log_probs: np.ndarray, top_ids: np.ndarray) -> np.ndarray:
        """Each row's candidates (rows, K), best first -> the parent row of every beam that runs on. The
        candidates are ranked with the beams best first (so ties break as in HF: a stable sort); the new beams then
        take rows so that as many as possible stay in their parent's row, which the cache need not copy."""
        k, eos, options = self.options.beam_size, self.eos_id, self.options
        log_probs, ids = top_log_probs.tolist(), top_ids.tolist()  # (rows, K) each
        length = len(self.sequences[0]) + 1  # generated tokens with this step's
        no_eos = length <= options.min_new_tokens  # EOS not allowed yet
        scored: list[tuple[float, int, int]] = []  # (total score, parent row, token), the beams best first
        for parent in self.ranked:
            base, row = self.scores[parent], zip(log_probs[parent], ids[parent], strict=True)
            if no_eos and eos in ids[parent]:  # (the check costs less than a conditional per candidate)
                scored += [(-math.inf if t == eos else base + p, parent, t) for p, t in row]
            else:
                scored += [(base + p, parent, t) for p, t in row]
        running = []  # the best k candidates that do not end their hypothesis
        for i, (score, parent, token) in enumerate(sorted(scored, key=itemgetter(0), reverse=True)[: 2 * k]):
            if token == eos or length >= options.max_new_tokens:
                if i < k:
                    self._finish(_hypothesis(self.sequences[parent] + (token,), score, options.length_penalty))
            elif len(running) < k:
                running.append((score, parent, token))
        if not running:
            self.done = True
            return np.zeros(0, np.int64)
        order = stay_in_parent_rows([parent for _, parent, _ in running])  # order[r]: the beam that takes row r
        beams = [running[b] for b in order]  # (k,) by row
        self.sequences = [self.sequences[parent] + (token,) for _, parent, token in beams]
        self.scores = [score for score, _, _ in beams]
        self.ranked = sorted(range(len(order)), key=order.__getitem__)  # the rows, best beam first (as `running`)
        self.done = self._cannot_improve()
        return np.zeros(0, np.int64) if self.done else np.array([parent for _, parent, _ in beams], np.int64)

    def _finish(self, hypothesis: Hypothesis) -> None:
        self.finished.append(hypothesis)
        self.finished.sort(key=lambda h: -h.score)
        del self.finished[self.options.beam_size :]

    def _cannot_improve(self) -> bool:
        """HF's early_stopping=False heuristic: the best running beam, scored at its current length."""
        if len(self.finished) < self.options.beam_size:
            return False
        best_running = self.scores[self.ranked[0]] / len(self.sequences[0]) ** self.options.length_penalty
        return best_running <= self.finished[-1].score

    def results(self) -> list[Hypothesis]:
        return self.finished[: self.options.n_best]


def stay_in_parent_rows(parents: list[int]) -> list[int]:
    """parents: each new beam's parent row -> order: order[r] is the beam that takes row r. A beam takes its
    parent's row when that row is free (the first such beam, best first); the others fill the rest in order.
    Beams sorted best first would move most rows every step (parents [0, 0, 1, 2]: three copies, here one)."""
    n = len(parents)
    order, others = [-1] * n, []
    for beam, parent in enumerate(parents):
        if parent < n and order[parent] < 0:
            order[parent] = beam
        else:
            others.append(beam)
    rest = iter(others)
    return [beam if beam >= 0 else next(rest) for beam in order]


Search = GreedySearch | BeamSearch


def new_search(start_id: int, eos_id: int, options: SearchOptions) -> Search:
    if options.beam_size == 1:
        return GreedySearch(start_id, eos_id, options)
    return BeamSearch(start_id, eos_id, options)
