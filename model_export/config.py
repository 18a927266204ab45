"""The architecture as one frozen record: every choice that changes the computation is a field.

Saved with every checkpoint and written into every model folder's manifest. The defaults are the
paper's base model; converters set the fields where their checkpoints differ (see each comment).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

NormPosition = Literal["post", "pre"]
Activation = Literal["relu", "gelu", "swish"]
SinusoidLayout = Literal["interleaved", "half"]

NORM_POSITIONS: tuple[str, ...] = ("post", "pre")
ACTIVATIONS: tuple[str, ...] = ("relu", "gelu", "swish")
SINUSOID_LAYOUTS: tuple[str, ...] = ("interleaved", "half")


class ConfigError(ValueError):
    """A config whose fields contradict each other or the architecture."""


@dataclass(frozen=True)
class TransformerConfig:
    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    # "post": LayerNorm(x + Sublayer(x)), the paper's and Marian's. "pre": x + Sublayer(LayerNorm(x)),
    # with a final LayerNorm after each stack.
    norm_position: NormPosition = "post"
    # Position-wise FFN non-linearity. The paper: relu. Marian/OPUS-MT: swish (x * sigmoid(x)).
    activation: Activation = "relu"
    # "interleaved": PE(pos, 2i) = sin, PE(pos, 2i+1) = cos (the paper). "half": sin in the first
    # d_model/2 dimensions, cos in the second half (Marian, tensor2tensor).
    sinusoid_layout: SinusoidLayout = "interleaved"
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model) (paper 3.4; Marian too)
    share_embeddings: bool = False  # one table for source and target tokens (Marian: shared vocab)
    tie_output: bool = True  # output projection = target embedding matrix (paper 3.4; Marian too)
    output_bias: bool = False  # a learned bias added to the logits (Marian: final_logits_bias)
    attention_bias: bool = True  # biases on the Q, K, V and output projections (paper counts; Marian)
    layer_norm_eps: float = 1e-6  # Marian: 1e-5
    max_positions: int = 512
    dropout: float = 0.1  # on every sub-layer output and on the embedding sums (paper 5.4)
    pad_id: int = 0
    decoder_start_id: int = 2  # first decoder input. Marian: the pad id.
    eos_id: int = 3
    unk_id: int = 1

    def __post_init__(self) -> None:
        for message in _problems(self):
            raise ConfigError(message)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TransformerConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config fields: {', '.join(unknown)}")
        return cls(**data)


# the Python types a field's annotation admits (a float field takes a whole number too; a bool is never a number)
FIELD_TYPES: dict[str, tuple[type, ...]] = {"int": (int,), "float": (int, float), "bool": (bool,)}
TYPE_NOUNS = {"int": "a whole number", "float": "a number", "bool": "true or false"}


def _wrong_types(cfg: TransformerConfig) -> list[str]:
    """Fields whose value is not of the field's type (a checkpoint's d_model 32.0 once ended in a torch TypeError)."""
    found = []
    for f in fields(cfg):
        value, kinds = getattr(cfg, f.name), FIELD_TYPES.get(str(f.type), (str,))
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            found.append(f"{f.name} must be {TYPE_NOUNS.get(str(f.type), 'a string')}, got {value!r}")
    return found


def _problems(cfg: TransformerConfig) -> list[str]:
    """Every contradiction in a config, as messages that say what to change."""
    found = _wrong_types(cfg)
    if found:  # the checks below compare numbers
        return found
    positive = ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "d_ff", "max_positions")
    found += [f"{name} must be positive, got {getattr(cfg, name)}" for name in positive if getattr(cfg, name) < 1]
    layers = ("n_encoder_layers", "n_decoder_layers")
    found += [f"{name} must be at least 1, got {getattr(cfg, name)}" for name in layers if getattr(cfg, name) < 1]
    if cfg.d_model % cfg.n_heads:
        found.append(f"d_model {cfg.d_model} is not divisible by n_heads {cfg.n_heads}")
    if cfg.d_model % 2:
        found.append(f"d_model must be even for sinusoidal positions, got {cfg.d_model}")
    if cfg.norm_position not in NORM_POSITIONS:
        found.append(f"norm_position must be one of {NORM_POSITIONS}, got {cfg.norm_position!r}")
    if cfg.activation not in ACTIVATIONS:
        found.append(f"activation must be one of {ACTIVATIONS}, got {cfg.activation!r}")
    if cfg.sinusoid_layout not in SINUSOID_LAYOUTS:
        found.append(f"sinusoid_layout must be one of {SINUSOID_LAYOUTS}, got {cfg.sinusoid_layout!r}")
    if cfg.share_embeddings and cfg.src_vocab_size != cfg.tgt_vocab_size:
        found.append("share_embeddings needs src_vocab_size == tgt_vocab_size")
    if not 0.0 <= cfg.dropout < 1.0:
        found.append(f"dropout must be in [0, 1), got {cfg.dropout}")
    for name in ("pad_id", "decoder_start_id", "eos_id", "unk_id"):
        token = getattr(cfg, name)
        if not 0 <= token < min(cfg.src_vocab_size, cfg.tgt_vocab_size):
            found.append(f"{name} {token} is outside the vocabularies")
    return found
