"""Hugging Face Marian (OPUS-MT) checkpoint folders <-> our Checkpoint: config fields, every weight, tokenizer files.

Knows the Marian layout that transformers 5.23 reads (config.json, weights, source/target.spm, vocab.json,
tokenizer_config.json) and which of our configs it can express; knows nothing of ONNX (export_folder does that).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from model_export import checkpoint as ckpt
from model_export.checkpoint import Checkpoint, TokenizerFiles
from model_export.config import ConfigError, TransformerConfig
from model_export.errors import ExportError
from model_export.export import check_new_folder, check_tokenizer, export_folder, staged_folder
from model_export.model import sinusoid_table

CONFIG, GENERATION_CONFIG, TOKENIZER_CONFIG = "config.json", "generation_config.json", "tokenizer_config.json"
SAFETENSORS, SAFETENSORS_INDEX, TORCH_WEIGHTS = "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"
SOURCE_SPM, TARGET_SPM, VOCAB = "source.spm", "target.spm", "vocab.json"

# transformers' MarianEncoderLayer/MarianDecoderLayer build nn.LayerNorm(d_model): eps is the default, 1e-5.
MARIAN_LAYER_NORM_EPS = 1e-5
# Marian's activation names -> ours. transformers' ACT2FN: "swish" and "silu" are both x * sigmoid(x); "gelu" is
# the exact erf GELU (like F.gelu); "gelu_new", "gelu_fast", "tanh"... have no counterpart here.
ACTIVATIONS_FROM_MARIAN = {"swish": "swish", "silu": "swish", "relu": "relu", "gelu": "gelu"}
ACTIVATIONS_TO_MARIAN = {"swish": "swish", "relu": "relu", "gelu": "gelu"}
# Fields of older (Bart-era) Marian configs that transformers' Marian ignores: a checkpoint that sets one
# to another value was trained for an architecture the Marian layout does not compute.
LEGACY_FIELDS = {
    "normalize_before": False, "add_final_layer_norm": False, "normalize_embedding": False,
    "static_position_embeddings": True, "add_bias_logits": False,
}
# Our fields that the Marian layout can only hold as zero weights; to-marian notes them so that a round trip
# gives the same config. Ignored where the weights are no longer zero.
ROUND_TRIP_KEY = "transformer_mt"
ATTENTION_BIAS = re.compile(r"\.(self_attn|encoder_attn)\.(q|k|v|out)_proj\.bias$")
LANGUAGE_TOKEN = re.compile(r">>([^<>\s]+)<<")
ISO_639_3_TO_1 = {
    "ara": "ar", "cat": "ca", "ces": "cs", "dan": "da", "deu": "de", "ell": "el", "eng": "en", "fin": "fi",
    "fra": "fr", "glg": "gl", "hun": "hu", "ita": "it", "jpn": "ja", "kor": "ko", "nld": "nl", "nor": "no",
    "pol": "pl", "por": "pt", "ron": "ro", "rus": "ru", "spa": "es", "swe": "sv", "tur": "tr", "ukr": "uk",
    "zho": "zh",
}
ISO_639_1_TO_3 = {short: long for long, short in ISO_639_3_TO_1.items()}


# -- one weight pair per tensor: (our name, Marian's name, shape), one function per submodule ---------------


@dataclass(frozen=True)
class Pair:
    ours: str
    marian: str
    shape: tuple[int, ...]
    attention_bias: bool = False  # a Q/K/V/O bias: absent from ours when cfg.attention_bias is false


def linear_pairs(ours: str, marian: str, n_out: int, n_in: int) -> list[Pair]:
    return [Pair(f"{ours}.weight", f"{marian}.weight", (n_out, n_in)), Pair(f"{ours}.bias", f"{marian}.bias", (n_out,))]


def attention_pairs(ours: str, marian: str, cfg: TransformerConfig) -> list[Pair]:
    """w_q/w_k/w_v/w_o <- q_proj/k_proj/v_proj/out_proj. Marian scales q.k by head_dim**-0.5 like we do."""
    pairs = []
    for mine, theirs in (("w_q", "q_proj"), ("w_k", "k_proj"), ("w_v", "v_proj"), ("w_o", "out_proj")):
        weight, bias = linear_pairs(f"{ours}.{mine}", f"{marian}.{theirs}", cfg.d_model, cfg.d_model)
        pairs += [weight, Pair(bias.ours, bias.marian, bias.shape, attention_bias=True)]
    return pairs


def feed_forward_pairs(ours: str, marian: str, cfg: TransformerConfig) -> list[Pair]:
    """w_1, w_2 <- fc1, fc2."""
    return linear_pairs(f"{ours}.w_1", f"{marian}.fc1", cfg.d_ff, cfg.d_model) + linear_pairs(
        f"{ours}.w_2", f"{marian}.fc2", cfg.d_model, cfg.d_ff
    )


def layer_norm_pairs(ours: str, marian: str, cfg: TransformerConfig) -> list[Pair]:
    return [Pair(f"{ours}.{name}", f"{marian}.{name}", (cfg.d_model,)) for name in ("weight", "bias")]


def encoder_layer_pairs(i: int, cfg: TransformerConfig) -> list[Pair]:
    """Post-norm: sublayer 0 = self-attention + self_attn_layer_norm, sublayer 1 = FFN + final_layer_norm."""
    ours, marian = f"encoder.layers.{i}", f"model.encoder.layers.{i}"
    return (
        attention_pairs(f"{ours}.self_attn", f"{marian}.self_attn", cfg)
        + layer_norm_pairs(f"{ours}.sublayer.0.norm", f"{marian}.self_attn_layer_norm", cfg)
        + feed_forward_pairs(f"{ours}.feed_forward", marian, cfg)
        + layer_norm_pairs(f"{ours}.sublayer.1.norm", f"{marian}.final_layer_norm", cfg)
    )


def decoder_layer_pairs(i: int, cfg: TransformerConfig) -> list[Pair]:
    """Post-norm: self-attention, cross-attention (encoder_attn), FFN, each followed by its layer norm."""
    ours, marian = f"decoder.layers.{i}", f"model.decoder.layers.{i}"
    return (
        attention_pairs(f"{ours}.self_attn", f"{marian}.self_attn", cfg)
        + layer_norm_pairs(f"{ours}.sublayer.0.norm", f"{marian}.self_attn_layer_norm", cfg)
        + attention_pairs(f"{ours}.cross_attn", f"{marian}.encoder_attn", cfg)
        + layer_norm_pairs(f"{ours}.sublayer.1.norm", f"{marian}.encoder_attn_layer_norm", cfg)
        + feed_forward_pairs(f"{ours}.feed_forward", marian, cfg)
        + layer_norm_pairs(f"{ours}.sublayer.2.norm", f"{marian}.final_layer_norm", cfg)
    )


def layer_pairs(cfg: TransformerConfig) -> list[Pair]:
    """Every weight of both stacks. Marian has no final encoder/decoder layer norm (post-norm), nor do we."""
    encoder = [p for i in range(cfg.n_encoder_layers) for p in encoder_layer_pairs(i, cfg)]
    return encoder + [p for i in range(cfg.n_decoder_layers) for p in decoder_layer_pairs(i, cfg)]


def checked(tensor: Tensor | None, name: str, shape: tuple[int, ...], where: str) -> Tensor:
    """The shape assertion of every weight import: a missing or misshapen tensor is a one-line ExportError."""
    if tensor is None:
        raise ExportError(f"{where}: missing weight {name}")
    if tuple(tensor.shape) != shape:
        raise ExportError(f"{where}: {name} has shape {tuple(tensor.shape)}, the config needs {shape}")
    return tensor


# -- reading a Marian folder ------------------------------------------------------------------------------


@dataclass
class MarianFolder:
    path: Path
    config: dict[str, Any]
    weights: dict[str, Tensor]
    weights_file: str
    files: dict[str, bytes]  # source.spm, target.spm, vocab.json as they are on disk
    vocab: dict[str, int]
    tokenizer_config: dict[str, Any] = field(default_factory=dict)


def read_json(path: Path) -> Any:
    if not path.is_file():
        raise ExportError(f"{path}: missing")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ExportError(f"{path}: not valid JSON ({error})") from None


def read_weights(folder: Path) -> tuple[dict[str, Tensor], str]:
    """model.safetensors (or its shards), else pytorch_model.bin; never anything that runs code."""
    try:
        if (folder / SAFETENSORS).is_file():
            return load_file(folder / SAFETENSORS), SAFETENSORS
        if (folder / SAFETENSORS_INDEX).is_file():
            shards = sorted(set(read_json(folder / SAFETENSORS_INDEX).get("weight_map", {}).values()))
            return {k: v for shard in shards for k, v in load_file(folder / shard).items()}, SAFETENSORS_INDEX
        if (folder / TORCH_WEIGHTS).is_file():
            weights = torch.load(folder / TORCH_WEIGHTS, map_location="cpu", weights_only=True)
            if not isinstance(weights, dict) or not all(isinstance(v, Tensor) for v in weights.values()):
                raise ExportError(f"{folder / TORCH_WEIGHTS}: not a state dict of tensors")
            return weights, TORCH_WEIGHTS
    except ExportError:
        raise
    except Exception as error:  # noqa: BLE001 - any failure to read the tensors means the same to the user
        raise ExportError(f"{folder}: unreadable weights ({type(error).__name__}: {error})".splitlines()[0]) from None
    raise ExportError(f"{folder}: no weights ({SAFETENSORS} or {TORCH_WEIGHTS})")


def read_vocab(path: Path) -> dict[str, int]:
    vocab = read_json(path)
    if not isinstance(vocab, dict) or not all(type(v) is int and v >= 0 for v in vocab.values()):
        raise ExportError(f"{path}: must be a JSON object mapping each piece to an id >= 0")
    return vocab


def read_marian_folder(folder: Path) -> MarianFolder:
    if not folder.is_dir():
        raise ExportError(f"Marian checkpoint folder not found: {folder}")
    config = read_json(folder / CONFIG)
    if not isinstance(config, dict) or config.get("model_type") != "marian":
        found = config.get("model_type") if isinstance(config, dict) else None
        raise ExportError(f"{folder / CONFIG}: model_type is {found!r}, not 'marian'")
    tokenizer_config = read_json(folder / TOKENIZER_CONFIG) if (folder / TOKENIZER_CONFIG).is_file() else {}
    if not isinstance(tokenizer_config, dict):
        raise ExportError(f"{folder / TOKENIZER_CONFIG}: not a JSON object")
    if tokenizer_config.get("separate_vocabs") or (folder / "target_vocab.json").is_file():
        raise ExportError(f"{folder}: separate source/target vocabularies (target_vocab.json) are not supported")
    for name in (SOURCE_SPM, TARGET_SPM):
        if not (folder / name).is_file():
            raise ExportError(f"{folder / name}: missing")
    vocab = read_vocab(folder / VOCAB)
    weights, weights_file = read_weights(folder)
    files = {name: (folder / name).read_bytes() for name in (SOURCE_SPM, TARGET_SPM, VOCAB)}
    return MarianFolder(folder, config, weights, weights_file, files, vocab, tokenizer_config)


# -- Marian -> ours: config ----------------------------------------------------------------------------------

REQUIRED = (
    "vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
    "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "pad_token_id", "eos_token_id",
)


def refuse_unsupported(hf: dict[str, Any], where: Path) -> None:
    """Everything of a Marian config that our architecture cannot compute ends here, with the field's name."""
    missing = [name for name in REQUIRED if hf.get(name) is None]
    if missing:
        raise ExportError(f"{where}: missing field(s) {', '.join(missing)}")
    activation = hf.get("activation_function", "gelu")  # transformers' MarianConfig default
    if activation not in ACTIVATIONS_FROM_MARIAN:
        supported = ", ".join(ACTIVATIONS_FROM_MARIAN)
        raise ExportError(f"{where}: activation_function {activation!r} is not supported (supported: {supported})")
    for name, value in LEGACY_FIELDS.items():
        if name in hf and bool(hf[name]) != value:
            raise ExportError(f"{where}: {name} {hf[name]!r} is not what transformers' Marian computes ({value})")
    for ours, enc, dec in (("n_heads", "encoder_attention_heads", "decoder_attention_heads"),
                           ("d_ff", "encoder_ffn_dim", "decoder_ffn_dim")):
        if hf[enc] != hf[dec]:
            raise ExportError(f"{where}: {enc} {hf[enc]} != {dec} {hf[dec]}; our {ours} is one value for both stacks")
    eos = hf["eos_token_id"]
    if isinstance(eos, list) and len(eos) != 1:
        raise ExportError(f"{where}: eos_token_id {eos}: our decoders stop at one EOS id")


def embedding_tables(src: MarianFolder) -> tuple[Tensor | None, Tensor | None]:
    """The source and target tables transformers 5.23 computes with. Shared and tied: all are model.shared.
    Otherwise each stack reads its own embed_tokens (falling back to model.shared, as transformers 4 did)."""
    weights, hf = src.weights, src.config
    shared = weights.get("model.shared.weight")
    share, tie = hf.get("share_encoder_decoder_embeddings", True), hf.get("tie_word_embeddings", True)
    if share and tie:
        table = shared if shared is not None else weights.get("model.encoder.embed_tokens.weight")
        return table, table
    fallback = shared if share else None
    return (
        weights.get("model.encoder.embed_tokens.weight", fallback),
        weights.get("model.decoder.embed_tokens.weight", fallback),
    )


def is_zero(tensors: list[Tensor | None]) -> bool:
    return all(t is None or not bool(t.any()) for t in tensors)


def config_from_marian(src: MarianFolder, unk_id: int) -> TransformerConfig:
    hf, where = src.config, src.path / CONFIG
    refuse_unsupported(hf, where)
    vocab = hf["vocab_size"]
    share = hf.get("share_encoder_decoder_embeddings", True)
    source_table, target_table = embedding_tables(src)
    kept = hf.get(ROUND_TRIP_KEY) if isinstance(hf.get(ROUND_TRIP_KEY), dict) else {}
    bias = src.weights.get("final_logits_bias")
    attention_biases = [t for name, t in src.weights.items() if ATTENTION_BIAS.search(name)]
    eos = hf["eos_token_id"][0] if isinstance(hf["eos_token_id"], list) else hf["eos_token_id"]
    try:
        return TransformerConfig(
            src_vocab_size=vocab,
            tgt_vocab_size=vocab if share else (hf.get("decoder_vocab_size") or vocab),
            d_model=hf["d_model"],
            n_heads=hf["encoder_attention_heads"],
            d_ff=hf["encoder_ffn_dim"],
            n_encoder_layers=hf["encoder_layers"],
            n_decoder_layers=hf["decoder_layers"],
            # Marian is post-norm (normalize_before false): LayerNorm(x + sublayer(x)), no final stack norm.
            norm_position="post",
            # OPUS-MT: swish, x * sigmoid(x); transformers' default when the field is absent: gelu.
            activation=ACTIVATIONS_FROM_MARIAN[hf.get("activation_function", "gelu")],
            # MarianSinusoidalPositionalEmbedding: sin in the first d_model/2 dims, cos in the second half,
            # positions counted from 0 on both sides; not a weight (recomputed, like our table).
            sinusoid_layout="half",
            # scale_embedding (OPUS-MT: true): token embeddings * sqrt(d_model) before adding positions.
            scale_embeddings=bool(hf.get("scale_embedding", False)),
            # share_encoder_decoder_embeddings (OPUS-MT: true): one table for both stacks, if transformers
            # really computes with one (with tie_word_embeddings false it reads two, which may differ).
            share_embeddings=bool(share) and _same(source_table, target_table),
            # tie_word_embeddings (OPUS-MT: true): lm_head is the target embedding table.
            tie_output=bool(hf.get("tie_word_embeddings", True)),
            # final_logits_bias: added to every step's logits (OPUS-MT carries Marian's output bias in it).
            output_bias=not is_zero([bias]) or bool(kept.get("output_bias", True)),
            # Marian's attention projections always have biases; zero ones only come from our to-marian.
            attention_bias=not is_zero(attention_biases) or bool(kept.get("attention_bias", True)),
            # transformers' Marian builds nn.LayerNorm(d_model): the default eps, 1e-5; there is no config field.
            layer_norm_eps=MARIAN_LAYER_NORM_EPS,
            # max_position_embeddings: the size of the sinusoid table, so the longest source and target.
            max_positions=hf.get("max_position_embeddings", 1024),
            dropout=float(hf.get("dropout", 0.1)),
            pad_id=hf["pad_token_id"],
            # Marian starts decoding with the pad token (decoder_start_token_id == pad_token_id in OPUS-MT).
            decoder_start_id=hf.get("decoder_start_token_id", hf["pad_token_id"]),
            eos_id=eos,
            unk_id=unk_id,
        )
    except (ConfigError, TypeError) as error:
        raise ExportError(f"{where}: {error}") from None


def _same(a: Tensor | None, b: Tensor | None) -> bool:
    return a is b or (a is not None and b is not None and a.shape == b.shape and torch.equal(a, b))


# -- Marian -> ours: weights -----------------------------------------------------------------------------------


def set_embeddings(state: dict[str, Tensor], src: MarianFolder, cfg: TransformerConfig) -> None:
    """src_embed/tgt_embed <- the tables transformers uses; one tensor under both names when shared."""
    where = src.path / src.weights_file
    source_table, target_table = embedding_tables(src)
    state["src_embed.lut.weight"] = checked(source_table, "model.encoder.embed_tokens.weight (or model.shared.weight)",
                                            (cfg.src_vocab_size, cfg.d_model), str(where))
    if cfg.share_embeddings:
        state["tgt_embed.lut.weight"] = state["src_embed.lut.weight"]
    else:
        state["tgt_embed.lut.weight"] = checked(target_table, "model.decoder.embed_tokens.weight",
                                                (cfg.tgt_vocab_size, cfg.d_model), str(where))


def set_layers(state: dict[str, Tensor], src: MarianFolder, cfg: TransformerConfig) -> None:
    where = str(src.path / src.weights_file)
    for pair in layer_pairs(cfg):
        if pair.attention_bias and not cfg.attention_bias:
            continue  # all zero (config_from_marian checked): our bias-free projections compute the same
        state[pair.ours] = checked(src.weights.get(pair.marian), pair.marian, pair.shape, where)


def set_generator(state: dict[str, Tensor], src: MarianFolder, cfg: TransformerConfig) -> None:
    """generator.proj <- lm_head (or the target table when tied); logits_bias <- final_logits_bias (1, V)."""
    where = str(src.path / src.weights_file)
    if cfg.tie_output:
        state["generator.proj.weight"] = state["tgt_embed.lut.weight"]
    else:
        lm_head = src.weights.get("lm_head.weight")
        state["generator.proj.weight"] = checked(lm_head, "lm_head.weight", (cfg.tgt_vocab_size, cfg.d_model), where)
    if cfg.output_bias:
        bias = src.weights.get("final_logits_bias", torch.zeros(1, cfg.tgt_vocab_size))  # transformers: zeros if absent
        state["generator.logits_bias"] = checked(bias, "final_logits_bias", (1, cfg.tgt_vocab_size), where)[0]


def check_positions(src: MarianFolder, cfg: TransformerConfig) -> None:
    """Older checkpoints store the sinusoid tables; they must be the half/half ones we compute."""
    expected = sinusoid_table(cfg.max_positions, cfg.d_model, "half")  # (P, D)
    for name in ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"):
        if name in src.weights:
            stored = checked(src.weights[name], name, tuple(expected.shape), str(src.path / src.weights_file))
            if not torch.allclose(stored.float(), expected, atol=1e-4):
                raise ExportError(f"{src.path / src.weights_file}: {name} is not Marian's half/half sinusoid table")


IGNORED_WEIGHTS = {
    "model.shared.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
    "lm_head.weight", "final_logits_bias", "model.encoder.embed_positions.weight",
    "model.decoder.embed_positions.weight",
}


def state_dict_from_marian(src: MarianFolder, cfg: TransformerConfig) -> dict[str, Tensor]:
    state: dict[str, Tensor] = {}
    set_embeddings(state, src, cfg)
    set_layers(state, src, cfg)
    set_generator(state, src, cfg)
    check_positions(src, cfg)
    unused = sorted(set(src.weights) - {p.marian for p in layer_pairs(cfg)} - IGNORED_WEIGHTS)
    if unused:
        raise ExportError(
            f"{src.path / src.weights_file}: weights transformers' Marian does not have: {', '.join(unused[:3])}"
        )
    return {name: t.float() if t.is_floating_point() else t for name, t in state.items()}


# -- Marian -> ours: tokenizer and languages ---------------------------------------------------------------------


def special_id(src: MarianFolder, role: str, default_piece: str) -> int | None:
    piece = src.tokenizer_config.get(f"{role}_token", default_piece)
    piece = piece.get("content") if isinstance(piece, dict) else piece  # AddedToken as saved by transformers
    return src.vocab.get(piece)


def check_vocab(src: MarianFolder, cfg: TransformerConfig) -> None:
    where = src.path / VOCAB
    largest = max(src.vocab.values(), default=-1)
    if largest >= min(cfg.src_vocab_size, cfg.tgt_vocab_size):
        raise ExportError(f"{where}: id {largest} is outside the model's vocabulary ({cfg.src_vocab_size} ids)")
    for role, piece, expected in (("eos", "</s>", cfg.eos_id), ("pad", "<pad>", cfg.pad_id)):
        found = special_id(src, role, piece)
        if found is not None and found != expected:
            raise ExportError(f"{where}: the {role} piece has id {found}, config.json's {role}_token_id is {expected}")


def language_tokens(vocab: dict[str, int]) -> dict[str, str]:
    """code -> token for every target-language token (>>fra<<), in id order."""
    found = sorted((token_id, piece) for piece, token_id in vocab.items() if LANGUAGE_TOKEN.fullmatch(piece))
    return {LANGUAGE_TOKEN.fullmatch(piece).group(1): piece for _, piece in found}


def token_for(language: str, tokens: dict[str, str], where: Path) -> str:
    """The token of an API language code: >>fr<<, or the other ISO 639 form (fr <-> fra)."""
    for code in (language, ISO_639_1_TO_3.get(language), ISO_639_3_TO_1.get(language)):
        if code in tokens:
            return tokens[code]
    raise ExportError(
        f"{where}: no target-language token for {language!r} (the vocabulary has {', '.join(tokens.values())})"
    )


def guessed_languages(src: MarianFolder) -> tuple[str | None, str | None]:
    """(source, target) from tokenizer_config.json, else from a name like opus-mt-en-fr (folder or _name_or_path)."""
    source, target = src.tokenizer_config.get("source_lang"), src.tokenizer_config.get("target_lang")
    for key, value in (("source_lang", source), ("target_lang", target)):
        if value is not None and not isinstance(value, str):
            raise ExportError(
                f"{src.path / 'tokenizer_config.json'}: {key} is {value!r}, not a language code; fix it, or pass "
                "--source-language / --target-languages"
            )
    for name in (src.path.resolve().name, Path(str(src.config.get("_name_or_path", ""))).name):
        parts = name.split("-")
        if name.startswith("opus-mt-") and len(parts) >= 4:
            source, target = source or parts[-2], target or parts[-1]
    return source, target


def languages(
    src: MarianFolder, source: str | None, targets: list[str] | None
) -> tuple[str, list[str], dict[str, str]]:
    """(source, targets, target_tokens): the command line wins over what the checkpoint says."""
    guess_source, guess_target = guessed_languages(src)
    source = source or guess_source
    if not source:
        raise ExportError(f"{src.path}: cannot tell the source language; pass --source-language (e.g. en)")
    tokens = language_tokens(src.vocab)
    if tokens:  # multilingual target: the API's target code selects the token prefixed to the source
        wanted = targets or list(dict.fromkeys(ISO_639_3_TO_1.get(code, code) for code in tokens))
        return source, wanted, {language: token_for(language, tokens, src.path / VOCAB) for language in wanted}
    targets = targets or (guess_target.split(",") if guess_target else None)  # to-marian joins several with ","
    if not targets:
        raise ExportError(f"{src.path}: cannot tell the target language; pass --target-languages (e.g. fr)")
    if len(targets) > 1:
        raise ExportError(
            f"{src.path}: the vocabulary has no target-language tokens (>>xx<<), so the model translates into one "
            f"language; got {','.join(targets)}"
        )
    return source, targets, {}


def checkpoint_from_marian(
    folder: Path, source: str | None = None, targets: list[str] | None = None
) -> Checkpoint:
    """A Hugging Face Marian folder as our Checkpoint: config, every weight (shape-checked), tokenizer files."""
    src = read_marian_folder(folder)
    unk_id = special_id(src, "unk", "<unk>")
    if unk_id is None:
        raise ExportError(f"{folder / VOCAB}: no unknown-token piece (<unk>)")
    cfg = config_from_marian(src, unk_id)
    check_vocab(src, cfg)
    state = state_dict_from_marian(src, cfg)
    source_language, target_languages, target_tokens = languages(src, source, targets)
    # Marian's tokenization: source.spm splits, vocab.json maps pieces to ids (unknown -> unk), </s> appended;
    # target ids -> pieces via vocab.json -> target.spm joins them.
    tokenizer = TokenizerFiles(dict(src.files), SOURCE_SPM, TARGET_SPM, VOCAB, True, target_tokens)
    provenance = {"name": folder.resolve().name, "origin": f"Hugging Face Marian checkpoint ({src.weights_file})"}
    if src.config.get("_name_or_path"):
        provenance["hf_name_or_path"] = str(src.config["_name_or_path"])
    checkpoint = Checkpoint(cfg, state, tokenizer, source_language, target_languages, provenance)
    # source.spm and target.spm must load; their pieces reach the model through vocab.json, whose ids must fit
    check_tokenizer(checkpoint, str(folder))
    return checkpoint


def convert_marian(
    folder: Path, out: Path, source: str | None, targets: list[str] | None, name: str | None, version: str
) -> Path:
    check_new_folder(out)  # before the conversion's work
    checkpoint = checkpoint_from_marian(folder, source, targets)
    return export_folder(checkpoint, out, name or checkpoint.provenance["name"], version)


# -- ours -> Marian ------------------------------------------------------------------------------------------------


def marian_blockers(checkpoint: Checkpoint) -> list[str]:
    """Each field that transformers' Marian cannot compute, with why; empty when the export is exact."""
    cfg, tok = checkpoint.config, checkpoint.tokenizer
    found = []
    if cfg.norm_position != "post":
        found.append(f"norm_position {cfg.norm_position!r} (transformers' Marian is post-norm only)")
    if cfg.sinusoid_layout != "half":
        found.append(f"sinusoid_layout {cfg.sinusoid_layout!r} (Marian's sinusoids are 'half': sin, then cos)")
    if cfg.layer_norm_eps != MARIAN_LAYER_NORM_EPS:
        found.append(f"layer_norm_eps {cfg.layer_norm_eps:g} (transformers' Marian LayerNorm eps is fixed at 1e-05)")
    if cfg.activation not in ACTIVATIONS_TO_MARIAN:
        found.append(f"activation {cfg.activation!r} (Marian: {', '.join(ACTIVATIONS_TO_MARIAN)})")
    if tok.vocabulary is None and tok.source_model != tok.target_model:
        found.append("tokenizer: separate source/target SentencePiece models without a joint vocabulary")
    return found


def marian_config(checkpoint: Checkpoint) -> dict[str, Any]:
    cfg = checkpoint.config
    return {
        "architectures": ["MarianMTModel"],
        "model_type": "marian",
        "vocab_size": cfg.src_vocab_size,
        "decoder_vocab_size": cfg.tgt_vocab_size,
        "d_model": cfg.d_model,
        "encoder_layers": cfg.n_encoder_layers,
        "decoder_layers": cfg.n_decoder_layers,
        "encoder_attention_heads": cfg.n_heads,
        "decoder_attention_heads": cfg.n_heads,
        "encoder_ffn_dim": cfg.d_ff,
        "decoder_ffn_dim": cfg.d_ff,
        "activation_function": ACTIVATIONS_TO_MARIAN[cfg.activation],
        "scale_embedding": cfg.scale_embeddings,
        "share_encoder_decoder_embeddings": cfg.share_embeddings,
        "tie_word_embeddings": cfg.tie_output,
        "max_position_embeddings": cfg.max_positions,
        "dropout": cfg.dropout,
        "attention_dropout": 0.0,
        "activation_dropout": 0.0,
        "pad_token_id": cfg.pad_id,
        "eos_token_id": cfg.eos_id,
        "decoder_start_token_id": cfg.decoder_start_id,
        "forced_eos_token_id": None,  # our decoders never force EOS at the length limit
        "is_encoder_decoder": True,
        ROUND_TRIP_KEY: {"output_bias": cfg.output_bias, "attention_bias": cfg.attention_bias},
    }


def generation_config(cfg: TransformerConfig) -> dict[str, Any]:
    """What makes transformers' generate decode like our server: pad and the decoder start never generated."""
    return {
        "decoder_start_token_id": cfg.decoder_start_id,
        "eos_token_id": cfg.eos_id,
        "pad_token_id": cfg.pad_id,
        "forced_eos_token_id": None,
        "bad_words_ids": [[token] for token in sorted({cfg.pad_id, cfg.decoder_start_id})],
        "max_length": cfg.max_positions,
    }


def marian_weights(checkpoint: Checkpoint) -> dict[str, Tensor]:
    """Our state dict under Marian's names, each tensor its own contiguous copy (safetensors shares nothing)."""
    cfg, state = checkpoint.config, checkpoint.state_dict
    out: dict[str, Tensor] = {}
    if cfg.share_embeddings:
        out["model.shared.weight"] = state["src_embed.lut.weight"]
        if not cfg.tie_output:  # transformers 5 ties nothing then: each stack reads its own table
            for stack in ("encoder", "decoder"):
                out[f"model.{stack}.embed_tokens.weight"] = state["src_embed.lut.weight"]
    else:
        out["model.encoder.embed_tokens.weight"] = state["src_embed.lut.weight"]
        out["model.decoder.embed_tokens.weight"] = state["tgt_embed.lut.weight"]
    if not cfg.tie_output:
        out["lm_head.weight"] = state["generator.proj.weight"]
    for pair in layer_pairs(cfg):
        if pair.attention_bias and not cfg.attention_bias:
            out[pair.marian] = torch.zeros(pair.shape)  # Marian always has the bias; zero adds nothing
        else:
            out[pair.marian] = checked(state.get(pair.ours), pair.ours, pair.shape, "checkpoint")
    bias = state["generator.logits_bias"] if cfg.output_bias else torch.zeros(cfg.tgt_vocab_size)
    out["final_logits_bias"] = checked(bias, "generator.logits_bias", (cfg.tgt_vocab_size,), "checkpoint")[None]
    return {name: t.detach().clone().contiguous() for name, t in out.items()}


def tokenizer_files(checkpoint: Checkpoint) -> tuple[dict[str, bytes], dict[str, int]]:
    """source.spm, target.spm and vocab.json (ours, or the SentencePiece ids as a piece -> id map)."""
    import sentencepiece as spm

    tok = checkpoint.tokenizer
    files = {SOURCE_SPM: tok.files[tok.source_model], TARGET_SPM: tok.files[tok.target_model]}
    if tok.vocabulary is not None:  # a Marian vocabulary already (a converted OPUS-MT model): as it is
        files[VOCAB] = tok.files[tok.vocabulary]
        return files, json.loads(files[VOCAB])
    sp = spm.SentencePieceProcessor(model_proto=tok.files[tok.source_model])
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}  # our ids are the SentencePiece ids
    files[VOCAB] = (json.dumps(vocab, ensure_ascii=False, indent=2) + "\n").encode("utf-8")
    return files, vocab


def marian_tokenizer_config(checkpoint: Checkpoint, vocab: dict[str, int]) -> dict[str, Any]:
    cfg = checkpoint.config
    pieces = {token: piece for piece, token in reversed(vocab.items())}
    for role in ("unk", "eos", "pad"):
        if getattr(cfg, f"{role}_id") not in pieces:
            raise ExportError(f"the vocabulary has no piece for {role}_id {getattr(cfg, f'{role}_id')}")
    return {
        "tokenizer_class": "MarianTokenizer",
        "source_lang": checkpoint.source_language,
        "target_lang": ",".join(checkpoint.target_languages),
        "unk_token": pieces[cfg.unk_id],
        "eos_token": pieces[cfg.eos_id],
        "pad_token": pieces[cfg.pad_id],
        "model_max_length": cfg.max_positions,
        "separate_vocabs": False,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_marian(checkpoint: Checkpoint, out: Path) -> Path:
    """Our checkpoint in the Hugging Face Marian layout, for transformers and CTranslate2's converter."""
    blockers = marian_blockers(checkpoint)
    if blockers:
        raise ExportError(f"transformers' Marian cannot express this model: {'; '.join(blockers)}")
    check_new_folder(out)
    check_tokenizer(checkpoint)
    files, vocab = tokenizer_files(checkpoint)
    tokenizer_config = marian_tokenizer_config(checkpoint, vocab)
    weights = marian_weights(checkpoint)
    with staged_folder(out) as staged:  # written beside `out`, renamed into place when complete
        staged.mkdir()
        save_file(weights, str(staged / SAFETENSORS), metadata={"format": "pt"})
        write_json(staged / CONFIG, marian_config(checkpoint))
        write_json(staged / GENERATION_CONFIG, generation_config(checkpoint.config))
        write_json(staged / TOKENIZER_CONFIG, tokenizer_config)
        for name, content in files.items():
            (staged / name).write_bytes(content)
    return out


def to_marian(checkpoint_path: Path, out: Path) -> Path:
    return write_marian(ckpt.load(checkpoint_path), out)
