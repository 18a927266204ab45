"""The engine benchmark's machinery on the tiny model: worker processes, forced lengths, alternation, tables."""

import json
import shutil
from pathlib import Path

import pytest

import bench.engine as engine_module
from bench.engine import (
    FORCED,
    THREADS,
    Engine,
    Result,
    Setting,
    alone_latencies,
    benchmark,
    best_layouts,
    latency_table,
    memory_table,
    real_text_table,
    split_layout,
    table,
    turn_size,
    written_by_this_exporter,
)


def test_engines_run_in_workers_with_forced_lengths_and_report_tables(model_dir: Path) -> None:
    engines = [
        Engine("ours-int8", "ours", folder=model_dir, variant="fp32"),
        Engine("other", "ours", folder=model_dir, variant="fp32"),
        Engine("ours-int8@2x1", "ours", folder=model_dir, variant="fp32", streams=2, threads=1),
    ]
    try:
        sources = [[5 + i, 6, 7, 3] for i in range(6)]
        settings = [Setting(beam=1, batch=4, sentences=6), Setting(beam=2, batch=1, sentences=2)]
        results = benchmark(engines, sources, settings, rounds=2)
        _, solo = engines[0].run(sources, settings[0], FORCED)
        _, streamed = engines[2].run(sources, settings[0], FORCED)
    finally:
        for engine in engines:
            engine.close()
    assert len(results) == 5  # the best of two rounds per engine and setting; a layout skips batch 1
    tokens = {(r.engine, r.batch): r.tokens for r in results}
    expected = {(e.name, b): n * FORCED for e in engines[:2] for b, n in ((4, 6), (1, 2))}
    assert tokens == expected | {("ours-int8@2x1", 4): 6 * FORCED}  # every output forced
    assert streamed == solo  # two sub-batches at once: the same outputs, in the sources' order
    assert all(r.peak_rss_mb >= engines[0].loaded_rss_mb * 0.5 and r.seconds > 0 for r in results)
    assert all(0 < r.cores <= THREADS + 0.5 for r in results)  # the worker's CPU time over its wall time
    speeds = table(results)
    assert "| ours-int8 | greedy | 4 |" in speeds and "| other | beam 2 | 1 |" in speeds
    assert "| ours-int8@2x1 | greedy | 4 |" in speeds and "ours-int8@2x1 | beam 2" not in speeds
    layout_row = next(line for line in speeds.splitlines() if line.startswith("| ours-int8@2x1 |"))
    assert layout_row.endswith("| 1.00 |")  # a layout's ratio: against ours in that layout (itself here)
    best = best_layouts(results, "ours-int8", "other")
    assert best.count("\n") == 3 and "| greedy | 4 |" in best and "| beam 2 | 1 |" in best
    fastest = max((r for r in results if r.beam == 1 and "ours-int8" in r.engine), key=lambda r: r.tokens_per_second)
    layout = fastest.engine.partition("@")[2] or f"1x{THREADS}"
    assert f"| greedy | 4 | {fastest.tokens_per_second:,.0f} | {layout} |" in best  # ours in its fastest layout
    assert all(len(r.rounds) == 2 and r.tokens_per_second == max(r.rounds) for r in results)  # best of its rounds
    other = next(r for r in results if (r.engine, r.beam, r.batch) == ("other", 1, 4))
    each = ", ".join(f"{a / b:.2f}" for a, b in zip(fastest.rounds, other.rounds, strict=True))
    assert next(line for line in best.splitlines() if line.startswith("| greedy |")).endswith(f"| {each} |")
    memory = memory_table(results, {e.name: e.loaded_rss_mb for e in engines})
    assert memory.count("\n") == 4 and "ours-int8" in memory


class TurnTaker:
    """An engine without a worker: each run is logged and takes a second a sentence (two for "slow")."""

    def __init__(self, name: str, log: list[tuple[str, int, bool]], streams: int = 1) -> None:
        self.name, self.log, self.streams = name, log, streams

    def run(self, sources: list[list[int]], setting: Setting, forced: int, warm_up: bool = True) -> tuple[Result, list]:
        self.log.append((self.name, setting.sentences, warm_up))
        seconds = setting.sentences * (2.0 if self.name == "slow" else 1.0)
        result = Result(
            self.name,
            setting.beam,
            setting.batch,
            setting.sentences,
            setting.sentences * forced,
            seconds,
            100.0 + len(self.log),
            seconds / 2,  # half a core busy
        )
        return result, [[7] * forced] * setting.sentences


def test_engines_take_turns_within_a_round_and_each_rounds_turns_are_summed() -> None:
    """Batch 1: turns of 8 sentences, the order rotating at each turn; the first turn of a round warms up; a
    round's turns add up to the whole setting; a layout that cannot split batch 1 takes no turn."""
    log: list[tuple[str, int, bool]] = []
    engines = [TurnTaker("fast", log), TurnTaker("slow", log), TurnTaker("fast@2x1", log, streams=2)]
    sources = [[5, 6, 3]] * 20
    results = benchmark(engines, sources, [Setting(beam=1, batch=1, sentences=20)], rounds=2)  # type: ignore[arg-type]
    assert turn_size(Setting(1, 1, 20)) == 8 and turn_size(Setting(1, 32, 256)) == 64
    assert [(name, n) for name, n, _ in log[:6]] == [
        ("fast", 8),
        ("slow", 8),
        ("slow", 8),
        ("fast", 8),
        ("fast", 4),
        ("slow", 4),
    ]  # 8 + 8 + 4, turns rotating
    assert [warm for _, _, warm in log] == [True, True] + [False] * 4 + [True, True] + [False] * 4
    by_name = {r.engine: r for r in results}
    assert set(by_name) == {"fast", "slow"}
    assert by_name["fast"].sentences == 20 and by_name["fast"].tokens == 20 * FORCED
    assert by_name["fast"].seconds == 20.0 and by_name["slow"].seconds == 40.0
    assert by_name["slow"].cpu_seconds == 20.0 and by_name["slow"].cores == 0.5  # CPU time summed over turns too
    assert by_name["fast"].rounds == (FORCED, FORCED) and by_name["slow"].rounds == (FORCED / 2, FORCED / 2)
    assert by_name["slow"].peak_rss_mb == 100.0 + 6  # the highest of its best round's turns (the first: a tie)


def test_real_text_ratios_set_each_layout_against_ours_in_it() -> None:
    rows = {
        "ours-int8@1x1": (39.4, 59.2, 8_000.0, 1.0),
        "ct2-int8@1x1": (39.5, 59.2, 10_000.0, 1.0),
        "ct2-int8": (39.5, 59.2, 5_000.0, 2.0),
    }
    lines = real_text_table(rows).splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| ct2-int8@1x1", "| ours-int8@1x1", "| ct2-int8"]
    assert lines[2].endswith("| 10,000 | 1.00 | 10,000 | 0.80 |")  # tok/s, cores, tok/s a core, the ratio
    assert lines[3].endswith("| 8,000 | 1.00 | 8,000 | 1.00 |")
    assert lines[4].endswith("| 5,000 | 2.00 | 2,500 | - |")  # no plain ours-int8 in this run: no ratio, not nan


def test_each_sentence_alone_is_timed_on_every_engine_of_one_stream(model_dir: Path) -> None:
    engines = [
        Engine("ours-int8", "ours", folder=model_dir, variant="fp32"),
        Engine("ours-fp32", "ours", folder=model_dir, variant="fp32"),
        Engine("ours-int8@2x1", "ours", folder=model_dir, variant="fp32", streams=2, threads=1),
    ]
    sources = [[5 + i % 7, 6, 7, 8, 9][: 2 + i % 4] + [3] for i in range(7)]
    try:
        rows = alone_latencies(engines, sources, eos=3, block=3)  # blocks of 3, 3 and 1, the engines taking turns
        _, batched = engines[0].run(sources, Setting(beam=1, batch=1, sentences=7), None)
    finally:
        for engine in engines:
            engine.close()
    assert set(rows) == {"ours-int8", "ours-fp32"}  # a layout of two streams cannot split a batch of one
    assert all(len(seconds) == 7 and min(seconds) > 0 for seconds, _ in rows.values())
    assert rows["ours-int8"][1] == sum(len([t for t in o if t != 3]) for o in batched)  # tokens without eos
    lines = latency_table(rows).splitlines()
    assert len(lines) == 4 and all(line.count("|") == 9 for line in lines)


def test_the_latency_table_gives_percentiles_their_spread_and_ratios_by_layout() -> None:
    rows = {
        "ct2-int8@1x1": ([0.002] * 50 + [0.020] * 50, 500),  # p50 11 ms (between the halves), p99 20
        "ours-int8@1x1": ([0.001] * 98 + [0.010] * 2, 200),
        "ct2-int8": ([0.004] * 100, 300),
    }
    lines = latency_table(rows).splitlines()
    assert [line.split(" | ")[0] for line in lines[2:]] == ["| ours-int8@1x1", "| ct2-int8", "| ct2-int8@1x1"]
    ours = lines[2].split(" | ")
    assert ours[1:4] == ["1.00", "1.00", "10.00"] and ours[4] == "10.00"  # p50, p95, p99 ms; p99 ÷ p50
    assert ours[5:7] == ["1.18", "1,695"] and lines[2].endswith("| 1.00 |")  # mean ms; tok/s: 200 / 0.118 s
    assert lines[3].endswith("| 4.00 | 750 | - |")  # mean ms, tok/s; no plain ours-int8 here: no ratio
    assert lines[4].endswith("| 9.32 |")  # its mean 11 ms against ours' 1.18 ms in the same layout


def test_layouts_split_the_threads_between_streams() -> None:
    assert split_layout("ct2-int8") == ("ct2-int8", 1, THREADS)
    assert split_layout("ct2-int8@2x1") == ("ct2-int8", 2, 1) and split_layout("ours-int8@1x1") == ("ours-int8", 1, 1)
    for bad in (f"ours-int8@{THREADS}x2", "ours-int8@2", "ours-int8@axb", "ours-int8@0x1"):
        with pytest.raises(SystemExit, match="STREAMSxTHREADS"):
            split_layout(bad)


def test_a_folder_from_an_older_exporter_is_rebuilt(model_dir: Path, tmp_path: Path) -> None:
    """The benchmark rebuilds its model folders when the format or the graphs' structure changed since."""
    assert written_by_this_exporter(model_dir)
    for key, old in (("format_version", 2), ("graphs", 1), ("graphs", None)):
        folder = Path(shutil.copytree(model_dir, tmp_path / f"{key}-{old}"))
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
        place = manifest if key == "format_version" else manifest["provenance"]["exporter"]
        if old is None:
            del place[key]  # a folder exported before the revision was recorded
        else:
            place[key] = old
        (folder / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
        assert not written_by_this_exporter(folder), (key, old)
    assert not written_by_this_exporter(tmp_path / "missing")


@pytest.mark.parametrize("names", [["ours-int8", "ct2-int8"], ["ours-int8@1x1", "ct2-int8@2x1", "ct2-float32@1x1"]])
def test_peers_are_converted_for_engines_named_with_their_layout(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, names: list[str]
) -> None:
    """ours-int8@1x1 needs the int8 variant and ct2-int8@2x1 CTranslate2's int8 model, as the bare names do: with
    the layout in the name nothing was converted, and every engine failed to load."""
    shutil.copytree(model_dir, tmp_path / "ours")  # of this exporter, fp32 only: not converted again
    commands: list[tuple[str, ...]] = []
    monkeypatch.setattr(engine_module, "run_command", lambda *command: commands.append(command))
    engine_module.convert_peers(tmp_path, names)
    ran = [" ".join(c[2:4]) if c[1] == "-m" else "" for c in commands]
    assert "model_export quantize" in ran  # the int8 variant
    quantizations = sorted(c[c.index("--quantization") + 1] for c in commands if "--quantization" in c)
    assert quantizations == (["float32", "int8"] if "ct2-float32@1x1" in names else ["int8"])
