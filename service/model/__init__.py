"""The model folder, the one contract between model_export and the server: its manifest (format, architecture,
tokenizer, graph variants, files) read and checked in one place, and the tokenizer it holds. model_export writes
folders and reads them back through these names only."""

from service.errors import ModelFolderError
from service.model.folder import (
    FORMAT,
    FORMAT_VERSION,
    GRAPHS,
    MANIFEST,
    OLDEST_FORMAT_VERSION,
    SHORTLIST_FEWEST,
    Architecture,
    Calibration,
    GraphSpec,
    Manifest,
    ModelFolder,
    ShortlistSpec,
    SpecialIds,
    TokenizerSpec,
    VariantSpec,
    load_model_folder,
    platt,
    sha256_of,
    uncalibrated,
)
from service.model.tokenizer import Tokenizer

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "GRAPHS",
    "MANIFEST",
    "OLDEST_FORMAT_VERSION",
    "SHORTLIST_FEWEST",
    "Architecture",
    "Calibration",
    "GraphSpec",
    "Manifest",
    "ModelFolder",
    "ModelFolderError",
    "ShortlistSpec",
    "SpecialIds",
    "Tokenizer",
    "TokenizerSpec",
    "VariantSpec",
    "load_model_folder",
    "platt",
    "sha256_of",
    "uncalibrated",
]
