"""Tests of the EN→FR corpus builder: catalog extraction, each cleaning rule, dedup and leak-free, seeded splits,
groups of the packages list, document-level hold-out, the FreeDict and XHTML documentation readers.

No network: catalogs are built with polib at test time and packed into a zip (a wheel) or a real .deb.
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import polib
import pytest
import sentencepiece as spm
from translate.storage import qm

from model_export.corpus import CorpusError, clean
from model_export.corpus.__main__ import main
from model_export.corpus.build import BuildOptions, build
from model_export.corpus.dictionary import dictd_number, entry_pair, read_freedict
from model_export.corpus.documents import block_pairs, is_document_member, read_documents
from model_export.corpus.extract import catalog_files, choose_catalogs, extract_archive, path_locale, read_catalog
from model_export.corpus.fetch import cached_archive, deb_glob
from model_export.corpus.freeorion import expand, parse_table
from model_export.corpus.manpages import plain, roff_blocks
from model_export.corpus.minetest import split_line
from model_export.corpus.notice import debian_licence, notice_text, wheel_licence
from model_export.corpus.pins import Group, Pin, load_recipe, parse_recipe, select_groups
from model_export.corpus.qt import QmFormatError, read_messages, read_qm
from model_export.corpus.split import (
    Pair,
    cap_pairs,
    deduplicate,
    group_by_key,
    group_shares,
    shares,
    split_general,
    split_pairs,
)
from model_export.corpus.tokenizer import pieces_per_sentence


def make_mo(path: Path, entries: list[polib.POEntry]) -> Path:
    """Compile entries to a .mo file at `path`."""
    po = polib.POFile()
    po.metadata = {"Content-Type": "text/plain; charset=UTF-8", "Plural-Forms": "nplurals=2; plural=(n > 1);"}
    for entry in entries:
        po.append(entry)
    path.parent.mkdir(parents=True, exist_ok=True)
    po.save_as_mofile(str(path))
    return path


SAMPLE = [
    polib.POEntry(msgid="_Open File", msgstr="_Ouvrir le fichier"),
    polib.POEntry(msgid="%d file", msgid_plural="%d files", msgstr_plural={0: "%d fichier", 1: "%d fichiers"}),
    polib.POEntry(msgctxt="menu", msgid="Quit", msgstr="Quitter"),
    polib.POEntry(msgid="Untranslated", msgstr=""),
]


def make_wheel(tmp_path: Path) -> Path:
    fr = make_mo(tmp_path / "src/pkg/locale/fr/LC_MESSAGES/pkg.mo", SAMPLE)
    ca = make_mo(tmp_path / "src/pkg/locale/fr_CA/LC_MESSAGES/pkg.mo", [polib.POEntry(msgid="Car", msgstr="Char")])
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(fr, "pkg/locale/fr/LC_MESSAGES/pkg.mo")
        archive.write(ca, "pkg/locale/fr_CA/LC_MESSAGES/pkg.mo")
        archive.writestr("pkg-1.0.dist-info/METADATA", "Name: pkg\nVersion: 1.0\nLicense-Expression: BSD-3-Clause\n\n")
    return wheel


# --- extraction -----------------------------------------------------------------------------------------


def test_path_locale_and_choice():
    assert path_locale("usr/share/locale/fr/LC_MESSAGES/a.mo") == "fr"
    assert path_locale("usr/share/locale/fr_FR.UTF-8/LC_MESSAGES/a.mo") == "fr_FR"
    assert path_locale("wp-content/languages/admin-fr_FR.mo") == "fr_FR"
    assert path_locale("x/locales.zip!fr/messages.mo") == "fr"
    assert path_locale("usr/share/locale/fy/LC_MESSAGES/a.mo") is None
    assert path_locale("usr/share/locale/fr/LC_MESSAGES/a.po") is None
    assert path_locale("mods/public/public.zip!l10n/fr.public-maps.po", ".po") == "fr"  # 0 A.D.: locale.domain
    assert path_locale("mods/public/public.zip!l10n/fy.public-maps.po", ".po") is None
    assert path_locale("l10n/french.po", ".po") is None
    paths = ["l/fr_CA/LC_MESSAGES/a.mo", "l/fr/LC_MESSAGES/a.mo", "l/de/LC_MESSAGES/a.mo"]
    assert choose_catalogs(paths) == ["l/fr/LC_MESSAGES/a.mo"]
    assert choose_catalogs(["l/fr_BE/a.mo", "l/fr_CA/a.mo"]) == ["l/fr_CA/a.mo"]


def test_read_catalog_pairs_plurals_and_skips_nothing(tmp_path):
    mo = make_mo(tmp_path / "a.mo", SAMPLE)
    pairs = {(p.source, p.target) for p in read_catalog(mo, "pkg", "a")}
    assert ("%d file", "%d fichier") in pairs and ("%d files", "%d fichiers") in pairs
    assert ("Quit", "Quitter") in pairs and ("_Open File", "_Ouvrir le fichier") in pairs


def test_extract_wheel_keeps_fr_only_and_caches(tmp_path):
    extracted = extract_archive(make_wheel(tmp_path), "pkg", tmp_path / "cache")
    files = catalog_files(extracted)
    assert [f.parent.parent.name for f in files] == ["fr"]
    assert "BSD-3-Clause" in (extracted / "LICENSE-SOURCE").read_text()
    files[0].unlink()  # a cached extraction is not redone
    assert catalog_files(extract_archive(make_wheel(tmp_path), "pkg", tmp_path / "cache")) == []


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_extract_deb(tmp_path):
    root = tmp_path / "root"
    make_mo(root / "usr/share/locale/fr/LC_MESSAGES/tool.mo", SAMPLE)
    (root / "usr/share/doc/tool").mkdir(parents=True)
    (root / "usr/share/doc/tool/copyright").write_text("Files: *\nLicense: GPL-2+\n")
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN/control").write_text(
        "Package: tool\nVersion: 1:1.0-1\nArchitecture: all\nMaintainer: t <t@e.org>\nDescription: t\n"
    )
    deb = tmp_path / "tool_1%3a1.0-1_all.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)], check=True, capture_output=True)
    extracted = extract_archive(deb, "tool", tmp_path / "cache")
    assert [f.name for f in catalog_files(extracted)] == ["tool.mo"]
    assert debian_licence((extracted / "LICENSE-SOURCE").read_text()) == "GPL-2+"
    pin = Pin("deb", "tool", "1:1.0-1", "g")
    (tmp_path / "debs").mkdir()
    shutil.copy(deb, tmp_path / "debs" / deb.name)
    assert deb_glob(pin) == "tool_1%3a1.0-1_*.deb" and cached_archive(pin, tmp_path) is not None


# --- cleaning -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "target", "fuzzy", "reason"),
    [
        ("", "Content-Type: text/plain", False, "header"),
        ("Open", "Ouvrir", True, "fuzzy"),
        ("Open", "  ", False, "untranslated"),
        ("translator-credits", "Jean Dupont", False, "translator_credits"),
        ("Open", "Ouvrir", False, None),
    ],
)
def test_entry_reason(source, target, fuzzy, reason):
    assert clean.entry_reason(source, target, fuzzy) == reason


@pytest.mark.parametrize(
    ("source", "target", "reason"),
    [
        ("Open", "Open", "identical"),
        ("Media", "Média", "identical_folded"),
        ("***", "***", "no_letters"),
        ("a" * 401, "b" * 401, "too_long"),
        ("Print", "Imprimer dans un fichier au format PDF", "length_ratio"),
        ("Copy %s to %s", "Copier %s", "placeholder_mismatch"),
        ("%1$s of %2$s", "%s sur %s", "placeholder_mismatch"),
        ("Save the file", "Save the file to the disk", "not_french"),
        ("Open", "", "empty"),
        ("Go", "Aller", None),
        ("Copy %(n)s files to {dest}", "Copier %(n)s fichiers vers {dest}", None),
        ("%s of %d", "%d : %s", None),
    ],
)
def test_segment_reason(source, target, reason):
    assert clean.segment_reason(source, target) == reason


def test_placeholders():
    assert clean.placeholders("%1$s %(name)s %-5.2f {0} {name!r} %% %1 %PRODUCTNAME $(ARG1)") == sorted(
        ["%1$s", "%(name)s", "%-5.2f", "{0}", "{name!r}", "%%", "%1", "%PRODUCTNAME", "$(ARG1)"]
    )
    assert clean.placeholders("50 % des fichiers") == []


@pytest.mark.parametrize(
    ("source", "target", "expected"),
    [
        ("_File", "_Fichier", ("File", "Fichier")),
        ("E_xit", "_Quitter", ("Exit", "Quitter")),
        ("&Open", "&Ouvrir", ("Open", "Ouvrir")),
        ("Save ~As...", "Enregistrer ~sous...", ("Save As...", "Enregistrer sous...")),
        ("Fo~rm", "Fo~rmulaire", ("Form", "Formulaire")),
        ("^Next", "^Suivant", ("Next", "Suivant")),
        ("Use LC_ALL here", "Utiliser LC_ALL ici", ("Use LC_ALL here", "Utiliser LC_ALL ici")),
        ("R&D team", "équipe R&D", ("R&D team", "équipe R&D")),
        ("Tom &amp; Jerry", "Tom &amp; Jerry", ("Tom &amp; Jerry", "Tom &amp; Jerry")),
        ("a && b", "a && b", ("a && b", "a && b")),
        ("%s_%d", "%s_%d", ("%s_%d", "%s_%d")),
        ("Go to ~/docs", "Aller à ~/docs", ("Go to ~/docs", "Aller à ~/docs")),
        ("Disable n&otifications", "Désactiver n&otifications", ("Disable notifications", "Désactiver notifications")),
        ("Paragraph St~yles", "St~yles de paragraphe", ("Paragraph Styles", "Styles de paragraphe")),
        ("Do not _observe", "Ne pas _observer", ("Do not observe", "Ne pas observer")),
        ("Call _mcount", "Appeler _mcount", ("Call _mcount", "Appeler _mcount")),
        ("The value is ~a.", "La valeur est ~a.", ("The value is ~a.", "La valeur est ~a.")),
        ("~aData~%", "~aDonnées~%", ("~aData~%", "~aDonnées~%")),
        ("Press ^C", "Appuyez sur ^C", ("Press ^C", "Appuyez sur ^C")),
        ("Open http://x?a&b", "Ouvrir http://x?a&b", ("Open http://x?a&b", "Ouvrir http://x?a&b")),
    ],
)
def test_strip_accelerators(source, target, expected):
    assert clean.strip_accelerators(source, target) == expected


@pytest.mark.parametrize(
    ("source", "target", "expected"),
    [
        ("female^Princess", "Princesse", ("Princess", "Princesse")),
        ("?unit:Owned", "?unit:Possédé", ("Owned", "Possédé")),
        ("File|e", "Fichier|F", ("File", "Fichier")),
        ("person|Title", "Titre", ("Title", "Titre")),
        ("[yes|no]", "[oui|non]", ("[yes|no]", "[oui|non]")),
    ],
)
def test_strip_context(source, target, expected):
    assert clean.strip_context(source, target) == expected


def test_whitespace_and_entities():
    assert clean.normalise_space("  Fichier\u00a0:\t %s \n suite ") == "Fichier : %s suite"
    assert clean.decode_entities("l&rsquo;aide&nbsp;! &amp; &lt;b&gt;") == "l\u2019aide\u00a0! &amp; &lt;b&gt;"


HELP_EN = (
    "  -a, --all          do not ignore entries\n"
    "                       starting with .\n"
    "  -l                 use a long listing format\n"
)
HELP_FR = (
    "  -a, --all          ne pas ignorer les entrées\n"
    "                       commençant par .\n"
    "  -l                 utiliser un format long\n"
)


def test_help_block_split_aligned():
    pairs, reasons = clean.clean_entry(HELP_EN, HELP_FR)
    assert reasons == []
    assert pairs == [
        ("-a, --all do not ignore entries starting with .", "-a, --all ne pas ignorer les entrées commençant par ."),
        ("-l use a long listing format", "-l utiliser un format long"),
    ]


def test_help_block_unaligned_is_dropped():
    swapped = "  -l                 utiliser un format long\n  -a, --all          ne pas ignorer les entrées\n"
    assert clean.clean_entry(HELP_EN, swapped) == ([], ["help_unaligned"])
    fewer = "  -a, --all          ne pas ignorer les entrées et utiliser -l\n"
    assert clean.clean_entry(HELP_EN, fewer) == ([], ["help_unaligned"])


def test_prose_newlines_are_joined():
    pairs, _ = clean.clean_entry("The file could not\nbe saved.", "Le fichier n'a pas pu\nêtre enregistré.")
    assert pairs == [("The file could not be saved.", "Le fichier n'a pas pu être enregistré.")]


def test_normalised_key():
    assert clean.normalised_key("Open %s...") == clean.normalised_key("open  %d") == "open phx"


# --- dedup and split ------------------------------------------------------------------------------------


def test_deduplicate_keeps_most_frequent_then_first():
    pairs = [Pair("Open", "Ouvrir", "a"), Pair("Open", "Ouvre", "b"), Pair("Open", "Ouvre", "c"),
             Pair("Close", "Fermer", "a"), Pair("Close", "Clore", "b")]  # fmt: skip
    assert deduplicate(pairs) == [Pair("Open", "Ouvre", "b"), Pair("Close", "Fermer", "a")]


def corpus(n: int) -> list[Pair]:
    pairs = []
    for i in range(n):
        package = f"pkg{i % 7}" if i % 3 else "big"
        pairs.append(Pair(f"Item {i} value", f"Élément {i} valeur", package))
        pairs.append(Pair(f"item {i} value!", f"élément {i} valeur !", package))  # collides with the one above
        pairs.append(Pair(f"Item {i} value: %s", f"Élément {i} valeur : %s", package))
    return pairs


def test_split_is_leak_free_sized_and_spread():
    pairs = corpus(600)
    splits = split_pairs(pairs, dev_size=90, test_size=90, seed=1)
    keys = {name: {clean.normalised_key(p.source) for p in part} for name, part in splits.items()}
    assert not keys["train"] & keys["dev"] and not keys["train"] & keys["test"] and not keys["dev"] & keys["test"]
    assert sum(len(v) for v in splits.values()) == len(pairs)
    assert 90 <= len(splits["test"]) < 90 + 3 and 90 <= len(splits["dev"]) < 90 + 3
    packages = {p.package for p in splits["test"]}
    assert len(packages) == 8
    assert sum(p.package == "big" for p in splits["test"]) < len(splits["test"]) / 2


def test_split_is_deterministic():
    pairs = corpus(300)
    assert split_pairs(pairs, 30, 30, seed=5) == split_pairs(list(pairs), 30, 30, seed=5)
    assert split_pairs(pairs, 30, 30, seed=5)["test"] != split_pairs(pairs, 30, 30, seed=6)["test"]


def test_group_by_key():
    groups = group_by_key([Pair("Open!", "a", "p"), Pair("open", "b", "p"), Pair("Close", "c", "p")])
    assert list(groups.values()) == [[0, 1], [2]]


# --- pins, licences, end to end -------------------------------------------------------------------------


def test_parse_recipe():
    pins, groups = parse_recipe("# intro\n\n# [ui] user interface\ncoreutils=9.1-1\n# [wheels] x\nDjango==5.2\n")
    assert pins == [Pin("deb", "coreutils", "9.1-1", "ui"), Pin("wheel", "Django", "5.2", "wheels")]
    assert groups == {"ui": Group("ui"), "wheels": Group("wheels")}
    with pytest.raises(CorpusError, match="line 1"):
        parse_recipe("coreutils 9.1\n")
    with pytest.raises(CorpusError, match="line 4: group \\[ui\\] starts a second time"):
        parse_recipe("# [ui] user interface\ncoreutils=9.1-1\n# [games] x (not those of\n# [ui] ...)\nwesnoth=1\n")


def test_shipped_recipe_holds_every_group_the_default_model_was_built_from():
    """models/en-fr's card names the groups to rebuild its corpus with; the groups added since are extra (built
    only when named), so the default build and those groups stay the shipped model's recipe."""
    pins, groups = load_recipe()
    card = (Path(__file__).parents[2] / "models" / "en-fr" / "README.md").read_text(encoding="utf-8")
    shipped = re.search(r"--groups ([a-z,]+)", card).group(1).split(",")
    assert set(shipped) <= set(groups)
    assert {name for name, g in groups.items() if not g.extra} <= set(shipped)
    assert all(groups[name].extra for name in groups if name not in shipped)
    assert {p.group for p in pins} == set(groups)
    assert groups["survival"] == Group("survival", holdout="none", yields=True)  # training only: one catalog
    # every training-only group yields, the dictionary too: none outvotes a held-out sentence's translation
    assert all(g.yields for g in groups.values() if g.holdout == "none")


def test_parse_recipe_index_pins():
    digest = "0123456789abcdef" * 4
    header = "# [meta extra reader=descriptions holdout=documents general=40] descriptions\n"
    text = f"{header}@bookworm/main/i18n/Translation-fr={digest}\n"
    pins, groups = parse_recipe(text)
    assert pins == [Pin("index", "Translation-fr", digest, "meta", "bookworm/main/i18n/Translation-fr")]
    assert groups["meta"] == Group("meta", True, "descriptions", "documents", general=40)
    for line in (f"@bookworm/main/i18n/Translation-fr={digest[:-1]}", f"@Bookworm/x={digest}", f"@bookworm={digest}"):
        with pytest.raises(CorpusError, match="line 1: expected .* or @suite/path=sha256"):
            parse_recipe(line + "\n")


RECIPE = (
    "# [ui] interface\ncoreutils=9.1-1\n"
    "# [games extra holdout=documents] story\nwesnoth-data=1.16\n"
    "# [dictionary extra reader=freedict holdout=none cap=50] words\ndict-eng-fra=1\n"
)


def test_group_attributes_and_selection():
    pins, groups = parse_recipe(RECIPE)
    assert groups["games"] == Group("games", extra=True, holdout="documents")
    assert groups["dictionary"] == Group("dictionary", True, "freedict", "none", 50)
    _, more = parse_recipe("# [survival extra holdout=none yields] items\ncdda=1\n")
    assert more["survival"] == Group("survival", extra=True, holdout="none", yields=True)
    assert list(select_groups(groups, None)) == ["ui"]
    assert list(select_groups(groups, ["all"])) == ["ui", "games", "dictionary"]
    assert list(select_groups(groups, ["dictionary", "ui"])) == ["ui", "dictionary"]
    with pytest.raises(CorpusError, match="unknown group.*nope.*ui, games, dictionary"):
        select_groups(groups, ["nope"])


@pytest.mark.parametrize(
    "header",
    ["[g reader=tmx]", "[g holdout=files]", "[g cap=x holdout=none]", "[g cap=5]", "[g x]", "[g general=5]",
     "[g holdout=none general=5]", "[g holdout=documents general=x]", "[g yields]", "[g holdout=documents yields]"],
)  # fmt: skip
def test_bad_group_attributes(header):
    with pytest.raises(CorpusError, match="line 1: group \\[g\\] has bad attributes"):
        parse_recipe(f"# {header} text\na=1\n")


# --- document-level hold-out, caps ----------------------------------------------------------------------


def documents_corpus() -> list[Pair]:
    """Three packages of four documents each, ten pairs a document; document d0 of p0 repeats a p1 source."""
    pairs = [
        Pair(f"Line {i} of {d} in {p}", f"Ligne {i} de {d} dans {p}", p, d)
        for p in ("p0", "p1", "p2")
        for d in ("d0", "d1", "d2", "d3")
        for i in range(10)
    ]
    return pairs + [Pair("Line 0 of d0 in p1!", "Ligne 0 de d0 dans p1 !", "p0", "d0")]


def test_general_splits_hold_out_whole_documents():
    pairs = documents_corpus()
    general, rest = split_general(pairs, [{"p0", "p1"}], dev_size=25, test_size=30, seed=3)
    held = {name: {(p.package, p.document) for p in part} for name, part in general.items()}
    assert len(general["test.general"]) <= 30 and len(general["dev.general"]) <= 25
    assert len(held["test.general"]) >= 2 and len(held["dev.general"]) >= 2
    assert not held["test.general"] & held["dev.general"]
    assert all({p.package for p in part} == {"p0", "p1"} for part in general.values())  # spread across packages
    for document in held["test.general"] | held["dev.general"]:  # whole: every pair of it held out, none in rest
        assert not any((p.package, p.document) == document for p in rest)
    keys = {clean.normalised_key(p.source) for part in general.values() for p in part}
    assert not keys & {clean.normalised_key(p.source) for p in rest}
    assert sum(p.package == "p2" for p in rest) == 40


def test_general_splits_are_deterministic():
    pairs = documents_corpus()
    assert split_general(pairs, [{"p0", "p1"}], 20, 20, seed=4) == split_general(list(pairs), [{"p0", "p1"}], 20, 20, 4)
    tests = {tuple(split_general(pairs, [{"p0", "p1"}], 20, 20, seed)[0]["test.general"]) for seed in range(6)}
    assert len(tests) > 1


def test_general_splits_give_each_group_an_equal_share():
    general, _ = split_general(documents_corpus(), [{"p0"}, {"p1", "p2"}], dev_size=20, test_size=41, seed=1)
    test = general["test.general"]
    assert sum(p.package == "p0" for p in test) == 21 and sum(p.package != "p0" for p in test) == 20
    assert shares(41, 2) == [21, 20] and shares(3, 3) == [1, 1, 1]


def test_a_group_with_a_fixed_general_size_leaves_the_others_test_as_it_was():
    pairs = documents_corpus()
    alone, _ = split_general(pairs, [{"p0"}, {"p1"}], dev_size=20, test_size=20, seed=1)
    added, _ = split_general(pairs, [{"p0"}, {"p1"}, {"p2"}], 20, 20, seed=1, fixed=[None, None, 10])
    assert [p for p in added["test.general"] if p.package != "p2"] == alone["test.general"]
    assert sum(p.package == "p2" for p in added["test.general"]) == 10
    assert group_shares(41, [None, 7, None]) == [21, 7, 20] and group_shares(5, [3]) == [3]


def test_cap_pairs_is_seeded_and_keeps_others():
    pairs = [Pair(f"w{i}", f"m{i}", "dict" if i % 2 else "ui") for i in range(40)]
    capped = cap_pairs(pairs, {"dict"}, 5, seed=1)
    assert sum(p.package == "dict" for p in capped) == 5 and sum(p.package == "ui" for p in capped) == 20
    assert capped == cap_pairs(pairs, {"dict"}, 5, seed=1) and capped == sorted(capped, key=pairs.index)
    assert cap_pairs(pairs, {"dict"}, 50, seed=1) == pairs


# --- FreeDict -------------------------------------------------------------------------------------------


def dictd_encode(value: int) -> str:
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    text = ""
    while True:
        value, digit = divmod(value, 64)
        text = digits[digit] + text
        if not value:
            return text


def make_dictd(folder: Path, entries: dict[str, str]) -> None:
    """A dictd dictionary (`x.index` and `x.dict.dz`) with a 00database header entry and the given entries."""
    body, index = b"", []
    for headword, text in {"00databaseinfo": "header\n", **entries}.items():
        data = text.encode()
        index.append(f"{headword}\t{dictd_encode(len(body))}\t{dictd_encode(len(data))}")
        body += data
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "x.index").write_text("\n".join(sorted(index)) + "\n", encoding="utf-8")
    (folder / "x.dict.dz").write_bytes(gzip.compress(body))


def test_dictd_number():
    assert dictd_number("A") == 0 and dictd_number("b") == 27 and dictd_number("BA") == 64
    assert all(dictd_number(dictd_encode(n)) == n for n in (0, 63, 64, 4095, 123456))


@pytest.mark.parametrize(
    ("entry", "pair"),
    [
        ("house /haus/\nmaison\n", ("house", "maison")),
        ("look /luk/\n1. avoir l'air de, paraître\n2. air, allure\n", ("look", "avoir l'air de")),
        ("bank /bæŋk/\nrive (de rivière); banque\n", ("bank", "rive")),
        ("alone /əloun/\n", None),
    ],
)
def test_entry_pair(entry, pair):
    assert entry_pair(entry) == pair


def test_read_freedict(tmp_path):
    make_dictd(tmp_path / "usr/share/dictd", {"house": "house /haus/\nmaison\n", "cat": "cat /kæt/\nchat\n"})
    pairs = [(p.source, p.target, p.catalog) for p in read_freedict(tmp_path, "dict")]
    assert pairs == [("cat", "chat", "x"), ("house", "maison", "x")]


def test_licences():
    assert debian_licence("Files: *\nLicense: GPL-2+\n\nFiles: x\nLicense: MIT\n text\n") == "GPL-2+, MIT"
    assert debian_licence("This is under the GNU General Public License, version 2.") == "GPL"
    assert wheel_licence("Name: x\nClassifier: License :: OSI Approved :: BSD License\n\nbody") == "BSD License"
    full_text = "Name: x\nLicense: (c) X\n        \n        Redistribution and use in source and binary forms"
    assert wheel_licence(full_text) == "BSD"
    assert debian_licence("See the package that owns /usr/share/doc/gcc-12-base\n").startswith("see /usr/share/doc/gcc")


def test_build_end_to_end_offline(tmp_path):
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    shutil.copy(make_wheel(tmp_path), cache / "wheels")
    pins = [Pin("wheel", "pkg", "1.0", "wheels")]
    stats = build(pins, BuildOptions(tmp_path / "out", cache, dev_size=1, test_size=1, seed=3))
    assert sum(stats["pairs"].values()) == 4 and stats["packages"]["pkg"]["entries"] >= 4
    out = tmp_path / "out"
    lines = {s: (out / f"{s}.en").read_text().splitlines() for s in ("train", "dev", "test")}
    assert sorted(sum(lines.values(), [])) == sorted(["Open File", "%d file", "%d files", "Quit"])
    assert (out / "test.origin").read_text() == "pkg\n"
    assert "pkg 1.0 (wheel): BSD-3-Clause" in (out / "NOTICE").read_text()


# --- documentation built in both languages -------------------------------------------------------------


def xhtml_page(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        '<?xml version="1.0" encoding="UTF-8"?>\n<html xmlns="http://www.w3.org/1999/xhtml"><head><title>t</title>'
        f"</head><body>{body}</body></html>\n",
        encoding="utf-8",
    )


def test_read_documents_aligns_blocks_and_skips_unaligned_pages(tmp_path):
    html = tmp_path / "usr/share/doc/book/html"
    xhtml_page(
        html / "en-US/apt.html",
        '<h2>Using APT</h2><div class="para">APT installs <code>packages</code>. It resolves dependencies.</div>'
        "<ul><li><p>One item</p></li></ul>",
    )
    xhtml_page(
        html / "fr-FR/apt.html",
        '<h2>Utiliser APT</h2><div class="para">APT installe des <code>paquets</code>. Il résout les '
        "dépendances.</div><ul><li><p>Un élément</p></li></ul>",
    )
    xhtml_page(html / "en-US/gone.html", "<p>One</p><p>Two</p>")
    xhtml_page(html / "fr-FR/gone.html", "<p>Un et deux</p>")  # block sequences differ: the page is skipped
    xhtml_page(html / "en-US/lonely.html", "<p>Only English</p>")
    (html / "fr-FR/html5.html").write_text("<!DOCTYPE html><p>Bonjour&nbsp;!<br></p>")  # HTML, not XML
    xhtml_page(html / "en-US/html5.html", "<p>Hello!</p>")
    help_page = '<page xmlns="http://projectmallard.org/1.0/"><info><desc>{}</desc>{}</info><title>{}</title></page>'
    (tmp_path / "usr/share/help/C/guide").mkdir(parents=True)
    (tmp_path / "usr/share/help/fr/guide").mkdir(parents=True)
    (tmp_path / "usr/share/help/C/guide/proxy.page").write_text(help_page.format("Set a proxy.", "", "Proxy"))
    translator = "<credit><name>Jean</name></credit>"  # the French page credits its translators: no block
    french = help_page.format("Définir un proxy.", translator, "Mandataire")
    (tmp_path / "usr/share/help/fr/guide/proxy.page").write_text(french)
    (tmp_path / "usr/share/help/C/guide/broken.page").write_text(help_page.format("Broken", "", "x"))
    (tmp_path / "usr/share/help/fr/guide/broken.page").write_text("<page><p>&nbsp;</page>")  # unreadable: skipped
    pairs = [(p.source, p.target, p.catalog) for p in read_documents(tmp_path, "book")]
    assert pairs == [
        ("Using APT", "Utiliser APT", "usr/share/doc/book/html/apt"),
        ("APT installs packages.", "APT installe des paquets.", "usr/share/doc/book/html/apt"),
        ("It resolves dependencies.", "Il résout les dépendances.", "usr/share/doc/book/html/apt"),
        ("One item", "Un élément", "usr/share/doc/book/html/apt"),
        ("Hello!", "Bonjour !", "usr/share/doc/book/html/html5"),
        ("Set a proxy.", "Définir un proxy.", "usr/share/help/guide/proxy"),
        ("Proxy", "Mandataire", "usr/share/help/guide/proxy"),
    ]
    assert is_document_member("usr/share/help/fr/guide/proxy.page") and is_document_member("x/html/en-US/a.html")
    assert not is_document_member("usr/share/help/de/guide/proxy.page")


def test_each_layout_names_the_french_twin_of_an_english_page():
    from model_export.corpus.documents import french_twins

    assert french_twins("usr/share/gimp/2.0/help/en/filters-cartoon.html") == [
        ("usr/share/gimp/2.0/help/fr/filters-cartoon.html", "usr/share/gimp/2.0/help/filters-cartoon")
    ]
    assert french_twins("usr/share/libreoffice/help/en-US/text/a.html")[0] == (  # the specific layout first
        "usr/share/libreoffice/help/fr/text/a.html", "usr/share/libreoffice/help/text/a"
    )
    assert french_twins("usr/share/gimp/2.0/help/de/filters-cartoon.html") == []


def test_read_documents_finds_the_french_build_in_another_package(tmp_path):
    english, french = tmp_path / "reference-en", tmp_path / "reference-fr"
    xhtml_page(english / "usr/share/reference/ch01.en.html", "<h1>Tutorials</h1>")
    xhtml_page(french / "usr/share/reference/ch01.fr.html", "<h1>Didacticiels</h1>")
    xhtml_page(english / "usr/share/libreoffice/help/en-US/text/a.html", "<p>Insert a table.</p>")
    xhtml_page(french / "usr/share/libreoffice/help/fr/text/a.html", "<p>Insérer un tableau.</p>")
    pairs = [(p.source, p.target, p.catalog) for p in read_documents(english, "ref-en", [french])]
    assert pairs == [
        ("Insert a table.", "Insérer un tableau.", "usr/share/libreoffice/help/text/a"),
        ("Tutorials", "Didacticiels", "usr/share/reference/ch01"),
    ]
    assert list(read_documents(french, "ref-fr", [english])) == []


def test_block_pairs_split_sentences_only_when_they_match():
    assert block_pairs("One. Two.", "Un. Deux.") == [("One.", "Un."), ("Two.", "Deux.")]
    assert block_pairs("One. Two.", "Un et deux.") == [("One. Two.", "Un et deux.")]


MAN_EN = r""".\" Copyright the authors
.TH ARP 7 2022-12-15 "Linux man-pages 6.03"
.SH NAME
arp \- Linux ARP kernel module.
.SH DESCRIPTION
A process can use
.BR packet (7)
sockets.
.PP
.TP
.B app_solicit
Maximum number of probes.
.PP
.nf
int fd = socket(AF_INET);
.fi
.SH "SEE ALSO"
.BR ip (7)
"""
MAN_FR = r"""'\" t
.TH arp 7 "15 décembre 2022" "Pages du manuel de Linux 6.03"
.SH NOM
arp \- Module ARP du noyau Linux
.SH DESCRIPTION
Un processus peut utiliser les sockets \fBpacket\fP(7).
.TP
\fIapp_solicit\fP
Nombre maximal de sondes.
.nf
int fd = socket(AF_INET);
.fi
.SH "VOIR AUSSI"
\fBip\fP(7)
.SH TRADUCTION
La traduction française de cette page a été créée par Jean Dupont
"""


def test_roff_blocks_read_macros_and_escapes_alike():
    english, french = roff_blocks(MAN_EN), roff_blocks(MAN_FR)
    assert [kind for kind, _ in english] == [kind for kind, _ in french]  # the TRADUCTION section is left out
    assert english[3] == ("text", "A process can use packet(7) sockets.")
    assert french[3] == ("text", "Un processus peut utiliser les sockets packet(7).")
    assert (english[4], french[4]) == (("TP-tag", "app_solicit"), ("TP-tag", "app_solicit"))
    assert english[6] == ("verbatim", "") and english[-2:] == [("SH", "SEE ALSO"), ("text", "ip(7)")]
    assert plain(r"\fBopen\fR(2) \(em a \(lqfile\(rq \e\- x\ y") == "open(2) — a “file” \\- x y"


def test_read_documents_pairs_manual_pages(tmp_path):
    for folder, text in (("usr/share/man/man7", MAN_EN), ("usr/share/man/fr/man7", MAN_FR)):
        (tmp_path / folder).mkdir(parents=True)
        (tmp_path / folder / "arp.7.gz").write_bytes(gzip.compress(text.encode()))
    pairs = {(p.source, p.target, p.catalog) for p in read_documents(tmp_path, "manpages")}
    assert ("Linux ARP kernel module.", "Module ARP du noyau Linux", "usr/share/man/man7/arp.7") not in pairs
    assert ("arp - Linux ARP kernel module.", "arp - Module ARP du noyau Linux", "usr/share/man/man7/arp.7") in pairs
    assert ("Maximum number of probes.", "Nombre maximal de sondes.", "usr/share/man/man7/arp.7") in pairs
    assert len(pairs) == 8


def catalog_wheel(folder: Path, name: str, catalogs: dict[str, list[tuple[str, str]]]) -> Path:
    """A wheel holding one French catalog per entry of `catalogs`."""
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for stem, entries in catalogs.items():
            mo = make_mo(folder / name / f"{stem}.mo", [polib.POEntry(msgid=s, msgstr=t) for s, t in entries])
            archive.write(mo, f"{name}/locale/fr/LC_MESSAGES/{stem}.mo")
        archive.writestr(f"{name}-1.0.dist-info/METADATA", f"Name: {name}\nLicense-Expression: MIT\n\n")
    return wheel


def test_build_groups_general_splits_and_stable_software_splits(tmp_path):
    cache = tmp_path / "cache"
    (cache / "wheels").mkdir(parents=True)
    ui = [(f"Open file number {i}", f"Ouvrir le fichier numéro {i}") for i in range(30)]
    shutil.copy(catalog_wheel(tmp_path, "ui", {"ui": ui}), cache / "wheels")
    story = {f"chapter{c}": [(f"The hero walks {c} {i} miles.", f"Le héros marche {c} {i} milles.") for i in range(8)]
             for c in range(6)}  # fmt: skip
    story["chapter0"].append(("Open file number 3", "Ouvrir le fichier 3"))  # a software source, kept in its layer
    shutil.copy(catalog_wheel(tmp_path, "story", story), cache / "wheels")
    pins = [Pin("wheel", "ui", "1.0", "ui"), Pin("wheel", "story", "1.0", "games")]
    groups = {"ui": Group("ui"), "games": Group("games", extra=True, holdout="documents")}
    options = BuildOptions(tmp_path / "out", cache, dev_size=3, test_size=3, seed=2, general_dev_size=10,
                           general_test_size=10)  # fmt: skip
    stats = build(pins, options, groups)
    out = tmp_path / "out"
    assert stats["groups"]["games"] == {"train": 32, "dev": 0, "test": 0, "dev.general": 8, "test.general": 8}
    assert [len(v) for v in stats["general_documents"].values()] == [1, 1]
    assert len((out / "test.general.en").read_text().splitlines()) == 8
    assert set((out / "dev.general.origin").read_text().splitlines()) == {"story"}
    software_only = build(pins[:1], BuildOptions(tmp_path / "sw", cache, 3, 3, 2), groups)
    for name in ("dev", "test"):
        assert (out / f"{name}.en").read_text() == (tmp_path / "sw" / f"{name}.en").read_text()
    assert "general_documents" not in software_only and not (tmp_path / "sw" / "test.general.en").exists()
    notice = (out / "NOTICE").read_text()
    assert notice.startswith("Training data of the default EN->FR model") and "story 1.0 (wheel): MIT\n" in notice
    wide = notice_text([("d", "1", "deb", "GPL-2+")], gettext_only=False)
    assert "gettext catalogs, dictionaries,\ndocumentation" in wide and wide.endswith("\nd 1 (deb): GPL-2+\n")


def make_deb(folder: Path, name: str, files: dict[str, str | bytes]) -> Path:
    """A real .deb of `name` 1.0 holding `files` (path: text, or bytes) and a DEP-5 copyright file."""
    root = folder / f"root-{name}"
    for path, content in {**files, f"usr/share/doc/{name}/copyright": "Files: *\nLicense: GPL-2+\n"}.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        data = content.encode("utf-8") if isinstance(content, str) else content
        (root / path).write_bytes(data)
    (root / "DEBIAN").mkdir()
    (root / "DEBIAN/control").write_text(
        f"Package: {name}\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@e.org>\nDescription: t\n"
    )
    deb = folder / "debs" / f"{name}_1.0_all.deb"
    deb.parent.mkdir(exist_ok=True)
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(root), str(deb)], check=True, capture_output=True)
    return deb


def build_training_only(tmp_path: Path, package: str, files: dict[str, str | bytes], reader: str) -> dict:
    """Build a corpus of one .deb of `files` read by `reader`, in a training-only group; its stats."""
    cache = tmp_path / "cache"
    make_deb(cache, package, files)
    group = Group("g", extra=True, reader=reader, holdout="none")
    return build([Pin("deb", package, "1.0", "g")], BuildOptions(tmp_path / "out", cache, 1, 1, 1), {"g": group})


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_build_pages_whose_french_build_is_another_package(tmp_path):
    page = '<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml"><body>{}</body></html>'
    english = {f"usr/share/ref/ch{i}.en.html": page.format(f"<h1>Chapter {i}</h1><p>Read {i}.</p>") for i in range(4)}
    french = {f"usr/share/ref/ch{i}.fr.html": page.format(f"<h1>Chapitre {i}</h1><p>Lisez {i}.</p>") for i in range(4)}
    cache = tmp_path / "cache"
    make_deb(cache, "ref-en", english)
    make_deb(cache, "ref-fr", french)
    pins = [Pin("deb", "ref-en", "1.0", "docs"), Pin("deb", "ref-fr", "1.0", "docs")]
    options = BuildOptions(tmp_path / "out", cache, 1, 1, 1, general_dev_size=2, general_test_size=2)
    stats = build(pins, options, {"docs": Group("docs", extra=True, reader="pages", holdout="documents")})
    assert stats["groups"]["docs"] == {"train": 4, "dev": 0, "test": 0, "dev.general": 2, "test.general": 2}
    assert stats["packages"]["ref-en"]["entries"] == 8 and stats["packages"]["ref-fr"]["entries"] == 0
    assert stats["general_documents"]["test.general"][0].startswith("ref-en/usr/share/ref/ch")
    assert "ref-fr 1.0 (deb): GPL-2+" in (tmp_path / "out/NOTICE").read_text()
    assert (tmp_path / "out/NOTICE").read_text().startswith("EN->FR training data")


def test_cli_error_is_one_line(tmp_path, capsys):
    assert main(["build", "--packages", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot read packages list") and err.count("\n") == 1
    assert main(["tokenizer", "--corpus", str(tmp_path)]) == 1
    capsys.readouterr()
    (tmp_path / "packages.txt").write_text(RECIPE)
    assert main(["build", "--packages", str(tmp_path / "packages.txt"), "--groups", "ui,nope"]) == 1
    assert capsys.readouterr().err == "error: unknown group(s) nope; the packages list has ui, games, dictionary\n"


def test_pieces_per_sentence_counts_the_lines_training_reads(spm_model: bytes, tmp_path: Path) -> None:
    """Lines split at "\\n" only, as `read_lines` splits them for training: a U+2028 inside a sentence is not a
    line break (str.splitlines made it two lines)."""
    model = tmp_path / "spm.model"
    model.write_bytes(spm_model)
    text = tmp_path / "dev.en"
    text.write_text("the cat\u2028sat\nthe dog\n", encoding="utf-8")
    pieces = sum(
        len(piece_ids)
        for piece_ids in spm.SentencePieceProcessor(model_file=str(model)).encode(["the cat\u2028sat", "the dog"])
    )
    assert pieces_per_sentence(model, text) == pieces / 2


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
@pytest.mark.parametrize("yields", [False, True])
def test_a_yielding_group_never_outvotes_a_held_out_documents_translation(tmp_path, yields):
    """A training-only group that translates a document's sentence otherwise, more often: without `yields` its
    translation wins and the document loses the sentence; with it the document keeps it (and the training-only
    pair, which shares a held-out source, leaves train)."""

    def po(pairs: list[tuple[str, str]]) -> str:
        body = "".join(f'msgid "{en}"\nmsgstr "{fr}"\n\n' for en, fr in pairs)
        return 'msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\n"\n\n' + body

    story = [("Open the cave door.", "Ouvre la porte de la grotte."), ("Endless Game", "Jeu sans fin")]
    items = [("Endless Game", "Partie sans fin"), ("A rope.", "Une corde.")]  # the first twice: it outvotes
    cache = tmp_path / "cache"
    make_deb(cache, "story-data", {"usr/share/story/levels/one/fr.po": po(story)})
    make_deb(cache, "items-data", {"usr/share/items/a/fr.po": po(items[:1]), "usr/share/items/b/fr.po": po(items)})
    options = BuildOptions(tmp_path / "out", cache, 1, 1, 1, general_dev_size=0, general_test_size=2)
    groups = {
        "stories": Group("stories", extra=True, reader="po", holdout="documents"),
        "items": Group("items", extra=True, reader="po", holdout="none", yields=yields),
    }
    pins = [Pin("deb", "story-data", "1.0", "stories"), Pin("deb", "items-data", "1.0", "items")]
    build(pins, options, groups)
    held = (tmp_path / "out/test.general.en").read_text(encoding="utf-8").splitlines()
    train = (tmp_path / "out/train.en").read_text(encoding="utf-8").splitlines()
    if yields:
        assert sorted(held) == ["Endless Game", "Open the cave door."] and train == ["A rope."]
    else:
        assert held == ["Open the cave door."] and sorted(train) == ["A rope.", "Endless Game"]

@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_build_po_catalogs_each_a_document_fuzzy_obsolete_and_regional_ones_left_out(tmp_path):
    """reader=po: games that ship only .po sources; each catalog (a level) is a document of its own."""

    def po(pairs: list[tuple[str, str]], tail: str = "") -> str:
        body = "".join(f'msgid "{en}"\nmsgstr "{fr}"\n\n' for en, fr in pairs)
        return 'msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\n"\n\n' + body + tail

    levels = {
        f"usr/share/games/tux/levels/world{i}/fr.po": po([(f"Jump over the wall number {i}.", f"Saute le mur {i}.")])
        for i in range(4)
    }
    levels["usr/share/games/tux/levels/world0/fr.po"] += (
        '#, fuzzy\nmsgid "The door is open."\nmsgstr "La porte."\n\n#~ msgid "Old line."\n#~ msgstr "Vieux."\n'
    )
    levels["usr/share/games/tux/levels/world1/fr_CA.po"] = po([("Hold on tight.", "Tiens bon.")])
    levels["usr/share/games/tux/levels/world1/de.po"] = po([("Run home now.", "Lauf nach Hause.")])
    cache = tmp_path / "cache"
    make_deb(cache, "tux-data", levels)
    options = BuildOptions(tmp_path / "out", cache, 1, 1, 1, general_dev_size=1, general_test_size=1)
    group = Group("quests", extra=True, reader="po", holdout="documents")
    stats = build([Pin("deb", "tux-data", "1.0", "quests")], options, {"quests": group})
    assert stats["groups"]["quests"] == {"train": 2, "dev": 0, "test": 0, "dev.general": 1, "test.general": 1}
    assert stats["packages"]["tux-data"]["entries"] == 5  # four levels' lines and the fuzzy one; no obsolete one
    assert stats["dropped"]["fuzzy"] == 1
    held = stats["general_documents"]["test.general"] + stats["general_documents"]["dev.general"]
    assert all(d.startswith("tux-data/usr/share/games/tux/levels/world") and d.endswith("/fr") for d in held)
    train = (tmp_path / "out/train.fr").read_text(encoding="utf-8")
    assert "Tiens bon." not in train and "Lauf" not in train and "Vieux." not in train



@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_build_po_catalogs_inside_a_game_data_zip(tmp_path):
    """reader=po reads the .po catalogs a game keeps inside a data zip (0 A.D.'s `public.zip!l10n/fr.*.po`)."""
    po = 'msgid ""\nmsgstr "Content-Type: text/plain; charset=UTF-8\\n"\n\nmsgid "{}"\nmsgstr "{}"\n'
    data = tmp_path / "public.zip"
    with zipfile.ZipFile(data, "w") as archive:
        river = "A river runs through the valley."
        archive.writestr("l10n/fr.public-maps.po", po.format(river, "Une rivière traverse la vallée."))
        house = po.format("Build a house first.", "Construis d'abord une maison.")
        archive.writestr("l10n/fr.public-tutorials.po", house)
        archive.writestr("l10n/de.public-maps.po", po.format(river, "Ein Fluss fließt."))
        archive.writestr("art/textures/stone.png", b"not text")
    files: dict[str, str | bytes] = {"usr/share/games/game/mods/public/public.zip": data.read_bytes()}
    stats = build_training_only(tmp_path, "game-data", files, "po")
    assert stats["groups"]["g"]["train"] == 2
    train = (tmp_path / "out/train.fr").read_text(encoding="utf-8").splitlines()
    assert sorted(train) == ["Construis d'abord une maison.", "Une rivière traverse la vallée."]
    extracted = tmp_path / "cache/extract-po/game-data_1.0_all/files/usr/share/games/game/mods/public/public.zip/l10n"
    assert sorted(p.name for p in extracted.iterdir()) == ["fr.public-maps.po", "fr.public-tutorials.po"]


def test_tr_lines_split_at_the_first_unescaped_equals_sign():
    assert split_line("Coffee Maker=Cafetière") == ("Coffee Maker", "Cafetière")
    assert split_line("1 @= 2 is false=1 @= 2 est faux") == ("1 = 2 is false", "1 = 2 est faux")
    assert split_line("Owner: @1@nLevel @2=Propriétaire : @1@nNiveau @2") == (
        "Owner: @1\nLevel @2",
        "Propriétaire : @1\nNiveau @2",
    )
    assert split_line("Mail: a@@b.org=Courriel : a@@b.org") == ("Mail: a@b.org", "Courriel : a@b.org")
    assert split_line("# textdomain: beds") is None and split_line("no sign here") is None
    assert split_line("Untranslated=") == ("Untranslated", "")


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_build_minetest_translation_files(tmp_path):
    """reader=tr: a mod's `locale/<domain>.fr.tr`; other languages and templates ignored, untranslated lines
    dropped."""
    tr = "# textdomain: {0}\nSmall table=Petite table\nHearty Stew=Ragoût copieux\nMissing line=\n"
    files = {
        "usr/share/games/minetest/mods/home/locale/home.fr.tr": tr.format("home"),
        "usr/share/games/minetest/mods/home/locale/home.de.tr": "# textdomain: home\nSmall table=Kleiner Tisch\n",
        "usr/share/games/minetest/mods/home/locale/template.txt": "# textdomain: home\nSmall table=\n",
    }
    stats = build_training_only(tmp_path, "mod-home", files, "tr")
    assert stats["packages"]["mod-home"]["entries"] == 3
    assert stats["dropped"]["untranslated"] == 1
    train = (tmp_path / "out/train.fr").read_text(encoding="utf-8").splitlines()
    assert sorted(train) == ["Petite table", "Ragoût copieux"]


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_build_megaglest_language_files_paired_by_key(tmp_path):
    """reader=lng: `<name>_french.lng` against `<name>_english.lng` (or a tech tree's `_default.lng`) by key;
    keys only one side has, other languages and a French file without an English one give nothing."""
    root = "usr/share/games/glest"
    files = {
        f"{root}/data/lang/english.lng": "; main file\nQuit=Quit the game\nOnlyHere=Only in English\n",
        f"{root}/data/lang/french.lng": "; fichier\nQuit=Quitter le jeu\nOnlyThere=Seulement ici\n",
        f"{root}/data/lang/german.lng": "Quit=Spiel beenden\n",
        f"{root}/tutorials/t1/t1_english.lng": "Welcome=Welcome to the tutorial.\\nMove the mouse.\n",
        f"{root}/tutorials/t1/t1_french.lng": "Welcome=Bienvenue dans le tutoriel.\\nBougez la souris.\n",
        f"{root}/techs/pack/lang/pack_default.lng": "ArmorTypeName_wood=wood armour\n",
        f"{root}/techs/pack/lang/pack_french.lng": "ArmorTypeName_wood=armure de bois\n",
        f"{root}/scenarios/lone/lone_french.lng": "Text=Un texte sans anglais\n",
    }
    stats = build_training_only(tmp_path, "glest-data", files, "lng")
    assert stats["packages"]["glest-data"]["entries"] == 3
    train = (tmp_path / "out/train.fr").read_text(encoding="utf-8")
    assert "Quitter le jeu" in train and "armure de bois" in train and "Bienvenue dans le tutoriel." in train
    assert "Spiel" not in train and "sans anglais" not in train and "Seulement" not in train
    assert "\\n" not in train  # a value's `\\n` is a line break, not two characters


def test_string_table_values_one_line_or_a_block_and_references_expanded():
    table = parse_table(
        "English\n# a comment\n\nAPPLY\nApply\n\nEMPIRE  # translated\nEmpire\n\n"
        "PEDIA_X\n'''The [[EMPIRE]] grows.\nIt sends a [[SHIP_PART]].'''\n\nONE\n'''On one line'''\n"
    )
    assert table == {
        "APPLY": "Apply",
        "EMPIRE": "Empire",
        "PEDIA_X": "The [[EMPIRE]] grows.\nIt sends a [[SHIP_PART]].",
        "ONE": "On one line",
    }
    assert expand(table["PEDIA_X"], table) == "The Empire grows.\nIt sends a [[SHIP_PART]]."
    assert expand("[[A]]", {"A": "[[B]]", "B": "[[A]]"}).startswith("[[")  # a cycle ends


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_build_freeorion_string_tables_paired_by_key(tmp_path):
    """reader=stringtable: fr.txt against en.txt by key, references expanded from each side's own table; a
    value left with a reference it cannot expand, keys only one side has and other languages give nothing."""
    root = "usr/share/games/space/default/stringtables"
    english = (
        "English\nSTAR\nstar\n\nPEDIA_STAR\n'''A [[STAR]] burns for a very long time.'''\n\n"
        "LINK\nBuild a [[buildingtype BLD_X]] here.\n\nEN_ONLY\nOnly in English\n"
    )
    french = (
        "Français\nSTAR\nétoile\n\nPEDIA_STAR\n'''Une [[STAR]] brûle très longtemps.'''\n\n"
        "LINK\nConstruisez un [[buildingtype BLD_X]] ici.\n"
    )
    files = {f"{root}/en.txt": english, f"{root}/fr.txt": french, f"{root}/de.txt": "Deutsch\nSTAR\nStern\n"}
    stats = build_training_only(tmp_path, "space-data", files, "stringtable")
    assert stats["packages"]["space-data"]["entries"] == 2
    train = dict(zip((tmp_path / "out/train.en").read_text(encoding="utf-8").splitlines(),
                     (tmp_path / "out/train.fr").read_text(encoding="utf-8").splitlines(), strict=True))  # fmt: skip
    assert train["A star burns for a very long time."] == "Une étoile brûle très longtemps."
    assert "Stern" not in train.values() and not any("[[" in t for t in train)

def qm_catalog(records: list[dict]) -> bytes:
    """A Qt .qm file written field by field as Qt's translator.cpp lays it out: magic, a Language section, then
    the Messages section; a record's keys: `translations` (None for a null one), `source`, `context`, `comment`,
    `obsolete1` (a 4-byte field of old catalogs)."""

    def field(tag: int, data: bytes | None) -> bytes:
        return bytes([tag]) + (b"\xff\xff\xff\xff" if data is None else len(data).to_bytes(4, "big") + data)

    body = b""
    for record in records:
        for form in record.get("translations", []):
            body += field(3, None if form is None else form.encode("utf-16-be"))
        if "obsolete1" in record:
            body += b"\x05" + record["obsolete1"]
        for tag, key in ((6, "source"), (7, "context"), (8, "comment")):
            if key in record:
                body += field(tag, record[key].encode("utf-8"))
        body += b"\x01"
    language = b"fr"
    return (
        bytes.fromhex("3cb86418caef9c95cd211cbf60a1bddd")
        + b"\xa7" + len(language).to_bytes(4, "big") + language
        + b"\x69" + len(body).to_bytes(4, "big") + body
    )  # fmt: skip


def test_read_qm_agrees_with_translate_toolkit_on_a_catalog_it_can_read():
    """An independent reader (translate-toolkit's qmfile, which decodes sources as Latin-1: ASCII sources here)."""
    records = [
        {"translations": [f"Trouve l'élément numéro {i}."], "source": f"Find item number {i}.", "context": f"c{i % 3}"}
        for i in range(12)
    ] + [{"translations": ["Évite les cœurs"], "source": "Avoid the hearts", "context": "c", "comment": "game"}]
    data = qm_catalog(records)
    theirs = [(u.source, str(u.target)) for u in qm.qmfile.parsestring(data).units]
    ours = [(m.source, m.translations[0]) for m in read_messages(data)]
    assert ours == theirs and len(ours) == 13
    assert [m.context for m in read_messages(data)][:3] == ["c0", "c1", "c2"]


def test_read_qm_rejects_a_file_that_is_not_a_catalog_and_a_record_cut_short():
    with pytest.raises(QmFormatError, match="magic"):
        list(read_messages(b"\x00" * 32))
    whole = qm_catalog([{"translations": ["Bonjour"], "source": "Hello"}])
    body = whole[16 + 7 + 5 : -3]  # the Messages section without the source's last two letters and the End tag
    cut = whole[: 16 + 7] + b"\x69" + len(body).to_bytes(4, "big") + body
    with pytest.raises(QmFormatError, match="runs past"):
        list(read_messages(cut))


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb")
def test_build_qm_catalogs_plurals_sourceless_and_null_translations_left_out(tmp_path, caplog):
    """reader=qm: GCompris's compiled Qt catalog; plain French over fr_CA, other languages ignored, each context a
    document; a plural record (one source for several forms), a record without source text and a null translation
    give no pair; an unreadable catalog is skipped with a warning."""
    lines = [{"translations": [f"Clique sur la balle {i}."], "source": f"Click on ball {i}.", "context": "ActivityInfo"}
             for i in range(3)]  # fmt: skip
    lines += [
        {"translations": ["Le chat dort sous la table."], "source": "The cat sleeps under the table.",
         "context": "Dataset", "comment": "", "obsolete1": b"\x12\x34\x56\x78"},
        {"translations": ["%n heure", "%n heures"], "source": "%n hour(s)", "context": "Clockgame"},
        {"translations": ["0 à 255 avec"], "context": "tutorial4"},
        {"translations": [None], "source": "Untranslated line.", "context": "Dataset"},
    ]  # fmt: skip
    files: dict[str, str | bytes] = {
        "usr/share/edu/translations/edu_fr.qm": qm_catalog(lines),
        "usr/share/edu/translations/edu_fr_CA.qm": qm_catalog([{"translations": ["Allô"], "source": "Hello there"}]),
        "usr/share/edu/translations/edu_de.qm": qm_catalog([{"translations": ["Hallo"], "source": "Hello there"}]),
        "usr/share/edu/extra/broken_fr.qm": b"not a catalog at all",
    }
    stats = build_training_only(tmp_path, "edu-data", files, "qm")
    assert stats["groups"]["g"]["train"] == 4
    assert stats["packages"]["edu-data"]["entries"] == 5  # four sentences and the null translation
    train = dict(zip((tmp_path / "out/train.en").read_text(encoding="utf-8").splitlines(),
                     (tmp_path / "out/train.fr").read_text(encoding="utf-8").splitlines(), strict=True))  # fmt: skip
    assert train["The cat sleeps under the table."] == "Le chat dort sous la table."
    assert train["Click on ball 2."] == "Clique sur la balle 2."
    assert "Hello there" not in train and "%n hour(s)" not in train
    catalog = tmp_path / "edu_fr.qm"
    catalog.write_bytes(files["usr/share/edu/translations/edu_fr.qm"])  # type: ignore[arg-type]
    documents = {raw.catalog for raw in read_qm(catalog, "edu-data", "edu_fr")}
    assert documents == {"edu_fr#ActivityInfo", "edu_fr#Dataset"}
    assert "broken_fr.qm" in caplog.text and "magic" in caplog.text
