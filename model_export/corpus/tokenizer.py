"""Trains the shared EN+FR SentencePiece unigram model on the train split and measures it on dev.

Knows the corpus file layout (`train.en`, `train.fr`, `dev.*`); knows nothing of how the corpus was built.
"""

from __future__ import annotations

import logging
from pathlib import Path

import sentencepiece as spm

from model_export.corpus import CorpusError, read_lines

log = logging.getLogger(__name__)

#: Placeholders kept as single pieces (the model copies them verbatim).
PLACEHOLDER_SYMBOLS = ("%s", "%d", "%u", "%i", "%1", "%2", "%3", "%1$s", "%2$s", "{0}", "{1}", "%%")


def _split_files(corpus: Path, split: str) -> list[Path]:
    files = [corpus / f"{split}.en", corpus / f"{split}.fr"]
    missing = [str(f) for f in files if not f.is_file()]
    if missing:
        raise CorpusError(f"missing corpus file(s): {', '.join(missing)} (run the build first)")
    return files


def train_tokenizer(corpus: Path, out_prefix: Path, vocab_size: int, sentence_cap: int = 1_000_000) -> Path:
    """Train `<out_prefix>.model` / `.vocab` on train.en + train.fr together; returns the model path."""
    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    try:
        spm.SentencePieceTrainer.train(
            input=[str(f) for f in _split_files(corpus, "train")],
            model_prefix=str(out_prefix),
            model_type="unigram",
            vocab_size=vocab_size,
            character_coverage=1.0,
            byte_fallback=True,
            pad_id=0,
            unk_id=1,
            bos_id=2,
            eos_id=3,
            user_defined_symbols=list(PLACEHOLDER_SYMBOLS),
            input_sentence_size=sentence_cap,
            shuffle_input_sentence=True,
            num_threads=2,
            minloglevel=1,
        )
    except RuntimeError as exc:
        raise CorpusError(f"SentencePiece training failed: {exc}") from exc
    return out_prefix.with_suffix(".model")


def pieces_per_sentence(model: Path, text_file: Path) -> float:
    """Average number of pieces per line of a text file (its lines as training reads them)."""
    processor = spm.SentencePieceProcessor(model_file=str(model))
    lines = read_lines(text_file)
    if not lines:
        return 0.0
    return sum(len(ids) for ids in processor.encode(lines)) / len(lines)


def dev_lengths(model: Path, corpus: Path) -> dict[str, float]:
    """Average pieces per dev sentence, per language."""
    en, fr = _split_files(corpus, "dev")
    return {"en": pieces_per_sentence(model, en), "fr": pieces_per_sentence(model, fr)}
