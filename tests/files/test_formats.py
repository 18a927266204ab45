"""Every format round trip with a stand-in translator: the output parses with the format's own library, keeps ids,
contexts, comments and translated entries, fills the rest, and keeps each ecosystem's placeholders exactly."""

from __future__ import annotations

import io
import json
import re
import zipfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lxml import etree
from translate.storage import properties, pypo

from service.files import FileError, FileOptions, Translated, formats, source_texts, translate_file

_OPAQUE = re.compile(r"(<code>.*?</code>|<[^>]*>|&[a-z]+;|&#\d+;)", re.DOTALL)


def loud(texts: list[str], fmt: str) -> list[str]:
    """A stand-in engine: letters upper-cased outside what the HTML mode keeps (tags, <code> placeholders,
    character references), as a model that translates every word and copies every placeholder."""
    assert fmt == "html"
    return ["".join(p if _OPAQUE.fullmatch(p) else p.upper() for p in _OPAQUE.split(text)) for text in texts]


class Counting:
    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, texts: list[str], fmt: str) -> list[str]:
        self.calls.append(len(texts))
        return loud(texts, fmt)


PO = b"""# Translator note
msgid ""
msgstr ""
"Content-Type: text/plain; charset=UTF-8\\n"

#. a developer's note
#: src/main.c:10
msgctxt "menu"
msgid "Open %s in %(app)s"
msgstr ""

#: src/main.c:20
msgid "One file"
msgid_plural "%d files"
msgstr[0] ""
msgstr[1] ""

msgid "Done"
msgstr "Fait"

#~ msgid "Old"
#~ msgstr "Vieux"
"""


def test_gettext_fills_what_is_empty_and_keeps_the_rest() -> None:
    counting = Counting()
    result = translate_file(PO, "app.po", "fr", counting, FileOptions())
    assert counting.calls == [3] and (result.units, result.translated, result.kept) == (3, 2, 1)
    store = pypo.pofile.parsestring(result.data)
    units = {u.source if not u.hasplural() else str(u.source.strings[0]): u for u in store.units if not u.isheader()}
    menu = units["Open %s in %(app)s"]
    assert menu.target == "OPEN %s IN %(app)s" and menu.getcontext() == "menu" and menu.isfuzzy()
    assert "src/main.c:10" in menu.getlocations() and "a developer's note" in menu.getnotes()
    plural = units["One file"]
    assert [str(s) for s in plural.target.strings] == ["ONE FILE", "%d FILES"] and plural.isfuzzy()
    assert units["Done"].target == "Fait" and not units["Done"].isfuzzy()
    assert store.getheaderplural() == ("2", "(n > 1)") and "Language: fr" in result.data.decode()
    assert any(u.isobsolete() and u.source == "Old" for u in store.units)
    assert "# Translator note" in result.data.decode()


def test_gettext_options_and_templates() -> None:
    again = translate_file(PO, "app.po", "fr", loud, FileOptions(fuzzy=False, only_untranslated=False))
    store = pypo.pofile.parsestring(again.data)
    done = next(u for u in store.units if u.source == "Done")
    assert done.target == "DONE" and not done.isfuzzy() and again.kept == 0
    russian = translate_file(PO, "messages.pot", "ru", loud, FileOptions())
    assert russian.filename == "messages.ru.po"
    plural = next(u for u in pypo.pofile.parsestring(russian.data).units if u.hasplural())
    assert len(plural.target.strings) == 3  # Russian's three forms


XLIFF_12 = b"""<?xml version="1.0" encoding="UTF-8"?>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2">
  <file source-language="en" datatype="plaintext" original="app">
    <body>
      <group id="g1">
        <trans-unit id="save"><source>Save <g id="1">the file</g> as <x id="2"/> now</source>
          <note>toolbar</note></trans-unit>
        <trans-unit id="done"><source>Done</source><target state="translated">Fait</target></trans-unit>
        <trans-unit id="brand" translate="no"><source>Acme</source></trans-unit>
      </group>
    </body>
  </file>
</xliff>"""


def test_xliff_12_keeps_ids_and_inline_elements() -> None:
    result = translate_file(XLIFF_12, "app.xlf", "fr", loud, FileOptions())
    root = etree.fromstring(result.data)
    ns = {"x": "urn:oasis:names:tc:xliff:document:1.2"}
    save = root.find(".//x:trans-unit[@id='save']", ns)
    target = save.find("x:target", ns)
    assert target.get("state") == "needs-review-translation" and target.get("state-qualifier") == "mt-suggestion"
    assert target.text == "SAVE " and target[0].tag.endswith("g") and target[0].get("id") == "1"
    assert target[0].text == "THE FILE" and target[1].tag.endswith("x") and target[1].get("id") == "2"
    assert save.find("x:note", ns).text == "toolbar"
    assert root.find(".//x:trans-unit[@id='done']/x:target", ns).text == "Fait"
    assert root.find(".//x:trans-unit[@id='brand']/x:target", ns) is None
    assert root.find("x:file", ns).get("target-language") == "fr" and (result.translated, result.kept) == (1, 1)


XLIFF_20 = b"""<?xml version="1.0" encoding="UTF-8"?>
<xliff xmlns="urn:oasis:names:tc:xliff:document:2.0" version="2.0" srcLang="en">
  <file id="f1">
    <unit id="u1"><segment><source>Delete <pc id="1">all</pc> items <ph id="2"/>?</source></segment></unit>
    <unit id="u2"><segment state="final"><source>Yes</source><target>Oui</target></segment></unit>
  </file>
</xliff>"""


def test_xliff_20_fills_segments() -> None:
    result = translate_file(XLIFF_20, "app.xliff", "fr", loud, FileOptions(fuzzy=False))
    root = etree.fromstring(result.data)
    ns = {"x": "urn:oasis:names:tc:xliff:document:2.0"}
    segment = root.find(".//x:unit[@id='u1']/x:segment", ns)
    target = segment.find("x:target", ns)
    assert segment.get("state") == "translated" and segment.get("subState") is None
    assert "".join(target.itertext()) == "DELETE ALL ITEMS ?" and target.find("x:ph", ns).get("id") == "2"
    assert root.get("trgLang") == "fr" and root.find(".//x:unit[@id='u2']//x:target", ns).text == "Oui"


ANDROID = b"""<?xml version="1.0" encoding="utf-8"?>
<resources xmlns:xliff="urn:oasis:names:tc:xliff:document:1.2">
    <!-- the app's name -->
    <string name="app_name" translatable="false">Acme</string>
    <string name="welcome">Welcome, <xliff:g id="user">%1$s</xliff:g>! Don\\'t wait.</string>
    <string name="bold">Tap <b>here</b></string>
    <string name="html"><![CDATA[Read <i>this</i>]]></string>
    <plurals name="files"><item quantity="one">%d file</item><item quantity="other">%d files</item></plurals>
    <string-array name="days"><item>Monday</item><item>Tuesday</item></string-array>
</resources>"""


def test_android_strings_escape_and_keep_markup() -> None:
    result = translate_file(ANDROID, "strings.xml", "fr", loud, FileOptions())
    text = result.data.decode()
    root = etree.fromstring(result.data)
    by_name = {e.get("name"): e for e in root}
    assert by_name["app_name"].text == "Acme" and "<!-- the app's name -->" in text
    welcome = by_name["welcome"]
    assert welcome.text == "WELCOME, " and welcome[0].text == "%1$s" and welcome[0].tail == "! DON\\'T WAIT."
    assert by_name["bold"][0].tag == "b" and by_name["bold"][0].text == "HERE"
    assert "<![CDATA[READ <i>THIS</i>]]>" in text
    quantities = {i.get("quantity"): i.text for i in by_name["files"]}
    assert quantities == {"one": "%d FILE", "many": "%d FILES", "other": "%d FILES"}  # French's CLDR categories
    assert [i.text for i in by_name["days"]] == ["MONDAY", "TUESDAY"]


def test_json_messages_nested_plural_suffixes_and_icu() -> None:
    messages = {
        "nav": {"home": "Home", "greeting": "Hello {{name}}, you have {count} messages"},
        "item_one": "{{count}} item",
        "item_other": "{{count}} items",
        "files": "You have {count, plural, =0 {no files} one {# file} other {# files}} in {folder}.",
        "list": ["First", "Second"],
        "ext": {"message": "Open", "description": "a button"},
    }
    result = translate_file(json.dumps(messages).encode(), "fr.json", "fr", loud, FileOptions())
    out = json.loads(result.data)
    assert out["nav"] == {"home": "HOME", "greeting": "HELLO {{name}}, YOU HAVE {count} MESSAGES"}
    assert (out["item_one"], out["item_other"]) == ("{{count}} ITEM", "{{count}} ITEMS")
    assert out["item_many"] == "{{count}} ITEMS"  # French's third category, from _other, in i18next's order
    assert list(out)[:4] == ["nav", "item_one", "item_many", "item_other"]
    assert out["files"] == "YOU HAVE {count, plural, =0 {NO FILES} one {# FILE} other {# FILES}} IN {folder}."
    assert out["list"] == ["FIRST", "SECOND"] and out["ext"] == {"message": "OPEN", "description": "a button"}


def test_properties_and_strings() -> None:
    java = "# greeting\nwelcome=Welcome, {0}!\nsave = Save \\u00e9l\u00e8ve\\n now\n".encode()
    result = translate_file(java, "Messages.properties", "fr", loud, FileOptions())
    store = properties.javautf8file(io.BytesIO(result.data))
    values = {u.name: u.source for u in store.units if u.name}
    assert values == {"welcome": "WELCOME, {0}!", "save": "SAVE \u00c9L\u00c8VE\n NOW"} and b"# greeting" in result.data
    apple = b'/* Button */\n"save" = "Save %@ as \\"%1$@\\"";\n'
    result = translate_file(apple, "Localizable.strings", "fr", loud, FileOptions())
    store = properties.stringsutf8file(io.BytesIO(result.data))
    assert {u.name: u.source for u in store.units if u.name} == {"save": 'SAVE %@ AS "%1$@"'}


def test_documents() -> None:
    srt = b"1\n00:00:01,000 --> 00:00:02,500\nHello there,\nmy friend.\n\n2\n00:00:03,000 --> 00:00:04,000\nBye.\n"
    out = translate_file(srt, "film.srt", "fr", loud, FileOptions()).data.decode()
    cues = "1\n00:00:01,000 --> 00:00:02,500\nHELLO THERE,\nMY FRIEND.\n\n2\n00:00:03,000 --> 00:00:04,000\nBYE.\n"
    assert out == cues  # the timings as they were, the cue's two lines broken where the source's were
    text = b"First paragraph,\nwrapped.\n\nSecond %s one.\n"
    translated = translate_file(text, "a.txt", "fr", loud, FileOptions()).data
    assert translated == b"FIRST PARAGRAPH,\nWRAPPED.\n\nSECOND %s ONE.\n"
    page = b"<html><body><h1>Title</h1><p>Some <b>bold</b> text &amp; more.</p></body></html>"
    translated = translate_file(page, "a.html", "fr", loud, FileOptions()).data
    assert translated == b"<html><body><h1>TITLE</h1><p>SOME <b>BOLD</b> TEXT &amp; MORE.</p></body></html>"


def test_source_texts_are_the_strings_to_translate() -> None:
    assert source_texts(PO, "app.po", FileOptions()) == ["Open %s in %(app)s", "One file", "%d files"]


@pytest.mark.parametrize(
    ("name", "data", "status", "words"),
    [
        ("a.pdf", b"%PDF", 400, "send one of .po"),
        ("a.po", b'msgid "x\nmsgstr', 400, "not a valid gettext"),
        ("a.json", b"{\"a\": ", 400, "not valid JSON"),
        ("a.json", b"[1, 2]", 400, "JSON object"),
        ("a.xlf", b"<xliff><file>", 400, "not well-formed XML at line 1"),
        ("a.xlf", b"<root/>", 400, "not XLIFF"),
        ("a.txt", b"caf\xe9 au lait", 400, "not utf-8"),
        ("a.srt", b"hello\n", 400, "not a SubRip cue at line 1"),
        ("strings.xml", b"<resources><string>" + b"x" * 50 + b"</string></resources>", 413, "over the limit"),
    ],
)
def test_bad_files_get_a_clear_error(name: str, data: bytes, status: int, words: str) -> None:
    options = FileOptions(max_bytes=60)
    with pytest.raises(FileError, match=re.escape(words)) as raised:
        translate_file(data, name, "fr", loud, options)
    assert raised.value.status == status


def test_too_many_strings() -> None:
    many = json.dumps({f"k{i}": "word" for i in range(11)}).encode()
    with pytest.raises(FileError, match="11 strings") as raised:
        translate_file(many, "a.json", "fr", loud, FileOptions(max_units=10))
    assert raised.value.status == 413


BOMB = b"""<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;&lol;">]>
<resources><string name="a">&lol2;</string></resources>"""
XXE = b"""<?xml version="1.0"?><!DOCTYPE r [<!ENTITY x SYSTEM "file:///etc/passwd">]>
<xliff version="1.2" xmlns="urn:oasis:names:tc:xliff:document:1.2"><file><body><trans-unit id="1"><source>&x;</source>
</trans-unit></body></file></xliff>"""


@pytest.mark.parametrize(("name", "data"), [("strings.xml", BOMB), ("a.xlf", XXE)])
def test_entities_are_refused_not_expanded(name: str, data: bytes) -> None:
    with pytest.raises(FileError, match="DOCTYPE or entities") as raised:
        translate_file(data, name, "fr", loud, FileOptions())
    assert raised.value.status == 400


def test_a_failing_engine_fails_the_file() -> None:
    def broken(texts: list[str], fmt: str) -> list[str]:
        raise TimeoutError("the engine is gone")

    with pytest.raises(TimeoutError):
        translate_file(PO, "app.po", "fr", broken, FileOptions())


VALID = {"a.po": PO, "a.xlf": XLIFF_12, "b.xliff": XLIFF_20, "strings.xml": ANDROID, "a.json": b'{"a": {"b": "Hi"}}',
         "a.properties": b"a=Hi\n", "a.strings": b'"a" = "Hi";\n', "a.srt": b"1\n00:00:01,000 --> 00:00:02,000\nHi\n",
         "a.txt": b"Hi\n", "a.html": b"<p>Hi</p>"}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(VALID)), cut=st.integers(0, 400), junk=st.binary(max_size=40))
def test_broken_files_raise_file_error_only(name: str, cut: int, junk: bytes) -> None:
    data = VALID[name][:cut] + junk
    try:
        translate_file(data, name, "fr", loud, FileOptions())
    except FileError as error:
        assert error.status in (400, 413)


def test_formats_are_listed() -> None:
    assert {".po", ".pot", ".xlf", ".xliff", "strings.xml", ".json", ".properties", ".strings", ".srt", ".txt",
            ".html"} <= set(formats())


def zipped(entries: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return out.getvalue()


OOXML = "http://schemas.openxmlformats.org"
DOCX_TYPES = (
    f'<?xml version="1.0" encoding="UTF-8"?><Types xmlns="{OOXML}/package/2006/content-types">'
    '<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>'
    '<Default Extension="xml" ContentType="application/xml"/><Override PartName="/word/document.xml" '
    'ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>'
).encode()
DOCX_RELS = (
    f'<?xml version="1.0" encoding="UTF-8"?><Relationships xmlns="{OOXML}/package/2006/relationships">'
    f'<Relationship Id="rId1" Type="{OOXML}/officeDocument/2006/relationships/officeDocument" '
    'Target="word/document.xml"/></Relationships>'
).encode()
DOCX_BODY = (
    f'<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="{OOXML}/wordprocessingml/2006/main"><w:body>'
    '<w:p><w:pPr><w:pStyle w:val="Title"/></w:pPr><w:r><w:rPr><w:b/></w:rPr><w:t>Save </w:t></w:r>'
    "<w:r><w:t>the file.</w:t></w:r></w:p><w:p><w:r><w:t>Open %s now.</w:t></w:r></w:p></w:body></w:document>"
).encode()


def test_docx_paragraphs_keep_their_style() -> None:
    import docx

    data = zipped({"[Content_Types].xml": DOCX_TYPES, "_rels/.rels": DOCX_RELS, "word/document.xml": DOCX_BODY})
    result = translate_file(data, "report.docx", "fr", loud, FileOptions())
    document = docx.Document(io.BytesIO(result.data))
    assert [p.text for p in document.paragraphs] == ["SAVE THE FILE.", "OPEN %s NOW."]
    assert document.paragraphs[0]._p.pPr.pStyle.val == "Title" and document.paragraphs[0].runs[0].bold
    assert result.media_type.endswith("wordprocessingml.document") and result.translated == 2


ODF = "urn:oasis:names:tc:opendocument:xmlns"
ODT_CONTENT = (
    f'<?xml version="1.0" encoding="UTF-8"?><office:document-content xmlns:office="{ODF}:office:1.0" '
    f'xmlns:text="{ODF}:text:1.0"><office:body><office:text><text:h text:outline-level="1">Title</text:h>'
    '<text:p>Read <text:span text:style-name="T1">this</text:span><text:s/>now.<text:line-break/>Bye.</text:p>'
    "</office:text></office:body></office:document-content>"
).encode()


def test_odt_keeps_spans_spaces_and_breaks() -> None:
    data = zipped({"mimetype": b"application/vnd.oasis.opendocument.text", "content.xml": ODT_CONTENT})
    result = translate_file(data, "notes.odt", "fr", loud, FileOptions())
    archive = zipfile.ZipFile(io.BytesIO(result.data))
    assert archive.namelist()[0] == "mimetype"
    assert archive.read("mimetype") == b"application/vnd.oasis.opendocument.text"
    root = etree.fromstring(archive.read("content.xml"))
    text = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
    heading, paragraph = root.find(f".//{{{text}}}h"), root.find(f".//{{{text}}}p")
    assert heading.text == "TITLE" and heading.get(f"{{{text}}}outline-level") == "1"
    kinds = [etree.QName(child).localname for child in paragraph]
    assert kinds == ["span", "s", "line-break"] and paragraph[0].text == "THIS"
    assert "".join(paragraph.itertext()) == "READ THISNOW.BYE."


def test_an_archive_bomb_is_refused_before_it_is_read() -> None:
    bomb = zipped({"content.xml": b"<a/>" + b" " * 300_000_000})
    with pytest.raises(FileError, match="over the limits") as raised:
        translate_file(bomb, "big.odt", "fr", loud, FileOptions(max_bytes=50_000_000))
    assert raised.value.status == 413
    with pytest.raises(FileError, match="not a docx document"):
        translate_file(b"PK\x03\x04 broken", "a.docx", "fr", loud, FileOptions())


STRINGSDICT = b"""<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict><key>files_count</key><dict>
<key>NSStringLocalizedFormatKey</key><string>%#@files@</string>
<key>files</key><dict><key>NSStringFormatSpecTypeKey</key><string>NSStringPluralRuleType</string>
<key>NSStringFormatValueTypeKey</key><string>d</string>
<key>one</key><string>%d file</string><key>other</key><string>%d files</string></dict></dict></dict></plist>"""


def test_stringsdict_plurals_get_the_targets_categories() -> None:
    import plistlib

    result = translate_file(STRINGSDICT, "Localizable.stringsdict", "fr", loud, FileOptions())
    entry = plistlib.loads(result.data)["files_count"]
    assert entry["NSStringLocalizedFormatKey"] == "%#@files@"  # a placeholder alone: not sent to the engine
    files = entry["files"]
    assert (files["one"], files["many"], files["other"]) == ("%d FILE", "%d FILES", "%d FILES")
    assert files["NSStringFormatValueTypeKey"] == "d" and result.translated == 3


def entries(data: bytes) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        return {entry.filename: archive.read(entry) for entry in archive.infolist()}


def assert_only_changed(source: bytes, translated: bytes, changed: set[str]) -> None:
    """The translated archive has the source's entries, each byte for byte but those of `changed`, which differ."""
    before, after = entries(source), entries(translated)
    assert set(after) == set(before)
    assert {name for name in before if before[name] != after[name]} == changed


DRAWINGML = f"{OOXML}/drawingml/2006/main"


def pptx_deck() -> bytes:
    import pptx

    deck = pptx.Presentation()
    slide = deck.slides.add_slide(deck.slide_layouts[1])  # a title and a text box
    slide.shapes.title.text = "Quarterly report"
    paragraph = slide.placeholders[1].text_frame.paragraphs[0]
    for text, bold in (("Sales grew ", False), ("fast", True), (" this year.", False)):
        run = paragraph.add_run()
        run.text, run.font.bold = text, bold
    paragraph.add_line_break()
    paragraph.add_run().text = "Costs fell."
    slide.notes_slide.notes_text_frame.text = "Thank the team."
    second = deck.slides.add_slide(deck.slide_layouts[5])  # a title only
    second.shapes.title.text = "Open %s now"
    footer = second.shapes.add_textbox(0, 0, 100, 100).text_frame
    footer.text = "Page "
    field = '<a:fld xmlns:a="{A}" id="{{B1}}" type="{kind}"><a:rPr lang="en-US"/><a:t>{text}</a:t></a:fld>'
    footer.paragraphs[0]._p.append(etree.fromstring(field.format(A=DRAWINGML, kind="slidenum", text="two")))
    footer.add_paragraph()._p.append(etree.fromstring(field.format(A=DRAWINGML, kind="datetime1", text="today")))
    deck.slides.add_slide(deck.slide_layouts[6])  # blank: no text, so written back as it was
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def test_pptx_slides_and_notes() -> None:
    import pptx

    data = pptx_deck()
    result = translate_file(data, "deck.pptx", "fr", loud, FileOptions())
    deck = pptx.Presentation(io.BytesIO(result.data))
    first, second, _ = deck.slides
    assert first.shapes.title.text == "QUARTERLY REPORT" and second.shapes.title.text == "OPEN %s NOW"
    footer = [shape for shape in second.shapes if not shape.is_placeholder][0].text_frame.paragraphs
    assert [p.text for p in footer] == ["PAGE two", "today"]  # fields kept whole: the application writes them
    paragraph = first.placeholders[1].text_frame.paragraphs[0]
    assert [(run.text, run.font.bold) for run in paragraph.runs] == [
        ("SALES GREW ", False), ("FAST", True), (" THIS YEAR.", False), ("COSTS FELL.", None)
    ]
    assert paragraph.text == "SALES GREW FAST THIS YEAR.\vCOSTS FELL."  # python-pptx's \v: the line break
    assert first.notes_slide.notes_text_frame.text == "THANK THE TEAM."
    slides = {"ppt/slides/slide1.xml", "ppt/slides/slide2.xml", "ppt/notesSlides/notesSlide1.xml"}
    assert_only_changed(data, result.data, slides)
    assert result.media_type.endswith("presentationml.presentation")
    assert (result.format, result.translated) == ("pptx", 5)


ODP_CONTENT = (
    f'<?xml version="1.0" encoding="UTF-8"?><office:document-content xmlns:office="{ODF}:office:1.0" '
    f'xmlns:text="{ODF}:text:1.0" xmlns:draw="{ODF}:drawing:1.0" xmlns:presentation="{ODF}:presentation:1.0">'
    '<office:body><office:presentation><draw:page draw:name="p1"><draw:frame><draw:text-box>'
    '<text:p>Our <text:span text:style-name="T1">new</text:span> plan</text:p></draw:text-box></draw:frame>'
    "<presentation:notes><draw:frame><draw:text-box><text:p>Speak slowly.</text:p></draw:text-box></draw:frame>"
    "</presentation:notes></draw:page></office:presentation></office:body></office:document-content>"
).encode()
ODP_MIMETYPE = b"application/vnd.oasis.opendocument.presentation"


def test_odp_slides_and_notes_keep_their_spans() -> None:
    data = zipped({"mimetype": ODP_MIMETYPE, "content.xml": ODP_CONTENT, "styles.xml": b"<office:document-styles/>",
                   "META-INF/manifest.xml": b"<manifest/>"})
    result = translate_file(data, "plan.odp", "fr", loud, FileOptions())
    archive = zipfile.ZipFile(io.BytesIO(result.data))
    assert archive.namelist()[0] == "mimetype" and archive.infolist()[0].compress_type == zipfile.ZIP_STORED
    paragraphs = etree.fromstring(archive.read("content.xml")).findall(f".//{{{ODF}:text:1.0}}p")
    assert ["".join(p.itertext()) for p in paragraphs] == ["OUR NEW PLAN", "SPEAK SLOWLY."]
    assert paragraphs[0][0].text == "NEW" and paragraphs[0][0].get(f"{{{ODF}:text:1.0}}style-name") == "T1"
    assert_only_changed(data, result.data, {"content.xml"})
    assert result.media_type == ODP_MIMETYPE.decode() and result.format == "odp"


EPUB_CONTAINER = (
    b'<?xml version="1.0"?><container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
    b'<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/></rootfiles>'
    b"</container>"
)
EPUB_PACKAGE = (
    b'<?xml version="1.0" encoding="UTF-8"?><package xmlns="http://www.idpf.org/2007/opf" version="3.0" '
    b'unique-identifier="id"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/"><dc:title>A Book</dc:title>'
    b'<dc:language>en</dc:language></metadata><manifest><item id="nav" href="nav.xhtml" properties="nav" '
    b'media-type="application/xhtml+xml"/><item id="c1" href="text/chapter%201.xhtml" '
    b'media-type="application/xhtml+xml"/><item id="css" href="style.css" media-type="text/css"/><item id="ncx" '
    b'href="toc.ncx" media-type="application/x-dtbncx+xml"/><item id="img" href="cat.png" media-type="image/png"/>'
    b'</manifest><spine toc="ncx"><itemref idref="c1"/></spine></package>'
)
EPUB_CHAPTER = (
    b'<?xml version="1.0" encoding="utf-8"?>\n<!DOCTYPE html>\n<html xmlns="http://www.w3.org/1999/xhtml" '
    b'xml:lang="en" lang="en"><head><title>Chapter One</title><link rel="stylesheet" href="../style.css"/></head>'
    b'<body><h1 id="c1">Chapter One</h1><p>It was a <em>dark</em> night &amp; cold.<br/>Then '
    b'<img src="../cat.png" alt="A cat"/> came.</p></body></html>'
)
EPUB_NAV = (
    b'<?xml version="1.0" encoding="utf-8"?><html xmlns="http://www.w3.org/1999/xhtml" '
    b'xmlns:epub="http://www.idpf.org/2007/ops"><head><title>Contents</title></head><body><nav epub:type="toc">'
    b'<ol><li><a href="text/chapter%201.xhtml">Chapter One</a></li></ol></nav></body></html>'
)
EPUB_NCX = b'<?xml version="1.0"?><ncx xmlns="http://www.daisy.org/z3986/2005/ncx/"><navMap/></ncx>'


def epub_book(mimetype_first: bool = True) -> bytes:
    members = {"META-INF/container.xml": EPUB_CONTAINER, "OEBPS/content.opf": EPUB_PACKAGE,
               "OEBPS/nav.xhtml": EPUB_NAV, "OEBPS/text/chapter 1.xhtml": EPUB_CHAPTER,
               "OEBPS/style.css": b"p { margin: 0 }", "OEBPS/toc.ncx": EPUB_NCX, "OEBPS/cat.png": bytes(range(256))}
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        if mimetype_first:
            archive.writestr("mimetype", b"application/epub+zip", zipfile.ZIP_STORED)
        for name, data in members.items():
            archive.writestr(name, data)
        if not mimetype_first:
            archive.writestr("mimetype", b"application/epub+zip")  # last and compressed: put right when written
    return out.getvalue()


def test_epub_content_documents_as_html_every_other_entry_kept() -> None:
    for data in (epub_book(), epub_book(mimetype_first=False)):
        result = translate_file(data, "book.epub", "fr", loud, FileOptions())
        archive = zipfile.ZipFile(io.BytesIO(result.data))
        first = archive.infolist()[0]
        assert (first.filename, first.compress_type) == ("mimetype", zipfile.ZIP_STORED)
        assert archive.read("mimetype") == b"application/epub+zip"
        chapter = etree.fromstring(archive.read("OEBPS/text/chapter 1.xhtml"))  # well-formed XML still
        xhtml = {"x": "http://www.w3.org/1999/xhtml"}
        assert chapter.find("x:body/x:h1", xhtml).text == "CHAPTER ONE"
        paragraph = chapter.find("x:body/x:p", xhtml)
        assert "".join(paragraph.itertext()) == "IT WAS A DARK NIGHT & COLD.THEN  CAME."
        assert paragraph.find("x:em", xhtml).text == "DARK"
        assert paragraph.find("x:img", xhtml).get("src") == "../cat.png"
        assert b"<!DOCTYPE html>" in archive.read("OEBPS/text/chapter 1.xhtml")
        assert etree.fromstring(archive.read("OEBPS/nav.xhtml")).find(".//x:a", xhtml).text == "CHAPTER ONE"
        assert_only_changed(data, result.data, {"OEBPS/text/chapter 1.xhtml", "OEBPS/nav.xhtml"})
        assert (result.media_type, result.format, result.translated) == ("application/epub+zip", "epub", 2)


def central_flags(data: bytes, name: bytes, flags: int = 0, method: int | None = None) -> bytes:
    """The archive with `name`'s central directory entry given general-purpose `flags` (1: encrypted) or another
    compression `method`."""
    at = data.index(b"PK\x01\x02")
    while data[at + 46 : at + 46 + len(name)] != name:
        at = data.index(b"PK\x01\x02", at + 4)
    changed = bytearray(data)
    changed[at + 8 : at + 10] = (int.from_bytes(data[at + 8 : at + 10], "little") | flags).to_bytes(2, "little")
    if method is not None:
        changed[at + 10 : at + 12] = method.to_bytes(2, "little")
    return bytes(changed)


@pytest.mark.parametrize(
    ("name", "data", "words"),
    [
        ("a.epub", zipped({"mimetype": b"application/epub+zip"}), "no META-INF/container.xml in the archive"),
        ("a.epub", zipped({"META-INF/container.xml": b"<container/>"}), "no <rootfile full-path=...>"),
        ("a.epub", zipped({"META-INF/container.xml": EPUB_CONTAINER, "OEBPS/content.opf": EPUB_PACKAGE}),
         "no OEBPS/nav.xhtml in the archive"),
        ("a.epub", zipped({"META-INF/container.xml": EPUB_CONTAINER, "OEBPS/content.opf": EPUB_PACKAGE,
                           "OEBPS/nav.xhtml": b"caf\xe9", "OEBPS/text/chapter 1.xhtml": b""}), "not utf-8"),
        ("a.epub", zipped({"META-INF/container.xml": EPUB_CONTAINER, "OEBPS/content.opf": b"<package"}),
         "not well-formed XML"),
        ("a.pptx", zipped({"ppt/slides/slide1.xml": b"<p/>"}), "no ppt/presentation.xml in the archive"),
        ("a.pptx", zipped({"ppt/presentation.xml": b"<p/>", "ppt/slides/slide1.xml": BOMB}), "DOCTYPE or entities"),
        ("a.odp", zipped({"mimetype": ODP_MIMETYPE}), "no content.xml in the archive: not a odp document"),
        ("a.odp", central_flags(zipped({"content.xml": ODP_CONTENT}), b"content.xml", flags=1), "a damaged archive"),
        ("a.docx", central_flags(zipped({"word/document.xml": DOCX_BODY}), b"word/document.xml", method=99),
         "a damaged archive"),
        ("a.epub", b"PK\x03\x04 broken", "not a epub document (a zip archive)"),
    ],
)
def test_broken_archives_get_a_clear_400(name: str, data: bytes, words: str) -> None:
    with pytest.raises(FileError, match=re.escape(words)) as raised:
        translate_file(data, name, "fr", loud, FileOptions())
    assert raised.value.status == 400


ARCHIVES = {
    "a.docx": zipped({"[Content_Types].xml": DOCX_TYPES, "_rels/.rels": DOCX_RELS, "word/document.xml": DOCX_BODY}),
    "a.odt": zipped({"mimetype": b"application/vnd.oasis.opendocument.text", "content.xml": ODT_CONTENT}),
    "a.odp": zipped({"mimetype": ODP_MIMETYPE, "content.xml": ODP_CONTENT}),
    "a.pptx": pptx_deck(),
    "a.epub": epub_book(),
}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(sorted(ARCHIVES)), at=st.floats(0, 1), cut=st.booleans(), junk=st.binary(max_size=40))
def test_damaged_archives_raise_file_error_only(name: str, at: float, cut: bool, junk: bytes) -> None:
    """An archive cut short, or with bytes overwritten anywhere (headers, compressed data, the directory)."""
    data = ARCHIVES[name]
    where = int(at * len(data))
    damaged = data[:where] + junk if cut else data[:where] + junk + data[where + len(junk) :]
    try:
        translate_file(damaged, name, "fr", loud, FileOptions())
    except FileError as error:
        assert error.status in (400, 413)


def test_docx_runs_keep_their_formatting_around_the_words() -> None:
    """A bold and an italic word mid-sentence come back bold and italic around their translations; a line break
    stays in its run, a tab goes to the model as a marker kept whole; a bookmark stays where it was; a hyperlink
    goes around the words of its translation, or, where its runs differ in formatting, the paragraph is written
    whole into its first run (the hyperlink's text emptied, not lost)."""
    import docx
    from docx.oxml import parse_xml

    document = docx.Document()
    paragraph = document.add_paragraph("Click ")
    paragraph.add_run("here").bold = True
    paragraph.add_run(" to save the ")
    paragraph.add_run("whole").italic = True
    paragraph.add_run(" file.\tNow").add_break()
    paragraph.add_run("or later.")
    w = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
    paragraph._p.append(parse_xml(f'<w:bookmarkEnd {w} w:id="0"/>'))
    link = '<w:hyperlink {w} r:id="rId9" xmlns:r="{r}"><w:r><w:rPr><w:rStyle w:val="Hyperlink"/></w:rPr>{runs}'
    link += "</w:hyperlink>"
    r = "http://schemas.openxmlformats.org/officeDocument/2006/relationships"
    document.add_paragraph("See ")._p.append(parse_xml(link.format(w=w, r=r, runs="<w:t>the site</w:t></w:r>")))
    mixed = "<w:t>the </w:t></w:r><w:r><w:rPr><w:b/></w:rPr><w:t>site</w:t></w:r>"
    document.add_paragraph("See ")._p.append(parse_xml(link.format(w=w, r=r, runs=mixed)))
    out = io.BytesIO()
    document.save(out)
    result = translate_file(out.getvalue(), "a.docx", "fr", loud, FileOptions())
    translated = docx.Document(io.BytesIO(result.data)).paragraphs
    assert [(r.text, bool(r.bold), bool(r.italic)) for r in translated[0].runs] == [
        ("CLICK ", False, False), ("HERE", True, False), (" TO SAVE THE ", False, False), ("WHOLE", False, True),
        (" FILE.", False, False), ("\t", False, False), ("NOW\nOR LATER.", False, False),  # the tab a run of its own
    ]
    assert etree.QName(translated[0]._p[-1]).localname == "bookmarkEnd"
    assert [run.text for run in translated[1].runs] == ["SEE "] and translated[1].text == "SEE THE SITE"
    [hyperlink] = translated[1].hyperlinks  # around the words of its translation, its runs' formatting kept
    assert hyperlink.text == "THE SITE" and hyperlink.runs[0]._r.rPr.rStyle.val == "Hyperlink"
    assert translated[1]._p[-1].get(f"{{{r}}}id") == "rId9"
    assert translated[2].runs[0].text == "SEE THE SITE" and not translated[2].hyperlinks[0].text  # runs of two
    # formattings in a hyperlink: the paragraph is written whole into its first run
    assert_only_changed(out.getvalue(), result.data, {"word/document.xml"})


def same(texts: list[str], fmt: str) -> list[str]:
    return texts


def formatted_chars(paragraph: object) -> list[tuple[str, bool, bool]]:
    return [(char, bool(run.bold), bool(run.italic)) for run in paragraph.runs for char in run.text]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.text(st.sampled_from("ab <&%s\t\n{}"), min_size=1, max_size=8), st.booleans(),
                          st.booleans()), min_size=1, max_size=6))
def test_docx_runs_read_and_written_back_unchanged(runs: list[tuple[str, bool, bool]]) -> None:
    """With a translator that gives each text back, every character keeps its formatting."""
    import docx

    document = docx.Document()
    paragraph = document.add_paragraph()
    for text, bold, italic in runs:
        run = paragraph.add_run(text)
        run.bold, run.italic = bold, italic
    out = io.BytesIO()
    document.save(out)
    if not paragraph.text.strip():
        return
    result = translate_file(out.getvalue(), "a.docx", "fr", same, FileOptions())
    assert formatted_chars(docx.Document(io.BytesIO(result.data)).paragraphs[0]) == formatted_chars(paragraph)


def test_a_text_box_in_a_docx_paragraph_is_translated_once_as_its_own() -> None:
    w = f"{OOXML}/wordprocessingml/2006/main"
    box = "<w:r><w:drawing><w:txbxContent><w:p><w:r><w:t>Inside box</w:t></w:r></w:p></w:txbxContent></w:drawing></w:r>"
    for link in ("", '<w:hyperlink><w:r><w:t> link</w:t></w:r></w:hyperlink>'):  # read as runs, or whole
        body = (f'<w:document xmlns:w="{w}"><w:body><w:p><w:r><w:t>Outer text</w:t></w:r>{box}{link}</w:p>'
                "</w:body></w:document>").encode()
        data = zipped({"[Content_Types].xml": DOCX_TYPES, "_rels/.rels": DOCX_RELS, "word/document.xml": body})
        result = translate_file(data, "a.docx", "fr", loud, FileOptions())
        root = etree.fromstring(entries(result.data)["word/document.xml"])
        outer, inner = root.iter(f"{{{w}}}p")
        assert [t.text for t in inner.iter(f"{{{w}}}t")] == ["INSIDE BOX"] and result.translated == 2
        own = [t.text or "" for t in outer.iter(f"{{{w}}}t") if next(t.iterancestors(f"{{{w}}}p")) is outer]
        assert "".join(own) == ("OUTER TEXT LINK" if link else "OUTER TEXT")


def test_a_part_without_text_comes_back_with_its_own_bytes() -> None:
    p = 'xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main"'
    text = f'<p:sld {p} xmlns:a="{DRAWINGML}"><a:p><a:r><a:t>Hi</a:t></a:r></a:p></p:sld>'.encode()
    blank = f"<?xml version='1.0'?>\n<p:sld {p}>\n  <p:cSld/>\n</p:sld>\n".encode()  # as no serialiser writes it
    data = zipped({"ppt/presentation.xml": b"<p/>", "ppt/slides/slide1.xml": text, "ppt/slides/slide2.xml": blank})
    assert_only_changed(data, translate_file(data, "a.pptx", "fr", loud, FileOptions()).data, {"ppt/slides/slide1.xml"})


def test_docx_runs_marks_hyphens_and_breaks() -> None:
    """Spelling marks are dropped (the translation would make them wrong), a non-breaking hyphen is text, a page
    break stays a run of its own where it stood, a field (its result the application's) is kept whole."""
    w = f"{OOXML}/wordprocessingml/2006/main"
    body = (f'<w:document xmlns:w="{w}"><w:body><w:p><w:proofErr w:type="spellStart"/><w:r><w:t>Colour</w:t></w:r>'
            '<w:proofErr w:type="spellEnd"/><w:r><w:t xml:space="preserve"> e</w:t></w:r><w:r><w:noBreakHyphen/></w:r>'
            '<w:r><w:t>mail</w:t><w:br w:type="textWrapping"/></w:r><w:r><w:br w:type="page"/></w:r>'
            '<w:fldSimple w:instr="PAGE"><w:r><w:t>two</w:t></w:r></w:fldSimple></w:p></w:body></w:document>').encode()
    data = zipped({"[Content_Types].xml": DOCX_TYPES, "_rels/.rels": DOCX_RELS, "word/document.xml": body})
    result = translate_file(data, "a.docx", "fr", loud, FileOptions())
    paragraph = etree.fromstring(entries(result.data)["word/document.xml"]).find(f".//{{{w}}}p")
    assert [etree.QName(child).localname for child in paragraph] == ["r", "r", "fldSimple"]
    text, page, field = paragraph
    assert [(etree.QName(c).localname, c.text) for c in text] == [("t", "COLOUR E\u2011MAIL"), ("br", None)]
    assert page[0].get(f"{{{w}}}type") == "page" and "".join(field.itertext()) == "two"  # a field: kept whole


def word_chars(paragraph: etree._Element) -> list[tuple[str, bool, bool]]:
    """Each character of a WordprocessingML paragraph: its text (a tab, a break as \\t, \\n), bold, in a hyperlink."""
    w = f"{{{OOXML}/wordprocessingml/2006/main}}"
    found = []
    for run in paragraph.iter(f"{w}r"):
        bold = run.find(f"{w}rPr/{w}b") is not None
        linked = run.getparent().tag == f"{w}hyperlink"
        for child in run:
            text = {f"{w}t": child.text or "", f"{w}tab": "\t", f"{w}br": "\n"}.get(child.tag, "")
            found += [(char, bold, linked) for char in text]
    return found


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.text(st.sampled_from("ab <&%s\t{}"), min_size=1, max_size=8), st.booleans(),
                          st.booleans()), min_size=1, max_size=6))
def test_docx_runs_and_hyperlinks_read_and_written_back_unchanged(runs: list[tuple[str, bool, bool]]) -> None:
    """With a translator that gives each text back, every character keeps its formatting and its hyperlink."""
    from xml.sax.saxutils import escape

    w = f"{OOXML}/wordprocessingml/2006/main"
    parts = []
    for text, bold, linked in runs:
        run = f'<w:r>{"<w:rPr><w:b/></w:rPr>" if bold else ""}<w:t xml:space="preserve">{escape(text)}</w:t></w:r>'
        parts.append(f'<w:hyperlink w:anchor="a">{run}</w:hyperlink>' if linked else run)
    body = f'<w:document xmlns:w="{w}"><w:body><w:p>{"".join(parts)}</w:p></w:body></w:document>'.encode()
    data = zipped({"word/document.xml": body})
    source = etree.fromstring(body).find(f".//{{{w}}}p")
    if not "".join(source.itertext()).strip():
        return
    result = translate_file(data, "a.docx", "fr", same, FileOptions())
    paragraph = etree.fromstring(entries(result.data)["word/document.xml"]).find(f".//{{{w}}}p")
    assert word_chars(paragraph) == word_chars(source)


def sure_of_short(texts: list[str], fmt: str) -> Translated:
    """`loud`, with a confidence of 0.9 for a string of under 12 characters and 0.2 for a longer one."""
    return Translated(loud(texts, fmt), [0.9 if len(text) < 12 else 0.2 for text in texts])


def test_gettext_marks_low_confidence_entries_fuzzy_and_gives_each_its_confidence() -> None:
    """fuzzy off: only the entries below low_confidence are fuzzy (a plural by its least confident form), each
    entry with a translator comment of its confidence, replaced (not added to) when it is translated again."""
    options = FileOptions(fuzzy=False, low_confidence=0.5)
    result = translate_file(PO, "app.po", "fr", sure_of_short, options)
    units = {u.getid(): u for u in pypo.pofile.parsestring(result.data).units if not u.isheader()}
    opened, files = units["menu\x04Open %s in %(app)s"], units["One file"]
    assert opened.isfuzzy() and files.isfuzzy()  # a plural by its least sure form: "<code>%d</code> files", 0.2
    assert "# machine translation, confidence 0.20\n" in opened.othercomments
    overwrite = FileOptions(fuzzy=False, only_untranslated=False)
    again = translate_file(result.data, "app.po", "fr", sure_of_short, overwrite)
    units = {u.getid(): u for u in pypo.pofile.parsestring(again.data).units if not u.isheader()}
    comments = [c for c in units["Done"].othercomments if c.startswith("# machine translation")]
    assert comments == ["# machine translation, confidence 0.90\n"] and not units["Done"].isfuzzy()
    assert [c for c in units["menu\x04Open %s in %(app)s"].othercomments if "confidence" in c] == [
        "# machine translation, confidence 0.20\n"
    ]


def test_xliff_marks_low_confidence_units_for_review_with_their_confidence_in_a_note() -> None:
    """fuzzy off: 1.2 needs-review-translation and 2.0 initial for a unit below low_confidence; the confidence in
    a note on the target (1.2: in the unit; 2.0: in the unit's <notes>, before its segments), replaced when the file
    is translated again; a confident unit translated, its note given too."""
    options = FileOptions(fuzzy=False, low_confidence=0.5)
    ns1 = {"x": "urn:oasis:names:tc:xliff:document:1.2"}
    root = etree.fromstring(translate_file(XLIFF_12, "app.xlf", "fr", sure_of_short, options).data)
    save = root.find(".//x:trans-unit[@id='save']", ns1)  # "Save <g>the file</g> <x/>": a long markup string
    assert save.find("x:target", ns1).get("state") == "needs-review-translation"
    assert save.find("x:target", ns1).get("state-qualifier") is None
    [note] = save.findall("x:note[@from='mt-confidence']", ns1)
    assert note.text == "0.20" and note.get("annotates") == "target"
    ns2 = {"x": "urn:oasis:names:tc:xliff:document:2.0"}
    once = translate_file(XLIFF_20, "app.xliff", "fr", sure_of_short, options).data
    overwrite = FileOptions(low_confidence=0.5, only_untranslated=False)
    twice = translate_file(once, "app.xliff", "fr", sure_of_short, overwrite).data
    for data in (once, twice):
        unit = etree.fromstring(data).find(".//x:unit[@id='u1']", ns2)
        assert unit.find("x:segment", ns2).get("state") == "initial"
        assert etree.QName(unit[0]).localname == "notes"  # before the segments, as 2.0's schema orders them
        [note] = unit.findall("x:notes/x:note[@category='mt-confidence']", ns2)
        assert note.text == "0.20" and note.get("appliesTo") == "target"
    yes = etree.fromstring(twice).find(".//x:unit[@id='u2']", ns2)
    assert yes.find("x:segment", ns2).get("state") == "translated" and yes.find("x:notes/x:note", ns2).text == "0.90"
