"""bench.inline translates sentences with inline tags three ways and prints what each gave and cost."""

import random
import re
from pathlib import Path

import pytest

from bench import inline
from service.text import document as text
from service.text import markup

SOURCES = "Open the file now.\nSave the document as a copy.\nThe printer is not responding today.\nHi.\n"
REFERENCES = "Ouvrir le fichier.\nEnregistrer le document.\nL'imprimante ne répond pas.\nSalut.\n"


@pytest.mark.parametrize("element", ["b", "code"])
def test_the_three_ways_are_scored_and_timed(
    element: str, model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "test.en").write_text(SOURCES)
    (tmp_path / "test.fr").write_text(REFERENCES)
    args = ["--model", str(model_dir), "--corpus", str(tmp_path), "--clients", "2", "--element", element]
    assert inline.main(args) == 0
    out = capsys.readouterr().out
    assert "3 test sentences" in out  # "Hi." has fewer than 4 words
    rows = re.findall(r"^\| ([a-z (),]+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) \| ([\d,]+) \| ([\d,]+) \|$", out, re.M)
    assert [r[0] for r in rows] == ["whole through its tags", "split at its tags (before)", "no tags (plain text)"]
    assert all(float(seconds) > 0 and int(read.replace(",", "")) > 0 for _, _, _, seconds, _, read in rows)
    if element == "code":
        held = re.search(r"(\d+) of 3 answers hold <code>config.yaml</code> exactly once; (\d+) took", out)
        assert held and held[1] == "3" and 0 <= int(held[2]) <= 3  # once each, from either pass
    else:
        assert re.search(r"whole through its tags: \d+ of 3 answers placed the tags in the whole translation", out)
    assert markup.split_html.__name__ == "split_html" and text.Document.unplaced.__name__ == "unplaced"  # restored


def test_an_element_goes_among_the_words() -> None:
    rng = random.Random(1)
    assert inline.with_kept("a < b is c", rng).count(inline.KEPT) == 1
    marked = inline.tagged("a < b is c", rng)
    assert marked.count("<b>") == marked.count("</b>") == 1 and "&lt;" in marked
    assert inline.without(marked, "b") == "a < b is c"
    assert inline.without("x <code>config.yaml</code> y", "code") == "x y"
