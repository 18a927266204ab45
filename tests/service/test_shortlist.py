"""The vocabulary shortlist on the server's side: each sentence's candidates from its own source, a bad shortlist
file or manifest entry refused with a message that names it, MT_SHORTLIST on a folder without one refused, and
/v1/models saying it is on."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

from model_export.export import file_entries
from service.api.app import create_app
from service.engine.sessions import open_runtime
from service.engine.shortlist import load_shortlist
from service.errors import ModelFolderError
from service.model.folder import MANIFEST, load_model_folder
from service.settings import Settings


@pytest.fixture()
def folder(shortlisted: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(shortlisted, tmp_path / "copy"))


def rewrite(folder: Path, arrays: dict[str, np.ndarray] | None = None, raw: bytes | None = None) -> None:
    """The folder's shortlist file replaced (its checksum in the manifest with it)."""
    path = folder / "shortlist.npz"
    if raw is not None:
        path.write_bytes(raw)
    else:
        with path.open("wb") as f:
            np.savez(f, **arrays)
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    manifest["files"].update(file_entries(folder, ["shortlist.npz"]))
    (folder / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")


def test_each_sentences_candidates_come_from_its_own_source_sorted_and_padded(shortlisted: Path) -> None:
    shortlist = load_shortlist(load_model_folder(shortlisted))
    src_ids = np.array([[5, 6, 7, 3, 0, 0], [40, 41, 42, 43, 44, 3]])  # (2, S), the first padded
    src_mask = src_ids != 0
    candidates = shortlist.candidates(src_ids, src_mask)  # (2, C)
    assert candidates.shape == (2, 64) and not np.array_equal(candidates[0], candidates[1])
    for row in range(2):
        alone = shortlist.candidates(src_ids[row : row + 1, src_mask[row]], np.ones((1, src_mask[row].sum()), bool))
        assert candidates[row].tolist() == alone[0].tolist()  # its neighbour and its padding change nothing
        chosen = np.unique(candidates[row])
        assert {0, 1, 2, 3} <= set(chosen.tolist())  # pad, unk, the decoder start, eos: always
        assert set(src_ids[row][src_mask[row]].tolist()) <= set(chosen.tolist())  # its source ids (shared vocabulary)
        first = candidates[row][: len(chosen)]
        assert first.tolist() == chosen.tolist()  # ascending, each id once, then pad ids to fill
        assert set(candidates[row][len(chosen) :].tolist()) <= {0}


def test_a_shortlist_file_that_is_not_an_npz_is_refused(folder: Path) -> None:
    rewrite(folder, raw=b"not a zip file")
    with pytest.raises(ModelFolderError, match=r"shortlist.npz: not a shortlist \(numpy .npz\) file"):
        load_shortlist(load_model_folder(folder))


def test_a_shortlist_file_without_its_arrays_is_refused(folder: Path) -> None:
    rewrite(folder, {"always": np.arange(3)})
    with pytest.raises(ModelFolderError, match="shortlist.npz: not a shortlist: it has no array offsets, targets"):
        load_shortlist(load_model_folder(folder))


def out_of_range(arrays: dict[str, np.ndarray]) -> None:
    arrays["targets"] = arrays["targets"].copy()
    arrays["targets"][0] = 1000


def decreasing(arrays: dict[str, np.ndarray]) -> None:
    arrays["offsets"] = arrays["offsets"].copy()
    arrays["offsets"][1] = arrays["offsets"][2] + 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda arrays: arrays.update(offsets=np.zeros(5, np.int64)), r"offsets must hold 97 values"),
        (out_of_range, r"targets holds ids outside the target vocabulary \(0..95\)"),
        (lambda arrays: arrays.update(always=np.array([[1]])), r"always must be a one-dimensional integer array"),
        (lambda arrays: arrays.update(always=np.array([1.5])), r"always must be a one-dimensional integer array"),
        (decreasing, "offsets decrease"),
    ],
)
def test_a_shortlist_file_with_bad_arrays_is_refused(folder: Path, change, message: str) -> None:  # noqa: ANN001
    arrays = dict(np.load(folder / "shortlist.npz"))
    change(arrays)
    rewrite(folder, arrays)
    with pytest.raises(ModelFolderError, match=message):
        load_shortlist(load_model_folder(folder))


def test_a_shortlist_graph_whose_candidate_axis_is_not_the_shortlists_is_refused(folder: Path) -> None:
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    manifest["shortlist"]["candidates"] = 128
    (folder / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(ModelFolderError, match="candidate_ids axis is 64, the shortlist's candidates 128"):
        load_model_folder(folder)
    del manifest["shortlist"]
    (folder / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    with pytest.raises(ModelFolderError, match="has a decoder_step_shortlist but the folder has no shortlist"):
        load_model_folder(folder)


def test_mt_shortlist_on_a_folder_without_one_is_refused_with_the_command_that_adds_it(quantized: Path) -> None:
    with pytest.raises(ModelFolderError, match="no shortlist step graph .*`python -m model_export shortlist`"):
        open_runtime(load_model_folder(quantized), Settings(shortlist=True, variant="int8"))


def test_the_models_endpoint_says_the_shortlist_is_on_and_the_server_translates_with_it(shortlisted: Path) -> None:
    for on, expected in ((True, 64), (False, None)):
        settings = Settings(
            models_dir=shortlisted.parent, models=[shortlisted.name], intra_op_threads=1, shortlist=on, variant="int8"
        )
        with TestClient(create_app(settings)) as client:
            assert client.get("/v1/models").json()["models"][0]["shortlist"] == expected
            answer = client.post("/translate", json={"q": "Open the file.", "source": "en", "target": "fr"})
            assert answer.status_code == 200, answer.text
