"""Names written with letters the model's training sources hardly held ("Søren", "Dvořák", "Łódź"): what giving
each such word to the model as a placeholder (the manifest's `tokenizer.rare_letters`, service/text/placeholders.py)
gives against letting the model read it, on the test set.

The sentences are those of the test and dev sets with a capitalised word, not the first, that the reference
translation holds as written and each holds once (a name the translator copied: "Start Konsole in fullscreen
mode"); that word becomes, in both, a name from NAMES (drawn with a fixed seed). They are translated through the
server's own text path (`Translator`, its scheduler in this process), `--clients` sentences at a time, four ways:
the folder's rare letters masked (the server's way), read by the model (the list emptied: before), the sentences
as they were (their ASCII names), and those with a request glossary that keeps each of their names as written
(`glossary`, {"Konsole": "Konsole", ...}). Prints, for each, how many answers hold their name exactly as written,
BLEU and chrF against the references (the name put in them too) and the wall time. Then, for each term of TERMS,
the test and dev sentences that hold it translated with a glossary that gives it another translation, and how many
translations hold that one.

    python -m bench.names                          # the default model (~10 s)
    python -m bench.names --model models/my-model  # a folder of yours, after `model_export letters`
"""

from __future__ import annotations

import argparse
import random
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path

import sacrebleu

from bench.inline import translate
from bench.machine import describe, headline
from service.arguments import description_of, positive_int
from service.metrics import Metrics
from service.settings import Settings
from service.text.glossary import Glossary
from service.translation.registry import load_translators
from service.translation.translator import Translator

ROOT = Path(__file__).resolve().parent.parent
# names of people, places and products, each with a letter beyond ASCII, from a dozen languages
NAMES = (
    "Søren", "Dvořák", "Łódź", "Tromsø", "Björk", "Zoë", "José", "Ångström", "Müller", "Çelik", "Gdańsk", "Şahin",
    "Kraków", "Núñez", "Bogotá", "Reykjavík", "Ørsted", "Škoda", "Žižek", "Malmö", "Gödel", "Brontë", "Citroën",
    "Łukasz", "Jürgen", "François", "Émile", "Hélène", "Ćosić", "Dušan", "Ålesund", "Nguyễn",
)  # fmt: skip
# terms of the test and dev sets given other translations than the model's ("fichier", "fenêtre")
TERMS = {"file": "document", "files": "documents", "window": "panneau", "server": "serveur"}
# a capitalised word of ASCII letters after a space, before a space or a punctuation mark
CANDIDATE = re.compile(r"(?<=\s)[A-Z][a-z]{2,}(?=[\s,.;:!?])")


def named_pairs(sources: list[str], references: list[str]) -> list[tuple[str, str, str]]:
    """(source, reference, word): each pair whose source and reference hold the same candidate word once each."""
    found = []
    for source, reference in zip(sources, references, strict=True):
        for match in CANDIDATE.finditer(source):
            word = re.compile(rf"\b{match.group()}\b")
            if len(word.findall(source)) == 1 and len(word.findall(reference)) == 1:
                found.append((source, reference, match.group()))
                break
    return found


def renamed(pairs: list[tuple[str, str, str]], rng: random.Random) -> list[tuple[str, str, str]]:
    """Each pair with its word replaced by a name from NAMES, in the source and in the reference."""
    out = []
    for source, reference, word in pairs:
        name = rng.choice(NAMES)
        pattern = re.compile(rf"\b{word}\b")
        out.append((pattern.sub(name, source), pattern.sub(name, reference), name))
    return out


@contextmanager
def letters_read(translator: Translator) -> Iterator[None]:
    """The translator's tokenizer without the folder's rare letters, as before the manifest listed them."""
    kept = translator.tokenizer
    translator.tokenizer = replace(kept, rare_letters=frozenset(), _readable={})
    try:
        yield
    finally:
        translator.tokenizer = kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.names", description=description_of(__doc__))
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "en-fr")
    parser.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus", help="holds test.* and dev.*")
    parser.add_argument("--clients", type=positive_int, default=32, help="sentences at a time")
    args = parser.parse_args(argv)
    settings = Settings(models_dir=args.model.parent, models=[args.model.name], engine_process=False)
    [translator] = load_translators(settings, Metrics())
    source, target = translator.source_language, translator.target_languages[0]
    pairs, sources = [], []
    for split in ("test", "dev"):
        lines = (args.corpus / f"{split}.{source}").read_text(encoding="utf-8").splitlines()
        pairs += named_pairs(lines, (args.corpus / f"{split}.{target}").read_text(encoding="utf-8").splitlines())
        sources += lines
    named = renamed(pairs, random.Random(0))
    print(headline(describe()), flush=True)
    rare = "".join(sorted(translator.tokenizer.rare_letters))
    print(
        f"{args.model.name}, variant {translator.variant}: {len(pairs)} test and dev sentences with a name the "
        f"reference copied, renamed from {len(NAMES)} names; {len(rare)} rare letters in the manifest"
    )
    translator.scheduler.start()
    try:
        translate(translator, [s for s, _, _ in named[:32]], "text", 1, args.clients)  # warm
        kept = Glossary.of({word: word for _, _, word in pairs})
        ways = [
            ("rare letters masked (the server's way)", named, nullcontext(), None),
            ("rare letters read by the model (before)", named, letters_read(translator), None),
            ("the names as they were (ASCII)", pairs, nullcontext(), None),
            ("the ASCII names, a glossary keeping them", pairs, nullcontext(), kept),
        ]
        rows = []
        for way, chosen, context, glossary in ways:
            with context:
                texts = [s for s, _, _ in chosen]
                answers, seconds, _ = translate(translator, texts, "text", 1, args.clients, glossary)
            intact = sum(answer.count(name) == 1 for answer, (_, _, name) in zip(answers, chosen, strict=True))
            refs = [[r for _, r, _ in chosen]]
            bleu, chrf = sacrebleu.corpus_bleu(answers, refs).score, sacrebleu.corpus_chrf(answers, refs).score
            rows.append((way, intact, bleu, chrf, seconds))
        terms = []
        for term, translation in TERMS.items():
            glossary = Glossary.of({term: translation})
            holding = [s for s in sources if glossary.spans(s)]
            answers, _, _ = translate(translator, holding, "text", 1, args.clients, glossary)
            wanted = [{target for _, _, target in glossary.spans(s)} for s in holding]  # Document, first
            kept = sum(all(t in answer for t in want) for want, answer in zip(wanted, answers, strict=True))
            terms.append((term, translation, kept, len(holding)))
    finally:
        translator.scheduler.stop()
    print("| way | names intact | BLEU | chrF | seconds |\n|---|---:|---:|---:|---:|")
    for way, intact, bleu, chrf, seconds in rows:
        print(f"| {way} | {intact} of {len(pairs)} | {bleu:.2f} | {chrf:.2f} | {seconds:.2f} |")
    print("\n| glossary | sentences holding the term | translations holding its translation |\n|---|---:|---:|")
    for term, translation, kept, holding in terms:
        print(f"| {term} -> {translation} | {holding} | {kept} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
