"""Everyday prose (travel, family, weather, news, shops, health): what a user's first try often is, and what the
corpus has least of. 60 English sentences written for this probe with a French reference each
(`bench/everyday.tsv`, tab-separated; CC0, as the rest of the project's own text), kept out of every corpus split.

Each model folder given translates them through the server's own text path (`Translator`, its scheduler in this
process, its guards and confidence), one sentence a request, 8 at a time. Prints, per folder, BLEU and chrF against
the references, the mean confidence and how many fall under 0.5, then each sentence's translation and confidence
for the first folder (or `--show` of them). A probe, not a test set: 60 sentences move chrF by a point or two with
any change, so compare folders side by side in one run.

    python -m bench.everyday                                         # the default model (~5 s)
    python -m bench.everyday --model models/en-fr --model runs/m12   # two folders side by side
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import sacrebleu

from bench.machine import describe, headline
from service.arguments import description_of, positive_int
from service.metrics import Metrics
from service.settings import Settings
from service.translation.registry import load_translators
from service.translation.translator import TranslateOptions, Translator

ROOT = Path(__file__).resolve().parent.parent
SENTENCES = Path(__file__).with_name("everyday.tsv")
LOW = 0.5  # a confidence under this counts as low in the summary


def read_pairs(path: Path = SENTENCES) -> list[tuple[str, str]]:
    """(English, French) per line of a tab-separated file; a line without exactly one tab is an error."""
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        fields = line.split("\t")
        if len(fields) != 2 or not all(f.strip() for f in fields):
            raise ValueError(f"{path} line {number}: expected English<TAB>French")
        pairs.append((fields[0], fields[1]))
    return pairs


def translate(translator: Translator, texts: list[str], clients: int) -> tuple[list[str], list[float]]:
    """Each text's translation and confidence, one text a request, `clients` requests at a time."""

    async def run() -> list[tuple[str, float]]:
        gate = asyncio.Semaphore(clients)

        async def one(text: str) -> tuple[str, float]:
            async with gate:
                answer = await translator.translate([text], translator.target_languages[0], TranslateOptions())
                return answer.texts[0], answer.confidences[0]

        return await asyncio.gather(*(one(text) for text in texts))

    results = asyncio.run(run())
    return [text for text, _ in results], [confidence for _, confidence in results]


def probe(model: Path, pairs: list[tuple[str, str]], clients: int) -> tuple[str, list[str], list[float]]:
    """The folder's name and version, its translations and their confidences."""
    settings = Settings(models_dir=model.parent, models=[model.name], engine_process=False)
    [translator] = load_translators(settings, Metrics())
    translator.scheduler.start()
    try:
        texts, confidences = translate(translator, [english for english, _ in pairs], clients)
    finally:
        translator.scheduler.stop()
    return f"{model} ({translator.name} {translator.version}, {translator.variant})", texts, confidences


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.everyday", description=description_of(__doc__))
    parser.add_argument("--model", type=Path, action="append", help="a model folder (repeat for several)")
    parser.add_argument("--sentences", type=Path, default=SENTENCES, help="English<TAB>French lines")
    parser.add_argument("--clients", type=positive_int, default=8, help="requests at a time")
    parser.add_argument("--show", type=int, default=1, help="folders whose translations are printed")
    args = parser.parse_args(argv)
    pairs = read_pairs(args.sentences)
    references = [french for _, french in pairs]
    print(headline(describe()), flush=True)
    for index, model in enumerate(args.model or [ROOT / "models" / "en-fr"]):
        name, texts, confidences = probe(model, pairs, args.clients)
        bleu, chrf = sacrebleu.corpus_bleu(texts, [references]).score, sacrebleu.corpus_chrf(texts, [references]).score
        low = sum(c < LOW for c in confidences)
        print(f"{name}: {len(pairs)} sentences, BLEU {bleu:.1f}, chrF {chrf:.1f}, mean confidence "
              f"{sum(confidences) / len(confidences):.2f}, {low} under {LOW}")  # fmt: skip
        if index < args.show:
            for (english, _), text, confidence in zip(pairs, texts, confidences, strict=True):
                print(f"  {confidence:.2f}  {english}  ->  {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
