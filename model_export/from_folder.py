"""Rebuilds a checkpoint from a model folder: the fp32 graphs hold every weight, so reading their initializers
back and undoing what `onnx_graphs` wrote (W^T stored, Q/K/V packed on the output axis, Q pre-scaled by
1/sqrt(d_k)) gives the checkpoint's state_dict, exactly. For a folder shipped without its training checkpoint
(the default model: its Marian and CTranslate2 copies are written from a checkpoint). Knows `onnx_graphs`'
initializer names and the manifest; nothing of the runtime. Training state does not come back.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from model_export.checkpoint import Checkpoint, TokenizerFiles
from model_export.config import ConfigError, TransformerConfig
from model_export.errors import ExportError
from model_export.model import Transformer
from service.model import MANIFEST, ModelFolder, ModelFolderError, load_model_folder

VARIANT = "fp32"  # the only variant whose graphs hold the weights as trained (int8 and fp16 have lost precision)
EXPORT_FIELDS = ("exported_at", "exporter")  # the manifest's provenance of the export itself, not of the weights
RESTORE = "restore the complete folder (as `export` wrote it) or export it again from its checkpoint"


@dataclass(frozen=True)
class Graph:
    """One graph's initializers by name, and the file they came from (for messages)."""

    path: Path
    arrays: dict[str, np.ndarray]

    def take(self, name: str) -> np.ndarray:
        if name not in self.arrays:
            raise ExportError(f"{self.path}: no initializer {name!r}, a weight of the config: {RESTORE}")
        return self.arrays[name]


def read_graph(path: Path) -> Graph:
    try:
        model = onnx.load(str(path))
    except Exception as error:  # noqa: BLE001 - any parse failure means the same thing to the user
        raise ExportError(f"{path}: not a readable ONNX graph ({type(error).__name__}): {RESTORE}") from None
    return Graph(path, {init.name: numpy_helper.to_array(init) for init in model.graph.initializer})


def _tensor(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(array, dtype=np.float32, order="C"))  # a copy: onnx's arrays are read-only


def _unscaled(array: np.ndarray, scale: float) -> np.ndarray:
    """Undoes the exporter's 1/sqrt(d_k) on Q (in float64, rounded once to float32)."""
    if scale == 1.0:
        return array
    return (array.astype(np.float64) / scale).astype(np.float32)


# -- one function per thing onnx_graphs writes: its initializers -> our state_dict entries ------------------------


def linear(graph: Graph, name: str, ours: str, bias: bool, scale: float = 1.0) -> dict[str, torch.Tensor]:
    """`{name}.weight_t` (in, out) and `{name}.bias` -> `{ours}.weight` (out, in) and `{ours}.bias`."""
    state = {f"{ours}.weight": _tensor(_unscaled(graph.take(f"{name}.weight_t").T, scale))}
    if bias:
        state[f"{ours}.bias"] = _tensor(_unscaled(graph.take(f"{name}.bias"), scale))
    return state


def packed(graph: Graph, name: str, parts: str, ours: str, bias: bool, head_dim: int) -> dict[str, torch.Tensor]:
    """`{name}.w_{parts}_t` (D, n*D) and `{name}.b_{parts}` (n*D), Q pre-scaled -> `{ours}.w_q/w_k/w_v`."""
    scale = 1.0 / math.sqrt(head_dim)
    weights = np.split(graph.take(f"{name}.w_{parts}_t").T, len(parts), axis=0)  # n x (D, D)
    biases = np.split(graph.take(f"{name}.b_{parts}"), len(parts)) if bias else [None] * len(parts)
    state = {}
    for part, weight, b in zip(parts, weights, biases, strict=True):
        factor = scale if part == "q" else 1.0
        state[f"{ours}.w_{part}.weight"] = _tensor(_unscaled(weight, factor))
        if b is not None:
            state[f"{ours}.w_{part}.bias"] = _tensor(_unscaled(b, factor))
    return state


def layer_norm(graph: Graph, name: str, ours: str) -> dict[str, torch.Tensor]:
    return {f"{ours}.{p}": _tensor(graph.take(f"{name}.{p}")) for p in ("weight", "bias")}


def sublayer_norms(graph: Graph, name: str, ours: str, count: int) -> dict[str, torch.Tensor]:
    """A layer's `{name}.{k}.norm` -> `{ours}.sublayer.{k}.norm`, k < count."""
    return {
        k: v
        for s in range(count)
        for k, v in layer_norm(graph, f"{name}.{s}.norm", f"{ours}.sublayer.{s}.norm").items()
    }


def feed_forward(graph: Graph, name: str, ours: str) -> dict[str, torch.Tensor]:
    return {**linear(graph, f"{name}.w_1", f"{ours}.w_1", True), **linear(graph, f"{name}.w_2", f"{ours}.w_2", True)}


def encoder_layer(encoder: Graph, i: int, cfg: TransformerConfig) -> dict[str, torch.Tensor]:
    name, ours, bias = f"encoder.{i}", f"encoder.layers.{i}", cfg.attention_bias
    return {
        **packed(encoder, name, "qkv", f"{ours}.self_attn", bias, cfg.head_dim),
        **linear(encoder, f"{name}.w_o", f"{ours}.self_attn.w_o", bias),
        **feed_forward(encoder, name, f"{ours}.feed_forward"),
        **sublayer_norms(encoder, name, ours, 2),
    }


def decoder_layer(encoder: Graph, step: Graph, i: int, cfg: TransformerConfig) -> dict[str, torch.Tensor]:
    """Self-attention, cross Q and both output projections from the step graph; cross K/V from the encoder graph,
    which computes them once per sentence."""
    name, ours, bias = f"decoder.{i}", f"decoder.layers.{i}", cfg.attention_bias
    scale = 1.0 / math.sqrt(cfg.head_dim)
    return {
        **packed(step, f"{name}.self", "qkv", f"{ours}.self_attn", bias, cfg.head_dim),
        **linear(step, f"{name}.self.w_o", f"{ours}.self_attn.w_o", bias),
        **linear(step, f"{name}.cross.w_q", f"{ours}.cross_attn.w_q", bias, scale),
        **packed(encoder, f"{name}.cross", "kv", f"{ours}.cross_attn", bias, cfg.head_dim),
        **linear(step, f"{name}.cross.w_o", f"{ours}.cross_attn.w_o", bias),
        **feed_forward(step, name, f"{ours}.feed_forward"),
        **sublayer_norms(step, name, ours, 3),
    }


def embeddings_and_output(encoder: Graph, step: Graph, cfg: TransformerConfig) -> dict[str, torch.Tensor]:
    """The token tables, the vocabulary projection and its bias, tied ones as one tensor (as a trained model's
    state_dict has them) after checking that the graphs hold the same values."""
    src = _tensor(encoder.take("src_embed.lut"))
    tgt = _tied(src, step, "tgt_embed.lut") if cfg.share_embeddings else _tensor(step.take("tgt_embed.lut"))
    projection = step.take("generator.weight_t").T  # (V, D)
    proj = _tied(tgt, step, "generator.weight_t", projection) if cfg.tie_output else _tensor(projection)
    state = {"src_embed.lut.weight": src, "tgt_embed.lut.weight": tgt, "generator.proj.weight": proj}
    if cfg.output_bias:
        state["generator.logits_bias"] = _tensor(step.take("generator.bias"))
    return state


def _tied(shared: torch.Tensor, graph: Graph, name: str, array: np.ndarray | None = None) -> torch.Tensor:
    stored = graph.take(name) if array is None else array
    if stored.shape != tuple(shared.shape) or not np.array_equal(stored, shared.numpy()):
        raise ExportError(f"{graph.path}: {name} differs from the table the config ties it to: {RESTORE}")
    return shared


def state_dict_from_graphs(encoder: Graph, step: Graph, cfg: TransformerConfig) -> dict[str, torch.Tensor]:
    state = embeddings_and_output(encoder, step, cfg)
    for i in range(cfg.n_encoder_layers):
        state.update(encoder_layer(encoder, i, cfg))
    for i in range(cfg.n_decoder_layers):
        state.update(decoder_layer(encoder, step, i, cfg))
    if cfg.norm_position == "pre":
        state.update(layer_norm(encoder, "encoder.norm", "encoder.norm"))
        state.update(layer_norm(step, "decoder.norm", "decoder.norm"))
    check_shapes(state, cfg, encoder.path.parent)
    return state


def check_shapes(state: dict[str, torch.Tensor], cfg: TransformerConfig, folder: Path) -> None:
    """Every weight the config's model has, of its shape, and nothing else."""
    with torch.device("meta"):
        expected = {name: tuple(t.shape) for name, t in Transformer(cfg).state_dict().items()}
    for name, shape in expected.items():
        if name not in state:
            raise ExportError(f"{folder}: the graphs hold no {name}, a weight of the manifest's config: {RESTORE}")
        if tuple(state[name].shape) != shape:
            got = tuple(state[name].shape)
            raise ExportError(f"{folder}: {name} has shape {got} in the graphs, the manifest's config needs {shape}")
    extra = sorted(set(state) - set(expected))
    if extra:
        raise ExportError(f"{folder}: weights the manifest's config has no place for: {', '.join(extra)}")


# -- the folder: its manifest (read by the server's reader), tokenizer, provenance ------------------------------------


def fp32_graph_paths(loaded: ModelFolder) -> tuple[Path, Path]:
    """The fp32 variant's encoder and step graph (the reader has checked that every listed file is present)."""
    variant = loaded.manifest.variants.get(VARIANT)
    if variant is None:
        raise ExportError(
            f"{loaded.path}: no {VARIANT} variant: the weights are rebuilt from the fp32 graphs (int8 and fp16 ones "
            f"have lost precision): {RESTORE}"
        )
    return loaded.path / variant.encoder.file, loaded.path / variant.decoder_step.file


def tokenizer_files(loaded: ModelFolder) -> TokenizerFiles:
    tokenizer = loaded.manifest.tokenizer
    names = [tokenizer.source_model, tokenizer.target_model, tokenizer.vocabulary or ""]
    files = {name: (loaded.path / name).read_bytes() for name in dict.fromkeys(names) if name}
    return TokenizerFiles(
        files=files,
        source_model=tokenizer.source_model,
        target_model=tokenizer.target_model,
        vocabulary=tokenizer.vocabulary,
        append_eos=tokenizer.append_eos,
        target_tokens=dict(tokenizer.target_tokens),
        rare_letters=tokenizer.rare_letters,
    )


def provenance(loaded: ModelFolder) -> dict[str, Any]:
    """The manifest's own provenance (training options, averaged checkpoints, licence...), the export's record
    moved under `rebuilt_from`, which says which folder the weights came from."""
    manifest = loaded.manifest
    given = manifest.provenance
    rebuilt = {
        "folder": manifest.name,
        "version": manifest.version,
        "path": str(loaded.path),
        "format_version": manifest.format_version,
        **{k: given[k] for k in EXPORT_FIELDS if k in given},
    }
    kept = {k: v for k, v in given.items() if k not in EXPORT_FIELDS}
    return {"name": manifest.name, **kept, "rebuilt_from": rebuilt}


def checkpoint_from_folder(folder: Path) -> Checkpoint:
    """A model folder's fp32 graphs back into the checkpoint they were exported from (its weights, config,
    tokenizer and languages; no training state)."""
    try:
        loaded = load_model_folder(folder)  # the manifest's format and schema, every file's size and checksum
    except ModelFolderError as error:
        raise ExportError(str(error)) from None
    encoder_path, step_path = fp32_graph_paths(loaded)
    try:
        cfg = TransformerConfig.from_dict(loaded.manifest.config.model_dump())
    except (ConfigError, TypeError) as error:
        raise ExportError(f"{folder / MANIFEST}: bad config: {error}") from None
    state = state_dict_from_graphs(read_graph(encoder_path), read_graph(step_path), cfg)
    return Checkpoint(
        config=cfg,
        state_dict=state,
        tokenizer=tokenizer_files(loaded),
        source_language=loaded.manifest.source_language,
        target_languages=list(loaded.manifest.target_languages),
        provenance=provenance(loaded),
    )
