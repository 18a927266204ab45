"""Search over next-token log-probabilities, one sentence at a time: greedy and beam search.

Sees numpy rows of log-probabilities and token ids only: no graphs, no batching, no text. Beam
search follows Hugging Face transformers' `generate` (early_stopping=False): 2k candidates per step,
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

    def last_tokens(self) -> np.ndarray:
        return np.array([self.tokens[-1] if self.tokens else self.start_id], dtype=np.int64)  # (1,)

    def advance(self, log_probs: np.ndarray) -> np.ndarray:
        """log_probs (1, V) -> the rows to keep (indexes into this step's rows)."""
        if len(self.tokens) < self.options.min_new_tokens:
            log_probs[:, self.eos_id] = -np.inf
        token = int(log_probs[0].argmax())
        self.tokens.append(token)
        self.log_prob += float(log_probs[0, token])
        self.done = token == self.eos_id or len(self.tokens) >= self.options.max_new_tokens
        return np.zeros(0 if self.done else 1, dtype=np.int64)

    def results(self) -> list[Hypothesis]:
        return [_hypothesis(np.array(self.tokens), self.log_prob, self.options.length_penalty)]


@dataclass
class BeamSearch:
    """k running beams; finished hypotheses kept while they are among the k best (HF semantics)."""

    start_id: int
    eos_id: int
    options: SearchOptions
    sequences: np.ndarray = field(init=False)  # (rows, t) generated ids of the running beams
    scores: np.ndarray = field(init=False)  # (rows,) their summed log-probabilities, best first
    finished: list[Hypothesis] = field(default_factory=list)
    done: bool = False

    def __post_init__(self) -> None:
        self.sequences = np.zeros((1, 0), dtype=np.int64)  # one beam until the first step has run
        self.scores = np.zeros(1, dtype=np.float64)

    @property
    def rows(self) -> int:
        return 0 if self.done else len(self.scores)

    def last_tokens(self) -> np.ndarray:
        if self.sequences.shape[1] == 0:
            return np.full(len(self.scores), self.start_id, dtype=np.int64)  # (rows,)
        return self.sequences[:, -1].copy()  # (rows,)

    def advance(self, log_probs: np.ndarray) -> np.ndarray:
        """log_probs (rows, V) -> the parent row of every beam that runs on (indexes into this step's rows)."""
        k, vocab = self.options.beam_size, log_probs.shape[1]
        if self.sequences.shape[1] < self.options.min_new_tokens:
            log_probs[:, self.eos_id] = -np.inf
        total = (self.scores[:, None] + log_probs).ravel()  # (rows * V,)
        n = min(2 * k, total.size)
        top = np.argpartition(-total, n - 1)[:n]  # (n,) unordered
        top = top[np.argsort(-total[top], kind="stable")]  # (n,) best first
        parents, tokens, cand_scores = top // vocab, top % vocab, total[top]  # (n,) each
        length = self.sequences.shape[1] + 1
        hits = (tokens == self.eos_id) | (length >= self.options.max_new_tokens)  # (n,)
        for i in np.flatnonzero(hits[:k]):
            ended = np.append(self.sequences[parents[i]], tokens[i])  # (length,)
            self._finish(_hypothesis(ended, cand_scores[i], self.options.length_penalty))
        keep = np.flatnonzero(~hits)[:k]  # (<= k,) best running candidates
        if keep.size == 0:
            self.done = True
            return keep
        self.sequences = np.concatenate([self.sequences[parents[keep]], tokens[keep, None]], axis=1)  # (k, t+1)
        self.scores = cand_scores[keep]  # (k,)
        self.done = self._cannot_improve()
        return np.zeros(0, np.int64) if self.done else parents[keep]

    def _finish(self, hypothesis: Hypothesis) -> None:
        self.finished.append(hypothesis)
        self.finished.sort(key=lambda h: -h.score)
        del self.finished[self.options.beam_size :]

    def _cannot_improve(self) -> bool:
        """HF's early_stopping=False heuristic: the best running beam, scored at its current length."""
        if len(self.finished) < self.options.beam_size:
            return False
        best_running = self.scores[0] / self.sequences.shape[1] ** self.options.length_penalty
        return best_running <= self.finished[-1].score

    def results(self) -> list[Hypothesis]:
        return self.finished[: self.options.n_best]


Search = GreedySearch | BeamSearch


def new_search(start_id: int, eos_id: int, options: SearchOptions) -> Search:
    if options.beam_size == 1:
        return GreedySearch(start_id, eos_id, options)
    return BeamSearch(start_id, eos_id, options)
