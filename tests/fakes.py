"""A fake Runtime for scheduler tests: deterministic next-token log-probabilities that depend only on a
row's own source, position, last token and cached history, so a mixed-up cache row changes the output."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from service.engine.kv_cache import DecoderCache
from service.engine.runtime import DEFAULT_CANDIDATES, Memory, StepOutput

VOCAB, PAD, START, EOS = 12, 0, 1, 2
TOP_K = 10


class FakeRuntime:
    n_layers, n_heads, head_dim = 1, 1, 1

    def __init__(self) -> None:
        self.steps = 0
        self.encoder_calls: list[int] = []  # batch size of each encoder call
        self.step_rows: list[int] = []
        self.log_softmax: list[bool] = []  # what each step was asked: normalise, or only the candidates' order
        self.fail_next_step = False
        self.fail_next_encode = False
        self.encode_seconds = 0.0  # each encoder pass takes at least this long (a race given room to be lost)

    def encode(self, src_ids: np.ndarray, src_mask: np.ndarray) -> Memory:
        if self.fail_next_encode:
            self.fail_next_encode = False
            raise RuntimeError("injected encoder failure")
        self.encoder_calls.append(len(src_ids))
        if self.encode_seconds:
            time.sleep(self.encode_seconds)
        signature = (np.where(src_mask, src_ids, 0) * np.arange(1, src_ids.shape[1] + 1)).sum(1) % 9973  # (b,)
        keys = np.zeros((1, len(src_ids), 1, src_ids.shape[1], 1), np.float32)  # (L, b, H, S, Dh)
        keys[0, :, 0, 0, 0] = signature
        return Memory(keys, np.zeros((1, len(src_ids), 1, src_ids.shape[1], 1), np.float32))

    def new_cache(self) -> DecoderCache:
        return DecoderCache(self.n_layers, self.n_heads, self.head_dim)

    def step(
        self,
        input_ids: np.ndarray,
        cache: DecoderCache,
        full: bool = False,
        candidates: int = DEFAULT_CANDIDATES,
        log_softmax: bool = True,
    ) -> StepOutput:
        self.steps += 1
        self.log_softmax.append(log_softmax)
        self.step_rows.append(len(input_ids))
        if self.fail_next_step:
            self.fail_next_step = False
            raise RuntimeError("injected decoder failure")
        cache.make_room()
        written = np.arange(cache.capacity) < cache.lengths[:, None]  # (B, T) the slots each row has written
        history = np.where(written, cache.self_keys[0][:, 0, :, 0], 0.0).sum(1)  # (B,) unwritten slots hold anything
        group = cache.sentence_rows.shape[1]  # what the step graph reads: each row's sentence from its slot
        signatures = cache.cross_keys[0][cache.row_slots // group, 0, 0, 0]  # (B,)
        log_probs = np.stack(
            [
                row_log_probs(int(sig), int(pos), int(tok), float(h))
                for sig, pos, tok, h in zip(signatures, cache.lengths, input_ids, history, strict=True)
            ]
        )  # (B, V)
        rows = np.arange(len(input_ids))  # (B,)
        for layers in (cache.self_keys, cache.self_values):  # as the step graph does: this step at each row's slot
            layers[0][rows, 0, cache.lengths, 0] = input_ids  # (B,)
        cache.advance(input_ids)
        width = min(candidates, TOP_K)  # what a format 4 graph gives: what was asked for (searches take no more)
        top_log_probs, top_ids = top_k(log_probs.astype(np.float32), width, banned=(PAD, START))
        return StepOutput(top_log_probs, top_ids, log_probs if full else None)


def top_k(log_probs: np.ndarray, k: int, banned: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """What the step graph returns: each row's k best (log-prob, id), best first, banned ids left out."""
    allowed = log_probs.copy()  # (B, V)
    allowed[:, list(banned)] = -np.inf
    ids = np.argsort(-allowed, axis=1, kind="stable")[:, :k]  # (B, k)
    return np.take_along_axis(allowed, ids, axis=1), ids


def row_log_probs(signature: int, position: int, last: int, history: float) -> np.ndarray:
    rng = np.random.default_rng([signature, position, last, int(history)])
    logits = rng.normal(scale=2.0, size=VOCAB)
    logits[EOS] += position * 0.6 - 2.0  # sentences end at varied lengths
    return logits - np.logaddexp.reduce(logits)


class PatientSteps:
    """Mixed into a runtime: its steps last until every encoder pass in flight on `scheduler` is done, as a step of
    many rows outlasts a pass of a few, so that newcomers are ready when a step's finished rows leave (and take
    their places: Scheduler._refill)."""

    scheduler: Any  # the Scheduler whose steps these are, set once it is made

    def step(self, *args: Any, **kwargs: Any) -> StepOutput:
        out = super().step(*args, **kwargs)  # type: ignore[misc] - the runtime's own
        for encoding in list(self.scheduler.encoding):
            encoding.memory.result(timeout=30)
        return out


class PatientRuntime(PatientSteps, FakeRuntime):
    pass
