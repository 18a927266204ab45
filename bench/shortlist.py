"""The vocabulary shortlist side by side with the full vocabulary, and CTranslate2 int8 with and without its
vocabulary map (use_vmap), in one run, the engines taking turns (bench.engine's workers and rounds): every output
forced to 32 tokens, greedy and beam 4, batch 1 and 32, one thread each; then, on the default model, BLEU and chrF
of its test set (each engine's own stopping) with and without them.

    python -m bench.shortlist paper                        # bench.engine paper's random model, shortlists of 512
                                                           # and 1,024 random candidates (bench.engine builds it)
    python -m bench.shortlist default --corpus /tmp/corpus # models/en-fr with a shortlist learned from the corpus
                                                           # (added to a linked copy of the folder, never to it)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.engine import (
    FORCED,
    WORK,
    Engine,
    Result,
    Setting,
    benchmark,
    prepare_default,
    prepare_paper,
    random_sources,
    vocabulary_pieces,
)
from bench.machine import describe, headline
from model_export.shortlist import Lists, add_shortlist, learn_from_corpus, pieces_of, write_vmap
from service.arguments import description_of, non_negative_int, positive_int, positive_ints
from service.model import MANIFEST, load_model_folder

ROOT = Path(__file__).resolve().parent.parent
THREADS = 1  # each engine on one thread: the shortlist's gain is per step, not from parallel work


def linked_copy(folder: Path, target: Path) -> Path:
    """A model folder whose files are hard links to `folder`'s (ONNX Runtime refuses external data behind a
    symbolic link that leaves the graph's folder), with its own manifest (add_shortlist writes into it)."""
    target.mkdir(parents=True, exist_ok=True)
    for path in folder.iterdir():
        link = target / path.name
        if path.name == MANIFEST:
            link.write_bytes(path.read_bytes())
        elif path.is_file() and not link.exists():
            os.link(path.resolve(), link)
    return target


def random_lists(src_vocab: int, tgt_vocab: int, always: int, per_source: int, seed: int) -> Lists:
    """A shortlist of random lists (a random model has no corpus): `always` ids, `per_source` per source id."""
    rng = np.random.default_rng(seed)
    targets = rng.integers(0, tgt_vocab, size=(src_vocab, per_source)).ravel()  # (V_src x k,)
    offsets = np.arange(0, src_vocab * per_source + 1, per_source, dtype=np.int64)  # (V_src + 1,)
    return Lists(rng.choice(tgt_vocab, size=always, replace=False), offsets, targets)


def shortlisted(base: Path, name: str, lists: Callable[[], Lists], candidates: int) -> tuple[Path, Path]:
    """Our folder with this shortlist (a linked copy of base/ours) and the CTranslate2 int8 model with the same
    lists as its vmap.txt (a linked copy of base/ct2-int8), each built once."""
    ours, mapped = base / f"ours-{name}", base / f"ct2-int8-{name}"
    if not (ours / "shortlist.npz").exists() or not (mapped / "vmap.txt").exists():
        made = lists()
        add_shortlist(linked_copy(base / "ours", ours), made, candidates, {"bench": name})
        folder = load_model_folder(ours, verify_checksums=False)
        linked_copy(base / "ct2-int8", mapped)
        write_vmap(made, pieces_of(folder, "source"), pieces_of(folder, "target"), mapped / "vmap.txt")
    return ours, mapped


def start(base: Path, shortlists: dict[str, tuple[Path, Path]]) -> list[Engine]:
    pieces = vocabulary_pieces(base / "hf")
    layout = {"streams": 1, "threads": THREADS, "device": "cpu"}
    engines = [
        Engine("ours-int8", "ours", folder=base / "ours", variant="int8", **layout),
        Engine("ct2-int8", "ctranslate2", ct2_dir=base / "ct2-int8", compute_type="int8", pieces=pieces, **layout),
    ]
    for name, (ours, mapped) in shortlists.items():
        engines.append(Engine(f"ours-int8-{name}", "ours", folder=ours, variant="int8", shortlist=True, **layout))
        engines.append(Engine(
            f"ct2-int8-vmap-{name}", "ctranslate2", ct2_dir=mapped, compute_type="int8", pieces=pieces, use_vmap=True,
            **layout,
        ))
    return engines


def ratios(results: list[Result]) -> str:
    """Each engine's time per token over its full-vocabulary peer's (ours-int8, ct2-int8) at each setting."""
    by = {(r.engine, r.beam, r.batch): r for r in results}
    lines = ["| engine | search | batch | target tok/s | time ÷ its full vocabulary's |", "|---|---|---:|---:|---:|"]
    for r in sorted(results, key=lambda r: (r.beam, r.batch, r.engine)):
        full = by.get(("ours-int8" if r.engine.startswith("ours") else "ct2-int8", r.beam, r.batch))
        ratio = f"{full.tokens_per_second / r.tokens_per_second:.2f}" if full else "-"
        search = "greedy" if r.beam == 1 else f"beam {r.beam}"
        lines.append(f"| {r.engine} | {search} | {r.batch} | {r.tokens_per_second:,.0f} | {ratio} |")
    return "\n".join(lines)


def test_sources(corpus: Path, limit: int | None) -> list[list[int]]:
    """The default model's test set's first `limit` sources (default all), as its ids."""
    from service.model.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(load_model_folder(ROOT / "models" / "en-fr", verify_checksums=False))
    return [tokenizer.encode(s, "fr") for s in (corpus / "test.en").read_text(encoding="utf-8").splitlines()[:limit]]


def quality(engines: list[Engine], corpus: Path, beams: list[int], limit: int | None) -> str:
    """BLEU and chrF of the default model's test set (its first `limit` sentences), batch 32, length-sorted, each
    engine's own stopping."""
    import sacrebleu

    from service.model.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_folder(load_model_folder(ROOT / "models" / "en-fr", verify_checksums=False))
    references = (corpus / "test.fr").read_text(encoding="utf-8").splitlines()[:limit]
    ids = test_sources(corpus, limit)
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    lines = ["| engine | search | BLEU | chrF | seconds |", "|---|---|---:|---:|---:|"]
    for beam in beams:
        for engine in engines:
            result, outputs = engine.run([ids[i] for i in order], Setting(beam, 32, len(ids)), None)
            texts = [""] * len(ids)
            for i, output in zip(order, outputs, strict=True):
                texts[i] = tokenizer.decode(output)
            bleu = sacrebleu.corpus_bleu(texts, [references]).score
            chrf = sacrebleu.corpus_chrf(texts, [references]).score
            search = "greedy" if beam == 1 else f"beam {beam}"
            lines.append(f"| {engine.name} | {search} | {bleu:.2f} | {chrf:.2f} | {result.seconds:.1f} |")
            print(lines[-1], flush=True)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.shortlist", description=description_of(__doc__))
    parser.add_argument("model", choices=["paper", "default"])
    parser.add_argument("--candidates", type=positive_ints, help="shortlist sizes (default: paper 512,1024; "
                        "default 512)")
    parser.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus", help="the default model's corpus")
    parser.add_argument("--sentences", type=positive_int, default=64, help="sources at batch 32")
    parser.add_argument("--sentences-batch-1", type=positive_int, default=16, help="sources at batch 1")
    parser.add_argument("--rounds", type=positive_int, default=2)
    parser.add_argument("--beams", type=positive_ints, default=[1, 4])
    parser.add_argument("--batches", type=positive_ints, default=[1, 32])
    parser.add_argument("--test-sentences", type=positive_int, help="BLEU/chrF on the first N (default: all)")
    parser.add_argument("--quality-beams", type=positive_ints, default=[1, 4])
    parser.add_argument("--seed", type=non_negative_int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
    machine = describe("cpu")
    print(headline(machine), flush=True)
    sizes = args.candidates or ([512, 1024] if args.model == "paper" else [512])
    if args.model == "paper":
        base = prepare_paper(args.seed, ["ours-int8", "ct2-int8"])
        cfg = load_model_folder(base / "ours", verify_checksums=False).manifest.config
        # about C candidates a sentence of 24 tokens: 200 always, and (C - 200) / 24 per source id
        shortlists = {
            f"c{c}": shortlisted(
                base, f"c{c}",
                lambda c=c: random_lists(cfg.src_vocab_size, cfg.tgt_vocab_size, 200, (c - 200) // 24, c), c,
            )
            for c in sizes
        }
    else:
        base = prepare_default(None)
        learned = functools.cache(lambda: learn_from_corpus(ROOT / "models" / "en-fr", args.corpus, 30, 200, 2, None))
        shortlists = {f"c{c}": shortlisted(base, f"c{c}", learned, c) for c in sizes}
    count = max(args.sentences, args.sentences_batch_1)
    if args.model == "paper":
        sources = random_sources(base / "hf", count, 24, args.seed)
    else:  # real sentences: their candidates are what a server's would be
        sources = test_sources(args.corpus, None)[:count]
    settings = [
        Setting(beam, batch, args.sentences if batch > 1 else args.sentences_batch_1)
        for beam in args.beams
        for batch in args.batches
    ]
    engines = start(base, shortlists)
    try:
        results = benchmark(engines, sources, settings, args.rounds)
        heading = f"{args.model} model, int8, {FORCED} tokens a sentence forced, {THREADS} thread each"
        print(f"\n{heading}\n{ratios(results)}")
        if args.model == "default" and (args.corpus / "test.en").is_file():
            print("\n" + quality(engines, args.corpus, args.quality_beams, args.test_sentences))
    finally:
        for engine in engines:
            engine.close()
    out = WORK / f"shortlist-{args.model}.json"
    out.write_text(json.dumps({"machine": machine, "results": [r.__dict__ for r in results]}, indent=2, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
