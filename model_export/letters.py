"""Lists in a model folder's manifest the letters its model's training sources held too seldom for it to read or
copy (`tokenizer.rare_letters`, format 9): the server gives a word that holds one to the model as a placeholder,
which it copies, so that a name such as "Søren" or "Dvořák" comes back as written.

`train` records them in its checkpoints and `export` writes them; this adds them to a folder exported before, or
imported (`convert-marian`), from the sources its model was trained on.
"""

from __future__ import annotations

import json
from pathlib import Path

import sentencepiece as spm

from model_export.corpus import read_lines
from model_export.corpus.tokenizer import rare_letters
from model_export.errors import ExportError
from model_export.export import write_manifest
from service.model import FORMAT_VERSION, MANIFEST, load_model_folder

#: The graphs of formats 9 and 10 are format 8's (10 adds an optional graph): a folder of format 8 takes the letters
#: as it is.
GRAPHS_OF = 8


def add_rare_letters(folder_path: Path, sources: Path, fewer_than: int, share: float) -> str:
    """Counts the letters of `sources` (the model's training sources, a sentence a line) and writes those of its
    source tokenizer's pieces held fewer than `fewer_than` times and less often than `share` of the characters
    into the manifest (`rare_letters`); returns them (`fewer_than` 0: none, which clears the list)."""
    folder = load_model_folder(folder_path)
    if folder.manifest.format_version < GRAPHS_OF:
        raise ExportError(
            f"{folder_path}: format_version {folder.manifest.format_version}; rare letters need format {GRAPHS_OF} or "
            "later: export the folder again (or convert-marian it again) first"
        )
    if not sources.is_file():
        raise ExportError(f"{sources}: no such file (the model's training sources, a sentence a line)")
    lines = read_lines(sources)
    if not lines:
        raise ExportError(f"{sources}: empty; give the sources the model was trained on")
    processor = spm.SentencePieceProcessor(model_file=str(folder.file(folder.manifest.tokenizer.source_model)))
    letters = rare_letters(lines, processor, fewer_than, share)
    manifest = json.loads((folder_path / MANIFEST).read_text(encoding="utf-8"))
    manifest["format_version"] = max(manifest["format_version"], FORMAT_VERSION)
    manifest["tokenizer"]["rare_letters"] = letters
    manifest["provenance"]["rare_letters"] = {
        "sources": str(sources),
        "lines": len(lines),
        "fewer_than": fewer_than,
        "share": share,
    }
    write_manifest(folder_path, manifest)
    load_model_folder(folder_path)  # the folder must still load
    return letters
