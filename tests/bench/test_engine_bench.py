"""The engine benchmark's machinery on the tiny model: worker processes, forced lengths, alternation, tables."""

from pathlib import Path

from bench.engine import FORCED, Engine, Setting, benchmark, memory_table, table


def test_engines_run_in_workers_with_forced_lengths_and_report_tables(model_dir: Path) -> None:
    engines = [
        Engine("ours-int8", "ours", folder=model_dir, variant="fp32"),
        Engine("other", "ours", folder=model_dir, variant="fp32"),
    ]
    try:
        sources = [[5 + i, 6, 7, 3] for i in range(6)]
        settings = [Setting(beam=1, batch=4, sentences=6), Setting(beam=2, batch=1, sentences=2)]
        results = benchmark(engines, sources, settings, rounds=2)
    finally:
        for engine in engines:
            engine.close()
    assert len(results) == 4  # the best of two rounds per engine and setting
    tokens = {(r.engine, r.batch): r.tokens for r in results}
    assert tokens == {(e.name, b): n * FORCED for e in engines for b, n in ((4, 6), (1, 2))}  # every output forced
    assert all(r.peak_rss_mb >= engines[0].loaded_rss_mb * 0.5 and r.seconds > 0 for r in results)
    speeds = table(results)
    assert "| ours-int8 | greedy | 4 |" in speeds and "| other | beam 2 | 1 |" in speeds
    memory = memory_table(results, {e.name: e.loaded_rss_mb for e in engines})
    assert memory.count("\n") == 3 and "ours-int8" in memory
