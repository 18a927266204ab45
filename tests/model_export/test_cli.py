"""The offline commands: export and verify succeed on a good checkpoint; bad input ends with one line
on stderr and a non-zero exit status, never a traceback."""

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from model_export.__main__ import EXIT_BAD_INPUT, main
from model_export.corpus.build import Harvest, stats_of
from model_export.corpus.pins import Pin
from model_export.corpus.split import Pair
from service.model.folder import sha256_of


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "model_export", *args], capture_output=True, text=True, timeout=300)


def test_export_then_verify(checkpoint_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "folder"
    assert main(["export", "--checkpoint", str(checkpoint_path), "--out", str(out), "--name", "x"]) == 0
    assert json.loads((out / "manifest.json").read_text())["name"] == "x"
    assert main(["verify", "--checkpoint", str(checkpoint_path), "--model-dir", str(out)]) == 0
    assert "greedy ids equal; beam-4 ids equal" in capsys.readouterr().out


def test_params_of_the_paper_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["params"]) == 0
    assert "44,138,496" in capsys.readouterr().out


def test_missing_checkpoint_is_one_line(tmp_path: Path) -> None:
    result = run_cli("export", "--checkpoint", str(tmp_path / "none.pt"), "--out", str(tmp_path / "o"))
    assert result.returncode == EXIT_BAD_INPUT
    assert result.stderr.strip() == f"error: checkpoint not found: {tmp_path / 'none.pt'}"


def test_not_a_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bogus = tmp_path / "bogus.pt"
    bogus.write_bytes(b"\x00" * 100)
    assert main(["export", "--checkpoint", str(bogus), "--out", str(tmp_path / "o")]) == EXIT_BAD_INPUT
    assert "is not a readable checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda f: (f / "encoder.onnx").unlink(), "encoder.onnx: missing"),
        (lambda f: (f / "decoder_step.onnx").write_bytes(b"corrupt"), "decoder_step.onnx: 7 bytes, the manifest says"),
        (
            lambda f: (f / "manifest.json").write_text(
                (f / "manifest.json").read_text().replace('"d_ff": 64', '"d_ff": 128')
            ),
            "manifest config differs from the checkpoint in: d_ff",
        ),
    ],
)
def test_verify_refuses_a_damaged_folder(
    damage,
    message: str,
    checkpoint_path: Path,
    model_dir: Path,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    folder = Path(shutil.copytree(model_dir, tmp_path / "f"))
    damage(folder)
    result = run_cli("verify", "--checkpoint", str(checkpoint_path), "--model-dir", str(folder))
    assert result.returncode == EXIT_BAD_INPUT
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert message in result.stderr


@pytest.mark.parametrize("command", ["quantize", "half"])
def test_a_derived_variant_refuses_a_graph_that_is_not_onnx(
    command: str, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A garbage encoder.onnx whose checksum was updated with it passes the folder's load; the converters once
    ended in a protobuf traceback."""
    folder = Path(shutil.copytree(model_dir, tmp_path / "f"))
    (folder / "encoder.onnx").write_bytes(b"garbage")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["encoder.onnx"] = {"sha256": sha256_of(folder / "encoder.onnx"), "bytes": 7}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    assert main([command, "--model-dir", str(folder)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.startswith(f"error: {folder / 'encoder.onnx'}: not a valid ONNX graph (Unable to parse proto")
    assert len(err.strip().splitlines()) == 1 and "re-export the model folder" in err
    assert json.loads((folder / "manifest.json").read_text()) == manifest  # nothing written


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["evaluate", "--model-dir", "m", "--batch-size", "0"],
            "argument --batch-size: must be a whole number of at least 1, not 0",
        ),
        (["evaluate", "--model-dir", "m", "--beam-size", "x"], "argument --beam-size: 'x' is not a whole number"),
        (
            ["evaluate", "--model-dir", "m", "--limit", "-1"],
            "argument --limit: must be a whole number of at least 1, not -1",
        ),
        (
            ["evaluate", "--model-dir", "m", "--streams", "0"],
            "argument --streams: must be a whole number of at least 1",
        ),
        (
            ["train", "--corpus", "c", "--tokenizer", "t", "--out", "o", "--max-steps", "-5"],
            "argument --max-steps: must be",
        ),
        (
            ["train", "--corpus", "c", "--tokenizer", "t", "--out", "o", "--warmup-steps", "0"],
            "argument --warmup-steps: must",
        ),
        (
            ["train", "--corpus", "c", "--tokenizer", "t", "--out", "o", "--dropout", "1"],
            "argument --dropout: must be a number from 0",
        ),
        (
            ["train", "--corpus", "c", "--tokenizer", "t", "--out", "o", "--peak-lr=-1e-3"],
            "argument --peak-lr: must be a number above 0",
        ),
        (
            ["verify", "--checkpoint", "c", "--model-dir", "m", "--tolerance", "0"],
            "argument --tolerance: must be a number above 0",
        ),
        (["params", "--vocab", "0"], "argument --vocab: must be a whole number from 1 to 2147483647"),
        (["params", "--vocab", "9" * 20], "argument --vocab: must be a whole number from 1 to 2147483647"),
    ],
)
def test_a_number_out_of_range_is_refused_before_any_work(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse refuses it, naming the option and what it takes, with exit status 2: no model is loaded, no file read
    (the paths given do not exist)."""
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == EXIT_BAD_INPUT
    assert message in capsys.readouterr().err


def test_the_corpus_commands_refuse_numbers_out_of_range(capsys: pytest.CaptureFixture[str]) -> None:
    from model_export.corpus.__main__ import main as corpus_main

    for argv, option in (
        (["tokenizer", "--vocab-size", "0"], "--vocab-size"),
        (["build", "--test-size", "-3"], "--test-size"),
    ):
        with pytest.raises(SystemExit) as stopped:
            corpus_main(argv)
        assert (
            stopped.value.code == 2
            and f"argument {option}: must be a whole number of at least 1" in capsys.readouterr().err
        )


def test_more_streams_than_threads_is_one_line(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["evaluate", "--model-dir", str(model_dir), "--threads", "1", "--streams", "2"]
    assert main(argv) == EXIT_BAD_INPUT
    assert (
        capsys.readouterr().err.strip()
        == "error: --streams 2 needs at least as many --threads (each stream runs on its own)"
    )


def test_a_missing_tokenizer_stops_training_with_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "spm.model"
    result = run_cli("train", "--corpus", str(tmp_path), "--tokenizer", str(missing), "--out", str(tmp_path / "run"))
    assert result.returncode == EXIT_BAD_INPUT and "Traceback" not in result.stderr
    assert (
        result.stderr.strip()
        == f"error: tokenizer not found: {missing} (make it: `python -m model_export.corpus tokenizer`)"
    )
    assert not (tmp_path / "run").exists()  # refused before the run folder was made


def card_inputs(model_dir: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    """A copy of the tiny model's folder, a corpus with its test split, stats and NOTICE, and an evaluation report
    of the folder on that split: what `card` reads."""
    from model_export.evaluate import evaluate
    from tests.factories import SENTENCES

    folder, corpus = Path(shutil.copytree(model_dir, tmp_path / "folder")), tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "test.en").write_text("\n".join(SENTENCES[:6]) + "\n")
    (corpus / "test.fr").write_text("\n".join(SENTENCES[6:12]) + "\n")
    pins = [Pin("deb", "a", "1.0", "apps")]
    splits = {"train": [Pair("x", "y", "a")] * 10, "dev": [Pair("x", "y", "a")] * 2, "test": [Pair("x", "y", "a")] * 6}
    stats = stats_of(pins, Harvest(entries=Counter(a=20)), splits, {})  # what `corpus build` writes
    (corpus / "stats.json").write_text(json.dumps(stats))
    (corpus / "NOTICE").write_text("notice\n")
    report = tmp_path / "fp32-greedy.json"
    report.write_text(json.dumps(evaluate(folder, corpus, threads=1).to_dict()))
    return folder, corpus, report


def test_card_writes_the_folders_readme_from_its_reports(
    checkpoint_path: Path, model_dir: Path, tmp_path: Path
) -> None:
    folder, corpus, report = card_inputs(model_dir, tmp_path)
    argv = ["card", "--model-dir", str(folder), "--checkpoint", str(checkpoint_path), "--corpus", str(corpus)]
    assert main([*argv, "--evaluations", str(report)]) == 0
    card = (folder / "README.md").read_text()
    assert "| fp32 | greedy |" in card and "## Examples" in card and (folder / "NOTICE").read_text() == "notice\n"
    assert "By split and corpus group" not in card  # a report without groups
    general = json.loads(report.read_text())
    general.update(split="test.general", bleu=12.5, groups={"docs": {"sentences": 6, "bleu": 12.5, "chrf": 30.0}})
    (tmp_path / "general.json").write_text(json.dumps(general))
    assert main([*argv, "--evaluations", str(report), str(tmp_path / "general.json")]) == 0
    card = (folder / "README.md").read_text()
    assert "| test.general | docs | 6 | 12.5 | 30.0 |" in card
    assert card.count("| fp32 | greedy |") == 1  # the test split's table holds the test split's reports alone


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda report, corpus: report.unlink(),
            "evaluation report not found: {report} (write one with `evaluate --json`)",
        ),
        (lambda report, corpus: report.write_text("{"), "{report}: not a JSON evaluation report"),
        (
            lambda report, corpus: report.write_text('{"bleu": 1}'),
            "{report}: not an evaluation report of `evaluate --json`: no variant",
        ),
        (lambda report, corpus: (corpus / "stats.json").unlink(), "{corpus}/stats.json: missing"),
        (
            lambda report, corpus: (corpus / "stats.json").write_text('{"pairs": {}}'),
            "{corpus}/stats.json: not the stats `corpus build` writes: no packages, groups, dropped",
        ),
        (
            lambda report, corpus: report.write_text(json.dumps({**json.loads(report.read_text()), "seconds": 0})),
            "{report}: seconds is 0; a report's run takes a positive time",
        ),
        (lambda report, corpus: (corpus.parent / "folder" / "manifest.json").write_text("{"), "not valid JSON"),
    ],
)
def test_card_refuses_what_it_cannot_read_in_one_line(
    damage,
    message: str,
    checkpoint_path: Path,
    model_dir: Path,
    tmp_path: Path,  # noqa: ANN001
) -> None:
    folder, corpus, report = card_inputs(model_dir, tmp_path)
    damage(report, corpus)
    argv = ["card", "--model-dir", str(folder), "--checkpoint", str(checkpoint_path), "--corpus", str(corpus)]
    result = run_cli(*argv, "--evaluations", str(report))
    assert result.returncode == EXIT_BAD_INPUT and "Traceback" not in result.stderr
    assert message.format(report=report, corpus=corpus) in result.stderr
    assert not (folder / "README.md").exists() or "fp32 | greedy" not in (folder / "README.md").read_text()


def test_the_cards_architecture_line_says_what_the_config_says() -> None:
    """The card claimed a shared vocabulary and tied embeddings whatever the model had."""
    from types import SimpleNamespace

    from model_export.card import architecture
    from tests.factories import tiny_config

    shared = architecture(SimpleNamespace(config=tiny_config(96)))
    assert "shared 96-piece SentencePiece vocabulary, output projection tied to the target embeddings" in shared
    separate = architecture(
        SimpleNamespace(config=tiny_config(96, share_embeddings=False, tgt_vocab_size=80, tie_output=False))
    )
    assert "96-piece source and 80-piece target vocabularies, an output projection of its own" in separate


def test_the_cards_data_section_names_the_groups_to_rebuild_and_the_kinds_of_source() -> None:
    from model_export.card import data_section

    pins = [Pin("deb", "a", "1.0", "apps"), Pin("index", "Translation-fr", "f" * 64, "descriptions", "x/y")]
    splits = {name: [Pair("x", "y", "a")] for name in ("train", "dev", "test")}
    splits["test.general"] = [Pair("z", "w", "Translation-fr")]
    text = "\n".join(data_section(stats_of(pins, Harvest(), splits, {})))
    assert "pinned Debian bookworm packages, PyPI wheels and index files of Debian's archive" in text
    assert "groups apps, descriptions), rebuilt offline by `python -m model_export.corpus build --groups " \
        "apps,descriptions`" in text  # fmt: skip
    software_splits = {name: splits[name] for name in ("train", "dev", "test")}
    software = "\n".join(data_section(stats_of(pins[:1], Harvest(), software_splits, {})))
    assert "packages and PyPI wheels (`model_export/corpus/packages.txt`, groups apps), rebuilt offline by " \
        "`python -m model_export.corpus build`." in software  # fmt: skip


def test_the_cards_training_section_says_which_pairs_were_weighed_up() -> None:
    from types import SimpleNamespace

    from model_export.card import training_section

    def section(options: dict) -> str:
        run = SimpleNamespace(provenance={"options": options}, training={"progress": {"step": 3}})
        return "\n".join(training_section(run))

    assert "`train --weigh stories=3,flare-game=2`" in section({"weigh": "stories=3,flare-game=2"})
    assert "weighed" not in section({"weigh": ""}) and "weighed" not in section({})
