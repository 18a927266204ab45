"""A self-contained PyTorch checkpoint: config, weights, tokenizer files, languages and provenance.

Everything an export needs travels in one file, so a checkpoint can be exported on another machine.
Training state (optimizer, step) may ride along; the exporter ignores it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from model_export.config import ConfigError, TransformerConfig
from model_export.errors import ExportError
from model_export.model import Transformer

CHECKPOINT_FORMAT = "transformer-mt-checkpoint"


@dataclass
class TokenizerFiles:
    """SentencePiece model(s) and, for Marian-style models, a piece -> id vocabulary."""

    files: dict[str, bytes]  # file name -> content, written as-is into the model folder
    source_model: str  # the SentencePiece model that splits source text
    target_model: str  # the one that joins target pieces back into text
    vocabulary: str | None = None  # a JSON piece -> id map; None: ids are the SentencePiece ids
    append_eos: bool = True  # the source ends with </s>
    target_tokens: dict[str, str] = field(default_factory=dict)  # language -> a token prefixed to the source


@dataclass
class Checkpoint:
    config: TransformerConfig
    state_dict: dict[str, torch.Tensor]
    tokenizer: TokenizerFiles
    source_language: str
    target_languages: list[str]
    provenance: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)

    def build_model(self) -> Transformer:
        model = Transformer(self.config)
        try:
            model.load_state_dict(self.state_dict)
        except RuntimeError as error:
            first = str(error).strip().splitlines()
            raise ExportError(f"weights do not fit the config: {' '.join(first[:2])}") from None
        return model.eval()


def save(checkpoint: Checkpoint, path: Path) -> None:
    tok = checkpoint.tokenizer
    payload = {
        "format": CHECKPOINT_FORMAT,
        "config": checkpoint.config.to_dict(),
        "state_dict": checkpoint.state_dict,
        "tokenizer": {**vars(tok)},
        "source_language": checkpoint.source_language,
        "target_languages": list(checkpoint.target_languages),
        "provenance": checkpoint.provenance,
        "training": checkpoint.training,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(payload, tmp)
    tmp.replace(path)  # atomic: an interrupted save never leaves a half-written checkpoint


def load(path: Path) -> Checkpoint:
    if not path.is_file():
        raise ExportError(f"checkpoint not found: {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unpickling failure means the same thing to the user
        raise ExportError(f"{path} is not a readable checkpoint ({type(error).__name__})") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ExportError(f"{path} is not a {CHECKPOINT_FORMAT} file")
    try:
        config = TransformerConfig.from_dict(payload["config"])
    except (ConfigError, TypeError) as error:
        raise ExportError(f"{path}: bad config: {error}") from None
    return Checkpoint(
        config=config,
        state_dict=payload["state_dict"],
        tokenizer=TokenizerFiles(**payload["tokenizer"]),
        source_language=payload["source_language"],
        target_languages=list(payload["target_languages"]),
        provenance=payload.get("provenance", {}),
        training=payload.get("training", {}),
    )
