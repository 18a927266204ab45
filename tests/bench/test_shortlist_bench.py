"""bench.shortlist's pieces that need no model: the random shortlist it gives a random model, its ratio table."""

from __future__ import annotations

from bench.engine import Result
from bench.shortlist import random_lists, ratios
from service.engine import check_arrays


def test_a_random_shortlist_is_a_valid_one(tmp_path) -> None:  # noqa: ANN001
    lists = random_lists(src_vocab=50, tgt_vocab=40, always=10, per_source=3, seed=1)
    check_arrays(tmp_path / "shortlist.npz", lists.arrays(), 50, 40)
    assert len(set(lists.always.tolist())) == 10 and len(lists.targets) == 150


def test_each_engine_is_set_against_its_own_full_vocabulary() -> None:
    results = [
        Result("ours-int8", 1, 32, 64, 2048, 2.0, 0.0),
        Result("ours-int8-c512", 1, 32, 64, 2048, 1.0, 0.0),
        Result("ct2-int8", 1, 32, 64, 2048, 4.0, 0.0),
        Result("ct2-int8-vmap-c512", 1, 32, 64, 2048, 3.0, 0.0),
    ]
    table = ratios(results)
    assert "| ours-int8-c512 | greedy | 32 | 2,048 | 0.50 |" in table
    assert "| ct2-int8-vmap-c512 | greedy | 32 | 683 | 0.75 |" in table
