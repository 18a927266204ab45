"""The corpus's translated package metadata: Debian's package descriptions (Translation-en against Translation-fr),
AppStream component data, and the index files of the archive they come in, fetched by apt and pinned by hash."""

from __future__ import annotations

import gzip
import hashlib
import shutil

import pytest

from model_export.corpus import CorpusError
from model_export.corpus.build import BuildOptions, build
from model_export.corpus.descriptions import description_blocks, markup_blocks, read_appstream, read_descriptions
from model_export.corpus.fetch import (
    APT_HELPER,
    FetchError,
    cached_archive,
    index_path,
    index_update_options,
    lists_file,
    store_index,
)
from model_export.corpus.pins import Group, Pin

ENGLISH = """Package: abc
Description-md5: aaa
Description-en: music notation tool
 The program translates tunes to PostScript. It can print them.
 .
 Features:
  * fast rendering
    of large scores
  * many fonts

Package: old
Description-md5: bbb
Description-en: a tool whose description changed
 It now does more.

Package: uneven
Description-md5: ccc
Description-en: an uneven translation
 First paragraph.
 .
 Second paragraph.
"""

FRENCH = """Package: abc
Description-md5: aaa
Description-fr: outil de notation musicale
 Le programme traduit des airs en PostScript. Il peut les imprimer.
 .
 Fonctionnalités :
  * rendu rapide
    de grandes partitions
  * beaucoup de polices

Package: old
Description-md5: stale
Description-fr: un outil
 Il fait des choses.

Package: uneven
Description-md5: ccc
Description-fr: une traduction inégale
 Premier et second paragraphes en un.
"""


def test_description_blocks_read_the_summary_paragraphs_and_list_items():
    blocks = description_blocks(ENGLISH.split("Description-en: ")[1].split("\n\nPackage")[0])
    assert blocks == [
        ("summary", "music notation tool"),
        ("para", "The program translates tunes to PostScript. It can print them."),
        ("para", "Features:"),
        ("item", "fast rendering of large scores"),
        ("item", "many fonts"),
    ]


def test_read_descriptions_pairs_only_translations_of_the_current_english_with_the_same_blocks(tmp_path):
    (tmp_path / "en").write_text(ENGLISH, encoding="utf-8")
    (tmp_path / "fr").write_text(FRENCH, encoding="utf-8")
    pairs = list(read_descriptions(tmp_path / "fr", tmp_path / "en", "Translation-fr"))
    assert {p.catalog for p in pairs} == {"abc"}  # `old` translates another English text, `uneven` misaligns
    assert [(p.source, p.target) for p in pairs] == [
        ("music notation tool", "outil de notation musicale"),
        ("The program translates tunes to PostScript.", "Le programme traduit des airs en PostScript."),
        ("It can print them.", "Il peut les imprimer."),
        ("Features:", "Fonctionnalités :"),
        ("fast rendering of large scores", "rendu rapide de grandes partitions"),
        ("many fonts", "beaucoup de polices"),
    ]
    assert all(p.package == "Translation-fr" for p in pairs)


COMPONENTS = """---
File: DEP-11
Version: '0.16'
---
Type: desktop-application
ID: org.example.Notes
Package: notes
Name:
  C: Notes
  de: Notizen
  fr: Bloc-notes
Summary:
  C: Take notes quickly
  fr: Prendre des notes rapidement
Description:
  C: <p>Notes keeps your ideas.</p><ul><li>Search them</li><li>Tag them</li></ul>
  fr: <p>Notes garde vos idées.</p><ul><li>Cherchez-les</li><li>Étiquetez-les</li></ul>
---
Type: desktop-application
ID: org.example.Untranslated
Package: other
Name:
  C: Other
Summary:
  C: Not in French
  fr: Pas en français
Description:
  C: <p>One.</p><p>Two.</p>
  fr: <p>Un et deux.</p>
---
Type: desktop-application
ID: org.example.Broken
Package: broken
Description:
  C: <p>Open <b>this</p>
  fr: <p>Ouvrez <b>ceci</p>
"""


def test_read_appstream_pairs_names_summaries_and_aligned_description_blocks(tmp_path):
    path = tmp_path / "Components-amd64.yml"
    path.write_text(COMPONENTS, encoding="utf-8")
    pairs = [(p.catalog, p.source, p.target) for p in read_appstream(path, "Components-amd64.yml")]
    assert pairs == [
        ("org.example.Notes", "Notes", "Bloc-notes"),
        ("org.example.Notes", "Take notes quickly", "Prendre des notes rapidement"),
        ("org.example.Notes", "Notes keeps your ideas.", "Notes garde vos idées."),
        ("org.example.Notes", "Search them", "Cherchez-les"),
        ("org.example.Notes", "Tag them", "Étiquetez-les"),
        ("org.example.Untranslated", "Not in French", "Pas en français"),  # its description's blocks differ
    ]
    assert markup_blocks("<p>Open <b>this</p>") is None
    path.write_text("---\nID: [unclosed\n", encoding="utf-8")
    with pytest.raises(CorpusError, match="cannot read AppStream data"):
        list(read_appstream(path, "Components-amd64.yml"))


def index_pin(name: str, text: str, group: str = "meta") -> Pin:
    digest = hashlib.sha256(text.encode()).hexdigest()
    return Pin("index", name, digest, group, f"bookworm/main/i18n/{name}")


def test_index_update_options_fetch_each_pinned_path_into_the_caches_own_lists(tmp_path):
    options = index_update_options([index_pin("Translation-fr", "x")], tmp_path / "apt" / "lists")
    values = options[1::2]
    assert set(options[::2]) == {"-o"}
    assert f"Dir::State::Lists={tmp_path}/apt/lists" in values and "Acquire::Languages=none" in values
    assert "Acquire::IndexTargets::deb::mt-corpus-0::MetaKey=main/i18n/Translation-fr" in values


@pytest.mark.skipif(not APT_HELPER.exists(), reason="needs apt's apt-helper")
def test_store_index_keeps_a_fetched_file_only_with_its_pinned_hash(tmp_path):
    lists, cache = tmp_path / "lists", tmp_path / "cache"
    lists.mkdir()
    for name in ("deb.example.org_debian_dists_bookworm-updates_main_i18n_Translation-fr.gz",
                 "deb.example.org_debian_dists_bookworm_main_i18n_Translation-fr.gz"):  # fmt: skip
        (lists / name).write_bytes(gzip.compress((name.split("_")[3] + FRENCH).encode()))
    pin = index_pin("Translation-fr", "bookworm" + FRENCH)
    found = lists_file(pin, lists)
    assert found is not None and found.name.startswith("deb.example.org_debian_dists_bookworm_main")
    assert lists_file(index_pin("Translation-de", ""), lists) is None
    store_index(pin, found, cache)
    assert index_path(pin, cache).read_text(encoding="utf-8") == "bookworm" + FRENCH
    assert cached_archive(pin, cache) == index_path(pin, cache)
    changed = index_pin("Translation-fr", "another text")
    shutil.rmtree(cache)
    with pytest.raises(FetchError, match="has SHA-256 .* packages.txt pins .* update the pin"):
        store_index(changed, found, cache)
    assert cached_archive(changed, cache) is None and not list((cache / "indexes").iterdir())


def test_build_reads_descriptions_from_cached_index_files_and_needs_the_english(tmp_path):
    english = ENGLISH + "".join(
        f"\nPackage: p{i}\nDescription-md5: m{i}\nDescription-en: tool number {i}\n Tool {i} counts sheep.\n"
        for i in range(6)
    )
    french = FRENCH + "".join(
        f"\nPackage: p{i}\nDescription-md5: m{i}\nDescription-fr: outil numéro {i}\n L'outil {i} compte les moutons.\n"
        for i in range(6)
    )  # fmt: skip
    cache = tmp_path / "cache"
    pins = [index_pin("Translation-en", english), index_pin("Translation-fr", french)]
    for pin, text in zip(pins, (english, french), strict=True):
        index_path(pin, cache).parent.mkdir(parents=True, exist_ok=True)
        index_path(pin, cache).write_text(text, encoding="utf-8")
    groups = {"meta": Group("meta", extra=True, reader="descriptions", holdout="documents", general=2)}
    options = BuildOptions(tmp_path / "out", cache, 1, 1, 1, general_dev_size=50, general_test_size=50)
    stats = build(pins, options, groups)
    assert stats["groups"]["meta"] == {"train": 14, "dev": 0, "test": 0, "dev.general": 2, "test.general": 2}
    assert stats["packages"]["Translation-fr"]["entries"] == 18 and stats["mb_downloaded"] == 0
    notice = (tmp_path / "out" / "NOTICE").read_text()
    assert f"bookworm/main/i18n/Translation-fr {pins[1].version} (index): each description under the licence" in notice
    with pytest.raises(CorpusError, match="needs the English descriptions .* Translation-en in the same group"):
        build(pins[1:], options, groups)
