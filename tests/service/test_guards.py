"""The guards against degenerate output (service/engine/guards.py) on crafted token strings and texts, and the
translator's retry of a degenerate greedy sentence with beams on the tiny random model."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from service.engine.batches import TokenRules, decode_batch, ends
from service.engine.decoding import Hypothesis, SearchOptions
from service.engine.guards import GuardLimits, degenerate, tandem_repeats
from service.engine.runtime import OnnxRuntime
from service.metrics import Metrics
from service.model.folder import load_model_folder
from service.model.tokenizer import Tokenizer
from service.settings import Settings
from service.translation.registry import load_translators
from service.translation.translator import TranslateOptions, Translator

LIMITS = GuardLimits()
EOS = 3
SOURCE = [10, 11, 12, 13, 14, 15, EOS]  # seven tokens


@pytest.mark.parametrize(
    ("ids", "repeats"),
    [
        ([], 1),
        ([5, 6, 7], 1),
        ([5, 5, 5, 5], 4),
        ([5, 6, 5, 6, 5, 6, 9], 3),
        ([1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3], 4),
        ([1, 2, 3, 4, 1, 2, 3, 4, 9], 2),
        ([1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4, 5], 1),  # a 5-gram: longer than the guard looks
    ],
)
def test_tandem_repeats_counts_an_ngram_repeated_in_a_row(ids: list[int], repeats: int) -> None:
    assert tandem_repeats(ids) == repeats


def test_a_loop_is_degenerate_unless_the_source_repeats_as_much() -> None:
    loop = [20, 21, 20, 21, 20, 21, 20, 21, EOS]
    assert degenerate(SOURCE, loop, True, None, LIMITS) == "repetition"
    assert degenerate(SOURCE, loop[:6] + [EOS], True, None, LIMITS) is None  # three times: a reference may
    echo = [10, 10, 10, 11, 12, EOS]  # "Yes, yes, yes"
    assert degenerate(echo, [20, 20, 20, 20, EOS], True, None, LIMITS) is None  # no more than the source's + 1


def test_a_length_far_from_the_sources_is_degenerate() -> None:
    assert degenerate(SOURCE, [20, EOS], True, None, LIMITS) is None  # 2/7 = 0.29: short, not too short
    assert degenerate(SOURCE * 4, [20, EOS], True, None, LIMITS) == "length"  # 2/28
    assert degenerate(SOURCE * 4, [20, 21], False, None, LIMITS) is None  # cut by a length cap, not the model's end
    assert degenerate(SOURCE, list(range(30, 52)) + [EOS], False, None, LIMITS) == "length"  # 23/7 > 3
    assert degenerate([10, 11, EOS], list(range(30, 45)), False, None, LIMITS) is None  # a short source: no ratio


def test_a_copy_of_a_source_of_four_words_is_degenerate() -> None:
    out = [20, 21, 22, EOS]
    assert degenerate(SOURCE, out, True, ("Open all the  files", "open all the files"), LIMITS) == "copy"
    assert degenerate(SOURCE, out, True, ("Open the file", "Open the file"), LIMITS) is None  # a short label
    copies = ("ascii ident : %.*s", "24.000 FPS (FILM)", 'Sticky <span class="count">(%s)</span>',
              "table_constraint_using_index", "zip;tar;extract;unpack;")
    for copy in copies:
        assert degenerate(SOURCE, out, True, (copy, copy), LIMITS) is None  # the dev set's right copies
    assert degenerate(SOURCE, out, True, ("Open the file", "Ouvrir le fichier"), LIMITS) is None
    assert degenerate(SOURCE, out, True, None, LIMITS) is None  # the same language on both sides: no copy guard


TEXTS = ["Open the file.", "Save the document before closing it.", "Could not connect to the server.", "Print",
         "Delete the selected items?", "The operation was cancelled by the user.", "Show hidden files"]  # fmt: skip


def translator(model_dir: Path, guards: bool) -> Translator:
    settings = Settings(models_dir=model_dir.parent, models=[model_dir.name], engine_process=False, guards=guards)
    [loaded] = load_translators(settings, Metrics())
    loaded.scheduler.start()
    return loaded


def solo(model_dir: Path, text: str, limits: GuardLimits) -> tuple[Hypothesis, str | None, Hypothesis | None]:
    """The sentence's greedy hypothesis decoded alone, what the guards find in it, and 4 beams' best if they do."""
    folder = load_model_folder(model_dir)
    tokenizer, ids = Tokenizer.from_folder(folder), folder.manifest.special_ids
    rules, runtime = TokenRules(ids.decoder_start, ids.eos, ids.pad), OnnxRuntime(folder)
    src = tokenizer.encode(text, "fr")

    def best(beam_size: int) -> Hypothesis:
        return decode_batch(runtime, [src], [SearchOptions(beam_size, int(2.0 * len(src)) + 10)], rules)[0][0]

    def kind(h: Hypothesis) -> str | None:
        return degenerate(src, h.tokens, ends(h, rules), (text, tokenizer.decode(h.tokens)), limits)

    greedy = best(1)
    found = kind(greedy)
    beams = best(4) if found else None
    return greedy, found, beams if beams is not None and kind(beams) is None else None


@pytest.mark.parametrize(
    "limits", [LIMITS, GuardLimits(repeats=18)], ids=["default-limits", "loops-of-18-beams-fix"]
)
def test_a_degenerate_greedy_sentence_is_searched_again_with_beams(model_dir: Path, limits: GuardLimits) -> None:
    """The tiny random model loops: a sentence whose greedy translation a guard flags is searched again with 4 beams
    and answered with their best where the guards pass it, else as it was; each one is counted by kind and outcome,
    and the answer is the sentence's alone (each decoded here on its own). MT_GUARDS=false: greedy as it is. Its
    beams loop less than its greedy search, but at the default limits still loop; counted from 18 repeats, two of
    its greedy loops (25 and 22 repeats) are fixed by beams (11 and 5)."""
    tokenizer = Tokenizer.from_folder(load_model_folder(model_dir))
    expected, greedy_texts, outcomes = [], [], Counter()
    for text in TEXTS:
        greedy, kind, fixed = solo(model_dir, text, limits)
        greedy_texts.append(tokenizer.decode(greedy.tokens))
        expected.append(tokenizer.decode((fixed or greedy).tokens))
        if kind:
            outcomes[kind, "retried_fixed" if fixed else "retried_kept"] += 1
    assert outcomes, "the random model should loop on some of these"
    assert any(outcome == "retried_fixed" for _, outcome in outcomes) == (limits != LIMITS)
    guarded, plain = translator(model_dir, True), translator(model_dir, False)
    guarded.guard_limits = limits
    try:
        got = asyncio.run(guarded.translate(TEXTS, "fr", TranslateOptions()))
        as_is = asyncio.run(plain.translate(TEXTS, "fr", TranslateOptions()))
    finally:
        guarded.scheduler.stop()
        plain.scheduler.stop()
    assert got.texts == expected and as_is.texts == greedy_texts
    registry = guarded.metrics.registry
    for (kind, outcome), n in outcomes.items():
        labels = {"model": guarded.name, "kind": kind, "outcome": outcome}
        assert registry.get_sample_value("mt_degenerate_outputs_total", labels) == n
    assert not [m for m in plain.metrics.registry.collect() if m.name == "mt_degenerate_outputs" and m.samples]
    assert all(0.0 <= c <= 1.0 for c in got.confidences) and len(got.confidences) == len(TEXTS)
