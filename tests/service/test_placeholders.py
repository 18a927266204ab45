"""Symbols and characters the model cannot read go to it as placeholders and come back in its translation."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from service.metrics import Metrics
from service.model_folder import load_model_folder
from service.placeholders import Masked, mask, protected
from service.settings import Settings
from service.tokenizer import Tokenizer
from service.translator import TranslateOptions, Translator


def latin(char: str) -> bool:
    """A stand-in vocabulary: ASCII, a few accented letters, French punctuation, two symbols."""
    return char.isascii() or char in "éèàçœ€°—«»…"


@pytest.mark.parametrize(
    ("sentence", "text", "runs"),
    [
        ("Open the file.", "Open the file.", ()),
        ("Price: 5 € per month.", "Price: 5 {0} per month.", (("{0}", "€"),)),  # in the vocabulary, a symbol
        ("Save it 🙂 now.", "Save it {0} now.", (("{0}", "🙂"),)),
        ("Good 👍🏽 job", "Good {0} job", (("{0}", "👍🏽"),)),  # a skin tone: one run
        ("👨\u200d👩\u200d👧 plan", "{0} plan", (("{0}", "👨\u200d👩\u200d👧"),)),  # an emoji sequence: one run
        ("⚠\ufe0f Warning", "{0} Warning", (("{0}", "⚠\ufe0f"),)),  # its variation selector with it
        ("Click ☰ then ⚙ to save.", "Click {0} then {1} to save.", (("{0}", "☰"), ("{1}", "⚙"))),
        ("The word 東京 means Tokyo.", "The word {0} means Tokyo.", (("{0}", "東京"),)),  # not in the vocabulary
        ("Hello {0}, ⚠ the disk", "Hello {0}, {1} the disk", (("{1}", "⚠"),)),  # its own {0} stays its own
        ("a + b = c | d < e > f ~ g ^ h $5", "a + b = c | d < e > f ~ g ^ h $5", ()),  # ASCII symbols: read
        ("Café crème — «très» bien…", "Café crème — «très» bien…", ()),  # letters and punctuation it has
    ],
)
def test_what_is_masked(sentence: str, text: str, runs: tuple) -> None:
    masked = mask(sentence, latin)
    assert (masked.text, masked.runs) == (text, runs)


def test_unmask_puts_each_run_in_its_placeholders_place() -> None:
    masked = Masked("Click {0} then {1}.", (("{0}", "☰"), ("{1}", "⚙")))
    assert masked.unmask("Cliquez sur {0} puis {1}.") == "Cliquez sur ☰ puis ⚙."
    assert masked.unmask("Puis {1}, cliquez sur {0}.") == "Puis ⚙, cliquez sur ☰."  # moved: follows
    assert masked.unmask("Cliquez sur {0} puis {0}.") == "Cliquez sur ☰ puis ☰. ⚙"  # repeated, dropped
    assert Masked("Open the file.").unmask("Ouvrir le fichier.") == "Ouvrir le fichier."


@given(st.text(max_size=80))
def test_a_translation_that_copies_the_masked_text_gives_the_sentence_back(sentence: str) -> None:
    masked = mask(sentence, latin)
    assert masked.unmask(masked.text) == sentence
    assert not any(protected(c, latin) for c in masked.text if not ("{" in masked.text and c in "{}0123456789"))


def test_the_tokenizer_says_which_characters_its_model_reads(model_dir: Path) -> None:
    tokenizer = Tokenizer.from_folder(load_model_folder(model_dir))
    assert tokenizer.readable("a") and tokenizer.readable("e")
    assert not tokenizer.readable("😀") and not tokenizer.readable("東")


@pytest.mark.parametrize("on", [True, False])
def test_the_model_reads_placeholders_and_the_answer_has_the_symbols(model_dir: Path, on: bool) -> None:
    """MT_MASK_SYMBOLS: the source ids are those of the masked sentence, and the translation holds the symbol
    whatever the model made of its placeholder (the tiny model, random, drops it: the symbol goes at the end)."""
    settings = Settings(models_dir=model_dir.parent, models=[model_dir.name], engine_process=False, mask_symbols=on)
    translator = Translator(load_model_folder(model_dir), settings, Metrics(), runtime=None)
    prepared = translator.prepare(["Open 😀 the file."], "fr", TranslateOptions())
    read = "Open {0} the file." if on else "Open 😀 the file."
    assert prepared.jobs == [translator.tokenizer.encode(read, "fr")]
    assert [m.runs for m in prepared.masks] == ([(("{0}", "😀"),)] if on else [()])
    translator.scheduler.stop()
