"""Writes one of our checkpoints as a CTranslate2 model (its own spec API), so CTranslate2 runs exactly our
weights: CTranslate2's Marian converter cannot take ours (it drops the last vocabulary row as <pad> and
starts decoding from a zero embedding, where our models learn a <s> start). Knows CTranslate2's
Transformer spec; nothing of ONNX or of the server.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import sentencepiece as spm
import torch

from model_export.checkpoint import Checkpoint
from model_export.errors import ExportError
from model_export.export import check_new_folder, staged_folder
from model_export.model import sinusoid_table


def _array(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy()


def set_linear(spec, state: dict[str, torch.Tensor], *names: str) -> None:  # noqa: ANN001
    """One CTranslate2 linear from one or several of ours stacked on the output axis (fused Q/K/V, K/V)."""
    spec.weight = np.concatenate([_array(state[f"{n}.weight"]) for n in names], axis=0)
    if f"{names[0]}.bias" in state:
        spec.bias = np.concatenate([_array(state[f"{n}.bias"]) for n in names], axis=0)


def set_layer_norm(spec, state: dict[str, torch.Tensor], name: str) -> None:  # noqa: ANN001
    spec.gamma, spec.beta = _array(state[f"{name}.weight"]), _array(state[f"{name}.bias"])


def set_attention(spec, state: dict[str, torch.Tensor], name: str, self_attention: bool) -> None:  # noqa: ANN001
    if self_attention:
        set_linear(spec.linear[0], state, f"{name}.w_q", f"{name}.w_k", f"{name}.w_v")
    else:
        set_linear(spec.linear[0], state, f"{name}.w_q")
        set_linear(spec.linear[1], state, f"{name}.w_k", f"{name}.w_v")
    set_linear(spec.linear[-1], state, f"{name}.w_o")


def set_stack(spec, state: dict[str, torch.Tensor], checkpoint: Checkpoint, side: str) -> None:  # noqa: ANN001
    """Embeddings, positions, every layer and (pre-norm) the final norm of the encoder or decoder."""
    cfg = checkpoint.config
    embed = "src_embed" if side == "encoder" else ("src_embed" if cfg.share_embeddings else "tgt_embed")
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _array(state[f"{embed}.lut.weight"])
    spec.scale_embeddings = math.sqrt(cfg.d_model) if cfg.scale_embeddings else False
    spec.position_encodings.encodings = _array(sinusoid_table(cfg.max_positions, cfg.d_model, cfg.sinusoid_layout))
    for i, layer in enumerate(spec.layer):
        name = f"{side}.layers.{i}"
        set_attention(layer.self_attention, state, f"{name}.self_attn", self_attention=True)
        set_layer_norm(layer.self_attention.layer_norm, state, f"{name}.sublayer.0.norm")
        if side == "decoder":
            set_attention(layer.attention, state, f"{name}.cross_attn", self_attention=False)
            set_layer_norm(layer.attention.layer_norm, state, f"{name}.sublayer.1.norm")
        set_linear(layer.ffn.linear_0, state, f"{name}.feed_forward.w_1")
        set_linear(layer.ffn.linear_1, state, f"{name}.feed_forward.w_2")
        set_layer_norm(layer.ffn.layer_norm, state, f"{name}.sublayer.{2 if side == 'decoder' else 1}.norm")
    if cfg.norm_position == "pre":
        set_layer_norm(spec.layer_norm, state, f"{side}.norm")


def vocabulary(checkpoint: Checkpoint) -> list[str]:
    tok = checkpoint.tokenizer
    if tok.vocabulary is not None or tok.source_model != tok.target_model:
        raise ExportError("to-ctranslate2 handles one shared SentencePiece model whose ids are the model's ids")
    model = spm.SentencePieceProcessor(model_proto=tok.files[tok.source_model])
    return [model.id_to_piece(i) for i in range(model.get_piece_size())]


def build_spec(checkpoint: Checkpoint):  # noqa: ANN201 - ctranslate2's TransformerSpec
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = checkpoint.config
    activation = {
        "relu": common_spec.Activation.RELU,
        "gelu": common_spec.Activation.GELU,
        "swish": common_spec.Activation.SWISH,
    }[cfg.activation]
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.n_encoder_layers, cfg.n_decoder_layers),
        cfg.n_heads,
        pre_norm=cfg.norm_position == "pre",
        activation=activation,
    )
    state = checkpoint.state_dict
    set_stack(spec.encoder, state, checkpoint, "encoder")
    set_stack(spec.decoder, state, checkpoint, "decoder")
    spec.decoder.projection.weight = _array(state["generator.proj.weight"])
    if cfg.output_bias:
        spec.decoder.projection.bias = _array(state["generator.logits_bias"])
    pieces = vocabulary(checkpoint)
    if len(pieces) != cfg.src_vocab_size or len(pieces) != cfg.tgt_vocab_size:
        raise ExportError(f"the tokenizer has {len(pieces)} pieces, the model {cfg.src_vocab_size}")
    spec.register_source_vocabulary(pieces)
    spec.register_target_vocabulary(pieces)
    spec.config.unk_token, spec.config.eos_token = pieces[cfg.unk_id], pieces[cfg.eos_id]
    spec.config.bos_token = spec.config.decoder_start_token = pieces[cfg.decoder_start_id]
    spec.config.layer_norm_epsilon = cfg.layer_norm_eps
    return spec


def to_ctranslate2(checkpoint: Checkpoint, out: Path, quantization: str = "float32") -> Path:
    """Writes `out/model.bin` and its vocabularies; quantization: float32, int8, int8_float32, int16. `out` must be
    new or an empty folder; a failed conversion leaves nothing there."""
    check_new_folder(out)
    try:
        from ctranslate2.converters.converter import Converter
    except ImportError:
        raise ExportError("to-ctranslate2 needs the ctranslate2 package (pip install '.[bench]')") from None

    class _Ours(Converter):
        def _load(self):  # noqa: ANN202
            return build_spec(checkpoint)

    # Converter.convert(force=True) would shutil.rmtree an existing output folder, so it writes to a new path
    # beside --out (force=False: it refuses to touch anything there) that is renamed into place when complete
    with staged_folder(out) as staged:
        _Ours().convert(str(staged), quantization=quantization, force=False)
    return out
