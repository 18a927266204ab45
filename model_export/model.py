"""The Transformer of "Attention Is All You Need" in PyTorch, one small class per box of the figure.

`encode` runs the encoder stack once per sentence; `decode` is teacher forcing (training);
`start_decoding` + `decode_step` generate one token per row with a KV cache. Knows nothing of
ONNX, tokenizers or files: every architectural choice comes from `TransformerConfig`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from model_export.config import TransformerConfig


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(d_k)) v, the paper's equation (1). `mask` is True where a key may be seen."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., Tq, Tk)
    if mask is not None:
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)  # (..., Tq, Tk)
    weights = scores.softmax(dim=-1)  # (..., Tq, Tk)
    return weights @ v, weights  # (..., Tq, Dv), (..., Tq, Tk)


def sinusoid_table(max_positions: int, d_model: int, layout: str) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(...): paper 3.5, in either layout."""
    position = torch.arange(max_positions, dtype=torch.float64)[:, None]  # (P, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    angles = position * inv_freq  # (P, D/2)
    if layout == "interleaved":
        table = torch.stack([angles.sin(), angles.cos()], dim=-1).reshape(max_positions, d_model)  # (P, D)
    else:
        table = torch.cat([angles.sin(), angles.cos()], dim=-1)  # (P, D)
    return table.float()


def causal_mask(length: int, device: torch.device | None = None) -> Tensor:
    """True on and below the diagonal: position t sees positions <= t."""
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()  # (T, T)


ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


class Embeddings(nn.Module):
    """Token embeddings, multiplied by sqrt(d_model) when the config says so (paper 3.4)."""

    def __init__(self, vocab_size: int, cfg: TransformerConfig) -> None:
        super().__init__()
        self.lut = nn.Embedding(vocab_size, cfg.d_model)
        self.scale = math.sqrt(cfg.d_model) if cfg.scale_embeddings else 1.0

    def forward(self, ids: Tensor) -> Tensor:
        return self.lut(ids) * self.scale  # (B, T, D)


class PositionalEncoding(nn.Module):
    """Adds the fixed sinusoid of each token's position, then dropout (paper 3.5)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        table = sinusoid_table(cfg.max_positions, cfg.d_model, cfg.sinusoid_layout)  # (P, D)
        self.register_buffer("table", table, persistent=False)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        return self.dropout(x + self.table[positions])  # (B, T, D)


class MultiHeadAttention(nn.Module):
    """Multi-head attention (paper 3.2.2): h heads of d_k = d_model / h, then the output projection."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        self.w_q = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.attention_bias)
        self.w_k = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.attention_bias)
        self.w_v = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.attention_bias)
        self.w_o = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.attention_bias)

    def split_heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        return self.split_heads(self.w_k(x)), self.split_heads(self.w_v(x))  # (B, H, T, Dh) each

    def attend(self, x: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        q = self.split_heads(self.w_q(x))  # (B, H, Tq, Dh)
        context, _ = scaled_dot_product_attention(q, k, v, mask)  # (B, H, Tq, Dh)
        batch, _, length, _ = context.shape
        return self.w_o(context.transpose(1, 2).reshape(batch, length, -1))  # (B, Tq, D)

    def forward(self, x: Tensor, memory: Tensor, mask: Tensor | None) -> Tensor:
        k, v = self.keys_values(memory)  # (B, H, Tk, Dh) each
        return self.attend(x, k, v, mask)  # (B, Tq, D)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2, applied to every position alike (paper 3.3)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.w_1 = nn.Linear(cfg.d_model, cfg.d_ff)
        self.w_2 = nn.Linear(cfg.d_ff, cfg.d_model)
        self.activation = ACTIVATIONS[cfg.activation]

    def forward(self, x: Tensor) -> Tensor:
        return self.w_2(self.activation(self.w_1(x)))  # (B, T, D)


class SublayerConnection(nn.Module):
    """Residual + layer norm: post-norm LN(x + drop(f(x))) (paper) or pre-norm x + drop(f(LN(x)))."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps)
        self.pre_norm = cfg.norm_position == "pre"
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))  # (B, T, D)
        return self.norm(x + self.dropout(sublayer(x)))  # (B, T, D)


class EncoderLayer(nn.Module):
    """Self-attention, then the position-wise FFN, each inside a residual + norm."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg)
        self.feed_forward = PositionwiseFeedForward(cfg)
        self.sublayer = nn.ModuleList([SublayerConnection(cfg) for _ in range(2)])

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, src_mask))  # (B, S, D)
        return self.sublayer[1](x, self.feed_forward)  # (B, S, D)


@dataclass
class LayerCache:
    """One decoder layer's keys and values: of earlier target steps (grows) and of the source (fixed)."""

    self_keys: Tensor  # (B, H, T, Dh)
    self_values: Tensor  # (B, H, T, Dh)
    cross_keys: Tensor  # (B, H, S, Dh)
    cross_values: Tensor  # (B, H, S, Dh)


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder memory, then the FFN (paper 3.1)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(cfg)
        self.cross_attn = MultiHeadAttention(cfg)
        self.feed_forward = PositionwiseFeedForward(cfg)
        self.sublayer = nn.ModuleList([SublayerConnection(cfg) for _ in range(3)])

    def forward(self, x: Tensor, cross_k: Tensor, cross_v: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, tgt_mask))  # (B, T, D)
        x = self.sublayer[1](x, lambda y: self.cross_attn.attend(y, cross_k, cross_v, src_mask))  # (B, T, D)
        return self.sublayer[2](x, self.feed_forward)  # (B, T, D)

    def step(self, x: Tensor, cache: LayerCache, self_mask: Tensor, src_mask: Tensor) -> tuple[Tensor, LayerCache]:
        """One new position per row: attends to the cached steps plus itself; returns the grown cache."""
        grown: list[LayerCache] = []

        def self_attention(y: Tensor) -> Tensor:
            k, v = self.self_attn.keys_values(y)  # (B, H, 1, Dh) each
            keys = torch.cat([cache.self_keys, k], dim=2)  # (B, H, T+1, Dh)
            values = torch.cat([cache.self_values, v], dim=2)  # (B, H, T+1, Dh)
            grown.append(replace(cache, self_keys=keys, self_values=values))
            return self.self_attn.attend(y, keys, values, self_mask)  # (B, 1, D)

        x = self.sublayer[0](x, self_attention)  # (B, 1, D)
        x = self.sublayer[1](x, lambda y: self.cross_attn.attend(y, cache.cross_keys, cache.cross_values, src_mask))
        return self.sublayer[2](x, self.feed_forward), grown[0]  # (B, 1, D)


class Stack(nn.Module):
    """N identical layers, with the final layer norm that pre-norm stacks need."""

    def __init__(self, layers: list[nn.Module], cfg: TransformerConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        pre_norm = cfg.norm_position == "pre"
        self.norm = nn.LayerNorm(cfg.d_model, eps=cfg.layer_norm_eps) if pre_norm else nn.Identity()


class Generator(nn.Module):
    """The final linear layer and softmax over the target vocabulary (log-probabilities)."""

    def __init__(self, cfg: TransformerConfig, tgt_embed: Embeddings) -> None:
        super().__init__()
        self.proj = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)
        if cfg.tie_output:
            self.proj.weight = tgt_embed.lut.weight  # the paper shares this matrix with the embeddings
        self.logits_bias = nn.Parameter(torch.zeros(cfg.tgt_vocab_size)) if cfg.output_bias else None

    def forward(self, x: Tensor) -> Tensor:
        logits = self.proj(x)  # (..., V)
        if self.logits_bias is not None:
            logits = logits + self.logits_bias  # (..., V)
        return F.log_softmax(logits.float(), dim=-1)  # (..., V)


@dataclass
class DecoderState:
    """Everything `decode_step` needs besides the new tokens; rows are sentences or beams."""

    layers: list[LayerCache]
    self_mask: Tensor  # (B, T) True where the slot holds an earlier step of that row
    src_mask: Tensor  # (B, S) True on real source tokens

    def select(self, rows: Tensor) -> DecoderState:
        """Keep, repeat or reorder rows (beam search, finished rows leaving): index on the batch axis."""
        layers = [LayerCache(*(t.index_select(0, rows) for t in vars(c).values())) for c in self.layers]
        return DecoderState(layers, self.self_mask.index_select(0, rows), self.src_mask.index_select(0, rows))


class Transformer(nn.Module):
    """Encoder-decoder Transformer: encode once per sentence, decode once per target token."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.src_embed = Embeddings(cfg.src_vocab_size, cfg)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else Embeddings(cfg.tgt_vocab_size, cfg)
        self.positions = PositionalEncoding(cfg)
        self.encoder = Stack([EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers)], cfg)
        self.decoder = Stack([DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers)], cfg)
        self.generator = Generator(cfg, self.tgt_embed)
        self._init_weights()

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if name.endswith("lut.weight"):
                nn.init.normal_(p, std=self.cfg.d_model**-0.5)
            elif p.dim() > 1:
                nn.init.xavier_uniform_(p)
            elif not name.startswith(("encoder.norm", "decoder.norm")) and ".norm." not in name:
                nn.init.zeros_(p)

    def encode(self, src_ids: Tensor, src_mask: Tensor) -> Tensor:
        """src_ids (B, S), src_mask (B, S) True on real tokens -> memory (B, S, D)."""
        positions = torch.arange(src_ids.size(1), device=src_ids.device)  # (S,)
        x = self.positions(self.src_embed(src_ids), positions)  # (B, S, D)
        attn_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        for layer in self.encoder.layers:
            x = layer(x, attn_mask)  # (B, S, D)
        return self.encoder.norm(x)  # (B, S, D)

    def decode(self, tgt_ids: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Teacher forcing: tgt_ids (B, T) starting with the decoder start -> log-probs (B, T, V)."""
        positions = torch.arange(tgt_ids.size(1), device=tgt_ids.device)  # (T,)
        x = self.positions(self.tgt_embed(tgt_ids), positions)  # (B, T, D)
        tgt_mask = causal_mask(tgt_ids.size(1), tgt_ids.device)[None, None]  # (1, 1, T, T)
        cross_mask = src_mask[:, None, None, :]  # (B, 1, 1, S)
        for layer in self.decoder.layers:
            cross_k, cross_v = layer.cross_attn.keys_values(memory)  # (B, H, S, Dh) each
            x = layer(x, cross_k, cross_v, cross_mask, tgt_mask)  # (B, T, D)
        return self.generator(self.decoder.norm(x))  # (B, T, V)

    def forward(self, src_ids: Tensor, src_mask: Tensor, tgt_ids: Tensor) -> Tensor:
        return self.decode(tgt_ids, self.encode(src_ids, src_mask), src_mask)  # (B, T, V)

    def start_decoding(self, memory: Tensor, src_mask: Tensor) -> DecoderState:
        """The cross-attention keys/values of the source, computed once; empty self-attention caches."""
        batch = memory.size(0)
        empty = memory.new_zeros(batch, self.cfg.n_heads, 0, self.cfg.head_dim)  # (B, H, 0, Dh)
        layers = [LayerCache(empty, empty, *layer.cross_attn.keys_values(memory)) for layer in self.decoder.layers]
        self_mask = torch.zeros(batch, 0, dtype=torch.bool, device=memory.device)  # (B, 0)
        return DecoderState(layers, self_mask, src_mask)

    def decode_step(self, tokens: Tensor, positions: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """tokens (B,) at positions (B,) -> log-probs (B, V) and the state grown by this step."""
        x = self.positions(self.tgt_embed(tokens[:, None]), positions[:, None])  # (B, 1, D)
        now = torch.ones_like(tokens, dtype=torch.bool)[:, None]  # (B, 1) every row sees its own new token
        self_mask = torch.cat([state.self_mask, now], dim=1)  # (B, T+1)
        attn_self, attn_cross = self_mask[:, None, None, :], state.src_mask[:, None, None, :]  # (B, 1, 1, *)
        layers = []
        for layer, cache in zip(self.decoder.layers, state.layers, strict=True):
            x, grown = layer.step(x, cache, attn_self, attn_cross)  # (B, 1, D)
            layers.append(grown)
        log_probs = self.generator(self.decoder.norm(x))[:, 0]  # (B, V)
        return log_probs, DecoderState(layers, self_mask, state.src_mask)
