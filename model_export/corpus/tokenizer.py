"""Trains the shared EN+FR SentencePiece unigram model on the train split and measures it on dev.

Knows the corpus file layout (`train.en`, `train.fr`, `dev.*`); knows nothing of how the corpus was built.
"""

from __future__ import annotations

import logging
import unicodedata
from collections import Counter
from collections.abc import Iterable
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


#: A letter the training sources held fewer times than this, and less often than RARE_SHARE of their characters, is
#: one the model cannot be trusted to read or copy: the default model's English sources (224,850 sentences, 13 M
#: characters) hold each letter beyond ASCII 87 times at most, and names written with them came back mangled
#: ("Søren" as "Sauvé", "Dvořák" as "Dvoák", "Straße" as "Strarararaît"). The share keeps a small corpus's
#: common letters readable: in 8 lines every letter is held fewer than 1,000 times.
RARE_FEWER_THAN = 1000
RARE_SHARE = 1e-5


def rare_letters(
    sources: Iterable[str],
    processor: spm.SentencePieceProcessor,
    fewer_than: int = RARE_FEWER_THAN,
    share: float = RARE_SHARE,
) -> str:
    """The letters of the tokenizer's pieces that the training sources hold fewer than `fewer_than` times and less
    often than `share` of their characters, counted in the sources as SentencePiece reads them (NFKC: µ is μ),
    sorted: the manifest's `tokenizer.rare_letters`, which the server gives the model as placeholders. A letter the
    pieces lack needs no listing: the server masks it already (its byte pieces). ASCII letters are left out (the
    server reads them always: its fast path), and so are modifier letters: ʼ is an apostrophe in "donʼt", whose word
    the placeholder would keep untranslated."""
    counts: Counter[str] = Counter()
    for line in sources:
        counts.update(unicodedata.normalize("NFKC", line))
    bound = min(fewer_than, share * counts.total())
    pieces = {c for i in range(processor.get_piece_size()) for c in processor.id_to_piece(i)}
    letters = (c for c in pieces if c.isalpha() and not c.isascii() and unicodedata.category(c) != "Lm")  # not ʼ
    return "".join(sorted(c for c in letters if counts[c] < bound))
