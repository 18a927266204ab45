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
