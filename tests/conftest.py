from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from model_export.checkpoint import Checkpoint
from model_export.export import export_folder
from model_export.quantize import add_int8_variant
from service.engine import kv_cache
from tests.factories import add_tiny_shortlist, tiny_checkpoint, train_sentencepiece, write_checkpoint


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


@pytest.fixture(scope="session")
def quantized(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with its int8 variant (and its one-row step graph), once per session; fp32 stays the
    default. Tests that alter it copy it first."""
    folder = Path(shutil.copytree(model_dir, tmp_path_factory.mktemp("q") / "tiny-en-fr"))
    add_int8_variant(folder)
    return folder


@pytest.fixture(autouse=True)
def unwritten_cache_slots_hold_nan(monkeypatch: pytest.MonkeyPatch) -> None:
    """A grown self-attention buffer is not zeroed (service/engine/kv_cache.py `resized`): whatever its memory held
    stays, often zeros. Every test sees NaN there instead, so that no result, and no test, leans on them."""
    original = kv_cache.resized

    def poisoned(
        layer: Any, rows: int, time: int, live: int, xp: Any = np, zeroed: bool = True, written: int | None = None,
        lazy: bool = False,
    ) -> Any:
        out = original(layer, rows, time, live, xp, zeroed, written, lazy)
        if not zeroed and np.issubdtype(out.dtype, np.floating):
            kept = min(time, layer.shape[-2], time if written is None else written)  # of ([L,] R, H, T, Dh)
            out[..., live:, :, :, :] = np.nan  # ([L,] rows - live, H, time, Dh)
            out[..., :live, :, kept:, :] = np.nan  # ([L,] live, H, slots not copied, Dh)
        return out

    monkeypatch.setattr(kv_cache, "resized", poisoned)


@pytest.fixture(scope="session")
def shortlisted(quantized: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny int8 model with a shortlist of 64 candidates (of 96 ids) learned from a tiny parallel corpus, and
    its shortlist step graphs. Tests that alter it copy it first."""
    folder = Path(shutil.copytree(quantized, tmp_path_factory.mktemp("sl") / "tiny-en-fr"))
    add_tiny_shortlist(folder, tmp_path_factory.mktemp("corpus"))
    return folder
