"""A self-contained PyTorch checkpoint: config, weights, tokenizer files, languages and provenance.

Everything an export needs travels in one file, so a checkpoint can be exported on another machine.
Training state (optimizer, step) may ride along; the exporter ignores it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
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
    rare_letters: str = ""  # letters the training sources held too seldom for the model to read (corpus.tokenizer)


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


def field_of(payload: dict, name: str, kind: type | tuple[type, ...], noun: str, path: Path) -> Any:
    """payload[name], which must be of `kind`: a missing or mistyped field is one ExportError naming it."""
    if name not in payload:
        raise ExportError(f"{path}: missing field {name!r}; the file is not a complete checkpoint")
    value = payload[name]
    if not isinstance(value, kind):
        raise ExportError(f"{path}: field {name!r} must be {noun}, got {type(value).__name__}")
    return value


def tokenizer_of(payload: dict, path: Path) -> TokenizerFiles:
    """The tokenizer field as TokenizerFiles, each of its entries checked for type."""
    tok = field_of(payload, "tokenizer", dict, "a mapping", path)
    known = {f.name for f in fields(TokenizerFiles)}
    unknown = sorted(set(tok) - known)
    if unknown:
        raise ExportError(f"{path}: unknown tokenizer field(s) {', '.join(map(str, unknown))}")
    files = field_of(tok, "files", dict, "a mapping of file names to bytes", path)
    if not all(isinstance(k, str) and isinstance(v, bytes) for k, v in files.items()):
        raise ExportError(f"{path}: tokenizer files must map each file name to its bytes")
    for name in ("source_model", "target_model"):
        field_of(tok, name, str, "a file name", path)
    if tok.get("vocabulary") is not None and not isinstance(tok["vocabulary"], str):
        raise ExportError(f"{path}: tokenizer field 'vocabulary' must be a file name or None")
    if not isinstance(tok.get("append_eos", True), bool):
        raise ExportError(f"{path}: tokenizer field 'append_eos' must be true or false")
    targets = tok.get("target_tokens", {})
    if not isinstance(targets, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in targets.items()):
        raise ExportError(f"{path}: tokenizer field 'target_tokens' must map language codes to tokens")
    return TokenizerFiles(**tok)


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
        config = TransformerConfig.from_dict(field_of(payload, "config", dict, "a mapping", path))
    except (ConfigError, TypeError) as error:
        raise ExportError(f"{path}: bad config: {error}") from None
    state_dict = field_of(payload, "state_dict", dict, "a mapping of names to tensors", path)
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state_dict.items()):
        raise ExportError(f"{path}: field 'state_dict' must map each weight's name to a tensor")
    # a string is a sequence too: list("fr") would be ["f", "r"]
    targets = field_of(payload, "target_languages", (list, tuple), "a list of language codes", path)
    if not targets or not all(isinstance(t, str) and t for t in targets):
        raise ExportError(f"{path}: field 'target_languages' must list at least one language code")
    source = field_of(payload, "source_language", str, "a language code", path)
    if not source:
        raise ExportError(f"{path}: field 'source_language' is empty")
    return Checkpoint(
        config=config,
        state_dict=state_dict,
        tokenizer=tokenizer_of(payload, path),
        source_language=source,
        target_languages=list(targets),
        provenance=field_of(payload, "provenance", dict, "a mapping", path) if "provenance" in payload else {},
        training=field_of(payload, "training", dict, "a mapping", path) if "training" in payload else {},
    )
