"""Trains a Transformer on a parallel corpus: token-bucketed batches, Adam with warm-up and inverse
square-root decay (paper 5.3), label smoothing, bf16 autocast on CPU, periodic dev evaluation, and
checkpoints that an interrupted run resumes from (same seed, same batch order).

Knows the corpus layout (train/dev .en/.fr files) and the tokenizer model; writes checkpoints only.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import sacrebleu
import sentencepiece as spm
import torch
import torch.nn.functional as F
from tqdm import tqdm

from model_export import checkpoint as ckpt
from model_export import reference
from model_export.config import TransformerConfig
from model_export.corpus import line_origins
from model_export.corpus import read_lines as corpus_lines
from model_export.corpus.tokenizer import RARE_FEWER_THAN, RARE_SHARE, rare_letters
from model_export.errors import ExportError
from model_export.model import Transformer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainOptions:
    corpus: Path
    tokenizer: Path  # SentencePiece model (shared source/target vocabulary)
    out: Path  # run folder: checkpoints and the training log
    source_language: str = "en"
    target_language: str = "fr"
    d_model: int = 256
    n_heads: int = 4
    d_ff: int = 1024
    n_encoder_layers: int = 4
    n_decoder_layers: int = 3
    # post-norm, half/half sinusoids and eps 1e-5 are what the Hugging Face Marian layout can express, so
    # transformers and CTranslate2 can run exactly our weights (model_export to-marian)
    norm_position: str = "post"
    sinusoid_layout: str = "half"
    layer_norm_eps: float = 1e-5
    activation: str = "relu"
    dropout: float = 0.1
    batch_tokens: int = 6000  # source + target tokens per batch
    peak_lr: float = 8e-4
    warmup_steps: int = 1000
    label_smoothing: float = 0.1
    max_steps: int = 100_000
    max_minutes: float = 115.0  # wall-clock budget of this run (resumed runs add their own)
    max_tokens_per_side: int = 128  # longer training pairs are skipped
    eval_every_minutes: float = 15.0
    checkpoint_every_minutes: float = 5.0
    keep_checkpoints: int = 5  # the last ones are averaged into the final model
    dev_sentences: int = 500  # dev sentences decoded for BLEU/chrF at each evaluation
    seed: int = 1234
    threads: int = 2
    bf16: bool = False  # bf16 autocast: faster only where the CPU has AMX (measured here: fp32 1.4x faster)
    device: str = "cpu"
    # fine-tuning: start from this checkpoint's weights (its architecture wins over the size options above) with a
    # fresh optimizer and schedule; a resumed run ignores it and carries on from its own last checkpoint
    init: Path | None = None
    # weigh groups or packages up: "stories=3,quests=3" gives each of their training pairs 3 copies in an epoch
    # (groups as the corpus's stats.json names them, packages as train.origin does)
    weigh: str = ""


@dataclass
class Progress:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    seconds: float = 0.0  # training time so far, over all resumed runs
    tokens: int = 0
    history: list[dict] = field(default_factory=list)


# -- data ---------------------------------------------------------------------------------------


def read_lines(path: Path) -> list[str]:
    """A corpus file's lines, split at "\\n" only (evaluate's rule: a U+2028 inside a sentence must not shift pairs)."""
    if not path.is_file():
        raise ExportError(f"corpus file not found: {path} (build it with `python -m model_export.corpus build`)")
    return corpus_lines(path)


def encode_split(corpus: Path, split: str, sp: spm.SentencePieceProcessor, opts: TrainOptions):
    """-> (sources, targets, kept line numbers): ids without specials; pairs over the length cap dropped."""
    src_lines = read_lines(corpus / f"{split}.{opts.source_language}")
    tgt_lines = read_lines(corpus / f"{split}.{opts.target_language}")
    if len(src_lines) != len(tgt_lines):
        raise ExportError(f"{corpus}: {split} sides differ in length ({len(src_lines)} vs {len(tgt_lines)})")
    sources, targets = sp.encode(src_lines), sp.encode(tgt_lines)
    keep = [
        i
        for i, (s, t) in enumerate(zip(sources, targets, strict=True))
        if 0 < len(s) < opts.max_tokens_per_side and 0 < len(t) < opts.max_tokens_per_side
    ]
    if not keep:
        raise ExportError(
            f"{corpus}: no {split} pair has 1 to {opts.max_tokens_per_side - 1} tokens on each side; "
            "raise --max-tokens-per-side or check the corpus"
        )
    return [sources[i] for i in keep], [targets[i] for i in keep], keep


def parse_weights(text: str) -> dict[str, int]:
    """'stories=3,quests=2' -> {"stories": 3, "quests": 2}: copies of each named group's or package's pairs."""
    weights: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, copies = item.partition("=")
        if not name or not copies.isdigit() or int(copies) < 1:
            raise ExportError(f"--weigh {item!r}: write NAME=COPIES with COPIES a whole number from 1, e.g. stories=3")
        weights[name.strip()] = int(copies)
    return weights


def pair_copies(corpus: Path, weights: dict[str, int], kept: list[int]) -> list[int]:
    """How many copies of each kept training pair an epoch holds: the weight of its package, else of its group,
    else 1 (train.origin names each pair's package; stats.json each package's group)."""
    found = line_origins(corpus, "train")
    if found is None:
        raise ExportError(
            f"--weigh needs {corpus / 'train.origin'} and {corpus / 'stats.json'}: a corpus that `corpus build` wrote"
        )
    origins, groups = found
    unknown = sorted(set(weights) - set(groups) - set(groups.values()))
    if unknown:
        raise ExportError(
            f"--weigh: {', '.join(unknown)} is neither a group nor a package of {corpus} "
            f"(its groups: {', '.join(sorted(set(groups.values())))})"
        )
    return [weights.get(origins[i], weights.get(groups.get(origins[i], ""), 1)) for i in kept]


def weighed(sources: list[list[int]], targets: list[list[int]], copies: list[int]):
    """The pairs with each repeated its number of copies (-> sources, targets)."""
    order = [i for i, n in enumerate(copies) for _ in range(n)]
    return [sources[i] for i in order], [targets[i] for i in order]


def make_batches(sources: list[list[int]], targets: list[list[int]], batch_tokens: int, seed: int) -> list[list[int]]:
    """Pair indexes grouped by similar length into batches of about `batch_tokens` padded tokens, shuffled."""
    rng = random.Random(seed)
    order = sorted(range(len(sources)), key=lambda i: (len(sources[i]) + len(targets[i]), rng.random()))
    batches, current, width = [], [], 0
    for i in order:
        need = max(len(sources[i]), len(targets[i])) + 1  # + EOS / decoder start
        if current and max(width, need) * 2 * (len(current) + 1) > batch_tokens:
            batches.append(current)
            current, width = [], 0
        current.append(i)
        width = max(width, need)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    return batches


def collate(indexes: list[int], sources, targets, cfg: TransformerConfig):  # noqa: ANN001
    """-> src (B, S), src_mask (B, S), tgt_in (B, T) starting with the decoder start, tgt_out (B, T) ending in EOS."""
    srcs = [sources[i] + [cfg.eos_id] for i in indexes]
    tins = [[cfg.decoder_start_id] + targets[i] for i in indexes]
    touts = [targets[i] + [cfg.eos_id] for i in indexes]
    src = torch.full((len(indexes), max(map(len, srcs))), cfg.pad_id)  # (B, S)
    tgt_in = torch.full((len(indexes), max(map(len, tins))), cfg.pad_id)  # (B, T)
    tgt_out = torch.full_like(tgt_in, cfg.pad_id)  # (B, T)
    for row, (s, ti, to) in enumerate(zip(srcs, tins, touts, strict=True)):
        src[row, : len(s)], tgt_in[row, : len(ti)], tgt_out[row, : len(to)] = (
            torch.tensor(s),
            torch.tensor(ti),
            torch.tensor(to),
        )
    return src, src != cfg.pad_id, tgt_in, tgt_out


# -- optimisation -------------------------------------------------------------------------------


def learning_rate(step: int, opts: TrainOptions) -> float:
    """Linear warm-up to peak_lr, then decay with the inverse square root of the step (paper 5.3)."""
    step = max(step, 1)
    return opts.peak_lr * min(step / opts.warmup_steps, math.sqrt(opts.warmup_steps / step))


def loss_of(model: Transformer, batch, opts: TrainOptions) -> tuple[torch.Tensor, int]:  # noqa: ANN001
    src, src_mask, tgt_in, tgt_out = batch
    with torch.autocast(opts.device, dtype=torch.bfloat16, enabled=opts.bf16):
        log_probs = model(src, src_mask, tgt_in)  # (B, T, V)
    n_tokens = int((tgt_out != model.cfg.pad_id).sum())
    loss = F.nll_loss(
        log_probs.flatten(0, 1).float(), tgt_out.flatten(), ignore_index=model.cfg.pad_id, reduction="sum"
    )
    if opts.label_smoothing:
        mask = (tgt_out != model.cfg.pad_id).flatten()
        smooth = -log_probs.flatten(0, 1).float().mean(dim=-1)[mask].sum()
        loss = (1 - opts.label_smoothing) * loss + opts.label_smoothing * smooth
    return loss / n_tokens, n_tokens


# -- evaluation ---------------------------------------------------------------------------------


@torch.no_grad()
def evaluate_dev(model: Transformer, dev, sp: spm.SentencePieceProcessor, opts: TrainOptions) -> dict:  # noqa: ANN001
    """Dev loss (no smoothing) on all of dev; BLEU and chrF of greedy decoding on its first sentences."""
    model.eval()
    sources, targets, _ = dev
    total, count = 0.0, 0
    for indexes in make_batches(sources, targets, opts.batch_tokens, seed=0):
        src, src_mask, tgt_in, tgt_out = (t.to(opts.device) for t in collate(indexes, sources, targets, model.cfg))
        log_probs = model(src, src_mask, tgt_in)
        total += float(
            F.nll_loss(log_probs.flatten(0, 1), tgt_out.flatten(), ignore_index=model.cfg.pad_id, reduction="sum")
        )
        count += int((tgt_out != model.cfg.pad_id).sum())
    hyps, refs = [], []
    n = min(opts.dev_sentences, len(sources))
    for start in range(0, n, 64):
        indexes = list(range(start, min(start + 64, n)))
        src, src_mask, _, _ = (t.to(opts.device) for t in collate(indexes, sources, targets, model.cfg))
        for ids in reference.greedy(model, src, src_mask, max_new_tokens=2 * src.size(1) + 10):
            hyps.append(sp.decode([t for t in ids if t != model.cfg.eos_id]))
        refs += [sp.decode(targets[i]) for i in indexes]
    model.train()
    return {
        "dev_loss": total / max(count, 1),
        "dev_bleu": sacrebleu.corpus_bleu(hyps, [refs]).score,
        "dev_chrf": sacrebleu.corpus_chrf(hyps, [refs]).score,
    }


# -- checkpoints --------------------------------------------------------------------------------


def initial_model(sp: spm.SentencePieceProcessor, opts: TrainOptions) -> Transformer:
    """A new model of the options' size, or the weights of --init (which must share the run's tokenizer)."""
    if opts.init is None:
        return Transformer(model_config(sp, opts))
    if not opts.init.is_file():
        raise ExportError(f"--init checkpoint not found: {opts.init} (rebuild one from a model folder: `from-folder`)")
    start = ckpt.load(opts.init)
    own = start.tokenizer.files.get(start.tokenizer.source_model)
    if own != opts.tokenizer.read_bytes():
        raise ExportError(
            f"{opts.init} was trained with another tokenizer than {opts.tokenizer}: "
            f"pass its own (`from-folder` writes it into the checkpoint; the model folder's spm.model)"
        )
    model = Transformer(dataclasses.replace(start.config, dropout=opts.dropout))
    model.load_state_dict(start.state_dict)
    log.info("initialised from %s: d_model %d, %d+%d layers", opts.init, start.config.d_model,
             start.config.n_encoder_layers, start.config.n_decoder_layers)
    return model


def model_config(sp: spm.SentencePieceProcessor, opts: TrainOptions) -> TransformerConfig:
    vocab = sp.get_piece_size()
    return TransformerConfig(
        src_vocab_size=vocab,
        tgt_vocab_size=vocab,
        d_model=opts.d_model,
        n_heads=opts.n_heads,
        d_ff=opts.d_ff,
        n_encoder_layers=opts.n_encoder_layers,
        n_decoder_layers=opts.n_decoder_layers,
        norm_position=opts.norm_position,
        sinusoid_layout=opts.sinusoid_layout,
        layer_norm_eps=opts.layer_norm_eps,
        activation=opts.activation,
        dropout=opts.dropout,
        share_embeddings=True,
        tie_output=True,
        pad_id=sp.pad_id(),
        unk_id=sp.unk_id(),
        decoder_start_id=sp.bos_id(),
        eos_id=sp.eos_id(),
    )


@functools.cache
def training_rare_letters(corpus: Path, language: str, tokenizer: Path) -> str:
    """`rare_letters` of the training sources, counted once a run."""
    sources = read_lines(corpus / f"train.{language}")
    return rare_letters(sources, spm.SentencePieceProcessor(model_file=str(tokenizer)), RARE_FEWER_THAN, RARE_SHARE)


@functools.cache
def initialised_from(path: Path) -> dict[str, str]:
    """What --init started from, for the card: the checkpoint and, where `from-folder` rebuilt it, its folder."""
    record = {"checkpoint": str(path)}
    folder = ckpt.load(path).provenance.get("rebuilt_from") or {}
    if folder:
        record["model"] = f"{folder.get('folder', '?')} {folder.get('version', '?')}"
    return record


def save_checkpoint(  # noqa: ANN001
    path: Path, model: Transformer, optimizer, progress: Progress, opts: TrainOptions, origin: dict | None = None
) -> None:
    """A resumable checkpoint; `origin`: what the run was initialised from (initialised_from), for the card."""
    rare = training_rare_letters(opts.corpus, opts.source_language, opts.tokenizer)
    files = {"spm.model": opts.tokenizer.read_bytes()}
    tokenizer = ckpt.TokenizerFiles(files, "spm.model", "spm.model", rare_letters=rare)
    provenance = {
        "name": f"{opts.source_language}-{opts.target_language}",
        "trained_on": str(opts.corpus),
        **({"initialised_from": origin} if origin else {}),
        "options": {k: str(v) for k, v in asdict(opts).items()},
    }
    training = {
        "optimizer": optimizer.state_dict(),
        "progress": asdict(progress),
        "torch_rng": torch.get_rng_state(),
        "python_rng": random.getstate(),
    }
    ckpt.save(
        ckpt.Checkpoint(
            model.cfg, model.state_dict(), tokenizer, opts.source_language, [opts.target_language], provenance, training
        ),
        path,
    )


def checkpoint_files(out: Path) -> list[Path]:
    return sorted(out.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1]))


def average_checkpoints(paths: list[Path]) -> ckpt.Checkpoint:
    """The mean of several checkpoints' weights (a cheap, reliable gain at the end of training)."""
    loaded = [ckpt.load(p) for p in paths]
    state = {k: sum(c.state_dict[k].float() for c in loaded) / len(loaded) for k in loaded[-1].state_dict}
    last = loaded[-1]
    provenance = {**last.provenance, "averaged": [p.name for p in paths]}
    return ckpt.Checkpoint(
        last.config,
        state,
        last.tokenizer,
        last.source_language,
        last.target_languages,
        provenance,
        {"progress": last.training.get("progress", {})},
    )


# -- the training loop --------------------------------------------------------------------------


def check_device(device: str) -> None:
    """cpu, or cuda (cuda:N) where torch sees a CUDA device; anything else is one line before any work."""
    try:
        kind = torch.device(device).type
    except RuntimeError:
        kind = None
    if kind not in ("cpu", "cuda"):
        raise ExportError(f"--device {device!r} is not cpu or cuda (cuda:N)")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ExportError(f"--device {device}: torch sees no CUDA device here; use --device cpu")


def check_run_folder(out: Path) -> None:
    """--out is a new folder or a run folder to resume (it prunes its own step-*.pt files there): a folder holding
    other files and no checkpoint is someone else's."""
    if out.exists() and not out.is_dir():
        raise ExportError(f"{out} exists and is not a folder; pass a new run folder as --out")
    if out.is_dir() and any(out.iterdir()) and not checkpoint_files(out) and not (out / "final.pt").is_file():
        raise ExportError(f"{out} holds files but no step-*.pt checkpoint to resume; pass a new run folder as --out")


def train(opts: TrainOptions) -> Path:
    """Runs (or resumes) training until max_steps or the time budget; returns the averaged checkpoint."""
    if not opts.tokenizer.is_file():
        raise ExportError(f"tokenizer not found: {opts.tokenizer} (make it: `python -m model_export.corpus tokenizer`)")
    check_device(opts.device)
    check_run_folder(opts.out)  # created by the first checkpoint's save
    torch.set_num_threads(opts.threads)
    sp = spm.SentencePieceProcessor(model_file=str(opts.tokenizer))
    # 1. data: encode once, keep ids in memory
    sources, targets, kept = encode_split(opts.corpus, "train", sp, opts)
    if opts.weigh:
        sources, targets = weighed(sources, targets, pair_copies(opts.corpus, parse_weights(opts.weigh), kept))
    dev = encode_split(opts.corpus, "dev", sp, opts)
    log.info("train pairs: %d, dev pairs: %d", len(sources), len(dev[0]))
    # 2. model and optimizer, or the state of an interrupted run
    torch.manual_seed(opts.seed)
    random.seed(opts.seed)
    existing = checkpoint_files(opts.out)
    resumed = ckpt.load(existing[-1]) if existing else None
    # a resumed run rebuilds its model from its own checkpoint: --init's weights were its start, not its state
    model = (Transformer(resumed.config) if resumed is not None else initial_model(sp, opts)).to(opts.device)
    if resumed is not None:
        origin = resumed.provenance.get("initialised_from")
    else:
        origin = initialised_from(opts.init) if opts.init else None
    optimizer = torch.optim.Adam(model.parameters(), lr=opts.peak_lr, betas=(0.9, 0.98), eps=1e-9)
    progress = Progress()
    if resumed is not None:
        model.load_state_dict(resumed.state_dict)
        optimizer.load_state_dict(resumed.training["optimizer"])
        progress = Progress(**resumed.training["progress"])
        torch.set_rng_state(resumed.training["torch_rng"])
        random.setstate(resumed.training["python_rng"])
        log.info("resumed from %s at step %d", existing[-1].name, progress.step)
    model.train()
    # 3. loop over batches until the step or time budget is spent
    run_started = time.monotonic()
    last_eval = last_save = run_started
    bar = tqdm(total=opts.max_steps, initial=progress.step, unit="step", dynamic_ncols=True)
    batches = make_batches(sources, targets, opts.batch_tokens, seed=opts.seed + progress.epoch)
    while progress.step < opts.max_steps and (time.monotonic() - run_started) / 60 < opts.max_minutes:
        if progress.batch_in_epoch >= len(batches):
            progress.epoch, progress.batch_in_epoch = progress.epoch + 1, 0
            batches = make_batches(sources, targets, opts.batch_tokens, seed=opts.seed + progress.epoch)
        batch = [t.to(opts.device) for t in collate(batches[progress.batch_in_epoch], sources, targets, model.cfg)]
        step_started = time.monotonic()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(progress.step + 1, opts)
        loss, n_tokens = loss_of(model, batch, opts)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        progress.step, progress.batch_in_epoch = progress.step + 1, progress.batch_in_epoch + 1
        progress.tokens += n_tokens
        progress.seconds += time.monotonic() - step_started
        bar.update(1)
        bar.set_postfix(
            loss=f"{loss.item():.3f}",
            tok_s=f"{progress.tokens / max(progress.seconds, 1e-9):,.0f}",
            epoch=progress.epoch,
            lr=f"{learning_rate(progress.step, opts):.1e}",
        )
        now = time.monotonic()
        if (now - last_eval) / 60 >= opts.eval_every_minutes:
            record = {
                "step": progress.step,
                "minutes": round(progress.seconds / 60, 1),
                "train_loss": loss.item(),
                **evaluate_dev(model, dev, sp, opts),
            }
            progress.history.append(record)
            bar.write(" ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()))
            last_eval = time.monotonic()
        if (now - last_save) / 60 >= opts.checkpoint_every_minutes:
            _save_and_prune(model, optimizer, progress, opts, origin)
            last_save = time.monotonic()
    bar.close()
    _save_and_prune(model, optimizer, progress, opts, origin)
    final = average_checkpoints(checkpoint_files(opts.out)[-opts.keep_checkpoints :])
    final_path = opts.out / "final.pt"
    ckpt.save(final, final_path)
    return final_path


def _save_and_prune(  # noqa: ANN001
    model: Transformer, optimizer, progress: Progress, opts: TrainOptions, origin: dict | None
) -> None:
    save_checkpoint(opts.out / f"step-{progress.step}.pt", model, optimizer, progress, opts, origin)
    for old in checkpoint_files(opts.out)[: -opts.keep_checkpoints]:
        old.unlink()
