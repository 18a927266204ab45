"""Command line of the corpus builder: `build` the EN→FR corpus, train its `tokenizer`.

Parses arguments and reports; the work is in build.py and tokenizer.py.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from model_export.corpus import CorpusError
from model_export.corpus.build import BuildOptions, build
from model_export.corpus.pins import DEFAULT_PINS, load_recipe, select_groups
from model_export.corpus.tokenizer import dev_lengths, train_tokenizer
from service.arguments import non_negative_int, positive_int


def _names(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("expected comma-separated group names")
    return names


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m model_export.corpus", description=__doc__.splitlines()[0]
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help="fetch pinned packages and write the parallel corpus")
    b.add_argument("--out", type=Path, default=Path("data/corpus"), help="output directory")
    b.add_argument("--cache", type=Path, default=Path("data/cache"), help="download/extraction cache")
    b.add_argument("--packages", type=Path, default=DEFAULT_PINS, help="pinned package list")
    b.add_argument("--dev-size", type=positive_int, default=2000)
    b.add_argument("--test-size", type=positive_int, default=2000)
    b.add_argument("--seed", type=non_negative_int, default=1234)
    b.add_argument(
        "--groups",
        type=_names,
        help="comma-separated groups of the packages list to build, or `all` (default: every group not marked "
        "`extra`, the recipe of the shipped model)",
    )
    b.add_argument("--general-dev-size", type=positive_int, default=1000, help="pairs of whole documents")
    b.add_argument("--general-test-size", type=positive_int, default=1000, help="pairs of whole documents")
    t = commands.add_parser("tokenizer", help="train the shared SentencePiece model on the train split")
    t.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    t.add_argument("--vocab-size", type=positive_int, default=8000)
    t.add_argument(
        "--out", type=Path, default=Path("data/corpus/spm"), help="directory for spm.model/spm.vocab"
    )
    t.add_argument(
        "--input-sentence-size", type=positive_int, default=1_000_000, help="sentences sampled for training"
    )
    return parser


def _build(args: argparse.Namespace) -> None:
    options = BuildOptions(
        args.out, args.cache, args.dev_size, args.test_size, args.seed, args.general_dev_size, args.general_test_size
    )
    pins, groups = load_recipe(args.packages)
    chosen = select_groups(groups, args.groups)
    stats = build([p for p in pins if p.group in chosen], options, chosen)
    pairs = ", ".join(f"{k} {v}" for k, v in stats["pairs"].items())
    print(f"wrote {args.out}: {pairs} pairs in {stats['seconds']} s, {stats['mb_downloaded']} MB downloaded")


def _tokenizer(args: argparse.Namespace) -> None:
    model = train_tokenizer(args.corpus, args.out / "spm", args.vocab_size, args.input_sentence_size)
    lengths = dev_lengths(model, args.corpus)
    print(f"wrote {model}; dev pieces per sentence: en {lengths['en']:.2f}, fr {lengths['fr']:.2f}")


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING, format="%(levelname)s %(message)s"
    )
    try:
        _build(args) if args.command == "build" else _tokenizer(args)
    except CorpusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
