"""The training command on a tiny corpus: it trains, evaluates, checkpoints, resumes where it stopped and
writes an averaged final checkpoint that exports and serves."""

import json
from pathlib import Path

import pytest
import torch

from model_export import checkpoint
from model_export.errors import ExportError
from model_export.export import export_folder
from model_export.train import (
    TrainOptions,
    initialised_from,
    learning_rate,
    make_batches,
    pair_copies,
    parse_weights,
    train,
)
from service.model.folder import load_model_folder
from tests.factories import SENTENCES, train_sentencepiece


@pytest.fixture()
def options(tmp_path: Path) -> TrainOptions:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    english, french = SENTENCES[:6] + SENTENCES[12:14], SENTENCES[6:12] + SENTENCES[14:16]
    for split in ("train", "dev"):
        (corpus / f"{split}.en").write_text("\n".join(english) + "\n")
        (corpus / f"{split}.fr").write_text("\n".join(french) + "\n")
    spm = tmp_path / "spm.model"
    spm.write_bytes(train_sentencepiece())
    return TrainOptions(
        corpus=corpus, tokenizer=spm, out=tmp_path / "run", d_model=32, n_heads=4, d_ff=64, n_encoder_layers=2,
        n_decoder_layers=1, batch_tokens=200, warmup_steps=4, max_steps=6, eval_every_minutes=0.0,
        checkpoint_every_minutes=0.0, dev_sentences=4, threads=1,
    )


def test_trains_checkpoints_resumes_and_averages(options: TrainOptions) -> None:
    final = train(options)
    first = checkpoint.load(final)
    progress = first.training["progress"]
    assert progress["step"] == 6 and progress["history"]
    # the English sources hold no letter beyond ASCII: the French side's, in the shared pieces, are rare; in 8
    # lines every letter is held fewer than 1,000 times, but those seen more than once in 100,000 characters are not
    assert {"é", "è"} <= set(first.tokenizer.rare_letters) and "e" not in first.tokenizer.rare_letters
    assert {"dev_loss", "dev_bleu", "dev_chrf"} <= set(progress["history"][-1])
    assert len(list(options.out.glob("step-*.pt"))) <= options.keep_checkpoints
    resumed = checkpoint.load(train(TrainOptions(**{**vars(options), "max_steps": 9})))
    assert resumed.training["progress"]["step"] == 9  # went on from step 6, not from 0
    assert resumed.config == first.config and resumed.config.norm_position == "post"
    assert all(torch.isfinite(t).all() for t in resumed.state_dict.values())
    folder = export_folder(resumed, options.out / "folder", "tiny", "0")
    assert load_model_folder(folder).manifest.tokenizer.rare_letters == first.tokenizer.rare_letters


def test_learning_rate_warms_up_then_decays() -> None:
    opts = TrainOptions(corpus=Path("."), tokenizer=Path("."), out=Path("."), peak_lr=1e-3, warmup_steps=100)
    assert learning_rate(50, opts) == pytest.approx(5e-4)
    assert learning_rate(100, opts) == pytest.approx(1e-3)
    assert learning_rate(400, opts) == pytest.approx(5e-4)


def test_batches_cover_every_pair_once_and_respect_the_token_budget() -> None:
    sources = [[1] * n for n in (3, 9, 4, 12, 5, 7, 2, 8)]
    targets = [[1] * n for n in (4, 8, 3, 11, 6, 7, 2, 9)]
    batches = make_batches(sources, targets, batch_tokens=60, seed=1)
    assert sorted(i for b in batches for i in b) == list(range(8))
    for batch in batches:
        width = max(max(len(sources[i]), len(targets[i])) + 1 for i in batch)
        assert len(batch) == 1 or width * 2 * len(batch) <= 60
    assert batches == make_batches(sources, targets, batch_tokens=60, seed=1)  # same seed, same order


def _built_corpus(corpus: Path, origins: list[str], groups: dict[str, str]) -> None:
    """A corpus as `corpus build` writes it: train.origin and stats.json's package groups."""
    (corpus / "train.origin").write_text("".join(o + "\n" for o in origins))
    (corpus / "stats.json").write_text(json.dumps({"packages": {p: {"group": g} for p, g in groups.items()}}))


def test_weighing_repeats_the_pairs_of_a_named_group_or_package(tmp_path: Path) -> None:
    groups = {"wesnoth": "games", "gimp": "apps", "flare": "quests"}
    _built_corpus(tmp_path, ["wesnoth", "gimp", "flare", "gimp"], groups)
    # a package's weight wins over its group's; unnamed ones keep one copy; only kept lines count
    assert pair_copies(tmp_path, {"games": 3, "quests": 2, "flare": 4}, [0, 1, 2, 3]) == [3, 1, 4, 1]
    assert pair_copies(tmp_path, {"apps": 2}, [1, 2]) == [2, 1]
    assert parse_weights(" stories=3, flare-game=2 ,") == {"stories": 3, "flare-game": 2}
    for bad in ("stories", "stories=0", "stories=x", "=3"):
        with pytest.raises(ExportError, match="NAME=COPIES"):
            parse_weights(bad)
    with pytest.raises(ExportError, match="neither a group nor a package.*its groups: apps, games, quests"):
        pair_copies(tmp_path, {"storeis": 3}, [0])
    (tmp_path / "train.origin").unlink()
    with pytest.raises(ExportError, match="a corpus that `corpus build` wrote"):
        pair_copies(tmp_path, {"games": 3}, [0])


def test_a_weighed_run_trains_on_the_copies(options: TrainOptions, caplog: pytest.LogCaptureFixture) -> None:
    lines = (options.corpus / "train.en").read_text().splitlines()
    _built_corpus(options.corpus, ["a"] * (len(lines) - 1) + ["b"], {"a": "apps", "b": "games"})
    weighed = TrainOptions(**{**vars(options), "weigh": "games=5", "max_steps": 1})
    with caplog.at_level("INFO", logger="model_export.train"):
        final = checkpoint.load(train(weighed))
    assert f"train pairs: {len(lines) + 4}," in caplog.text  # the games pair 5 times
    assert final.provenance["options"]["weigh"] == "games=5"
    with pytest.raises(ExportError, match="neither a group nor a package"):
        train(TrainOptions(**{**vars(options), "weigh": "stories=5", "out": options.out.parent / "other"}))


def test_fine_tunes_from_a_checkpoint_keeping_its_architecture(options: TrainOptions, tmp_path: Path) -> None:
    start = checkpoint.load(train(TrainOptions(**{**vars(options), "max_steps": 2})))
    tuned_opts = TrainOptions(
        **{**vars(options), "out": tmp_path / "tuned", "init": options.out / "final.pt", "d_model": 64,
           "max_steps": 1, "peak_lr": 1e-7, "warmup_steps": 1}
    )
    tuned = checkpoint.load(train(tuned_opts))
    assert tuned.config == start.config  # the checkpoint's size, not --d-model's
    assert tuned.provenance["initialised_from"] == {"checkpoint": str(options.out / "final.pt")}
    assert tuned.training["progress"]["step"] == 1  # a fresh schedule, not the first run's step count
    moved = max(float((tuned.state_dict[k] - v).abs().max()) for k, v in start.state_dict.items())
    assert moved < 1e-4  # one step at lr 1e-7 from the given weights (a fresh model would differ everywhere)


def test_a_fine_tuning_run_resumes_from_its_own_checkpoint_without_reading_init(
    options: TrainOptions, tmp_path: Path
) -> None:
    train(TrainOptions(**{**vars(options), "max_steps": 1}))
    start = tmp_path / "start.pt"
    (options.out / "final.pt").rename(start)
    tuned = {**vars(options), "out": tmp_path / "tuned", "init": start, "max_steps": 1}
    first = checkpoint.load(train(TrainOptions(**tuned)))
    start.unlink()  # gone: a resumed run reads its own last checkpoint, not --init
    initialised_from.cache_clear()  # as in a new process
    resumed = checkpoint.load(train(TrainOptions(**{**tuned, "max_steps": 2})))
    assert resumed.training["progress"]["step"] == 2 and resumed.config == first.config
    assert resumed.provenance["initialised_from"] == first.provenance["initialised_from"]


def test_fine_tuning_refuses_a_checkpoint_of_another_tokenizer(options: TrainOptions, tmp_path: Path) -> None:
    train(TrainOptions(**{**vars(options), "max_steps": 1}))
    other = tmp_path / "other.model"
    other.write_bytes(train_sentencepiece(vocab_size=60))
    with pytest.raises(ExportError, match="another tokenizer"):
        train(TrainOptions(**{**vars(options), "out": tmp_path / "t", "tokenizer": other,
                              "init": options.out / "final.pt"}))
