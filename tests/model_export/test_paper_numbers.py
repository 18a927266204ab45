"""The seeds' numbers: parameter counts at the paper's size and the worked attention example."""

import math

import pytest
import torch

from model_export.config import TransformerConfig
from model_export.model import Transformer, scaled_dot_product_attention
from model_export.params import count_parameters, format_table, layer_total


@pytest.fixture(scope="module")
def paper_model() -> Transformer:
    cfg = TransformerConfig(src_vocab_size=37000, tgt_vocab_size=37000, share_embeddings=True)
    with torch.device("meta"):
        return Transformer(cfg)


def test_paper_size_layer_counts(paper_model: Transformer) -> None:
    counts = count_parameters(paper_model)
    encoder, decoder = counts["encoder layer 0"], counts["decoder layer 0"]
    assert encoder["self-attention"] == 1_050_624
    assert encoder["feed-forward network"] == 2_099_712
    assert encoder["layer norms"] == 2_048
    assert sum(encoder.values()) == 3_152_384
    assert decoder["cross-attention"] == 1_050_624
    assert decoder["layer norms"] == 3_072
    assert sum(decoder.values()) == 4_204_032
    assert layer_total(counts, "encoder") + layer_total(counts, "decoder") == 44_138_496


def test_tied_embeddings_are_counted_once(paper_model: Transformer) -> None:
    model_parts = count_parameters(paper_model)["model"]
    assert model_parts["source embeddings"] == 37000 * 512
    assert "target embeddings" not in model_parts and "output projection" not in model_parts


def test_table_prints_every_part(paper_model: Transformer) -> None:
    table = format_table(paper_model)
    assert "3,152,384" in table and "4,204,032" in table and "44,138,496" in table
    assert f"{44_138_496 + 37000 * 512:,}" in table.splitlines()[-1]


def test_worked_attention_example() -> None:
    """d_k = 1, query 1, keys ln 3 and 0, values 2 and 6: weights 3/4, 1/4, output 3; masked: output 2."""
    q = torch.tensor([[1.0]])  # (1, 1)
    k = torch.tensor([[math.log(3.0)], [0.0]])  # (2, 1)
    v = torch.tensor([[2.0], [6.0]])  # (2, 1)
    output, weights = scaled_dot_product_attention(q, k, v)
    assert weights.tolist()[0] == pytest.approx([0.75, 0.25])
    assert output.item() == pytest.approx(3.0)
    output, weights = scaled_dot_product_attention(q, k, v, mask=torch.tensor([[True, False]]))
    assert weights.tolist()[0] == [1.0, 0.0]
    assert output.item() == pytest.approx(2.0)
