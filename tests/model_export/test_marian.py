"""Hugging Face Marian (OPUS-MT) checkpoints, both ways. A tiny random MarianMTModel built with transformers at
test time, converted, must give transformers' log-probabilities (PyTorch and ONNX), its greedy and beam ids and
its text through our server; our checkpoints go to the Marian layout and back unchanged. Nothing is downloaded."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm
import torch
from fastapi.testclient import TestClient

from model_export import marian, reference
from model_export.__main__ import EXIT_BAD_INPUT, main
from model_export.errors import ExportError
from model_export.export import export_folder
from service.api.app import create_app
from service.engine.batches import TokenRules, decode_batch
from service.engine.decoding import SearchOptions
from service.engine.kv_cache import DecoderCache
from service.engine.runtime import OnnxRuntime, SessionSettings
from service.model.folder import load_model_folder
from service.settings import Settings
from tests.factories import tiny_checkpoint, train_sentencepiece, write_checkpoint

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore:Recommended. pip install sacremoses")

TEXTS = ["Open the file.", "Save the document as %s.", "The printer is not responding.", "Delete %d items?",
         "Cannot connect to the server.", "Hello world, how are you today?"]


# -- a tiny OPUS-MT-like checkpoint folder ---------------------------------------------------------------------


def marian_vocab(source: bytes, target: bytes, language_tokens: list[str]) -> dict[str, int]:
    """Like OPUS-MT's vocab.json: </s> 0, <unk> 1, the pieces of both SentencePiece models, <pad> last.
    Its ids are not the SentencePiece ids, so the piece -> id mapping is really exercised."""
    pieces = ["</s>", "<unk>"]
    for model in (source, target):
        sp = spm.SentencePieceProcessor(model_proto=model)
        pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i))]
    pieces = list(dict.fromkeys(pieces + language_tokens)) + ["<pad>"]
    return {piece: i for i, piece in enumerate(pieces)}


# std of the random weights, by role: a tied random model copies its previous token forever unless the decoder's
# self-attention and the token embeddings are small; a large FFN makes the next token a random function of the
# previous one, a sharp cross-attention makes every step depend on the source.
WEIGHT_STD = (
    ("layer_norm", 0.1), ("model.shared", 0.3), ("encoder_attn.q_proj", 0.3), ("encoder_attn.k_proj", 0.3),
    ("encoder_attn", 0.2), ("q_proj", 0.1), ("k_proj", 0.1), ("decoder.layers", 0.02, "self_attn"),
    ("self_attn", 0.2), ("", 1.0),
)


def weight_std(name: str) -> float:
    for part, std, *also in WEIGHT_STD:
        if part in name and all(a in name for a in also):
            return std
    raise AssertionError(name)


def randomise(model: torch.nn.Module, vocab: dict[str, int], seed: int) -> None:
    """Random weights (see WEIGHT_STD) and a random logits bias with EOS raised, so that outputs vary in tokens
    and length. Real models never emit <unk> or >>xx<< tokens, which transformers' and our detokenizers join
    differently: made unlikely here."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_positions" in name:
                continue  # the sinusoids: not saved, recomputed by transformers on loading
            noise = weight_std(name) * torch.randn(p.shape, generator=generator)
            p.copy_(noise + 1.0 if "layer_norm.weight" in name else noise)
        bias = 0.2 * torch.randn(model.final_logits_bias.shape, generator=generator)
        bias[0, vocab["</s>"]] += 1.5
        bias[0, [i for piece, i in vocab.items() if piece == "<unk>" or piece.startswith(">>")]] = -10.0
        model.final_logits_bias.copy_(bias)


def make_marian_folder(
    folder: Path, spm_pair: tuple[bytes, bytes], language_tokens: list[str], tokenizer_config: dict, seed: int
) -> Path:
    source, target = spm_pair
    vocab = marian_vocab(source, target, language_tokens)
    pad = vocab["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(vocab), decoder_vocab_size=len(vocab), d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
        max_position_embeddings=128, activation_function="swish", scale_embedding=True, dropout=0.1,
        pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=vocab["</s>"], forced_eos_token_id=vocab["</s>"],
        bad_words_ids=[[pad]], share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
    )  # as OPUS-MT's config.json: swish, scaled and tied embeddings, pad as decoder start, forced EOS, bad words
    torch.manual_seed(seed)
    model = transformers.MarianMTModel(config).eval()
    randomise(model, vocab, seed)
    model.save_pretrained(folder)
    (folder / "source.spm").write_bytes(source)
    (folder / "target.spm").write_bytes(target)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    return folder


def hf_model(folder: Path) -> transformers.MarianMTModel:
    return transformers.MarianMTModel.from_pretrained(folder).eval()


def hf_tokenizer(folder: Path) -> transformers.MarianTokenizer:
    return transformers.MarianTokenizer(
        str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"), source_lang="en"
    )


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    """Tiny models: torch's thread pool only fights the other processes on a small CPU (10x slower here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def spm_pair() -> tuple[bytes, bytes]:
    """OPUS-MT has one SentencePiece model per side and a joint vocabulary: two different models here."""
    return train_sentencepiece(96), train_sentencepiece(72)


@pytest.fixture(scope="module")
def hf_dir(spm_pair: tuple[bytes, bytes], tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hf") / "opus-mt-en-fr"  # languages from the folder name
    return make_marian_folder(folder, spm_pair, [], {"tokenizer_class": "MarianTokenizer"}, seed=3)


@pytest.fixture(scope="module")
def converted(hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("models") / "opus-en-fr"
    assert main(["convert-marian", "--hf-dir", str(hf_dir), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def multilingual_dir(spm_pair: tuple[bytes, bytes], tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hf") / "tiny-en-romance"
    config = {"source_lang": "en", "target_lang": "ROMANCE"}  # OPUS-MT's multilingual models name a group
    return make_marian_folder(folder, spm_pair, [">>fra<<", ">>spa<<"], config, seed=4)


@pytest.fixture(scope="module")
def source_batch(hf_dir: Path) -> dict[str, torch.Tensor]:
    return dict(hf_tokenizer(hf_dir)(TEXTS, return_tensors="pt", padding=True))  # right-padded with <pad>


# -- parity with transformers ----------------------------------------------------------------------------------


def runtime(folder: Path) -> OnnxRuntime:
    return OnnxRuntime(load_model_folder(folder), settings=SessionSettings(intra_op_threads=1))


def onnx_log_probs(runtime: OnnxRuntime, src_ids: np.ndarray, src_mask: np.ndarray, tgt: np.ndarray) -> np.ndarray:
    """Teacher forcing through the server's runtime: the encoder graph once, the step graph per position."""
    memory = runtime.encode(src_ids, src_mask)
    cache = DecoderCache(runtime.n_layers, runtime.n_heads, runtime.head_dim)
    cache.add(memory.keys, memory.values, src_mask)
    steps = []
    for t in range(tgt.shape[1]):
        out = runtime.step(tgt[:, t], cache, full=True)
        steps.append(out.log_probs)
    return np.stack(steps, axis=1)  # (B, T, V)


def test_log_probs_match_transformers(hf_dir: Path, converted: Path, source_batch: dict) -> None:
    model, ours = hf_model(hf_dir), marian.checkpoint_from_marian(hf_dir).build_model()
    src_ids, src_mask = source_batch["input_ids"], source_batch["attention_mask"].bool()
    assert not src_mask.all(), "the batch must hold padded rows"
    tgt = torch.randint(2, model.config.vocab_size - 1, (len(TEXTS), 9), generator=torch.Generator().manual_seed(0))
    tgt[:, 0] = model.config.decoder_start_token_id
    with torch.no_grad():
        expected = model(**source_batch, decoder_input_ids=tgt).logits.log_softmax(-1)  # (B, T, V)
        torch_diff = (ours(src_ids, src_mask, tgt) - expected).abs().max().item()
    served_log_probs = onnx_log_probs(runtime(converted), src_ids.numpy(), src_mask.numpy(), tgt.numpy())  # (B, T, V)
    onnx_diff = np.abs(served_log_probs - expected.numpy()).max()
    assert torch_diff < 1e-4 and onnx_diff < 1e-4, (torch_diff, onnx_diff)


def hf_ids(row: torch.Tensor, eos: int, pad: int) -> list[int]:
    """A generated row without the decoder start, up to its EOS (included), without the padding after it."""
    ids = row[1:].tolist()
    if eos in ids:
        return ids[: ids.index(eos) + 1]
    while ids and ids[-1] == pad:
        ids.pop()
    return ids


def hf_generate(model: transformers.MarianMTModel, batch: dict, beams: int, max_length: int, lp: float) -> list:
    # forced_eos_token_id off: our decoders never force EOS at the length limit (OPUS-MT's configs do; see README)
    out = model.generate(
        **batch, num_beams=beams, max_length=max_length, length_penalty=lp, early_stopping=False, do_sample=False,
        bad_words_ids=[[model.config.pad_token_id]], forced_eos_token_id=None,
    )
    return [hf_ids(row, model.config.eos_token_id, model.config.pad_token_id) for row in out]


def source_rows(batch: dict) -> list[list[int]]:
    """The padded batch's rows as id lists, padding removed."""
    return [ids[mask.bool()].tolist() for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)]


def ours_generate(runtime: OnnxRuntime, batch: dict, beams: int, max_length: int, lp: float, rules: TokenRules) -> list:
    sources = source_rows(batch)
    options = [SearchOptions(beam_size=beams, max_new_tokens=max_length - 1, length_penalty=lp)] * len(sources)
    return [list(hyps[0].tokens) for hyps in decode_batch(runtime, sources, options, rules)]


@pytest.mark.parametrize(("beams", "max_length", "lp"), [(1, 24, 1.0), (4, 24, 1.0), (4, 24, 0.8), (4, 16, 1.5)])
def test_greedy_and_beam_ids_match_generate(
    hf_dir: Path, converted: Path, source_batch: dict, beams: int, max_length: int, lp: float
) -> None:
    model, ids = hf_model(hf_dir), load_model_folder(converted).manifest.special_ids
    expected = hf_generate(model, source_batch, beams, max_length, lp)
    rules = TokenRules(ids.decoder_start, ids.eos, ids.pad)
    got = ours_generate(runtime(converted), source_batch, beams, max_length, lp, rules)
    assert got == expected
    lengths = {len(ids) for ids in expected}
    assert len(lengths) > 1 and any(e[-1] == model.config.eos_token_id for e in expected), "degenerate outputs"


def hf_translate(model: transformers.MarianMTModel, tokenizer: transformers.MarianTokenizer, texts: list[str]) -> list:
    """transformers' greedy translations, each sentence cut at the server's default cap (MT_MAX_OUTPUT_TOKENS,
    MT_MAX_OUTPUT_RATIO): greedy ids do not depend on the cap, so one batch run to the largest cap gives them all."""
    batch = dict(tokenizer(texts, return_tensors="pt", padding=True))
    default = Settings()
    lengths = batch["attention_mask"].sum(1).tolist()
    caps = [min(default.max_output_tokens, int(default.max_output_ratio * n) + 10) for n in lengths]
    rows = hf_generate(model, batch, 1, max(caps) + 1, 1.0)
    return [tokenizer.decode(row[:cap], skip_special_tokens=True) for row, cap in zip(rows, caps, strict=True)]


def served(texts: list[str]) -> list[str]:
    """MarianTokenizer strips the text it decodes; our detokenizer keeps the spaces of leading or trailing
    word-start pieces (deviation reported, not fixed here: service/model/tokenizer.py)."""
    return [text.strip() for text in texts]


def test_translate_gives_transformers_text(hf_dir: Path, converted: Path) -> None:
    model, tokenizer = hf_model(hf_dir), hf_tokenizer(hf_dir)
    expected = hf_translate(model, tokenizer, TEXTS)
    # greedy as transformers decodes it: no guard's retry with beams of the random model's loops (MT_GUARDS)
    settings = Settings(models_dir=converted.parent, models=[converted.name], intra_op_threads=1, guards=False)
    with TestClient(create_app(settings)) as client:
        body = client.post("/translate", json={"q": TEXTS, "source": "en", "target": "fr"}).json()
    assert served(body["translatedText"]) == expected
    assert len(set(expected)) == len(expected) and all(expected)


def test_multilingual_target_tokens_are_reached_through_target(multilingual_dir: Path, tmp_path: Path) -> None:
    checkpoint = marian.checkpoint_from_marian(multilingual_dir)
    assert checkpoint.target_languages == ["fr", "es"]
    assert checkpoint.tokenizer.target_tokens == {"fr": ">>fra<<", "es": ">>spa<<"}
    folder = export_folder(checkpoint, tmp_path / "en-romance", "en-romance", "1.0.0")
    model, tokenizer = hf_model(multilingual_dir), hf_tokenizer(multilingual_dir)
    settings = Settings(models_dir=tmp_path, models=[folder.name], intra_op_threads=1, guards=False)  # greedy as HF
    with TestClient(create_app(settings)) as client:
        assert client.get("/languages").json()[0] == {"code": "en", "name": "English", "targets": ["es", "fr"]}
        answers = {
            code: client.post("/translate", json={"q": TEXTS, "source": "en", "target": code}).json()["translatedText"]
            for code in ("fr", "es")
        }
    assert served(answers["fr"]) == hf_translate(model, tokenizer, [f">>fra<< {text}" for text in TEXTS])
    assert served(answers["es"]) == hf_translate(model, tokenizer, [f">>spa<< {text}" for text in TEXTS])
    assert answers["fr"] != answers["es"]


# -- ours -> Marian -> ours -------------------------------------------------------------------------------------

MARIAN_EXPRESSIBLE = {"norm_position": "post", "sinusoid_layout": "half", "layer_norm_eps": 1e-5}


@pytest.fixture(scope="module")
def spm_model() -> bytes:
    return train_sentencepiece()


@pytest.mark.parametrize(
    "changes",
    [
        {"activation": "swish"},  # tiny_checkpoint: shared embeddings, untied output, logits bias
        {"activation": "relu", "tie_output": True, "output_bias": False},  # the training run's config
        {"activation": "gelu", "share_embeddings": False, "attention_bias": False, "scale_embeddings": False},
    ],
)
def test_round_trip_is_lossless_and_transformers_runs_our_weights(
    spm_model: bytes, tmp_path: Path, changes: dict
) -> None:
    ours = tiny_checkpoint(spm_model, **MARIAN_EXPRESSIBLE, **changes)
    path, hf_folder = write_checkpoint(ours, tmp_path / "ck.pt"), tmp_path / "hf"
    assert main(["to-marian", "--checkpoint", str(path), "--out", str(hf_folder)]) == 0
    back = marian.checkpoint_from_marian(hf_folder)
    assert back.config == ours.config
    assert sorted(back.state_dict) == sorted(ours.state_dict)
    for name, tensor in ours.state_dict.items():
        assert back.state_dict[name].dtype == tensor.dtype and torch.equal(back.state_dict[name], tensor), name
    assert (back.source_language, back.target_languages) == (ours.source_language, ours.target_languages)

    # transformers runs exactly our weights: same log-probabilities, same greedy ids with its generation_config
    model, tokenizer = hf_model(hf_folder), hf_tokenizer(hf_folder)
    sp = spm.SentencePieceProcessor(model_proto=spm_model)
    batch = tokenizer(TEXTS, return_tensors="pt", padding=True)
    assert source_rows(batch) == [sp.encode(text) + [ours.config.eos_id] for text in TEXTS]
    src_ids, src_mask = batch["input_ids"], batch["attention_mask"].bool()
    tgt = torch.randint(4, ours.config.tgt_vocab_size, (len(TEXTS), 7), generator=torch.Generator().manual_seed(1))
    tgt[:, 0] = ours.config.decoder_start_id
    mine = ours.build_model()
    with torch.no_grad():
        diff = (model(**batch, decoder_input_ids=tgt).logits.log_softmax(-1) - mine(src_ids, src_mask, tgt)).abs().max()
        generated = model.generate(**batch, max_new_tokens=12, num_beams=1, do_sample=False)
    assert diff < 1e-4, diff
    eos, pad = ours.config.eos_id, ours.config.pad_id
    assert [hf_ids(row, eos, pad) for row in generated] == reference.greedy(mine, src_ids, src_mask, 12)


# -- bad input: one line, exit status 2 ---------------------------------------------------------------------------


def edit_json(path: Path, **changes: object) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}), encoding="utf-8")


def test_languages_from_the_command_line_win(hf_dir: Path, multilingual_dir: Path) -> None:
    ours = marian.checkpoint_from_marian(hf_dir, "de", ["it"])
    assert (ours.source_language, ours.target_languages, ours.tokenizer.target_tokens) == ("de", ["it"], {})
    ours = marian.checkpoint_from_marian(multilingual_dir, None, ["fra", "es"])  # either ISO 639 form
    assert ours.tokenizer.target_tokens == {"fra": ">>fra<<", "es": ">>spa<<"}


@pytest.mark.parametrize(
    ("damage", "args", "message"),
    [
        (lambda f: shutil.rmtree(f), [], "Marian checkpoint folder not found"),
        (lambda f: (f / "vocab.json").unlink(), [], "vocab.json: missing"),
        (lambda f: (f / "model.safetensors").unlink(), [], "no weights (model.safetensors or pytorch_model.bin)"),
        (lambda f: edit_json(f / "config.json", activation_function="gelu_new"), [],
         "activation_function 'gelu_new' is not supported (supported: swish, silu, relu, gelu)"),
        (lambda f: edit_json(f / "config.json", normalize_before=True), [], "normalize_before True is not what"),
        (lambda f: edit_json(f / "config.json", d_model=48), [], "model.shared.weight) has shape (95, 32), the config"),
        (lambda f: f.rename(f.with_name("tiny")), [], "cannot tell the source language; pass --source-language"),
        (lambda f: None, ["--target-languages", "fr,es"], "translates into one language; got fr,es"),
        (lambda f: (f / "tokenizer_config.json").write_text('{"target_lang": ["fr"]}'), [],
         "tokenizer_config.json: target_lang is ['fr'], not a language code"),
    ],
)
def test_convert_marian_refuses_bad_input(
    hf_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], damage, args: list, message: str  # noqa: ANN001
) -> None:
    folder = Path(shutil.copytree(hf_dir, tmp_path / "opus-mt-en-fr"))
    damage(folder)
    hf = folder if folder.exists() else folder.with_name("tiny")
    assert main(["convert-marian", "--hf-dir", str(hf), "--out", str(tmp_path / "out"), *args]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "out").exists()


def test_a_missing_target_token_is_refused(multilingual_dir: Path) -> None:
    with pytest.raises(ExportError, match=r"no target-language token for 'de' \(the vocabulary has >>fra<<, >>spa<<\)"):
        marian.checkpoint_from_marian(multilingual_dir, None, ["fr", "de"])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"norm_position": "pre"}, "norm_position 'pre' (transformers' Marian is post-norm only)"),
        ({"sinusoid_layout": "interleaved"}, "sinusoid_layout 'interleaved'"),
        ({"layer_norm_eps": 1e-6}, "layer_norm_eps 1e-06"),
    ],
)
def test_to_marian_refuses_what_marian_cannot_express(
    spm_model: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str], changes: dict, message: str
) -> None:
    path = write_checkpoint(tiny_checkpoint(spm_model, **{**MARIAN_EXPRESSIBLE, **changes}), tmp_path / "ck.pt")
    assert main(["to-marian", "--checkpoint", str(path), "--out", str(tmp_path / "hf")]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err, err
    assert not (tmp_path / "hf").exists()


def test_to_marian_without_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "none.pt"
    assert main(["to-marian", "--checkpoint", str(missing), "--out", str(tmp_path / "hf")]) == EXIT_BAD_INPUT
    assert capsys.readouterr().err.strip() == f"error: checkpoint not found: {missing}"
