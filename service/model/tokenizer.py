"""Text <-> token ids for one model folder, driven by its manifest's `tokenizer` section and special ids.

Knows SentencePiece models, an optional Marian-style piece -> id vocabulary and target-language tokens;
knows nothing of sentences, batches or graphs.
"""

from __future__ import annotations

import json
import logging
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import sentencepiece as spm

from service.errors import InvalidRequest, ModelFolderError
from service.model.folder import MANIFEST, ModelFolder, SpecialIds

logger = logging.getLogger(__name__)

WORD_START = "\u2581"  # SentencePiece's "▁", the piece prefix that stands for a space


@dataclass(frozen=True)
class Tokenizer:
    """Source text -> source ids and target ids -> target text for one model."""

    source: spm.SentencePieceProcessor
    target: spm.SentencePieceProcessor
    special: SpecialIds
    append_eos: bool = True
    target_token_ids: dict[str, int] = field(default_factory=dict)  # language -> id prefixed to the source
    vocabulary: dict[str, int] | None = None  # piece -> model id; None: the SentencePiece ids are the model's
    pieces: dict[int, str] = field(default_factory=dict)  # model id -> piece, the vocabulary inverted
    rare_letters: frozenset[str] = frozenset()  # letters the model reads too poorly to be given (manifest, format 9)
    _readable: dict[str, bool] = field(default_factory=dict, compare=False, repr=False)  # readable's answers

    @classmethod
    def from_folder(cls, folder: ModelFolder) -> Tokenizer:
        """Load the SentencePiece model(s) and vocabulary the manifest names; ModelFolderError names a bad file."""
        spec = folder.manifest.tokenizer
        source = _load_sentencepiece(folder.file(spec.source_model))
        target = (
            source if spec.target_model == spec.source_model else _load_sentencepiece(folder.file(spec.target_model))
        )
        vocabulary = _load_vocabulary(folder.file(spec.vocabulary)) if spec.vocabulary else None
        _check_ids_fit(folder, source, vocabulary)
        token_ids = {
            language: _target_token_id(token, source, vocabulary, folder.path)
            for language, token in spec.target_tokens.items()
        }
        pieces = _invert(vocabulary) if vocabulary is not None else {}
        logger.debug(
            "%s: tokenizer %s -> %s, vocabulary %s", folder.path, spec.source_model, spec.target_model, spec.vocabulary
        )
        rare = frozenset(spec.rare_letters)
        return cls(source, target, folder.manifest.special_ids, spec.append_eos, token_ids, vocabulary, pieces, rare)

    def encode(self, text: str, target_language: str | None = None) -> list[int]:
        """Source ids: [the target language's token, if the model has one] + the text's pieces + [eos]."""
        prefix = [self.target_token_ids[target_language]] if target_language in self.target_token_ids else []
        return prefix + self._piece_ids(text) + ([self.special.eos] if self.append_eos else [])

    def count(self, text: str, target_language: str | None = None) -> int:
        """len(encode(text, target_language)); without a language, the most any language gives (an upper bound)."""
        has_prefix = target_language in self.target_token_ids if target_language else bool(self.target_token_ids)
        return int(has_prefix) + len(self._pieces(text)) + int(self.append_eos)

    def decode(self, ids: Sequence[int]) -> str:
        """Target ids -> text: stops at the first eos; pad, decoder start and target-language tokens are dropped;
        no leading or trailing whitespace (the text path puts the source's own spacing back, as MarianTokenizer)."""
        kept = self._content_ids(ids)
        if self.vocabulary is None:
            size = self.target.get_piece_size()
            return self.target.decode([i if 0 <= i < size else self.target.unk_id() for i in kept]).strip()
        unknown = self.pieces.get(self.special.unk, self.target.id_to_piece(self.target.unk_id()))
        return self._decode_pieces([self.pieces.get(i, unknown) for i in kept]).strip()

    def readable(self, char: str) -> bool:
        """Whether the model can read this character: its source vocabulary has it (SentencePiece encodes it without
        its unknown piece or byte pieces, byte fallback, and a Marian vocabulary has each piece), and it is none of
        the manifest's `rare_letters`, nor one they become in SentencePiece's NFKC (µ, the micro sign, is μ there)."""
        known = self._readable.get(char)
        if known is None:
            ids = self.source.encode(char)
            known = not any(self.source.is_byte(i) or self.source.is_unknown(i) for i in ids)
            if known and self.vocabulary is not None:
                known = all(piece in self.vocabulary for piece in self.source.encode(char, out_type=str))
            if known and self.rare_letters:
                known = not any(c in self.rare_letters for c in {char, *unicodedata.normalize("NFKC", char)})
            self._readable[char] = known
        return known

    def _piece_ids(self, text: str) -> list[int]:
        if self.vocabulary is None:
            return self._pieces(text)
        vocabulary, unk = self.vocabulary, self.special.unk
        return [vocabulary.get(piece, unk) for piece in self._pieces(text, str)]

    def _pieces(self, text: str, out_type: type = int) -> list:
        """SentencePiece's ids (or pieces) of text; text that is not valid Unicode is the client's to fix."""
        try:
            return self.source.encode(text, out_type=out_type)
        except RuntimeError:  # a lone surrogate: SentencePiece cannot take the string
            raise InvalidRequest("the text is not valid Unicode (it holds a lone surrogate); send UTF-8 text") from None

    def _content_ids(self, ids: Sequence[int]) -> list[int]:
        dropped = {self.special.pad, self.special.decoder_start, *self.target_token_ids.values()}
        kept: list[int] = []
        for token in ids:
            if token == self.special.eos:
                break
            if token not in dropped:
                kept.append(int(token))
        return kept

    def _decode_pieces(self, pieces: list[str]) -> str:
        """The target model joins its pieces; a piece it does not know (a source-only piece of a joint Marian
        vocabulary) is copied as is, so its word-start mark is turned into a space here."""
        text = self.target.decode_pieces(pieces)
        if pieces and pieces[0].startswith(WORD_START) and self.target.piece_to_id(pieces[0]) == self.target.unk_id():
            text = text.removeprefix(WORD_START)
        return text.replace(WORD_START, " ")


def _load_sentencepiece(path: Path) -> spm.SentencePieceProcessor:
    try:
        return spm.SentencePieceProcessor(model_file=str(path))
    except (RuntimeError, OSError) as error:
        raise ModelFolderError(
            f"{path}: not a readable SentencePiece model ({error}); re-export the model folder"
        ) from None


def _check_ids_fit(
    folder: ModelFolder, source: spm.SentencePieceProcessor, vocabulary: dict[str, int] | None
) -> None:
    """Every source id the tokenizer can give is one the model has (else the encoder's first Gather fails on the
    first request that holds it): the SentencePiece model's pieces, or the vocabulary's ids where it has one."""
    spec, size = folder.manifest.tokenizer, folder.manifest.config.src_vocab_size
    if vocabulary is None and source.get_piece_size() > size:
        raise ModelFolderError(
            f"{folder.file(spec.source_model)}: {source.get_piece_size()} pieces, more than the model's {size} source "
            "ids (manifest config.src_vocab_size): not this model's tokenizer"
        )
    largest = max(vocabulary.values(), default=-1) if vocabulary is not None else -1
    if largest >= size:
        raise ModelFolderError(
            f"{folder.file(spec.vocabulary)}: id {largest} is outside the model's {size} source ids "
            "(manifest config.src_vocab_size): not this model's vocabulary"
        )


def _target_token_id(
    token: str, source: spm.SentencePieceProcessor, vocabulary: dict[str, int] | None, folder: Path
) -> int:
    """The id of a target-language token, looked up as one piece; ModelFolderError if the model lacks it."""
    found = vocabulary.get(token) if vocabulary is not None else source.piece_to_id(token)
    if found is None or (vocabulary is None and found == source.unk_id()):
        raise ModelFolderError(
            f"{folder / MANIFEST}: target token {token!r} is not in the model's vocabulary; "
            "fix tokenizer.target_tokens or add the token to the vocabulary"
        )
    return found


def _load_vocabulary(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ModelFolderError(
            f"{path}: not a readable JSON vocabulary ({error}); re-export the model folder"
        ) from None
    if not isinstance(data, dict) or not all(type(v) is int and v >= 0 for v in data.values()):
        raise ModelFolderError(f"{path}: the vocabulary must be a JSON object mapping each piece to an id >= 0")
    return data


def _invert(vocabulary: dict[str, int]) -> dict[int, str]:
    """id -> piece; where two pieces share an id, the first one listed wins."""
    pieces: dict[int, str] = {}
    for piece, token in vocabulary.items():
        pieces.setdefault(token, piece)
    return pieces
