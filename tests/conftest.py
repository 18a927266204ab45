from __future__ import annotations

from pathlib import Path

import pytest

from model_export.checkpoint import Checkpoint
from model_export.export import export_folder
from tests.factories import tiny_checkpoint, train_sentencepiece, write_checkpoint


@pytest.fixture(scope="session")
def spm_model() -> bytes:
    return train_sentencepiece()


@pytest.fixture(scope="session")
def checkpoint(spm_model: bytes) -> Checkpoint:
    return tiny_checkpoint(spm_model)


@pytest.fixture(scope="session")
def checkpoint_path(checkpoint: Checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_checkpoint(checkpoint, tmp_path_factory.mktemp("ckpt") / "tiny.pt")


@pytest.fixture(scope="session")
def model_dir(checkpoint: Checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model exported once per session. Tests that alter a folder copy it first."""
    return export_folder(checkpoint, tmp_path_factory.mktemp("models") / "tiny-en-fr", "tiny-en-fr", "0.0.1")
