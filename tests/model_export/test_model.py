"""The PyTorch model: the cached one-token step reproduces teacher-forced decoding."""

import pytest
import torch

from model_export.model import Transformer, sinusoid_table
from tests.factories import tiny_config

VARIANTS = [
    {"norm_position": "post"},
    {"norm_position": "pre", "activation": "gelu", "sinusoid_layout": "half"},
    {"activation": "swish", "output_bias": True, "share_embeddings": False, "tie_output": False, "tgt_vocab_size": 70},
    {"scale_embeddings": False, "attention_bias": False},
]


def padded_batch(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.randint(4, vocab, (3, 9))  # (B, S)
    mask = torch.ones(3, 9, dtype=torch.bool)  # (B, S)
    mask[1, 6:] = False
    mask[2, 2:] = False
    return src.masked_fill(~mask, 0), mask


@pytest.mark.parametrize("changes", VARIANTS)
def test_decode_step_matches_full_decode(changes: dict) -> None:
    torch.manual_seed(1)
    model = Transformer(tiny_config(60, **changes)).eval()
    if model.generator.logits_bias is not None:
        torch.nn.init.normal_(model.generator.logits_bias)
    src, mask = padded_batch(60)
    tgt = torch.randint(4, model.cfg.tgt_vocab_size, (3, 7))  # (B, T)
    with torch.no_grad():
        memory = model.encode(src, mask)
        full = model.decode(tgt, memory, mask)  # (B, T, V)
        state = model.start_decoding(memory, mask)
        for t in range(tgt.size(1)):
            log_probs, state = model.decode_step(tgt[:, t], torch.full((3,), t), state)
            torch.testing.assert_close(log_probs, full[:, t], atol=1e-5, rtol=0)


def test_padding_does_not_change_a_sentence() -> None:
    torch.manual_seed(2)
    model = Transformer(tiny_config(60)).eval()
    src, mask = padded_batch(60)
    tgt = torch.randint(4, 60, (3, 5))
    with torch.no_grad():
        batched = model(src, mask, tgt)
        alone = model(src[2:, :2], mask[2:, :2], tgt[2:])
    torch.testing.assert_close(batched[2:], alone, atol=1e-5, rtol=0)


def test_sinusoid_layouts() -> None:
    interleaved, half = sinusoid_table(10, 8, "interleaved"), sinusoid_table(10, 8, "half")
    assert interleaved[0].tolist() == [0, 1, 0, 1, 0, 1, 0, 1]
    assert half[0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    torch.testing.assert_close(interleaved[:, 0::2], half[:, :4])
    assert half[3, 0].item() == pytest.approx(torch.sin(torch.tensor(3.0)).item())
