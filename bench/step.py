"""Step profile: where one decoder step's time goes, by operator type, under ONNX Runtime's profiler. The runtime's
own step (the same sessions, binding and cache as the server's), at the rows, cache length, source length and
intra-op threads asked, one column per (rows, threads) pair: the figures behind docs/performance.md's "What the time
goes to". Random source ids, every source position real (so the step graph, not the ragged one), greedy rows unless
--beam, asking no scores (greedy steps skip the log-softmax, as the server's do without `return_scores`); with --dense,
as a static runtime does: the folder's dense step graph (format 10) from 8 rows, over a dense cache. Run it
with nothing else on the machine. The profiler costs a few µs per node: the last line, the same steps without it,
says how much of a small step's profile that is.

    python -m bench.step                                                        # the default model, 32 rows
    python -m bench.step --model runs/bench/paper/ours --rows 32,16,32 --threads 2,1,1   # after bench.engine paper
    python -m bench.step --model runs/bench/paper/ours --rows 64 --beam 4 --dense       # as the static mode steps it
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from bench.machine import describe, headline
from service.arguments import description_of, non_negative_int, positive_int, positive_ints
from service.engine.decoding import SearchOptions, candidates, needs_log_probs
from service.engine.runtime import OnnxRuntime, SessionSettings
from service.engine.sessions import single_row_rows
from service.errors import ModelFolderError
from service.model.folder import ModelFolder, load_model_folder

ROOT = Path(__file__).resolve().parent.parent
GRAPH_NOTES = {"single": ", the one-row graph", "dense": ", the dense graph"}


@dataclass(frozen=True)
class Workload:
    sentences: int
    beam: int  # rows per sentence
    source: int  # source tokens per sentence
    slots: int  # steps taken before the timed ones
    steps: int  # timed steps


def timed_steps(runtime: OnnxRuntime, work: Workload, src_vocab: int, tgt_vocab: int) -> tuple[float, str, int]:
    """Encodes random sources, takes `slots` steps to fill the cache, then times `steps` more: µs per step of the
    runtime's whole `step` (binding, the graph, its outputs), not only the graph, which step graph ran the timed
    steps (one row: the one-row graph, when the folder has it), and how many steps it ran in all (a beam's first
    step has one row per sentence, which the one-row graph may have taken)."""
    rng = np.random.default_rng(0)
    src_ids = rng.integers(4, src_vocab, (work.sentences, work.source))  # (N, S)
    src_mask = np.ones((work.sentences, work.source), np.bool_)  # (N, S) every position real
    memory = runtime.encode(src_ids, src_mask)  # (L, N, H, S, Dh) twice
    cache = runtime.new_cache()
    cache.add(memory.keys, memory.values, src_mask)
    search = SearchOptions(beam_size=work.beam, scored=False)  # as a request without return_scores
    width, normalised = candidates(search), needs_log_probs(search)  # what such searches take from a step
    graphs = collections.Counter()
    for step in range(work.slots):
        runtime.step(rng.integers(4, tgt_vocab, cache.rows), cache, candidates=width, log_softmax=normalised)
        graphs[cache.bound.graph] += 1
        if step == 0 and work.beam > 1:
            cache.select(np.repeat(np.arange(work.sentences), work.beam))  # (N x beam,) each sentence's beams
    started = time.perf_counter()
    for _ in range(work.steps):
        runtime.step(rng.integers(4, tgt_vocab, cache.rows), cache, candidates=width, log_softmax=normalised)
    elapsed = time.perf_counter() - started
    return elapsed / work.steps * 1e6, cache.bound.graph, graphs[cache.bound.graph] + work.steps


def profile_step(
    loaded: ModelFolder, variant: str | None, threads: int, work: Workload, dense: bool = False
) -> tuple[dict[str, tuple[int, float]], float, float, str]:
    """{operator type: (nodes per step, µs per step)} over the timed steps under ONNX Runtime's profiler, the wall
    time per step in µs with the profiler on, and without it (the profiler's own cost per node is a few µs: at
    small steps most of what it reports), and the step graph that ran."""
    cfg = loaded.manifest.config
    rows = single_row_rows(cfg)  # as the server would: the one-row graph for steps of up to this many rows
    settings = SessionSettings(
        intra_op_threads=threads, encoder_threads=1, ragged_step=False, single_row_rows=rows, dense_step=dense
    )
    plain, *_ = timed_steps(OnnxRuntime(loaded, variant, settings), work, cfg.src_vocab_size, cfg.tgt_vocab_size)
    with tempfile.TemporaryDirectory() as tmp:
        runtime = OnnxRuntime(loaded, variant, replace(settings, profile_prefix=str(Path(tmp) / "p")))
        profiled, graph, runs = timed_steps(runtime, work, cfg.src_vocab_size, cfg.tgt_vocab_size)
        events = json.loads(Path(runtime.steps[graph].end_profiling()).read_text())
        del runtime
        gc.collect()  # the other sessions write their (unread) profiles into tmp before it goes
    nodes = [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    per_run, rest = divmod(len(nodes), runs)
    if rest:
        raise SystemExit(f"the profile holds {len(nodes)} node runs, not a whole number of steps")
    by_type: dict[str, list[float]] = collections.defaultdict(list)
    for event in own_times(nodes[-work.steps * per_run :]):
        by_type[event["args"]["op_name"]].append(event["dur"])
    return {op: (len(d) // work.steps, sum(d) / work.steps) for op, d in by_type.items()}, profiled, plain, graph


def own_times(nodes: list[dict]) -> list[dict]:
    """The profile's node events with each control-flow node's time less the time of the nodes its branch ran
    (format 8's If around the log-softmax and top-K), which the profile lists as events of their own, inside the If's
    span: each node's time counted once, by its own type."""
    out = []
    for event in nodes:
        if event["args"]["op_name"] == "If":
            start, end = event["ts"], event["ts"] + event["dur"]
            inner = sum(e["dur"] for e in nodes if e is not event and start <= e["ts"] and e["ts"] + e["dur"] <= end)
            event = {**event, "dur": event["dur"] - inner}
        out.append(event)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.step", description=description_of(__doc__))
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "en-fr", help="a model folder")
    parser.add_argument("--variant", default=None, help="default: the folder's default variant")
    parser.add_argument("--rows", type=positive_ints, default=[32], help="one column each, e.g. 32,16")
    parser.add_argument("--threads", type=positive_ints, default=[1], help="intra-op threads: one, or one per --rows")
    parser.add_argument("--beam", type=positive_int, default=1, help="rows per sentence; --rows must be a multiple")
    parser.add_argument("--source", type=positive_int, default=24, help="source tokens per sentence")
    parser.add_argument("--slots", type=non_negative_int, default=24, help="steps taken before the profiled ones")
    parser.add_argument("--steps", type=positive_int, default=10, help="profiled steps")
    parser.add_argument("--top", type=positive_int, default=12, help="operator types listed; the rest summed")
    parser.add_argument(
        "--dense", action="store_true", help="as a static runtime: the dense step graph (format 10, int8) from 8 rows"
    )
    args = parser.parse_args(argv)
    rows, threads = args.rows, args.threads * len(args.rows) if len(args.threads) == 1 else args.threads
    if len(threads) != len(rows) or any(r % args.beam for r in rows):
        parser.error("--threads takes one value or one per --rows value; every --rows value a multiple of --beam")
    if not (args.model / "manifest.json").is_file():
        parser.error(f"--model {args.model}: not a model folder (no manifest.json); bench.engine paper makes one")
    loaded = load_model_folder(args.model, verify_checksums=False)
    try:
        spec = loaded.variant(args.variant)
    except ModelFolderError as error:
        parser.error(str(error))
    if args.dense and spec.decoder_step_dense is None:
        parser.error(f"--dense: {args.model}'s {args.variant or 'default'} variant has no dense step graph (an int8 "
                     "variant of format 10 has one: python -m model_export quantize)")
    print(headline(describe()), flush=True)
    columns = [
        profile_step(
            loaded,
            args.variant,
            t,
            Workload(r // args.beam, args.beam, args.source, args.slots, args.steps),
            args.dense,
        )
        for r, t in zip(rows, threads, strict=True)
    ]
    total = collections.Counter()
    for ops, *_ in columns:
        total.update({op: us for op, (_, us) in ops.items()})
    listed = [op for op, _ in total.most_common(args.top)]
    print(
        f"{args.model.name}, beam {args.beam}, {args.source} source tokens, cache {args.slots}-"
        f"{args.slots + args.steps} slots; ms per step (nodes)"
    )
    heads = [
        f"{r} rows, {t} thread{'s' if t > 1 else ''}" + GRAPH_NOTES.get(graph.rsplit("_", 1)[-1], "")
        for r, t, (*_, graph) in zip(rows, threads, columns, strict=True)
    ]
    print("| operator | " + " | ".join(heads) + " |\n|---|" + "---:|" * len(heads))
    for op in listed:
        cells = [f"{ops[op][1] / 1000:.2f} ({ops[op][0]})" if op in ops else "-" for ops, *_ in columns]
        print(f"| {op} | " + " | ".join(cells) + " |")
    others = [sum(us for op, (_, us) in ops.items() if op not in listed) / 1000 for ops, *_ in columns]
    print("| the rest | " + " | ".join(f"{ms:.2f}" for ms in others) + " |")
    graph = [sum(us for _, us in ops.values()) / 1000 for ops, *_ in columns]
    print("| all nodes | " + " | ".join(f"**{ms:.2f}**" for ms in graph) + " |")
    print("| wall, the runtime's step | " + " | ".join(f"{wall / 1000:.2f}" for _, wall, *_ in columns) + " |")
    print("| wall, unprofiled | " + " | ".join(f"{plain / 1000:.2f}" for _, _, plain, _ in columns) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
