"""Search over next-token log-probabilities, one sentence at a time: greedy and beam search.

Sees each row's K best candidates (log-probabilities and token ids, best first; the step graph computes
them) and nothing else: no graphs, no batching, no text. The best 2k candidates over all of a sentence's
rows are always among each row's best 2k, so K >= 2k + 1 (one spare for a banned EOS) loses nothing.
Beam search follows Hugging Face transformers' `generate` (early_stopping=False): 2k candidates per step,
a hypothesis is scored sum(log p) / length ** length_penalty (length counts the generated tokens,
EOS included), and a sentence stops once no running beam can beat its k-th finished hypothesis.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class SearchOptions:
    beam_size: int = 1  # 1 is greedy
    max_new_tokens: int = 256  # generated tokens, EOS included; reaching it finishes the hypothesis
    length_penalty: float = 1.0
    n_best: int = 1  # hypotheses returned, best first; at most beam_size
    min_new_tokens: int = 0  # EOS is banned until this many tokens exist (as HF generate; benchmarks force lengths)


@dataclass(frozen=True)
class Hypothesis:
    tokens: tuple[int, ...]  # generated ids, without the decoder start, with EOS if one was generated
    log_prob: float  # sum of the tokens' log-probabilities
    score: float  # log_prob / len(tokens) ** length_penalty


def _hypothesis(tokens: np.ndarray, log_prob: float, length_penalty: float) -> Hypothesis:
    return Hypothesis(tuple(int(t) for t in tokens), float(log_prob), float(log_prob / len(tokens) ** length_penalty))


def candidates(options: SearchOptions) -> int:
    """The candidates per row a search takes from each step: greedy the best two (the second for an EOS not
    allowed yet), beam k the best 2k of all its rows, plus one for an EOS not allowed yet."""
    return 2 if options.beam_size == 1 else 2 * options.beam_size + 1


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
        return [_hypothesis(np.array(self.tokens), self.log_prob, self.options.length_penalty)]


@dataclass
class BeamSearch:
    """k running beams; finished hypotheses kept while they are among the k best (HF semantics)."""

    start_id: int
    eos_id: int
    options: SearchOptions
    sequences: np.ndarray = field(init=False)  # (rows, t) generated ids of the running beams, one per cache row
    scores: np.ndarray = field(init=False)  # (rows,) their summed log-probabilities
    ranked: np.ndarray = field(init=False)  # (rows,) the rows, best beam first (the order HF keeps its beams in)
    finished: list[Hypothesis] = field(default_factory=list)
    done: bool = False

    def __post_init__(self) -> None:
        self.sequences = np.zeros((1, 0), dtype=np.int64)  # one beam until the first step has run
        self.scores = np.zeros(1, dtype=np.float64)
        self.ranked = np.zeros(1, dtype=np.int64)

    @property
    def rows(self) -> int:
        return 0 if self.done else len(self.scores)

    def last_tokens(self) -> np.ndarray:
        if self.sequences.shape[1] == 0:
            return np.full(len(self.scores), self.start_id, dtype=np.int64)  # (rows,)
        return self.sequences[:, -1].copy()  # (rows,)

    def advance(self, top_log_probs: np.ndarray, top_ids: np.ndarray) -> np.ndarray:
        """Each row's candidates (rows, K), best first -> the parent row of every beam that runs on. The
        candidates are ranked with the beams best first (so ties break as in HF); the new beams then take
        rows so that as many as possible stay in their parent's row, which the cache need not copy."""
        k, width = self.options.beam_size, top_ids.shape[1]
        top_log_probs, top_ids = top_log_probs[self.ranked], top_ids[self.ranked]  # (rows, K) best beam first
        total = self.scores[self.ranked, None] + top_log_probs  # (rows, K)
        if self.sequences.shape[1] < self.options.min_new_tokens:
            total = np.where(top_ids == self.eos_id, -np.inf, total)  # (rows, K) EOS not allowed yet
        flat = total.ravel()  # (rows * K,)
        n = min(2 * k, flat.size)
        top = np.argsort(-flat, kind="stable")[:n]  # (n,) best first
        parents, tokens, cand_scores = self.ranked[top // width], top_ids.ravel()[top], flat[top]  # (n,) each
        length = self.sequences.shape[1] + 1
        hits = (tokens == self.eos_id) | (length >= self.options.max_new_tokens)  # (n,)
        for i in np.flatnonzero(hits[:k]):
            ended = np.append(self.sequences[parents[i]], tokens[i])  # (length,)
            self._finish(_hypothesis(ended, cand_scores[i], self.options.length_penalty))
        keep = np.flatnonzero(~hits)[:k]  # (<= k,) best running candidates
        if keep.size == 0:
            self.done = True
            return keep
        rows = keep[stay_in_parent_rows(parents[keep])]  # (k,) the candidate each row takes
        self.sequences = np.concatenate([self.sequences[parents[rows]], tokens[rows, None]], axis=1)  # (k, t+1)
        self.scores = cand_scores[rows]  # (k,)
        self.ranked = np.argsort(rows, kind="stable")  # (k,) rows, best beam first: `keep` is best first
        self.done = self._cannot_improve()
        return np.zeros(0, np.int64) if self.done else parents[rows]

    def _finish(self, hypothesis: Hypothesis) -> None:
        self.finished.append(hypothesis)
        self.finished.sort(key=lambda h: -h.score)
        del self.finished[self.options.beam_size :]

    def _cannot_improve(self) -> bool:
        """HF's early_stopping=False heuristic: the best running beam, scored at its current length."""
        if len(self.finished) < self.options.beam_size:
            return False
        best_running = self.scores[self.ranked[0]] / self.sequences.shape[1] ** self.options.length_penalty
        return best_running <= self.finished[-1].score

    def results(self) -> list[Hypothesis]:
        return self.finished[: self.options.n_best]


def stay_in_parent_rows(parents: np.ndarray) -> np.ndarray:
    """parents (n,): each new beam's parent row -> order (n,): order[r] is the beam that takes row r. A beam takes
    its parent's row when that row is free (the first such beam, best first); the others fill the rest in order.
    Beams sorted best first would move most rows every step (parents [0, 0, 1, 2]: three copies, here one)."""
    n = len(parents)
    order = np.full(n, -1, np.int64)
    others = []
    for beam, parent in enumerate(parents.tolist()):
        if parent < n and order[parent] < 0:
            order[parent] = beam
        else:
            others.append(beam)
    order[order < 0] = others
    return order


Search = GreedySearch | BeamSearch


def new_search(start_id: int, eos_id: int, options: SearchOptions) -> Search:
    if options.beam_size == 1:
        return GreedySearch(start_id, eos_id, options)
    return BeamSearch(start_id, eos_id, options)
