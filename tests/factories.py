"""Tiny models built at test time: a SentencePiece model trained on a few sentences and a randomly
initialised Transformer around it, packed as a checkpoint. No network, no shipped weights."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import sentencepiece as spm
import torch
from onnx import numpy_helper

from model_export.checkpoint import Checkpoint, TokenizerFiles, save
from model_export.config import TransformerConfig
from model_export.model import Transformer

SENTENCES = [
    "Open the file.", "Save the document as %s.", "The printer is not responding.",
    "Delete %d items?", "Cannot connect to the server.", "Select a color for the background.",
    "Ouvrir le fichier.", "Enregistrer le document sous %s.", "L'imprimante ne répond pas.",
    "Supprimer %d éléments ?", "Impossible de se connecter au serveur.", "Choisissez une couleur de fond.",
    "Hello world, how are you today?", "Bonjour le monde, comment allez-vous aujourd'hui ?",
    "The quick brown fox jumps over the lazy dog.", "Le renard brun saute par-dessus le chien paresseux.",
    "Settings were saved successfully.", "Les paramètres ont été enregistrés.",
    "An unknown error occurred while reading {name}.", "Une erreur inconnue est survenue lors de la lecture.",
]


def train_sentencepiece(vocab_size: int = 96) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SENTENCES * 4), model_writer=model, vocab_size=vocab_size,
        model_type="unigram", pad_id=0, unk_id=1, bos_id=2, eos_id=3, character_coverage=1.0,
        hard_vocab_limit=False, minloglevel=2, num_threads=1,
    )
    return model.getvalue()


def tiny_config(vocab_size: int, **changes: object) -> TransformerConfig:
    cfg = TransformerConfig(
        src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, d_model=32, n_heads=4, d_ff=64,
        n_encoder_layers=2, n_decoder_layers=2, dropout=0.0, share_embeddings=True, max_positions=256,
    )
    return replace(cfg, **changes)


def tiny_checkpoint(spm_model: bytes, seed: int = 1, eos_bias: float = 5.0, **changes: object) -> Checkpoint:
    """A random model whose greedy outputs vary in length: an untied output projection (a tied one
    makes random models repeat one token forever) and a logits bias that makes EOS a contender."""
    vocab = spm.SentencePieceProcessor(model_proto=spm_model).get_piece_size()
    cfg = tiny_config(vocab, **{"tie_output": False, "output_bias": True, **changes})
    torch.manual_seed(seed)
    model = Transformer(cfg)
    with torch.no_grad():
        if not cfg.tie_output:
            torch.nn.init.normal_(model.generator.proj.weight, std=0.5)
        if model.generator.logits_bias is not None:
            model.generator.logits_bias[cfg.eos_id] = eos_bias
    tokenizer = TokenizerFiles(files={"spm.model": spm_model}, source_model="spm.model", target_model="spm.model")
    return Checkpoint(cfg, model.state_dict(), tokenizer, "en", ["fr"], {"name": "tiny-en-fr", "origin": "random init"})


def write_checkpoint(checkpoint: Checkpoint, path: Path) -> Path:
    save(checkpoint, path)
    return path


# An int8 variant's graphs whose products are MatMulIntegerToFloat over per-row activation codes
# (model_export.quantize.to_per_row_products; the one-row graph's are MatMulNBits)
DYNAMIC_INT8_GRAPHS = ("encoder", "decoder_step", "decoder_step_ragged", "decoder_step_dense")


def product_weights(graph: Path) -> dict[str, np.ndarray]:
    """An int8 graph's products' weights (MatMulIntegerToFloat's constant second input), by name: (K, N) int8 each."""
    model = onnx.load(graph, load_external_data=False)
    constants = {t.name: t for t in model.graph.initializer}
    names = [node.input[1] for node in model.graph.node if node.op_type == "MatMulIntegerToFloat"]
    return {name: numpy_helper.to_array(constants[name]) for name in names}


def add_tiny_shortlist(folder: Path, corpus: Path) -> None:
    """A shortlist of 64 candidates (of the tiny tokenizer's 96 ids) learned from a parallel corpus of SENTENCES
    written into `corpus`, and its shortlist step graphs, added to the folder."""
    from model_export.shortlist import add_shortlist, learn_from_corpus

    english, french = SENTENCES[0:6] + SENTENCES[12:13], SENTENCES[6:12] + SENTENCES[13:14]
    (corpus / "train.en").write_text("\n".join(english * 3) + "\n", encoding="utf-8")
    (corpus / "train.fr").write_text("\n".join(french * 3) + "\n", encoding="utf-8")
    lists = learn_from_corpus(folder, corpus, per_source=6, always=8, min_count=2, most=None)
    add_shortlist(folder, lists, 64, {"corpus": "tests"})
