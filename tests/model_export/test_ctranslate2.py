"""to-ctranslate2: CTranslate2 runs exactly our weights: the same token log-probabilities (1e-4) and the
same greedy ids as the PyTorch reference, for post-norm and pre-norm configs."""

from pathlib import Path

import numpy as np
import pytest
import torch

from model_export import reference
from model_export.__main__ import EXIT_BAD_INPUT, main
from model_export.ctranslate2_export import to_ctranslate2
from model_export.verify import random_sources
from tests.factories import tiny_checkpoint

ctranslate2 = pytest.importorskip("ctranslate2")
CONFIGS = {
    "post-norm": {},
    "pre-norm": {"norm_position": "pre", "activation": "gelu", "sinusoid_layout": "half"},
    "swish, no attention bias": {"activation": "swish", "attention_bias": False, "layer_norm_eps": 1e-5},
}


@pytest.mark.parametrize("changes", CONFIGS.values(), ids=CONFIGS.keys())
def test_ctranslate2_runs_exactly_our_weights(spm_model: bytes, tmp_path: Path, changes: dict) -> None:
    ckpt = tiny_checkpoint(spm_model, **changes)
    folder = to_ctranslate2(ckpt, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(folder), compute_type="float32", intra_threads=1)
    model, cfg = ckpt.build_model(), ckpt.config
    src_ids, src_mask = random_sources(cfg, 4, 8, np.random.default_rng(3))
    vocab = __import__("sentencepiece").SentencePieceProcessor(model_proto=spm_model)
    tokens = [[vocab.id_to_piece(int(i)) for i in row[mask]] for row, mask in zip(src_ids, src_mask, strict=True)]
    expected = reference.greedy(model, src_ids, src_mask, 12)
    results = translator.translate_batch(
        tokens, beam_size=1, max_decoding_length=12, min_decoding_length=0, return_scores=False
    )
    got = [[vocab.piece_to_id(p) for p in r.hypotheses[0]] for r in results]
    assert got == [[t for t in ids if t != cfg.eos_id] for ids in expected]
    for row, ids in enumerate(expected):  # token log-probabilities of the reference's own output
        scored = translator.score_batch([tokens[row]], [[vocab.id_to_piece(t) for t in ids if t != cfg.eos_id]])
        tgt = torch.tensor([[cfg.decoder_start_id] + ids])
        with torch.no_grad():
            log_probs = model(
                src_ids[row : row + 1, : len(tokens[row])], src_mask[row : row + 1, : len(tokens[row])], tgt[:, :-1]
            )[0]
        ours = [float(log_probs[t, tok]) for t, tok in enumerate(ids)]
        assert np.abs(np.array(scored[0].log_probs[: len(ours)]) - np.array(ours)).max() < 1e-4


def test_cli_and_bad_input(checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["to-ctranslate2", "--checkpoint", str(checkpoint_path), "--out", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / "model.bin").is_file()
    assert main(["to-ctranslate2", "--checkpoint", str(tmp_path / "no.pt"), "--out", str(tmp_path / "d")]) == 2
    assert "checkpoint not found" in capsys.readouterr().err
    assert EXIT_BAD_INPUT == 2
