"""Counts a model's parameters by part, like the seed's table: embeddings, attention, FFN and norms per
encoder and decoder layer, the layer totals and the grand total. It counts the module's real tensors,
so a tied or shared matrix is counted once.
"""

from __future__ import annotations

from collections import Counter

from torch import nn

PARTS = {
    "self_attn": "self-attention",
    "cross_attn": "cross-attention",
    "feed_forward": "feed-forward network",
    "sublayer": "layer norms",
}


def _part(name: str) -> tuple[str, str]:
    """'decoder.layers.3.cross_attn.w_q.weight' -> ('decoder layer', 'cross-attention')."""
    pieces = name.split(".")
    if pieces[1:2] == ["layers"]:
        return f"{pieces[0]} layer {pieces[2]}", PARTS[pieces[3]]
    top = {
        "src_embed": "source embeddings",
        "tgt_embed": "target embeddings",
        "generator": "output projection" if pieces[1] == "proj" else "logits bias",
        "encoder": "final layer norms",
        "decoder": "final layer norms",
    }
    return "model", top[pieces[0]]


def count_parameters(model: nn.Module) -> dict[str, Counter[str]]:
    """{'encoder layer 0': {'self-attention': n, ...}, ..., 'model': {'source embeddings': n, ...}}."""
    counts: dict[str, Counter[str]] = {}
    for name, parameter in model.named_parameters():  # shared tensors appear once
        group, part = _part(name)
        counts.setdefault(group, Counter())[part] += parameter.numel()
    return counts


def layer_total(counts: dict[str, Counter[str]], stack: str) -> int:
    return sum(sum(c.values()) for group, c in counts.items() if group.startswith(f"{stack} layer"))


def format_table(model: nn.Module) -> str:
    counts = count_parameters(model)
    cfg = model.cfg
    lines = [f"{'part':<40}{'parameters':>14}"]

    def row(label: str, value: int) -> None:
        lines.append(f"{label:<40}{value:>14,}")

    for label, value in sorted(counts["model"].items()):
        if "norms" not in label:
            row(label, value)
    for stack, n in (("encoder", cfg.n_encoder_layers), ("decoder", cfg.n_decoder_layers)):
        one = counts[f"{stack} layer 0"]
        lines.append(f"one {stack} layer (each of {n})")
        for part, value in one.items():
            row(f"  {'masked self-attention' if stack == 'decoder' and part == 'self-attention' else part}", value)
        row(f"  one {stack} layer", sum(one.values()))
        row(f"{n} {stack} layers", layer_total(counts, stack))
    all_layers = layer_total(counts, "encoder") + layer_total(counts, "decoder")
    row(f"all {cfg.n_encoder_layers + cfg.n_decoder_layers} layers", all_layers)
    row("final layer norms (pre-norm)", counts["model"].get("final layer norms", 0))
    row("total", sum(sum(c.values()) for c in counts.values()))
    return "\n".join(lines)
