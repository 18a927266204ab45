"""The tokenizer follows the manifest alone: SentencePiece ids, or a Marian-style vocabulary with target-language
tokens; decoding undoes encoding for text of the model's domain, and a bad tokenizer file names itself."""

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import sentencepiece as spm

from service.errors import InvalidRequest, ModelFolderError
from service.model.folder import MANIFEST, ModelFolder, load_model_folder, sha256_of
from service.model.tokenizer import Tokenizer
from tests.factories import SENTENCES, train_sentencepiece

PAD, DECODER_START, EOS, UNK = 0, 2, 3, 1  # the tiny model's special ids (tests/factories.py)
MARIAN = {"pad": 95, "decoder_start": 95, "eos": 0, "unk": 1}  # Marian: </s> first, the pad last and the start
DROPPED = "▁fi"  # a piece of the SentencePiece model the Marian vocabulary below leaves out


def rewrite(
    folder: Path, tokenizer: dict[str, Any], files: dict[str, bytes], special: dict[str, int] | None = None
) -> ModelFolder:
    """The folder with new tokenizer files and manifest fields, loaded as the server loads it."""
    manifest = json.loads((folder / MANIFEST).read_text())
    for name, content in files.items():
        (folder / name).write_bytes(content)
        manifest["files"][name] = {"sha256": sha256_of(folder / name), "bytes": len(content)}
    manifest["tokenizer"].update(tokenizer)
    if special:
        manifest["special_ids"] = special
        manifest["config"].update({f"{role}_id": token for role, token in special.items()})
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return load_model_folder(folder)


def marian_vocabulary(spm_model: bytes) -> dict[str, int]:
    """Specials first, then the SentencePiece pieces in shuffled order (less one), then the pad: ids that are
    not the SentencePiece ids, as in an OPUS-MT vocab.json."""
    processor = spm.SentencePieceProcessor(model_proto=spm_model)
    pieces = [
        processor.id_to_piece(i) for i in range(4, processor.get_piece_size()) if processor.id_to_piece(i) != DROPPED
    ]
    random.Random(7).shuffle(pieces)
    vocabulary = {"</s>": 0, "<unk>": 1, ">>fra<<": 2, ">>spa<<": 3} | {p: 4 + i for i, p in enumerate(pieces)}
    return vocabulary | {"<pad>": MARIAN["pad"]}


@pytest.fixture()
def folder(model_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model_dir, tmp_path / "model"))


@pytest.fixture(scope="module")
def processor(spm_model: bytes) -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_proto=spm_model)


@pytest.fixture()
def plain(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_folder(load_model_folder(model_dir))


@pytest.fixture()
def marian_folder(folder: Path, spm_model: bytes) -> ModelFolder:
    vocabulary = json.dumps(marian_vocabulary(spm_model)).encode()
    tokenizer = {
        "source_model": "source.spm",
        "target_model": "target.spm",
        "vocabulary": "vocab.json",
        "target_tokens": {"fr": ">>fra<<", "es": ">>spa<<"},
    }
    files = {"source.spm": spm_model, "target.spm": spm_model, "vocab.json": vocabulary}
    return rewrite(folder, tokenizer, files, MARIAN)


@pytest.fixture()
def marian(marian_folder: ModelFolder) -> Tokenizer:
    return Tokenizer.from_folder(marian_folder)


# Without a vocabulary: the SentencePiece ids


def test_encode_gives_the_sentencepiece_ids_and_eos(plain: Tokenizer, processor: spm.SentencePieceProcessor) -> None:
    assert plain.encode("Open the file.") == processor.encode("Open the file.") + [EOS]
    assert plain.encode("") == [EOS]


def test_no_eos_when_the_manifest_says_so(folder: Path, processor: spm.SentencePieceProcessor) -> None:
    tokenizer = Tokenizer.from_folder(rewrite(folder, {"append_eos": False}, {}))
    assert tokenizer.encode("Open the file.") == processor.encode("Open the file.")
    assert tokenizer.count("Open the file.") == len(processor.encode("Open the file."))


@pytest.mark.parametrize("text", SENTENCES)
def test_round_trip(plain: Tokenizer, text: str) -> None:
    ids = plain.encode(text)
    assert ids[-1] == EOS
    assert plain.decode(ids[:-1]) == text
    assert plain.decode(ids) == text
    assert plain.count(text) == len(ids)


def test_text_with_a_lone_surrogate_is_refused(plain: Tokenizer) -> None:
    with pytest.raises(InvalidRequest, match="not valid Unicode"):
        plain.encode("a\ud800b")
    with pytest.raises(InvalidRequest, match="not valid Unicode"):
        plain.count("a\ud800b")


def test_decode_stops_at_the_first_eos_and_drops_specials(plain: Tokenizer) -> None:
    hello, file = plain.encode("Hello world")[:-1], plain.encode("Open the file.")[:-1]
    assert plain.decode([DECODER_START, *hello, PAD, EOS, *file]) == "Hello world"
    assert plain.decode([EOS, *hello]) == ""
    assert plain.decode([]) == ""


def test_unknown_and_out_of_range_ids_decode_as_unknown(plain: Tokenizer) -> None:
    assert plain.decode([UNK]) == "⁇"
    assert plain.decode([10_000]) == "⁇"


def test_a_target_token_must_be_a_piece_of_the_model(folder: Path) -> None:
    with pytest.raises(ModelFolderError, match=r"manifest.json: target token '>>fra<<' is not in the model's voc"):
        Tokenizer.from_folder(rewrite(folder, {"target_tokens": {"fr": ">>fra<<"}}, {}))


# With a Marian-style vocabulary


def test_vocabulary_ids_replace_sentencepiece_ids(marian: Tokenizer, processor: spm.SentencePieceProcessor) -> None:
    vocabulary = marian.vocabulary or {}
    pieces = processor.encode("Hello world", out_type=str)
    assert marian.encode("Hello world") == [vocabulary[p] for p in pieces] + [MARIAN["eos"]]
    assert marian.encode("Hello world") != processor.encode("Hello world") + [MARIAN["eos"]]


def test_target_language_token_is_prefixed(marian: Tokenizer) -> None:
    body = marian.encode("Hello world")
    assert marian.encode("Hello world", "fr") == [2, *body]
    assert marian.encode("Hello world", "es") == [3, *body]
    assert marian.encode("Hello world", "de") == body  # no token for that language: the API layer refuses it


def test_count_matches_encode(marian: Tokenizer) -> None:
    for text in ["", "Hello world", "Le renard brun saute."]:
        assert marian.count(text, "fr") == len(marian.encode(text, "fr"))
        assert marian.count(text) == len(marian.encode(text, "fr"))  # no language: the most any gives


def test_pieces_missing_from_the_vocabulary_are_unknown(
    marian: Tokenizer, processor: spm.SentencePieceProcessor
) -> None:
    assert DROPPED in processor.encode("the file", out_type=str)
    assert MARIAN["unk"] in marian.encode("the file")
    assert MARIAN["unk"] in marian.encode("😀")  # not a piece of the SentencePiece model either


@pytest.mark.parametrize("text", SENTENCES)
def test_vocabulary_round_trip(marian: Tokenizer, processor: spm.SentencePieceProcessor, text: str) -> None:
    ids = marian.encode(text, "fr")
    if DROPPED in processor.encode(text, out_type=str):
        assert " ⁇ " in marian.decode(ids)
    else:
        assert marian.decode(ids) == text  # the target token and eos are dropped


def test_vocabulary_decode_drops_pad_start_and_language_tokens(marian: Tokenizer) -> None:
    body = marian.encode("Hello world", "es")[1:-1]
    assert marian.decode([MARIAN["decoder_start"], 3, *body, MARIAN["eos"], *body]) == "Hello world"
    assert marian.decode([MARIAN["unk"], 10_000]) == "⁇  ⁇"


def test_a_source_only_piece_decodes_with_its_space(folder: Path, spm_model: bytes) -> None:
    vocabulary = {piece: i for piece, i in marian_vocabulary(spm_model).items() if i != 94} | {"▁Xylo": 94}
    files = {"vocab.json": json.dumps(vocabulary).encode()}  # (ids within the model's 96: the loader refuses others)
    tokenizer = Tokenizer.from_folder(rewrite(folder, {"vocabulary": "vocab.json"}, files, MARIAN))
    the = tokenizer.encode("the")[:-1]
    assert 94 not in the and tokenizer.decode([94, *the, 94]) == "Xylo the Xylo"


def test_separate_target_model_decodes(folder: Path, spm_model: bytes) -> None:
    target_model = train_sentencepiece(vocab_size=80)
    target = spm.SentencePieceProcessor(model_proto=target_model)
    files = {"source.spm": spm_model, "target.spm": target_model}
    tokenizer = Tokenizer.from_folder(
        rewrite(folder, {"source_model": "source.spm", "target_model": "target.spm"}, files)
    )
    assert tokenizer.decode(target.encode("Bonjour le monde")) == "Bonjour le monde"
    assert tokenizer.encode("Bonjour") == spm.SentencePieceProcessor(model_proto=spm_model).encode("Bonjour") + [EOS]


# A bad tokenizer file names itself


def test_the_manifests_rare_letters_are_not_read(folder: Path, plain: Tokenizer) -> None:
    """format 9: a letter of `tokenizer.rare_letters`, and a character SentencePiece reads as one (NFKC: the roman
    numeral ⅰ is i), is one the model cannot read, though its vocabulary has it; the others it reads as before."""
    assert plain.readable("é") and plain.readable("i") and plain.readable("ⅰ")
    rare = Tokenizer.from_folder(rewrite(folder, {"rare_letters": "éi"}, {}))
    assert not rare.readable("é") and not rare.readable("i") and not rare.readable("ⅰ")
    assert rare.readable("è") and rare.readable("a") and rare.encode("été") == plain.encode("été")


def test_corrupt_sentencepiece_model(folder: Path) -> None:
    bad = rewrite(folder, {}, {"spm.model": b"\x08\x01 not a model"})
    with pytest.raises(ModelFolderError, match=r"spm.model: not a readable SentencePiece model .*re-export"):
        Tokenizer.from_folder(bad)


def test_corrupt_target_model(folder: Path, spm_model: bytes) -> None:
    files = {"source.spm": spm_model, "target.spm": b"garbage"}
    bad = rewrite(folder, {"source_model": "source.spm", "target_model": "target.spm"}, files)
    with pytest.raises(ModelFolderError, match=r"target.spm: not a readable SentencePiece model"):
        Tokenizer.from_folder(bad)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"{not json", r"vocab.json: not a readable JSON vocabulary"),
        (b"\xff\xfe", r"vocab.json: not a readable JSON vocabulary"),
        (b'["</s>", "<unk>"]', r"vocab.json: the vocabulary must be a JSON object mapping each piece to an id >= 0"),
        (b'{"</s>": "0"}', r"vocab.json: the vocabulary must be a JSON object mapping each piece to an id >= 0"),
    ],
)
def test_bad_vocabulary(folder: Path, content: bytes, message: str) -> None:
    bad = rewrite(folder, {"vocabulary": "vocab.json"}, {"vocab.json": content})
    with pytest.raises(ModelFolderError, match=message):
        Tokenizer.from_folder(bad)


def test_target_token_missing_from_the_vocabulary(folder: Path, spm_model: bytes) -> None:
    files = {"vocab.json": json.dumps(marian_vocabulary(spm_model)).encode()}
    bad = rewrite(folder, {"vocabulary": "vocab.json", "target_tokens": {"de": ">>deu<<"}}, files, MARIAN)
    with pytest.raises(
        ModelFolderError, match="target token '>>deu<<' is not in the model's vocabulary; fix tokenizer"
    ):
        Tokenizer.from_folder(bad)


def test_more_pieces_than_the_model_has_ids_is_refused(folder: Path) -> None:
    """A source id the model lacks would fail the first request in the encoder's Gather: the loader refuses it."""
    manifest = json.loads((folder / MANIFEST).read_text())
    manifest["config"]["src_vocab_size"] = 50  # the tiny model's SentencePiece model has 96 pieces
    (folder / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ModelFolderError, match=r"spm\.model: 96 pieces, more than the model's 50 source ids"):
        Tokenizer.from_folder(load_model_folder(folder))


def test_a_vocabulary_id_outside_the_model_is_refused(folder: Path, spm_model: bytes) -> None:
    vocabulary = {**marian_vocabulary(spm_model), "▁beyond": 96}  # the tiny model has ids 0-95
    tokenizer = {"vocabulary": "vocab.json"}
    with pytest.raises(ModelFolderError, match=r"vocab\.json: id 96 is outside the model's 96 source ids"):
        Tokenizer.from_folder(rewrite(folder, tokenizer, {"vocab.json": json.dumps(vocabulary).encode()}, MARIAN))
