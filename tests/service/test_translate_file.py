"""POST /translate_file end to end on the tiny model: LibreTranslate's multipart request, the download link (and the
file in the answer itself), the same strings' translations as /translate gives, a request's glossary over the
server's, presentations and books in their formats, and clear 4xx for bad files."""

from __future__ import annotations

import io
import json
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from lxml import etree
from translate.storage import pypo

from service.api.app import create_app
from service.files.segments import Segment
from service.settings import Settings
from service.translation.translator import Translator
from tests.files.test_formats import (
    ODF,
    ODP_CONTENT,
    ODP_MIMETYPE,
    assert_only_changed,
    entries,
    epub_book,
    pptx_deck,
    zipped,
)

PO = b"""msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"

#: app.c:1
msgid "Open the file."
msgstr ""

msgid "Save %s as a new file."
msgstr ""

msgid "Done"
msgstr "Fait"
"""


def settings_for(model_dir: Path, tmp_path: Path, **changes: object) -> Settings:
    return Settings(
        models_dir=model_dir.parent, models=[model_dir.name], intra_op_threads=1, file_store_dir=tmp_path / "store",
        **changes,
    )


@pytest.fixture
def client(model_dir: Path, tmp_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(model_dir, tmp_path))) as c:
        yield c


def send(client: TestClient, name: str, data: bytes, **fields: str) -> object:
    return client.post("/translate_file", files={"file": (name, data)}, data={"source": "en", "target": "fr", **fields})


def test_a_catalogue_comes_back_translated_by_its_link(client: TestClient) -> None:
    answer = send(client, "app.po", PO)
    assert answer.status_code == 200, answer.text
    url = answer.json()["translatedFileUrl"]
    assert url.startswith("http://testserver/download_file/") and url.endswith("/app.po")
    download = client.get(url)
    assert download.status_code == 200 and "app.po" in download.headers["content-disposition"]
    store = pypo.pofile.parsestring(download.content)
    targets = {u.source: u.target for u in store.units if not u.isheader()}
    # what /translate's HTML mode gives for the same strings with their placeholders kept as elements
    sources = ["Open the file.", "Save %s as a new file."]
    markup = [Segment.of_text(text).markup for text in sources]
    answer = client.post("/translate", json={"q": markup, "source": "en", "target": "fr", "format": "html"}).json()
    assert [targets[text] for text in sources] == [Segment("").text(t) for t in answer["translatedText"]]
    assert "%s" in targets["Save %s as a new file."]
    assert targets["Done"] == "Fait"
    assert all(u.isfuzzy() for u in store.units if u.source in ("Open the file.", "Save %s as a new file."))


def test_the_file_in_the_answer_itself_and_options(client: TestClient) -> None:
    answer = send(client, "app.po", PO, response="file", fuzzy="false", overwrite="true")
    assert answer.status_code == 200 and answer.headers["content-type"].startswith("text/x-gettext-translation")
    store = pypo.pofile.parsestring(answer.content)
    done = next(u for u in store.units if u.source == "Done")
    assert not any(u.isfuzzy() for u in store.units) and done.target != "Fait"


def test_auto_source_reads_the_file(client: TestClient) -> None:
    answer = send(client, "app.po", PO, source="auto")
    assert answer.status_code == 200, answer.text


def test_bad_requests_get_clear_errors(client: TestClient, model_dir: Path, tmp_path: Path) -> None:
    unknown = send(client, "a.pdf", b"%PDF")
    assert unknown.status_code == 400 and ".po" in unknown.json()["error"]
    broken = send(client, "a.po", b'msgid "x\nmsgstr')
    assert broken.status_code == 400 and "not a valid gettext" in broken.json()["error"]
    assert client.post("/translate_file", data={"target": "fr"}).status_code == 400
    assert send(client, "a.po", PO, target="").status_code == 400
    assert send(client, "a.po", PO, target="de").status_code == 400
    assert send(client, "a.po", PO, fuzzy="maybe").status_code == 400
    assert client.get("/download_file/nope/a.po").status_code == 404
    with TestClient(create_app(settings_for(model_dir, tmp_path, max_file_bytes=100))) as small:
        assert send(small, "a.po", PO).status_code == 413
        big = small.post("/translate_file", files={"file": ("a.po", b"x" * 200_000)}, data={"target": "fr"})
        assert big.status_code == 413


def test_a_link_expires(model_dir: Path, tmp_path: Path) -> None:
    with TestClient(create_app(settings_for(model_dir, tmp_path, file_store_seconds=0.5))) as c:
        url = send(c, "app.po", PO).json()["translatedFileUrl"]
        assert c.get(url).status_code == 200
        time.sleep(0.6)
        assert c.get(url).status_code == 404
        assert not list((tmp_path / "store").glob("*.bin"))  # swept


def test_files_are_counted_by_format_and_outcome(client: TestClient) -> None:
    send(client, "app.po", PO)
    send(client, "a.po", b'msgid "x\nmsgstr')
    metrics = client.get("/metrics").text
    assert 'mt_files_total{format="po",outcome="translated"} 1.0' in metrics
    assert 'mt_files_total{format="po",outcome="refused"} 1.0' in metrics


def test_frontend_settings_offer_the_formats(client: TestClient) -> None:
    body = client.get("/frontend/settings").json()
    assert body["filesTranslation"] is True and ".po" in body["supportedFilesFormat"]


class Glossaries:
    """Translator.translate wrapped: each call's glossary terms (its `given`) recorded, the translation as it was."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[dict[str, str] | None] = []
        original = Translator.translate

        async def recording(translator: Translator, texts: list[str], target: str, options: object) -> object:
            self.seen.append(None if options.glossary is None else dict(options.glossary.given))
            return await original(translator, texts, target, options)

        monkeypatch.setattr(Translator, "translate", recording)


def test_a_glossary_field_goes_over_the_servers_glossary(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny model never gives a term's placeholder back (the sentence goes again without it): what is checked
    is the glossary each of the file's requests carries, the server's terms with the form's over them."""
    path = tmp_path / "glossary.json"
    path.write_text(json.dumps({"en": {"fr": {"Files": "Files", "Open": "Ouvrir"}}}), encoding="utf-8")
    glossaries = Glossaries(monkeypatch)
    with TestClient(create_app(settings_for(model_dir, tmp_path, glossary_file=path))) as c:
        answer = send(c, "app.po", PO, glossary=json.dumps({"Open": "Ouvrez", "file": "fichier"}))
        assert answer.status_code == 200, answer.text
        assert glossaries.seen == [{"Files": "Files", "Open": "Ouvrez", "file": "fichier"}]
        glossaries.seen.clear()
        assert send(c, "app.po", PO, glossary="").status_code == 200  # an empty field: the server's alone
        assert glossaries.seen == [{"Files": "Files", "Open": "Ouvrir"}]


@pytest.mark.parametrize(
    ("glossary", "status", "message"),
    [
        ("file=fichier", 400, "glossary: a glossary in a form is a JSON object of terms and their translations"),
        ('["file"]', 400, "glossary: Input should be a valid dictionary"),
        ('{"file": 5}', 400, "glossary.file: Input should be a valid string"),
        ('{" file": "fichier"}', 400, "glossary term ' file': spaces around it"),
        ('{"file": ""}', 400, "an empty translation: give the term itself to keep it as written"),
        (json.dumps({f"t{i}": "x" for i in range(1001)}), 413, "the glossary has 1001 terms; the limit is 1000"),
    ],
)
def test_a_bad_glossary_is_refused_saying_what_to_change(
    client: TestClient, glossary: str, status: int, message: str
) -> None:
    answer = send(client, "app.po", PO, glossary=glossary)
    assert answer.status_code == status and message in answer.json()["error"], answer.text


def test_a_glossary_needs_the_models_placeholders(model_dir: Path, tmp_path: Path) -> None:
    with TestClient(create_app(settings_for(model_dir, tmp_path, mask_symbols=False))) as c:
        refused = send(c, "app.po", PO, glossary='{"file": "fichier"}')
        assert refused.status_code == 400 and "which a glossary needs" in refused.json()["error"]
        assert send(c, "app.po", PO).status_code == 200


def test_presentations_and_books_through_the_tiny_model(client: TestClient) -> None:
    """.pptx, .odp, .epub through the real app: each comes back in its format (opened with python-pptx, or parsed
    as the zip and XML it must be), its text replaced, every entry but the translated ones byte for byte."""
    import pptx

    deck = pptx_deck()
    answer = send(client, "deck.pptx", deck, response="file")
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"] == "application/vnd.openxmlformats-officedocument.presentationml.presentation"
    slides = pptx.Presentation(io.BytesIO(answer.content)).slides
    assert slides[0].shapes.title.text.strip() and slides[0].shapes.title.text != "Quarterly report"
    assert slides[0].notes_slide.notes_text_frame.text != "Thank the team."
    bold = [run.font.bold for run in slides[0].placeholders[1].text_frame.paragraphs[0].runs if run.text.strip()]
    assert bold.count(True) == 1 and len(bold) > 1  # the bold word's run around its translation, the rest plain
    assert_only_changed(deck, answer.content, {"ppt/slides/slide1.xml", "ppt/slides/slide2.xml",
                                               "ppt/notesSlides/notesSlide1.xml"})

    odp = zipped({"mimetype": ODP_MIMETYPE, "content.xml": ODP_CONTENT, "styles.xml": b"<s/>"})
    answer = send(client, "plan.odp", odp, response="file")
    assert answer.status_code == 200 and answer.headers["content-type"] == ODP_MIMETYPE.decode()
    paragraphs = etree.fromstring(entries(answer.content)["content.xml"]).findall(f".//{{{ODF}:text:1.0}}p")
    assert len(paragraphs) == 2 and "".join(paragraphs[1].itertext()) != "Speak slowly."
    assert_only_changed(odp, answer.content, {"content.xml"})

    book = epub_book()
    answer = send(client, "book.epub", book, response="file")
    assert answer.status_code == 200 and answer.headers["content-type"] == "application/epub+zip"
    chapter = etree.fromstring(entries(answer.content)["OEBPS/text/chapter 1.xhtml"])  # well-formed XML still
    xhtml = {"x": "http://www.w3.org/1999/xhtml"}
    assert chapter.find("x:body/x:p/x:img", xhtml).get("src") == "../cat.png"
    assert chapter.find("x:body/x:h1", xhtml).text != "Chapter One"
    assert zipfile.ZipFile(io.BytesIO(answer.content)).infolist()[0].filename == "mimetype"
    assert_only_changed(book, answer.content, {"OEBPS/text/chapter 1.xhtml", "OEBPS/nav.xhtml"})

    metrics = client.get("/metrics").text
    for label in ("pptx", "odp", "epub"):
        assert f'mt_files_total{{format="{label}",outcome="translated"}} 1.0' in metrics


@pytest.mark.parametrize("name", ["a.pptx", "a.odp", "a.epub"])
def test_broken_presentations_and_books_are_4xx(client: TestClient, name: str) -> None:
    valid = {"a.pptx": pptx_deck(), "a.odp": zipped({"content.xml": ODP_CONTENT}), "a.epub": epub_book()}[name]
    bomb = zipped({"content.xml": b"<a/>" + b" " * 210_000_000})
    for data in (b"", b"not a zip", valid[: len(valid) // 2], valid[:100] + b"\0" * 64 + valid[164:], bomb):
        answer = send(client, name, data)
        assert 400 <= answer.status_code < 500, (name, answer.status_code, answer.text)
    assert send(client, name, bomb).status_code == 413
    metrics = client.get("/metrics").text
    assert f'mt_files_total{{format="{name[2:]}",outcome="refused"}} 6.0' in metrics


def test_frontend_settings_offer_presentations_and_books(client: TestClient) -> None:
    offered = client.get("/frontend/settings").json()["supportedFilesFormat"]
    assert {".docx", ".odt", ".pptx", ".odp", ".epub"} <= set(offered)
    unknown = send(client, "a.pdf", b"%PDF")
    assert unknown.status_code == 400 and all(s in unknown.json()["error"] for s in (".pptx", ".odp", ".epub"))


W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def test_a_bold_word_of_a_docx_paragraph_stays_bold(client: TestClient) -> None:
    import docx

    document = docx.Document()
    paragraph = document.add_paragraph("Click ")
    paragraph.add_run("here").bold = True
    paragraph.add_run(" to save the whole file.\tNow.")
    w = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    link = f'<w:hyperlink {w} w:anchor="help"><w:r><w:t>Read the help.</w:t></w:r></w:hyperlink>'
    document.add_paragraph("Or ")._p.append(etree.fromstring(link))
    out = io.BytesIO()
    document.save(out)
    answer = send(client, "a.docx", out.getvalue(), response="file")
    assert answer.status_code == 200, answer.text
    runs = docx.Document(io.BytesIO(answer.content)).paragraphs[0].runs
    assert [bool(run.bold) for run in runs if run.text.strip()].count(True) == 1
    assert "".join(run.text for run in runs) != "Click here to save the whole file.\tNow."
    assert "".join(run.text for run in runs).count("\t") == 1  # the tab, kept whole, where the model put it
    [link] = docx.Document(io.BytesIO(answer.content)).paragraphs[1].hyperlinks
    assert link.text.strip() and link.text != "Read the help." and link._hyperlink.get(f"{{{W}}}anchor") == "help"
    assert_only_changed(out.getvalue(), answer.content, {"word/document.xml"})
