"""Command line of the offline side: `python -m model_export <command>` (or `mt-export`).

Every bad input ends with one line on stderr that says what is wrong and a non-zero exit status.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from model_export.config import ConfigError, TransformerConfig
from model_export.errors import ExportError
from service.arguments import fraction, int_between, non_negative_int, os_error_line, positive_float, positive_int
from service.engine import BEAM_SIZE_LIMIT
from service.model import ModelFolderError

EXIT_BAD_INPUT = 2
# evaluate's threads for one process's graph runs: past the cores they only contend; 256 is above any CPU here
MAX_THREADS = 256


def cmd_params(args: argparse.Namespace) -> int:
    import torch

    from model_export import checkpoint
    from model_export.model import Transformer
    from model_export.params import format_table

    if args.checkpoint:
        cfg = checkpoint.load(args.checkpoint).config
    else:
        cfg = TransformerConfig(src_vocab_size=args.vocab, tgt_vocab_size=args.vocab, share_embeddings=True)
    with torch.device("meta"):
        model = Transformer(cfg)
    print(format_table(model))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from model_export import checkpoint
    from model_export.export import check_tokenizer, export_folder

    ckpt = checkpoint.load(args.checkpoint)
    check_tokenizer(ckpt, str(args.checkpoint))
    name = args.name or ckpt.provenance.get("name") or f"{ckpt.source_language}-{'-'.join(ckpt.target_languages)}"
    folder = export_folder(ckpt, args.out, name=name, version=args.version)
    print(f"wrote {folder}")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from model_export import checkpoint
    from model_export.verify import DEFAULT_TOLERANCE, verify_folder

    report = verify_folder(args.model_dir, checkpoint.load(args.checkpoint), args.variant, tolerance=args.tolerance)
    tolerance = DEFAULT_TOLERANCE if args.tolerance is None else args.tolerance  # fp32's; int8 and fp16 have their own
    print(report.summary(tolerance))
    if report.failed(tolerance):
        raise ExportError(f"{args.model_dir} does not reproduce {args.checkpoint}: {report.summary(tolerance)}")
    return 0


def cmd_from_folder(args: argparse.Namespace) -> int:
    from model_export import checkpoint
    from model_export.from_folder import checkpoint_from_folder

    if args.out.exists():  # a checkpoint of the user's, or a folder: never replaced
        raise ExportError(f"{args.out} exists; pass a new path as --out")
    ckpt = checkpoint_from_folder(args.model_dir)
    checkpoint.save(ckpt, args.out)
    print(f"wrote {args.out} ({len(ckpt.state_dict)} tensors rebuilt from {args.model_dir}'s fp32 graphs)")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from model_export.train import TrainOptions, train

    given = {f.name: getattr(args, f.name) for f in fields(TrainOptions) if getattr(args, f.name, None) is not None}
    final = train(TrainOptions(**given))
    print(f"wrote {final}")
    return 0


# train's numbers are positive unless named here
TRAIN_TYPES = {
    "seed": non_negative_int,
    "dropout": fraction,
    "label_smoothing": fraction,
}


# the argparse type of each of TrainOptions' annotations (strings: the module has `from __future__ import annotations`)
TRAIN_KINDS = {"Path": Path, "Path | None": Path, "int": positive_int, "float": positive_float}

TRAIN_HELP = {
    "init": "fine-tune: start from this checkpoint's weights and architecture (e.g. from `from-folder`), "
    "with a fresh optimizer; pair it with a lower --peak-lr and --warmup-steps",
    "weigh": "copies of some groups' or packages' training pairs in each epoch, e.g. stories=3,flare-game=3 "
    "(names as the corpus's stats.json has them)",
}


def _add_train(sub: argparse._SubParsersAction) -> None:
    from dataclasses import MISSING, fields

    from model_export.train import TrainOptions

    train = sub.add_parser("train", help="train a model on a corpus; resumes from the run folder's last checkpoint")
    for f in fields(TrainOptions):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool",):
            train.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None)
            continue
        kind = TRAIN_TYPES.get(f.name) or TRAIN_KINDS.get(f.type, str)
        required = f.default is MISSING
        train.add_argument(flag, dest=f.name, type=kind, required=required,
                           help=TRAIN_HELP.get(f.name, None if required else f"default: {f.default}"))
    train.set_defaults(run=cmd_train)


def cmd_evaluate(args: argparse.Namespace) -> int:
    import json

    from model_export.evaluate import evaluate

    if args.streams > args.threads:
        raise ExportError(f"--streams {args.streams} needs at least as many --threads (each stream runs on its own)")
    if args.json:  # before the evaluation, so that a finished one is never lost to a bad path
        if args.json.is_dir():
            raise ExportError(f"--json {args.json} is a folder; name the report's file")
        args.json.parent.mkdir(parents=True, exist_ok=True)
        existed = args.json.exists()
        with args.json.open("a", encoding="utf-8"):  # writable (an OSError: one line, below), kept as it was
            pass
        if not existed:
            args.json.unlink()
    report = evaluate(args.model_dir, args.corpus, args.split, args.variant, args.beam_size, args.batch_size,
                      args.threads, args.limit, args.streams, args.fast_graphs)
    print(report.summary())
    if args.json:
        args.json.write_text(json.dumps(report.to_dict(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    import json

    from model_export.calibrate import calibrate, report_dict
    from model_export.card import write_calibration_section

    report = calibrate(args.model_dir, args.corpus, args.variant, args.threshold, tuple(args.splits),
                       args.batch_size, args.threads, args.fit_splits)
    print(report.summary())
    data = report_dict(report)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    if (args.model_dir / "README.md").is_file():
        print(f"wrote {write_calibration_section(args.model_dir / 'README.md', data)}'s confidence section")
    return 0


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    from model_export.calibrate import CHRF_GOOD

    calibrate = sub.add_parser(
        "calibrate", help="fit a model folder's confidence on the dev set, measure it and the guards on dev and test"
    )
    calibrate.add_argument("--model-dir", type=Path, required=True)
    calibrate.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    calibrate.add_argument("--variant", help="graph variant (default: the manifest's, the one the server runs)")
    calibrate.add_argument(
        "--threshold", type=positive_float, default=CHRF_GOOD,
        help=f"a translation whose sentence chrF reaches this is good (default {CHRF_GOOD:g})",
    )
    calibrate.add_argument(
        "--splits", nargs="+", default=["dev", "test"], help="the first is fitted on, each measured (default: dev test)"
    )
    calibrate.add_argument(
        "--fit-splits", type=positive_int, default=1,
        help="fit on this many of the first --splits pooled, e.g. 2 with `--splits dev dev.general test "
        "test.general`: one confidence for both domains (default 1)",
    )
    calibrate.add_argument("--batch-size", type=positive_int, default=32)
    calibrate.add_argument("--threads", type=int_between(1, MAX_THREADS), default=2)
    calibrate.add_argument("--json", type=Path, help="also write the report here (the card's section reads it)")
    calibrate.set_defaults(run=cmd_calibrate)


def cmd_quantize(args: argparse.Namespace) -> int:
    from model_export.quantize import add_int8_variant

    manifest = add_int8_variant(
        args.model_dir, per_channel=not args.per_tensor, make_default=args.make_default,
        embeddings=not args.fp32_embeddings, single_row_bits=args.single_row_bits,
        activation_scales=args.activation_scales,
    )
    print(f"added variant int8 to {args.model_dir} (default: {manifest['default_variant']})")
    return 0


def cmd_half(args: argparse.Namespace) -> int:
    from model_export.half import add_fp16_variant

    manifest = add_fp16_variant(args.model_dir, make_default=args.make_default)
    print(f"added variant fp16 to {args.model_dir} (default: {manifest['default_variant']})")
    return 0


def cmd_shortlist(args: argparse.Namespace) -> int:
    from model_export import shortlist

    if args.vmap:
        lists = shortlist.vmap_of_folder(args.model_dir, args.vmap)
        how = {"vmap": str(args.vmap)}
    else:
        lists = shortlist.learn_from_corpus(
            args.model_dir, args.corpus, args.per_source, args.always, args.min_count, args.limit
        )
        how = {"corpus": str(args.corpus), "per_source": args.per_source, "always": args.always,
               "min_count": args.min_count, "limit": args.limit}
    how["candidates"] = args.candidates
    shortlist.add_shortlist(args.model_dir, lists, args.candidates, how)
    if args.write_vmap:
        folder = shortlist.load_model_folder(args.model_dir)
        source, target = shortlist.pieces_of(folder, "source"), shortlist.pieces_of(folder, "target")
        shortlist.write_vmap(lists, source, target, args.write_vmap)
    print(f"added a shortlist of {args.candidates} candidates per sentence to {args.model_dir} "
          f"({len(lists.always)} always, {len(lists.targets)} source-target pairs)")
    return 0


def _add_shortlist(sub: argparse._SubParsersAction) -> None:
    from service.model import SHORTLIST_FEWEST

    shortlist = sub.add_parser(
        "shortlist", help="add a vocabulary shortlist (and its step graphs) to a model folder: learned or a vmap.txt"
    )
    shortlist.add_argument("--model-dir", type=Path, required=True)
    source = shortlist.add_mutually_exclusive_group(required=True)
    source.add_argument("--corpus", type=Path, help="learn it from this corpus's training split (train.<lang>)")
    source.add_argument("--vmap", type=Path, help="import a CTranslate2 vocabulary map (one-token rules)")
    shortlist.add_argument(
        "--candidates", type=int_between(SHORTLIST_FEWEST, 2**20), default=512,
        help="candidates per sentence, C (default 512)",
    )
    shortlist.add_argument("--always", type=non_negative_int, default=200, help="most frequent targets in every set")
    shortlist.add_argument("--per-source", type=positive_int, default=30, help="targets kept per source token")
    shortlist.add_argument("--min-count", type=positive_int, default=2, help="sentence pairs a pair needs, at least")
    shortlist.add_argument("--limit", type=positive_int, help="learn from the first N pairs only")
    shortlist.add_argument("--write-vmap", type=Path, help="also write the shortlist as a CTranslate2 vmap.txt")
    shortlist.set_defaults(run=cmd_shortlist)


def cmd_letters(args: argparse.Namespace) -> int:
    from model_export.letters import add_rare_letters

    letters = add_rare_letters(args.model_dir, args.sources, args.fewer_than, args.share)
    listed = f"{len(letters)} rare letters: {letters}" if letters else "no rare letters"
    bound = f"fewer than {args.fewer_than:,} times and less often than {args.share:g} of the characters"
    print(f"{args.model_dir}: {listed} (held {bound} in {args.sources})")
    return 0


def _add_letters(sub: argparse._SubParsersAction) -> None:
    from model_export.corpus.tokenizer import RARE_FEWER_THAN, RARE_SHARE

    letters = sub.add_parser(
        "letters", help="list in a model folder the letters its training sources held too seldom for it to read"
    )
    letters.add_argument("--model-dir", type=Path, required=True)
    letters.add_argument(
        "--sources", type=Path, required=True, help="the model's training sources, a sentence a line (train.en)"
    )
    letters.add_argument(
        "--fewer-than",
        type=non_negative_int,
        default=RARE_FEWER_THAN,
        help=f"a letter held fewer times is rare (default {RARE_FEWER_THAN:,}; 0: none, which clears the list)",
    )
    letters.add_argument(
        "--share",
        type=fraction,
        default=RARE_SHARE,
        help=f"... and held less often than this share of the characters (default {RARE_SHARE:g})",
    )
    letters.set_defaults(run=cmd_letters)


def _add_evaluate_and_quantize(sub: argparse._SubParsersAction) -> None:
    max_beam = BEAM_SIZE_LIMIT  # the server's bound on MT_MAX_BEAM_SIZE
    evaluate = sub.add_parser("evaluate", help="BLEU, chrF and placeholder accuracy of a model folder on a split")
    evaluate.add_argument("--model-dir", type=Path, required=True)
    evaluate.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    evaluate.add_argument("--split", default="test")
    evaluate.add_argument("--variant", help="graph variant (default: the manifest's)")
    evaluate.add_argument(
        "--beam-size", type=int_between(1, max_beam), default=1,
        help=f"1 to {max_beam}, the largest beam the server can be set to allow (MT_MAX_BEAM_SIZE's limit)",
    )
    evaluate.add_argument("--batch-size", type=positive_int, default=32)
    evaluate.add_argument(
        "--threads", type=int_between(1, MAX_THREADS), default=2,
        help=f"1 to {MAX_THREADS}: ONNX Runtime threads; more than the cores only contend",
    )
    evaluate.add_argument(
        "--streams", type=positive_int, default=1,
        help="batches decoded at once, each on threads/streams threads (the server's MT_DECODER_STREAMS); a batch "
        "goes as that many sub-batches of batch-size/streams. 2 streams of one thread translated the default "
        "model's test set 1.76x as fast as one batch on two (bench.engine); int8 scores move by ~0.2 with the "
        "batches' size",
    )
    evaluate.add_argument(
        "--fast-graphs", action="store_true",
        help="also run the folder's faster graphs for static batches (dense, one-row), as a server with "
        "MT_BATCH_INVARIANT=false does; default: the step graph alone, as the server runs by default",
    )
    evaluate.add_argument("--limit", type=positive_int, help="only the first N sentences")
    evaluate.add_argument("--json", type=Path, help="also write the report (with 20 examples) here")
    evaluate.set_defaults(run=cmd_evaluate)

    quantize = sub.add_parser("quantize", help="add an int8 (dynamically quantized) variant to a model folder")
    quantize.add_argument("--model-dir", type=Path, required=True)
    quantize.add_argument("--per-tensor", action="store_true", help="one scale per matrix instead of per column")
    quantize.add_argument("--make-default", action="store_true", help="make int8 the folder's default variant")
    quantize.add_argument(
        "--fp32-embeddings", action="store_true", help="keep the embedding tables in fp32 (default: int8 too)"
    )
    quantize.add_argument(
        "--single-row-bits", type=int, choices=(8, 4), default=8,
        help="the one-row step graph's weights: 8 bits in blocks of 128, or 4 in blocks of 32 (faster at batch 1; "
        "the default model's test set at batch 1 scored as at 8 bits, a tiny model's worse: evaluate yours)",
    )
    quantize.add_argument(
        "--activation-scales", choices=("per-row", "per-tensor"), default="per-row",
        help="per-row: each activation row quantized with its own scale, so a sentence's output does not depend on "
        "its batch (the server's MT_BATCH_INVARIANT); per-tensor: one scale per activation tensor (ONNX Runtime's "
        "dynamic quantization), a few per cent faster, served only with MT_BATCH_INVARIANT=false",
    )
    quantize.set_defaults(run=cmd_quantize)

    half = sub.add_parser("half", help="add a float16 variant to a model folder (for GPUs: MT_PROVIDERS=cuda)")
    half.add_argument("--model-dir", type=Path, required=True)
    half.add_argument("--make-default", action="store_true", help="make fp16 the folder's default variant")
    half.set_defaults(run=cmd_half)


def cmd_convert_marian(args: argparse.Namespace) -> int:
    from model_export.marian import convert_marian

    targets = [t.strip() for t in args.target_languages.split(",") if t.strip()] if args.target_languages else None
    print(f"wrote {convert_marian(args.hf_dir, args.out, args.source_language, targets, args.name, args.version)}")
    return 0


def cmd_to_marian(args: argparse.Namespace) -> int:
    from model_export.marian import to_marian

    print(f"wrote {to_marian(args.checkpoint, args.out)}")
    return 0


def _add_marian(sub: argparse._SubParsersAction) -> None:
    convert = sub.add_parser("convert-marian", help="write a model folder from a Hugging Face Marian (OPUS-MT) folder")
    convert.add_argument("--hf-dir", type=Path, required=True, help="config.json, weights, *.spm, vocab.json")
    convert.add_argument("--out", type=Path, required=True, help="the model folder to write")
    convert.add_argument("--source-language", help="default: tokenizer_config.json or a name like opus-mt-en-fr")
    convert.add_argument("--target-languages", help="comma-separated; multilingual models: default all >>xx<< tokens")
    convert.add_argument("--name", help="model name in the manifest (default: the folder's name)")
    convert.add_argument("--version", default="1.0.0")
    convert.set_defaults(run=cmd_convert_marian)

    to_marian = sub.add_parser("to-marian", help="write a checkpoint as a Hugging Face Marian folder")
    to_marian.add_argument("--checkpoint", type=Path, required=True)
    to_marian.add_argument("--out", type=Path, required=True, help="the Hugging Face folder to write")
    to_marian.set_defaults(run=cmd_to_marian)


def cmd_card(args: argparse.Namespace) -> int:
    from model_export import checkpoint
    from model_export.card import read_calibration, read_reports, write_card

    reports = read_reports(args.evaluations)
    calibration = read_calibration(args.calibration) if args.calibration else None
    card = write_card(args.model_dir, checkpoint.load(args.checkpoint), args.corpus, reports, args.title, calibration)
    print(f"wrote {card}")
    return 0


def cmd_to_ctranslate2(args: argparse.Namespace) -> int:
    from model_export import checkpoint
    from model_export.ctranslate2_export import to_ctranslate2

    print(f"wrote {to_ctranslate2(checkpoint.load(args.checkpoint), args.out, args.quantization)}")
    return 0


def _add_ctranslate2(sub: argparse._SubParsersAction) -> None:
    ct2 = sub.add_parser("to-ctranslate2", help="write a checkpoint as a CTranslate2 model (exactly its weights)")
    ct2.add_argument("--checkpoint", type=Path, required=True)
    ct2.add_argument("--out", type=Path, required=True, help="the CTranslate2 model folder to write")
    ct2.add_argument("--quantization", default="float32", choices=["float32", "int8", "int8_float32", "int16"])
    ct2.set_defaults(run=cmd_to_ctranslate2)


def _add_card(sub: argparse._SubParsersAction) -> None:
    card = sub.add_parser("card", help="write a model folder's README.md and NOTICE from measured results")
    card.add_argument("--model-dir", type=Path, required=True)
    card.add_argument("--checkpoint", type=Path, required=True, help="the checkpoint the folder was exported from")
    card.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    card.add_argument("--evaluations", type=Path, nargs="+", required=True, help="JSON reports of `evaluate`")
    card.add_argument("--calibration", type=Path, help="the JSON report of `calibrate --json`")
    card.add_argument("--title", default="English to French for software text")
    card.set_defaults(run=cmd_card)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m model_export", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    params = sub.add_parser("params", help="print a model's parameter count by part")
    params.add_argument("--checkpoint", type=Path, help="count this checkpoint's model")
    params.add_argument(
        "--vocab",
        type=int_between(1, 2**31 - 1),
        default=37000,
        help="without --checkpoint: the paper's base model, shared vocab",
    )
    params.set_defaults(run=cmd_params)

    export = sub.add_parser("export", help="write a model folder (ONNX graphs, tokenizer, manifest) from a checkpoint")
    export.add_argument("--checkpoint", type=Path, required=True)
    export.add_argument("--out", type=Path, required=True, help="the model folder to write")
    export.add_argument("--name", help="model name in the manifest (default: from the checkpoint)")
    export.add_argument("--version", default="1.0.0")
    export.set_defaults(run=cmd_export)

    verify = sub.add_parser("verify", help="check a model folder against the checkpoint it was exported from")
    verify.add_argument("--checkpoint", type=Path, required=True)
    verify.add_argument("--model-dir", type=Path, required=True)
    verify.add_argument("--variant", help="graph variant to check (default: every variant the folder has)")
    verify.add_argument(
        "--tolerance",
        type=positive_float,
        help="largest |log p| difference from PyTorch for every graph (default: fp32 1e-4, fp16 0.02, int8 1.0)",
    )
    verify.set_defaults(run=cmd_verify)

    from_folder = sub.add_parser("from-folder", help="rebuild a checkpoint from a model folder's fp32 graphs")
    from_folder.add_argument("--model-dir", type=Path, required=True)
    from_folder.add_argument("--out", type=Path, required=True, help="the checkpoint to write")
    from_folder.set_defaults(run=cmd_from_folder)
    _add_train(sub)
    _add_evaluate_and_quantize(sub)
    _add_calibrate(sub)
    _add_letters(sub)
    _add_shortlist(sub)
    _add_marian(sub)
    _add_card(sub)
    _add_ctranslate2(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except (ExportError, ModelFolderError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as error:  # a destination under a file, a read-only file system, a missing folder: the user's to fix
        print(f"error: {os_error_line(error)}", file=sys.stderr)
        return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
