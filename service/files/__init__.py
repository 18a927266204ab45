"""Localisation files in, localisation files out: a file's strings read with its format's library, translated
together in one call of the caller's `Translate`, and written back into the same format, ids, contexts, comments
and translated entries kept. The one entry is `translate_file`; `formats` lists the extensions it reads."""

from service.files.formats import (
    FileError,
    FileOptions,
    Translate,
    Translated,
    TranslatedFile,
    formats,
    source_texts,
    translate_file,
)

__all__ = [
    "FileError",
    "FileOptions",
    "Translate",
    "Translated",
    "TranslatedFile",
    "formats",
    "source_texts",
    "translate_file",
]
