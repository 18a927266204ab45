"""Inline HTML tags: what translating a sentence whole through its tags (service/text/document.py, Tagged) gives against
translating the text between its tags piece by piece, as every tag did before, on the test set.

Each of the test set's first N sentences of at least 4 words gets an element (drawn with a fixed seed): with
`--element b` (the default) 1-3 of its words wrapped in `<b>`...`</b>`; with `--element code` a kept element,
`<code>config.yaml</code>`, put between two of its words. They are sent in requests of `--per-request` sentences,
`--clients` at a time, through the server's own text path (`Translator`, its scheduler in this process, format
html), three ways: whole through their tags (the server's way), split at their tags (`split_html(inline=False)`),
and without the element (plain text: for `b` its words unwrapped, for `code` the sentence as it was; the
ceiling). Prints, for each, BLEU and chrF of the answers, the element taken out, against the references, the wall
time and the source tokens read; for the whole way, how many answers placed the tags in the whole translation and
how many fell back to the pieces between them (`b`), or how many answers hold the element exactly once and how many
sentences took the second pass for their pieces (`code`), counted where the server decides.

    python -m bench.inline                                   # the default model, 500 sentences, 32 clients (~30 s)
    python -m bench.inline --element code                   # a kept element in each sentence
    python -m bench.inline --per-request 16 --clients 4     # documents of 16 sentences, 4 at a time
"""

from __future__ import annotations

import argparse
import asyncio
import html
import random
import re
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path

import sacrebleu

from bench.machine import describe, headline
from service.arguments import description_of, positive_int
from service.metrics import Metrics
from service.settings import Settings
from service.text import document as text
from service.text import markup
from service.text.glossary import Glossary
from service.translation.registry import load_translators
from service.translation.translator import TranslateOptions, Translator

ROOT = Path(__file__).resolve().parent.parent
TAG = re.compile(r"</?b>")
KEPT = "<code>config.yaml</code>"


def tagged(sentence: str, rng: random.Random) -> str:
    """The sentence, html-escaped, with 1-3 of its words (not the first) in <b>."""
    words = html.escape(sentence, quote=False).split(" ")
    size = rng.randint(1, min(3, len(words) - 1))
    start = rng.randint(1, len(words) - size)
    return " ".join([*words[:start], "<b>" + " ".join(words[start : start + size]) + "</b>", *words[start + size :]])


def with_kept(sentence: str, rng: random.Random) -> str:
    """The sentence, html-escaped, with KEPT between two of its words."""
    words = html.escape(sentence, quote=False).split(" ")
    at = rng.randint(1, len(words) - 1)
    return " ".join([*words[:at], KEPT, *words[at:]])


def without(answer: str, element: str) -> str:
    """An answer as text, the element taken out."""
    return html.unescape(TAG.sub("", answer) if element == "b" else " ".join(answer.replace(KEPT, " ").split()))


@contextmanager
def counting_fallbacks(counts: list[int]) -> Iterator[None]:
    """Counts, into counts[0], the sentences Document.unplaced sends to the second pass, and into counts[1] the
    tagged sentences whose elements found no place in their whole translation (text.project)."""
    unplaced, project = text.Document.unplaced, text.project

    def counted(doc: text.Document, translations: list[str]) -> list[int]:
        found = unplaced(doc, translations)
        counts[0] += len(found)
        return found

    def placed(*args: object) -> list[tuple[int, int]] | None:
        spans = project(*args)  # type: ignore[arg-type]
        counts[1] += spans is None
        return spans

    text.Document.unplaced, text.project = counted, placed  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        text.Document.unplaced, text.project = unplaced, project  # type: ignore[method-assign]


@contextmanager
def pieces_only() -> Iterator[None]:
    """split_html as before inline elements: every tag ends a sentence."""
    whole = markup.split_html
    markup.split_html = partial(whole, inline=False)
    try:
        yield
    finally:
        markup.split_html = whole


def translate(
    translator: Translator, texts: list[str], fmt: str, per_request: int, clients: int, glossary: Glossary | None = None
) -> tuple[list[str], float, int]:
    """(answers, seconds, source tokens read): the texts in requests of `per_request`, `clients` at a time, each
    with `glossary`."""
    options = TranslateOptions(html=fmt == "html", glossary=glossary)

    async def run() -> list[tuple[list[str], int]]:
        chunks = [texts[i : i + per_request] for i in range(0, len(texts), per_request)]
        gate = asyncio.Semaphore(clients)

        async def one(chunk: list[str]) -> tuple[list[str], int]:
            async with gate:
                answer = await translator.translate(chunk, "fr", options)
                return answer.texts, answer.input_tokens

        return await asyncio.gather(*(one(chunk) for chunk in chunks))

    started = time.perf_counter()
    results = asyncio.run(run())
    seconds = time.perf_counter() - started
    answers = [t for texts_, _ in results for t in texts_]
    return answers, seconds, sum(read for _, read in results)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.inline", description=description_of(__doc__))
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "en-fr")
    parser.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus", help="holds test.en, test.fr")
    parser.add_argument("--sentences", type=positive_int, default=500)
    parser.add_argument("--per-request", type=positive_int, default=1, help="sentences a request")
    parser.add_argument("--clients", type=positive_int, default=32, help="requests at a time")
    parser.add_argument("--element", choices=["b", "code"], default="b", help="words in <b>, or a <code> among them")
    args = parser.parse_args(argv)
    sources = (args.corpus / "test.en").read_text(encoding="utf-8").splitlines()
    references = (args.corpus / "test.fr").read_text(encoding="utf-8").splitlines()
    pairs = [(s, r) for s, r in zip(sources, references, strict=True) if len(s.split(" ")) >= 4][: args.sentences]
    rng = random.Random(0)
    marked = [(tagged if args.element == "b" else with_kept)(s, rng) for s, _ in pairs]
    settings = Settings(models_dir=args.model.parent, models=[args.model.name], engine_process=False)
    [translator] = load_translators(settings, Metrics())
    translator.scheduler.start()
    print(headline(describe()), flush=True)
    print(
        f"{args.model.name}, {len(pairs)} test sentences with {'1-3 words in <b>' if args.element == 'b' else KEPT}, "
        f"variant {translator.variant}, "
        f"{args.clients} requests of {args.per_request} at a time"
    )
    fallbacks = [0, 0]
    try:
        translate(translator, marked[:32], "html", args.per_request, args.clients)  # warm
        ways = [
            ("whole through its tags", marked, "html", counting_fallbacks(fallbacks)),
            ("split at its tags (before)", marked, "html", pieces_only()),
            ("no tags (plain text)", [s for s, _ in pairs], "text", nullcontext()),
        ]
        rows = []
        for name, texts, fmt, way in ways:
            with way:
                answers, seconds, read = translate(translator, texts, fmt, args.per_request, args.clients)
            plain = [without(a, args.element) for a in answers]
            refs = [[r for _, r in pairs]]
            bleu, chrf = sacrebleu.corpus_bleu(plain, refs).score, sacrebleu.corpus_chrf(plain, refs).score
            rows.append((name, bleu, chrf, seconds, read, answers))
    finally:
        translator.scheduler.stop()
    print("| way | BLEU | chrF | seconds | sentences/s | source tokens read |\n|---|---:|---:|---:|---:|---:|")
    for name, bleu, chrf, seconds, read, _ in rows:
        print(f"| {name} | {bleu:.2f} | {chrf:.2f} | {seconds:.2f} | {len(pairs) / seconds:,.0f} | {read:,} |")
    if args.element == "code":
        once = sum(answer.count(KEPT) == 1 for answer in rows[0][5])
        print(
            f"\nwhole through its tags: {once} of {len(pairs)} answers hold {KEPT} exactly once; {fallbacks[0]} took "
            "the second pass (the translation lost or doubled its placeholder): the pieces around it"
        )
        return 0
    print(
        f"\nwhole through its tags: {len(pairs) - fallbacks[1]} of {len(pairs)} answers placed the tags in the whole "
        f"translation, {fallbacks[1]} took the pieces between them (no words for an element, or none that nest)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
