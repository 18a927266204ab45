import pytest

from model_export.config import ConfigError, TransformerConfig


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"d_model": 30, "n_heads": 4}, "not divisible by n_heads"),
        ({"activation": "tanh"}, "activation must be one of"),
        ({"norm_position": "middle"}, "norm_position must be one of"),
        ({"sinusoid_layout": "spiral"}, "sinusoid_layout must be one of"),
        ({"share_embeddings": True, "tgt_vocab_size": 99}, "share_embeddings needs"),
        ({"eos_id": 100}, "eos_id 100 is outside the vocabularies"),
        ({"n_decoder_layers": 0}, "n_decoder_layers must be at least 1"),
        ({"dropout": 1.0}, "dropout must be in"),
    ],
)
def test_contradictions_are_refused(changes: dict, message: str) -> None:
    fields = {"src_vocab_size": 100, "tgt_vocab_size": 100, **changes}
    with pytest.raises(ConfigError, match=message):
        TransformerConfig(**fields)


def test_round_trip_and_unknown_fields() -> None:
    cfg = TransformerConfig(src_vocab_size=100, tgt_vocab_size=120, activation="swish", sinusoid_layout="half")
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="unknown config fields: colour"):
        TransformerConfig.from_dict({**cfg.to_dict(), "colour": "blue"})
