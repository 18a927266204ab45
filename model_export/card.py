"""Writes a model folder's card (README.md) and NOTICE from what was measured: the corpus statistics, the
training history kept in the checkpoint, the evaluation reports, the calibration report and the parameter count.
Knows file layouts; computes nothing it reports.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from model_export.checkpoint import Checkpoint
from model_export.errors import ExportError
from model_export.export import variant_files
from model_export.model import Transformer
from service.model import load_model_folder


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def parameter_count(checkpoint: Checkpoint) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in Transformer(checkpoint.config).parameters())


def architecture(checkpoint: Checkpoint) -> str:
    """The model in one line, each claim read from its config."""
    c = checkpoint.config
    vocabulary = (
        f"shared {c.src_vocab_size:,}-piece SentencePiece vocabulary"
        if c.share_embeddings
        else f"{c.src_vocab_size:,}-piece source and {c.tgt_vocab_size:,}-piece target vocabularies"
    )
    output = "output projection tied to the target embeddings" if c.tie_output else "an output projection of its own"
    return (
        f"{c.norm_position}-norm Transformer, d_model {c.d_model}, {c.n_heads} heads, d_ff {c.d_ff}, "
        f"{c.n_encoder_layers} encoder + {c.n_decoder_layers} decoder layers, {c.activation}, "
        f"{c.sinusoid_layout} sinusoids, {vocabulary}, {output}, {parameter_count(checkpoint):,} parameters"
    )


def data_section(stats: dict) -> list[str]:
    pairs = stats["pairs"]
    splits = [split for split in pairs if split in ("train", "dev", "test") or pairs[split]]
    extra = [split for split in splits if split not in ("train", "dev", "test")]
    general = "".join(f", {pairs[split]:,} {split}" for split in extra)
    groups_flag = f" --groups {','.join(sorted(stats['groups']))}" if extra else ""
    kinds = {entry.get("kind", "deb") for entry in stats["packages"].values()}
    sources = (
        "Debian bookworm packages, PyPI wheels and index files of Debian's archive"
        if "index" in kinds
        else "Debian bookworm packages and PyPI wheels"
    )
    lines = [
        "## Data",
        "",
        f"{sum(pairs.values()):,} English→French pairs ({pairs['train']:,} train, {pairs['dev']:,} dev, "
        f"{pairs['test']:,} test{general}) from the French translations of {len(stats['packages'])} pinned "
        f"{sources} (`model_export/corpus/packages.txt`, groups {', '.join(sorted(stats['groups']))}), rebuilt "
        f"offline by `python -m model_export.corpus build{groups_flag}`. Dev and test were held out after grouping "
        "on a normalised source (lower case, no punctuation, placeholders masked), so near-identical strings cannot "
        "leak.",
        "",
        _row("group", *splits),
        _row("---", *["---:" for _ in splits]),
    ]
    for group, counts in sorted(stats["groups"].items(), key=lambda kv: -kv[1]["train"]):
        lines.append(_row(group, *[f"{counts.get(split, 0):,}" for split in splits]))
    dropped = ", ".join(f"{reason} {n:,}" for reason, n in sorted(stats["dropped"].items(), key=lambda kv: -kv[1]))
    lines += ["", f"Dropped while cleaning: {dropped}.", "", "Licences of the sources: `NOTICE` and `licenses/`.", ""]
    return lines


def base_model(checkpoint: Checkpoint) -> str:
    """The model a fine-tuned checkpoint started from, as `train` recorded it."""
    init = checkpoint.provenance["initialised_from"]
    if isinstance(init, str):  # a path alone
        init = {"checkpoint": init}
    if "model" in init:
        return f"the weights of {init['model']} (rebuilt from its folder by `from-folder`)"
    return f"the checkpoint `{Path(init['checkpoint']).name}`"


def weighing(options: dict) -> str:
    """The sentence that says which training pairs `train --weigh` repeated, or nothing."""
    weigh = options.get("weigh", "")
    if not weigh:
        return ""
    return (
        f" Some groups and packages were weighed up (`train --weigh {weigh}`): each of their training pairs came that"
        " many times in every pass over the data."
    )


def training_section(checkpoint: Checkpoint) -> list[str]:
    progress = checkpoint.training.get("progress", {})
    options = checkpoint.provenance.get("options", {})
    hours = progress.get("seconds", 0) / 3600
    tuned = "initialised_from" in checkpoint.provenance
    passes = progress.get("epoch", 0) + 1
    started = f"Fine-tuned (`train --init`) from {base_model(checkpoint)}: " if tuned else ""
    lines = [
        "## Training",
        "",
        f"{started}{progress.get('step', 0):,} steps ({passes} pass{'es' if passes > 1 else ''} over the data begun), "
        f"{progress.get('tokens', 0):,} target tokens, {hours:.2f} hours of training on 2 CPU cores "
        f"({progress.get('tokens', 0) / max(progress.get('seconds', 1), 1):,.0f} target tokens/s), "
        f"Adam with {options.get('warmup_steps', '?')} warm-up steps to {options.get('peak_lr', '?')} and "
        f"inverse square-root decay, label smoothing {options.get('label_smoothing', '?')}, dropout "
        f"{options.get('dropout', '?')}, about {options.get('batch_tokens', '?')} tokens per batch, seed "
        f"{options.get('seed', '?')}; the shipped weights average the last checkpoints "
        f"({', '.join(checkpoint.provenance.get('averaged', []))}).{weighing(options)}",
        "",
        _row("step", "minutes", "train loss", "dev loss", "dev BLEU", "dev chrF"),
        _row("---:", "---:", "---:", "---:", "---:", "---:"),
    ]
    for h in progress.get("history", []):
        lines.append(
            _row(
                h["step"],
                h["minutes"],
                f"{h['train_loss']:.2f}",
                f"{h['dev_loss']:.2f}",
                f"{h['dev_bleu']:.1f}",
                f"{h['dev_chrf']:.1f}",
            )
        )
    return lines + [""]


def test_reports(reports: list[dict]) -> list[dict]:
    """The reports on the test split (all of them when none is: a report of an older `evaluate` has no split)."""
    return [r for r in reports if r.get("split", "test") == "test"] or reports


def evaluation_section(reports: list[dict], default_variant: str) -> list[str]:
    reports = test_reports(reports)
    lines = [
        "## Evaluation",
        "",
        f"Held-out test set ({reports[0]['sentences']:,} sentences), sacrebleu defaults, through the server's "
        "own path (tokenizer, ONNX Runtime, decoding loop), batches of 32, 2 threads. Placeholders: the share "
        "of the test sentences with format placeholders (`%s`, `%d`, `%1$s`, `{name}`, ...) whose translation "
        "has exactly the same ones.",
        "",
        _row("variant", "search", "BLEU", "chrF", "placeholders exact", "target tokens/s"),
        _row("---", "---", "---:", "---:", "---:", "---:"),
    ]
    for r in reports:
        search = "greedy" if r["beam_size"] == 1 else f"beam {r['beam_size']}"
        ph = f"{r['placeholder_exact']}/{r['placeholder_sentences']} ({r['placeholder_accuracy']:.1f}%)"
        lines.append(
            _row(
                r["variant"],
                search,
                f"{r['bleu']:.1f}",
                f"{r['chrf']:.1f}",
                ph,
                f"{r['target_tokens'] / r['seconds']:,.0f}",
            )
        )
    lines += ["", f"The server runs `{default_variant}` unless `MT_VARIANT` says otherwise.", ""]
    return lines


def groups_section(reports: list[dict], default_variant: str) -> list[str]:
    """Each split's score and its corpus groups' (the subsets `evaluate` scored), for the default variant, greedy."""
    chosen = [r for r in reports if r["variant"] == default_variant and r["beam_size"] == 1 and r.get("groups")]
    if not chosen:
        return []
    lines = [
        "### By split and corpus group",
        "",
        f"`{default_variant}`, greedy; a group is scored as the subset of its split (dev.general and test.general "
        "hold whole documents out of train: pages of the documentation groups, catalogs of the games):",
        "",
        _row("split", "group", "sentences", "BLEU", "chrF"),
        _row("---", "---", "---:", "---:", "---:"),
    ]
    for r in chosen:
        lines.append(_row(r["split"], "all", f"{r['sentences']:,}", f"{r['bleu']:.1f}", f"{r['chrf']:.1f}"))
        lines += [_row(r["split"], group, f"{g['sentences']:,}", f"{g['bleu']:.1f}", f"{g['chrf']:.1f}")
                  for group, g in r["groups"].items()]
    return lines + [""]


def examples_section(report: dict) -> list[str]:
    lines = [
        "## Examples",
        "",
        f"20 test sentences drawn at random (seed 0), best first by sentence chrF ({report['variant']}, "
        f"{'greedy' if report['beam_size'] == 1 else 'beam ' + str(report['beam_size'])}):",
        "",
        _row("source", "reference", "translation", "chrF"),
        _row("---", "---", "---", "---:"),
    ]
    lines += [_row(e["source"], e["reference"], e["translation"], e["chrf"]) for e in report["examples"]]
    return lines + [""]


CALIBRATION_HEADING = "## Confidence and guards"


def calibration_section(report: dict) -> list[str]:
    """The confidence's fit and measures, and the guards' rates, from `calibrate --json`'s report."""
    splits, limits = report["splits"], report["guard_limits"]
    fit = report["confidence"]["fitted_on"]
    lines = [
        CALIBRATION_HEADING,
        "",
        f"`/translate` gives each text a `confidence`: sigmoid({report['a']:.4f} m + {report['b']:.4f}), m the mean "
        f"log-probability of its tokens, the probability that its sentence chrF reaches {report['threshold']:g}, "
        f"fitted on the {fit['split']} set's greedy `{report['variant']}` translations ({fit['sentences']:,} "
        f"sentences, {fit['good']:,} of them good) by `python -m model_export calibrate`, which writes it into the "
        "manifest (`confidence`). Expected calibration error over 10 bins of equal width, and the Brier score:",
        "",
        _row("split", "sentences", "good", "ECE", "Brier"),
        _row("---", "---:", "---:", "---:", "---:"),
    ]
    lines += [_row(s["name"], f"{s['sentences']:,}", f"{s['good']:,}", f"{s['ece']:.3f}", f"{s['brier']:.3f}")
              for s in splits]
    lines += ["", "Reliability (each bin: sentences, mean confidence, share good):", "",
              _row("confidence", *[s["name"] for s in splits]), _row("---", *["---:" for _ in splits])]
    for b in range(10):
        cells = []
        for s in splits:
            row = next((r for r in s["reliability"] if round(r["from"] * 10) == b), None)
            cells.append(f"{row['sentences']}: {row['confidence']:.2f} / {row['good']:.2f}" if row else "")
        lines.append(_row(f"{b / 10:.1f}-{(b + 1) / 10:.1f}", *cells))
    kinds = ("repetition", "length", "copy")
    lines += [
        "",
        f"Guards (`MT_GUARDS`): an n-gram of up to 4 tokens repeated {limits['repeats']} times in a row (and more "
        f"often than in the source + 1), a translation of under {limits['shortest']:g} or over "
        f"{limits['longest']:g} times its source's tokens (sources of {limits['length_from']} tokens or more), a "
        f"copy of a source of {limits['copy_words']} words or more (outside tags; shorter ones, identifiers, units "
        "and lists of keywords, the model copied rightly on the dev set): limits no reference translation of the dev "
        f"set passes. The greedy translations they flag, those that a search with {report['retry_beam']} beams (the "
        "server's retry) fixes, and the references they would flag:",
        "",
        _row("split", *kinds, "flagged", "fixed by beams", "references flagged"),
        _row("---", *["---:" for _ in kinds], "---:", "---:", "---:"),
    ]
    for s in splits:
        found = sum(s["guards"].values())
        lines.append(_row(s["name"], *[s["guards"].get(k, 0) for k in kinds],
                          f"{found}/{s['sentences']:,} ({100 * found / s['sentences']:.2f}%)",
                          sum(s["fixed"].values()), sum(s["reference_guards"].values())))
    return lines + [""]


def write_calibration_section(card: Path, report: dict) -> Path:
    """The card's confidence section replaced by `report`'s (or put before its Data section), the rest as it is."""
    lines = card.read_text(encoding="utf-8").split("\n")
    section = calibration_section(report)
    if CALIBRATION_HEADING in lines:
        start = lines.index(CALIBRATION_HEADING)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        lines[start:end] = section
    else:
        at = lines.index("## Data") if "## Data" in lines else len(lines)
        lines[at:at] = section
    card.write_text("\n".join(lines), encoding="utf-8")
    return card


LIMITATIONS = [
    "## Limitations",
    "",
    "- The domain is what the corpus holds: software strings, documentation (handbooks, help, manual pages) and",
    "  game text (interface, story, dialogue). Conversation, news, legal or medical prose lies outside it and",
    "  will translate worse: `python -m bench.everyday` scores 60 such sentences written outside the corpus.",
    "- A source of made-up words (`Zzkx qwv plomb trazzle gnurf.`) comes back copied, nearly as written, with",
    "  the high confidence of a copy: the calibration was fitted on real sentences, whose copies (names,",
    "  identifiers, commands) are right.",
    "- Sentences are translated one at a time: no document context (gender and register across sentences).",
    "- A small model trained on two CPU cores (see Training): expect literal translations,",
    "  occasional omissions on long sentences, and English words left untranslated.",
    "- Keyboard accelerators (`_File`, `&Open`) were removed from the training data: send strings without them.",
    "- Placeholders come out exactly as in the source in about 98% of sentences; the misses are mostly named",
    "  ones whose name is an English word, which the model sometimes translates (`%(folder)s` ->",
    "  `%(dossier)s`). Check placeholders before shipping a translation.",
    "- The English sources hold few letters beyond ASCII: the server gives a word with one the training",
    "  sources held too seldom (`Søren`, `Dvořák`) to the model as a placeholder, so it comes back as written,",
    "  never translated (the manifest's `rare_letters`; read by the model, such names came back mangled).",
    "",
]


def variant_bytes(folder: Path, variant: dict) -> int:
    """Every file a variant's sessions open: its graphs (the encoder and each step graph) and its shared tables."""
    files = variant_files(variant) + [table["file"] for table in variant.get("shared_initializers", [])]
    return sum((folder / name).stat().st_size for name in files)


REPORT_KEYS = ("variant", "beam_size", "sentences", "bleu", "chrf", "placeholder_sentences", "placeholder_exact",
               "placeholder_accuracy", "seconds", "target_tokens", "examples")  # what the card reads of a report


def read_reports(paths: list[Path]) -> list[dict]:
    """The evaluation reports `evaluate --json` wrote, each checked for what the card reads of it."""
    reports = []
    for path in paths:
        report = _json_report(path, "evaluation", "evaluate", REPORT_KEYS)
        if not (isinstance(report["seconds"], int | float) and report["seconds"] > 0):
            raise ExportError(f"{path}: seconds is {report['seconds']!r}; a report's run takes a positive time")
        reports.append(report)
    return reports


def read_calibration(path: Path) -> dict:
    """The report `calibrate --json` wrote, checked for what the card reads of it."""
    return _json_report(path, "calibration", "calibrate", ("a", "b", "threshold", "variant", "splits", "guard_limits",
                                                            "retry_beam"))


def _json_report(path: Path, kind: str, command: str, keys: tuple[str, ...]) -> dict:
    """The JSON report `<command> --json` wrote at `path`, with every one of `keys`; else an ExportError saying so."""
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ExportError(f"{kind} report not found: {path} (write one with `{command} --json`)") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise ExportError(f"{path}: not a JSON {kind} report ({error})") from None
    missing = [key for key in keys if key not in report] if isinstance(report, dict) else list(keys)
    if missing:
        raise ExportError(f"{path}: not an {kind} report of `{command} --json`: no {', '.join(missing)}")
    return report


def read_stats(path: Path) -> dict:
    """The corpus's stats.json (`corpus build` writes it), checked for what the card reads of it."""
    try:
        stats = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ExportError(f"{path}: not valid JSON ({error}); `corpus build` writes it") from None
    shapes = {"pairs": dict, "packages": dict, "groups": dict, "dropped": dict}  # packages: name -> its counts
    wrong = [key for key, kind in shapes.items() if not isinstance(stats, dict) or not isinstance(stats.get(key), kind)]
    if not wrong and not all(isinstance(stats["pairs"].get(split), int) for split in ("train", "dev", "test")):
        wrong = ["pairs (train, dev and test counts)"]
    if wrong:
        raise ExportError(f"{path}: not the stats `corpus build` writes: no {', '.join(wrong)}")
    return stats


def write_card(
    folder: Path, checkpoint: Checkpoint, corpus: Path, reports: list[dict], title: str, calibration: dict | None = None
) -> Path:
    for needed in (folder / "manifest.json", corpus / "stats.json", corpus / "NOTICE"):
        if not needed.is_file():
            raise ExportError(f"{needed}: missing (the model folder `export` writes, the corpus `corpus build` writes)")
    load_model_folder(folder, verify_checksums=False)  # a manifest the server reads, or its one-line error
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    stats = read_stats(corpus / "stats.json")
    default = manifest["default_variant"]
    sizes = ", ".join(f"{name} {variant_bytes(folder, v) / 1e6:.1f} MB" for name, v in manifest["variants"].items())
    lines = [
        f"# {manifest['name']} {manifest['version']}: {title}",
        "",
        f"{architecture(checkpoint)}. Graph variants: {sizes} (each with all of its graphs and shared tables); "
        f"default `{default}`.",
        "",
        "```sh",
        "curl -s localhost:8000/translate -H 'content-type: application/json' \\",
        '  -d \'{"q": "Save the document as %s.", "source": "en", "target": "fr"}\'',
        "```",
        "",
    ]
    lines += evaluation_section(reports, default) + groups_section(reports, default)
    lines += calibration_section(calibration) if calibration else []
    lines += data_section(stats) + training_section(checkpoint)
    tests = test_reports(reports)
    best = next((r for r in tests if r["variant"] == default and r["beam_size"] == 1), tests[0])
    lines += examples_section(best) + LIMITATIONS
    card = folder / "README.md"
    card.write_text("\n".join(lines), encoding="utf-8")
    shutil.copy(corpus / "NOTICE", folder / "NOTICE")
    if (corpus / "licenses").is_dir():
        shutil.copytree(corpus / "licenses", folder / "licenses", dirs_exist_ok=True)
    return card
