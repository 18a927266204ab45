"""Reference greedy and beam-search decoders in PyTorch, written for clarity, not speed.

They define the expected output of every other decoder (the ONNX loop, the server): same banned
tokens (pad and the decoder start are never generated), same beam semantics as Hugging Face
transformers' `generate` with early_stopping=False. With `allowed` (a vocabulary shortlist's candidate sets), each
sentence's distribution is its model distribution restricted to its own candidates and normalised over them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from model_export.model import Transformer


def banned_tokens(model: Transformer) -> list[int]:
    return sorted({model.cfg.pad_id, model.cfg.decoder_start_id})


def restricted(log_probs: Tensor, allowed: Tensor | None) -> Tensor:
    """(B, V) log-probs -> the same restricted to each row's `allowed` (B, V) ids and normalised over them (-inf
    elsewhere); unchanged without `allowed`."""
    if allowed is None:
        return log_probs
    return torch.log_softmax(log_probs.masked_fill(~allowed, float("-inf")), dim=-1)  # (B, V)


@torch.no_grad()
def greedy(
    model: Transformer, src_ids: Tensor, src_mask: Tensor, max_new_tokens: int, allowed: Tensor | None = None
) -> list[list[int]]:
    """Batched greedy decoding; each row's ids end at its EOS (included) or at max_new_tokens. `allowed`: (B, V)
    each sentence's candidates (a shortlist), or None for the whole vocabulary."""
    cfg = model.cfg
    state = model.start_decoding(model.encode(src_ids, src_mask), src_mask)
    batch = src_ids.size(0)
    device = src_ids.device
    tokens = torch.full((batch,), cfg.decoder_start_id, dtype=torch.long, device=device)  # (B,)
    outputs: list[list[int]] = [[] for _ in range(batch)]
    finished = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
    for step in range(max_new_tokens):
        log_probs, state = model.decode_step(tokens, torch.full((batch,), step, device=device), state)  # (B, V)
        log_probs = restricted(log_probs, allowed)  # (B, V)
        log_probs[:, banned_tokens(model)] = float("-inf")
        tokens = log_probs.argmax(dim=-1)  # (B,)
        for row in torch.nonzero(~finished).flatten().tolist():
            outputs[row].append(int(tokens[row]))
        finished |= tokens == cfg.eos_id
        if finished.all():
            break
    return outputs


@torch.no_grad()
def beam_search(
    model: Transformer, src_ids: Tensor, src_mask: Tensor, beam_size: int, max_new_tokens: int,
    length_penalty: float = 1.0, allowed: Tensor | None = None,
) -> list[list[int]]:
    """Beam search, one sentence at a time; returns each sentence's best hypothesis. `allowed` as in greedy."""
    return [
        _beam_one(
            model, src_ids[i : i + 1], src_mask[i : i + 1], beam_size, max_new_tokens, length_penalty,
            None if allowed is None else allowed[i : i + 1],
        )[0][0]
        for i in range(src_ids.size(0))
    ]


@torch.no_grad()
def _beam_one(
    model: Transformer, src_ids: Tensor, src_mask: Tensor, k: int, max_new_tokens: int, length_penalty: float,
    allowed: Tensor | None = None,
) -> list[tuple[list[int], float]]:
    """All k finished hypotheses of one sentence as (ids, normalised score), best first; `allowed` (1, V) or None."""
    cfg = model.cfg
    state = model.start_decoding(model.encode(src_ids, src_mask), src_mask)
    beams: list[tuple[list[int], float]] = [([], 0.0)]
    finished: list[tuple[list[int], float]] = []
    for step in range(max_new_tokens):
        tokens = torch.tensor([seq[-1] if seq else cfg.decoder_start_id for seq, _ in beams])  # (rows,)
        log_probs, state = model.decode_step(tokens, torch.full((len(beams),), step), state)  # (rows, V)
        log_probs = restricted(log_probs, None if allowed is None else allowed.expand(len(beams), -1))  # (rows, V)
        log_probs[:, banned_tokens(model)] = float("-inf")
        totals = torch.tensor([score for _, score in beams], dtype=torch.float64)[:, None] + log_probs.double()
        values, flat = totals.flatten().topk(min(2 * k, totals.numel()))  # (2k,) best first
        vocab = totals.size(1)
        candidates = [(int(i) // vocab, int(i) % vocab, float(v)) for i, v in zip(flat, values, strict=True)]
        length = step + 1
        for rank, (parent, token, score) in enumerate(candidates):
            if rank < k and (token == cfg.eos_id or length >= max_new_tokens):
                finished.append((beams[parent][0] + [token], score / length**length_penalty))
        finished = sorted(finished, key=lambda h: -h[1])[:k]
        running = [(p, t, s) for p, t, s in candidates if t != cfg.eos_id and length < max_new_tokens][:k]
        if not running:
            break
        beams = [(beams[p][0] + [t], s) for p, t, s in running]
        state = state.select(torch.tensor([p for p, _, _ in running]))
        if len(finished) == k and beams[0][1] / length**length_penalty <= finished[-1][1]:
            break
    return finished
