"""Symbols and characters the model cannot read go to it as placeholders and come back in its translation."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from service.engine.decoding import Hypothesis
from service.metrics import Metrics
from service.model.folder import MANIFEST, load_model_folder
from service.model.tokenizer import Tokenizer
from service.settings import Settings
from service.text import document as text
from service.text.glossary import Glossary
from service.text.placeholders import Masked, Run, mask, protected
from service.translation.registry import load_translators
from service.translation.translator import TranslateOptions, Translator

FLAG = "🏴\U000e0067\U000e0062\U000e0073\U000e0063\U000e0074\U000e007f"  # Scotland's: a black flag and tags


def latin(char: str) -> bool:
    """A stand-in vocabulary: ASCII, a few accented letters, French punctuation, two symbols, one Cyrillic letter."""
    return char.isascii() or char in "éèàçœ€°—«»…р"


@pytest.mark.parametrize(
    ("sentence", "read", "runs"),
    [
        ("Open the file.", "Open the file.", ()),
        ("Price: 5 € per month.", "Price: 5 %1 per month.", (Run("%1", "€"),)),  # in the vocabulary, a symbol
        ("Pay €5 now.", "Pay %1 5 now.", (Run("%1", "€", spaced=True),)),  # %15 would be another placeholder
        ("It costs 5€ or 20€.", "It costs 5%1 or 20%2.", (Run("%1", "€"), Run("%2", "€"))),
        ("Good 👍🏽 job", "Good %1 job", (Run("%1", "👍🏽"),)),  # a skin tone: one run
        ("👨\u200d👩\u200d👧 plan", "%1 plan", (Run("%1", "👨\u200d👩\u200d👧"),)),  # an emoji sequence: one run
        ("⚠\ufe0f Warning", "%1 Warning", (Run("%1", "⚠\ufe0f"),)),  # its variation selector with it
        ("Press 1️⃣ now", "Press %1 now", (Run("%1", "1️⃣"),)),  # a keycap: its base with it
        ("5 m² or 4½", "5 m%1 or 4%2", (Run("%1", "²"), Run("%2", "½"))),  # numbers that are no digits
        (f"The {FLAG} flag", "The %1 flag", (Run("%1", FLAG),)),  # a subdivision flag: its tags with it
        ("Click ☰ then ⚙ to save.", "Click %1 then %2 to save.", (Run("%1", "☰"), Run("%2", "⚙"))),
        ("The word 東京 means Tokyo.", "The word %1 means Tokyo.", (Run("%1", "東京"),)),  # not in the vocabulary
        ("He said Привет.", "He said %1.", (Run("%1", "Привет"),)),  # the whole word, not П + р + ивет
        ("Use %1 and ⚠ and %2$s", "Use %1 and %3 and %2$s", (Run("%3", "⚠"),)),  # its own placeholders stay
        ("a + b = c | d < e > f ~ g ^ h $5", "a + b = c | d < e > f ~ g ^ h $5", ()),  # ASCII symbols: read
        ("Café crème — «très» bien…", "Café crème — «très» bien…", ()),  # letters and punctuation it has
        ("Open\u200e the\xa0file", "Open\u200e the\xa0file", ()),  # format characters and spaces: never runs
    ],
)
def test_what_is_masked(sentence: str, read: str, runs: tuple) -> None:
    masked = mask(sentence, latin)
    assert (masked.text, masked.runs) == (read, runs)
    assert masked.sentence == sentence


GLOSSARY = Glossary.of({"Files": "Files", "file": "document", "Visual Studio": "VS", "Visual Studio Code": "VS Code",
                         "Zürich": "Zurich", "C++": "C++", "e\u0301tat": "state", "zip": "archive",
                         "Zip": "Zip"})  # fmt: skip


@pytest.mark.parametrize(
    ("sentence", "read", "runs"),
    [
        ("Open the file.", "Open the %1.", (Run("%1", "file", target="document"),)),
        ("Open Files, files or a profile.", "Open %1, files or a profile.", (Run("%1", "Files", target="Files"),)),
        ("File it.", "%1 it.", (Run("%1", "File", target="Document"),)),  # a sentence's first word: upper case
        ("FILE it, Zip it.", "FILE it, %1 it.", (Run("%1", "Zip", target="Zip"),)),  # the glossary's own Zip wins
        ("The file_name and file2.", "The file_name and file2.", ()),
        ("Run Visual Studio Code, not Visual Studio.", "Run %1, not %2.",
         (Run("%1", "Visual Studio Code", target="VS Code"), Run("%2", "Visual Studio", target="VS"))),  # longest
        ("Ship to Zürich €5", "Ship to %1 %2 5", (Run("%1", "Zürich", target="Zurich"), Run("%2", "€", True))),
        ("Use C++ and C.", "Use %1 and C.", (Run("%1", "C++", target="C++"),)),
        ("L'état du file %1.", "L'%2 du %3 %1.",
         (Run("%2", "état", target="state"), Run("%3", "file", target="document"))),  # its own %1 stays
    ],
)  # fmt: skip
def test_a_glossary_term_is_a_placeholder_that_comes_back_as_its_translation(
    sentence: str, read: str, runs: tuple
) -> None:
    """Whole words in their case as written (or, for a term that begins lower case, with that letter upper case, its
    translation's too), the longest term first; a symbol run inside a term gives way to it
    (ü is no letter `latin` reads: without the glossary Zürich would be a run of its own); a term given in another
    Unicode form (e + U+0301) matches its NFC one, as the model's input is."""
    masked = mask(sentence, lambda c: c != "ü" and latin(c), GLOSSARY)
    assert (masked.text, masked.runs) == (read, runs)
    assert masked.sentence == sentence  # the source: the terms as written
    expected = sentence
    for run in runs:
        expected = expected.replace(run.text, run.target, 1) if run.target else expected
    assert masked.restore(masked.text) == expected


def test_restore_takes_back_only_a_translation_with_each_placeholder_once() -> None:
    masked = mask("Click ☰ then ⚙, pay €5, see %1.", latin)
    assert masked.text == "Click %2 then %3, pay %4 5, see %1."
    assert masked.restore("Cliquez sur %2 puis %3, payez %4 5, voir %1.") == "Cliquez sur ☰ puis ⚙, payez €5, voir %1."
    assert masked.restore("Puis %3, cliquez sur %2, %4 5, %1.") == "Puis ⚙, cliquez sur ☰, €5, %1."  # moved: follows
    assert masked.restore("Cliquez sur %2 puis %2, payez %4 5, %1.") is None  # one repeated, one lost
    assert masked.restore("Cliquez sur %2 puis %3, payez %45, %1.") is None  # a digit run into one: %45
    assert masked.restore("Cliquez sur %2 puis %3, payez %4 5.") is None  # the sentence's own %1 lost
    # an alternative of a beam whose best restored: what is found goes back, what is lost goes at the end
    assert masked.unmask("Cliquez sur %2 puis %2, payez %4 5, %1.") == "Cliquez sur ☰ puis ☰, payez €5, %1. ⚙"
    assert Masked("Open the file.").restore("Ouvrir le fichier.") == "Ouvrir le fichier."


@given(st.text(max_size=80))
def test_a_translation_that_copies_the_masked_text_gives_the_sentence_back(sentence: str) -> None:
    masked = mask(sentence, latin)
    assert masked.restore(masked.text) == sentence
    assert not [c for c in masked.text if protected(c, latin)]


PIECES = ["ab", "b", " ", "c", "€", "%1", "a", "5", "é", "-", ".", "_", "C++", "C", "+"]
text_of_pieces = st.lists(st.sampled_from(PIECES), max_size=14).map("".join)


terms_of_pieces = st.dictionaries(text_of_pieces.map(str.strip).filter(bool), st.just("T"), min_size=1, max_size=5)


@given(terms_of_pieces, text_of_pieces)
@example({"€": "T", "C++": "T"}, "a€ €C C++_ C++ .C++")  # a term that begins with no word character, after one
@settings(max_examples=300)
def test_a_glossary_finds_what_a_regex_alternation_of_its_terms_finds(terms: dict[str, str], sentence: str) -> None:
    """The reference: one regex, the terms longest first between (?<!\\w) and (?!\\w) (what Glossary did before it
    looked terms up by their first word: 588 µs a sentence at 10,000 terms)."""
    glossary = Glossary.of(terms)
    longest = sorted(glossary.terms, key=len, reverse=True)
    pattern = re.compile(r"(?<!\w)(?:" + "|".join(map(re.escape, longest)) + r")(?!\w)")
    assert glossary.spans(sentence) == [(m.start(), m.end(), "T") for m in pattern.finditer(sentence)]


KEEP = Glossary.of({"ab": "ab", "b c": "b c", "€": "€", "a%1": "a%1"})  # terms kept as written


@given(st.lists(st.sampled_from(["ab", "b", " ", "c", "€", "%1", "a", "5", "é", "ü"]), max_size=20).map("".join))
@example("a€ab")  # reads "a%1%2": the term "a%1" formed across a placeholder, not one of the sentence's
@example("a%1ü")  # reads "a%1%2": its own "a%1" was no whole word before ü, and is one before %2
def test_a_glossary_that_keeps_its_terms_gives_the_sentence_back(sentence: str) -> None:
    """Terms among symbols, digits, placeholders of the sentence's own and each other: what the model reads holds
    none of the sentence's terms as a whole word (a term it shows was formed by a placeholder in it or beside it),
    and the translation that copies it is the sentence."""
    masked = mask(sentence, latin, KEEP)
    assert masked.restore(masked.text) == sentence and masked.sentence == sentence
    placeholders = [run.pattern.search(masked.text).span() for run in masked.runs]  # type: ignore[union-attr]
    for start, end, _ in KEEP.spans(masked.text):
        assert any(a <= end and start <= b for a, b in placeholders), f"{masked.text[start:end]!r} in {masked.text!r}"


def test_the_tokenizer_says_which_characters_its_model_reads(model_dir: Path) -> None:
    tokenizer = Tokenizer.from_folder(load_model_folder(model_dir))
    assert tokenizer.readable("a") and tokenizer.readable("e")
    assert not tokenizer.readable("😀") and not tokenizer.readable("東")


def test_a_subdivision_flag_keeps_its_tags_on_the_way_to_the_model() -> None:
    """model_input drops format characters, tags among them, but not a flag's when placeholders take it whole."""
    assert text.model_input(f"The {FLAG}\u200b flag\u2060", keep_flags=True) == f"The {FLAG} flag"
    assert text.model_input(f"The {FLAG}\u200b flag\u2060") == "The 🏴 flag"  # unmasked: the tags are noise


def translator(model_dir: Path, on: bool) -> Translator:
    """The model's scheduler in this process (MT_ENGINE_PROCESS false), MT_MASK_SYMBOLS `on`."""
    settings = Settings(  # no guards: the random model's loops would be searched again, and counted
        models_dir=model_dir.parent, models=[model_dir.name], engine_process=False, mask_symbols=on, guards=False
    )
    [loaded] = load_translators(settings, Metrics())
    loaded.scheduler.start()
    return loaded


@pytest.mark.parametrize("on", [True, False])
def test_the_model_reads_placeholders(model_dir: Path, on: bool) -> None:
    """MT_MASK_SYMBOLS: the source ids are those of the masked sentence."""
    serving = translator(model_dir, on)
    prepared = serving.prepare(["Open 😀 the file."], "fr", TranslateOptions())
    read = "Open %1 the file." if on else "Open 😀 the file."
    assert prepared.jobs == [serving.tokenizer.encode(read, "fr")]
    assert [m.runs for m in prepared.masks] == ([(Run("%1", "😀"),)] if on else [()])
    serving.scheduler.stop()


def test_a_glossary_term_is_what_the_model_reads_as_a_placeholder(model_dir: Path) -> None:
    """In plain text and in HTML, an attribute value's text included: each term is %k in the model's input."""
    serving = translator(model_dir, True)
    options = TranslateOptions(glossary=Glossary.of({"file": "document"}))
    prepared = serving.prepare(["Open the file.", "Open the files."], "fr", options)
    assert prepared.jobs == [serving.tokenizer.encode(s, "fr") for s in ("Open the %1.", "Open the files.")]
    assert prepared.masks[0].runs == (Run("%1", "file", target="document"),)
    html = TranslateOptions(html=True, glossary=options.glossary)
    prepared = serving.prepare(['<p title="Save the file.">Open the <b>file</b> now.</p>'], "fr", html)
    assert serving.tokenizer.encode("Save the %1.", "fr") in prepared.jobs  # the title's
    assert serving.tokenizer.encode("%1", "fr") in prepared.jobs  # the piece inside <b>
    serving.scheduler.stop()


@pytest.mark.parametrize("on", [True, False])
def test_a_word_with_a_rare_letter_is_a_placeholder(model_dir: Path, tmp_path: Path, on: bool) -> None:
    """The manifest's `rare_letters` (format 9): a word that holds one goes to the model as a placeholder, whole,
    as one with a letter its vocabulary lacks; MT_MASK_SYMBOLS off, as it is."""
    folder = Path(shutil.copytree(model_dir, tmp_path / model_dir.name))
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    manifest["tokenizer"]["rare_letters"] = "è"
    (folder / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    serving = translator(folder, on)
    prepared = serving.prepare(["Send the file to Lefèvre-Brière today."], "fr", TranslateOptions())
    read = "Send the file to %1-%2 today." if on else "Send the file to Lefèvre-Brière today."
    assert prepared.jobs == [serving.tokenizer.encode(read, "fr")]
    serving.scheduler.stop()


@pytest.mark.parametrize("on", [True, False])
def test_kept_html_elements_are_placeholders_only_for_a_model_that_reads_them(model_dir: Path, on: bool) -> None:
    """MT_MASK_SYMBOLS: inline code stays in its sentence as %1; off, it ends the sentence, as any tag did."""
    serving = translator(model_dir, on)
    prepared = serving.prepare(["Run <code>make</code> now."], "fr", TranslateOptions(html=True))
    read = ["Run %1 now."] if on else ["Run", "now."]
    assert prepared.jobs == [serving.tokenizer.encode(s, "fr") for s in read]
    serving.scheduler.stop()


def test_the_first_hypothesis_that_gives_the_placeholders_back_goes_first(model_dir: Path) -> None:
    """What a sentence's beams (its rescue search, or a beam request's alternatives) give when its best lost or
    repeated a placeholder: the first that gives each back once, then the others in their order; none if none does."""
    serving = translator(model_dir, True)
    texts = ["Ouvrir maintenant.", "Ouvrir %1 %1.", "Ouvrir %1 maintenant.", "Ouvrir %1."]
    serving.tokenizer = SimpleNamespace(decode=lambda tokens: texts[tokens[0]])
    masked = mask("Open ☰ now.", latin)
    lost, twice, kept, also = (Hypothesis((n,), -1.0, -1.0) for n in range(4))
    assert serving._restoring(masked, [lost, twice, kept, also], 4) == [kept, lost, twice, also]
    assert serving._restoring(masked, [lost, twice, kept, also], 2) == [kept, lost]  # the request's n_best
    assert serving._restoring(masked, [lost, twice], 2) == []
    serving.scheduler.stop()


def test_a_sentence_whose_placeholders_did_not_come_back_is_translated_again_as_it_is(model_dir: Path) -> None:
    """The tiny model, random, never gives %1 back, nor do its beams: each masked sentence goes again, searched
    with 4 beams and unmasked, and the answer is the unmasked translation, as with MT_MASK_SYMBOLS off (the symbol
    then is the model's to keep or lose)."""
    q = ["Open 😀 the file.", "Open the file.", "Save ☰ now."]
    masked, plain = translator(model_dir, True), translator(model_dir, False)
    try:
        got = asyncio.run(masked.translate(q, "fr", TranslateOptions()))
        expected = asyncio.run(plain.translate(q, "fr", TranslateOptions()))
    finally:
        masked.scheduler.stop()
        plain.scheduler.stop()
    assert got.texts == expected.texts
    assert (got.input_tokens, got.output_tokens) == (expected.input_tokens, expected.output_tokens)
    finished = [t.metrics.registry.get_sample_value("mt_sentences_total", {"model": t.name}) for t in (masked, plain)]
    assert finished == [7.0, 3.0]  # the decoder's work: the two masked sentences three times
