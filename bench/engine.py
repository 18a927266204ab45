"""Engine benchmark: our runtime (fp32, int8) against transformers' generate (PyTorch, fp32) and
CTranslate2 (float32, int8) on exactly the same weights; greedy and beam 4, batch 1 and 32; every
output forced to 32 tokens so that every engine does the same work. Each engine lives in its own worker
process (so its peak RSS is its own, and loading is not timed); the engines take turns within each round (8
sentences at batch 1, two batches at 32), so that the machine's drift falls on all of them alike.

    python -m bench.engine paper     # paper-size Marian-shaped model, random weights (fixed seed)
    python -m bench.engine default   # the shipped default model: the same workload, then real text (in
                                     # batches of 32, then each sentence alone: its latency's p50 and p99)
    python -m bench.engine paper --device cuda   # on the GPU: ours fp16 (and fp32), CTranslate2 float16,
                                                 # int8_float16 and float32, transformers fp16 and fp32
                                                 # (needs onnxruntime-gpu, CuPy, CUDA torch, CTranslate2)
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench.machine import describe, headline
from model_export import graph_io
from service.arguments import description_of, non_negative_int, positive_int, positive_ints

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "runs" / "bench"
THREADS = 2
FORCED = 32  # output tokens per sentence, every engine


@dataclass(frozen=True)
class Setting:
    beam: int
    batch: int
    sentences: int


@dataclass
class Result:
    engine: str
    beam: int
    batch: int
    sentences: int
    tokens: int
    seconds: float
    peak_rss_mb: float
    cpu_seconds: float = 0.0  # the worker's CPU time over `seconds`, all its threads
    rounds: tuple[float, ...] = ()  # tok/s in each round, in order (`benchmark` fills it in the best round's result)

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds

    @property
    def cores(self) -> float:
        """The cores the engine kept busy on average: its CPU time over its wall time."""
        return self.cpu_seconds / self.seconds


def rss_mb(field: str = "VmHWM") -> float:
    """This process's peak (VmHWM) or current (VmRSS) resident memory. Not getrusage's ru_maxrss: Linux
    carries that across exec, so a worker would report its parent's peak."""
    status = Path("/proc/self/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith(f"{field}:")) / 1024


# -- the engines, each in a worker process ------------------------------------------------------


class Ours:
    """Our runtime; with `streams` > 1, that many sub-batches decode at once on threads of their own, the cores
    shared between them (as CTranslate2's inter_threads)."""

    def __init__(
        self, folder: Path, variant: str, device: str = "cpu", streams: int = 1, threads: int = THREADS,
        invariant: bool = True, shortlist: bool = False,
    ) -> None:
        from service.engine.batches import TokenRules
        from service.engine.runtime import OnnxRuntime, SessionSettings
        from service.engine.sessions import step_graph_options
        from service.model.folder import load_model_folder
        from service.settings import Settings

        loaded = load_model_folder(folder, verify_checksums=False)
        providers = ("CUDAExecutionProvider",) if device == "cuda" else ("CPUExecutionProvider",)
        # the static mode's step graphs; not `invariant`: also the faster ones (MT_BATCH_INVARIANT=false); `shortlist`:
        # the shortlist step graph's (MT_SHORTLIST; bench.shortlist)
        static = Settings(batching="static", batch_invariant=invariant, shortlist=shortlist)
        steps = step_graph_options(loaded, variant, static)
        settings = SessionSettings(providers, threads, **steps)
        self.runtime = OnnxRuntime(loaded, variant, settings)
        if self.runtime.providers[0] != providers[0]:
            raise SystemExit(f"ONNX Runtime cannot run on {device} here (it offers {self.runtime.providers})")
        if device == "cuda":
            where = "GPU" if self.runtime.gpu else "host"
            print(f"ours-{variant}: {self.runtime.providers}, decoder cache in {where} memory", flush=True)
        ids = loaded.manifest.special_ids
        self.rules = TokenRules(ids.decoder_start, ids.eos, ids.pad)
        self.streams = streams

    def translate(self, sources: list[list[int]], beam: int, batch: int, forced: int | None) -> list[list[int]]:
        from service.engine.batches import decode_batches
        from service.engine.decoding import SearchOptions

        # no scores, as CTranslate2's translate_batch by default (its greedy search then skips the log-softmax too)
        options = SearchOptions(beam, forced or 256, min_new_tokens=forced or 0, scored=False)
        size = max(1, batch // self.streams)  # each stream's sub-batch
        chunks = [sources[start : start + size] for start in range(0, len(sources), size)]
        decoded = decode_batches(self.runtime, chunks, [[options] * len(c) for c in chunks], self.rules, self.streams)
        return [list(hyps[0].tokens) for results in decoded for hyps in results]


class Transformers:
    def __init__(self, hf_dir: Path, device: str = "cpu", dtype: str = "float32") -> None:
        import torch
        from transformers import MarianMTModel
        from transformers.utils import logging

        logging.set_verbosity_error()  # else each generate() warns that max_new_tokens overrides max_length
        torch.set_num_threads(THREADS)
        self.torch = torch
        self.model = MarianMTModel.from_pretrained(hf_dir, dtype=getattr(torch, dtype)).eval().to(device)
        self.device = device
        self.eos, self.pad = self.model.config.eos_token_id, self.model.config.pad_token_id

    def translate(self, sources: list[list[int]], beam: int, batch: int, forced: int | None) -> list[list[int]]:
        out = []
        for start in range(0, len(sources), batch):
            chunk = sources[start : start + batch]
            width = max(map(len, chunk))
            ids = self.torch.tensor([s + [self.pad] * (width - len(s)) for s in chunk], device=self.device)
            mask = self.torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in chunk], device=self.device)
            extra = {"min_new_tokens": forced} if forced else {}
            with self.torch.no_grad():
                generated = self.model.generate(
                    input_ids=ids,
                    attention_mask=mask,
                    num_beams=beam,
                    max_new_tokens=forced or 256,
                    do_sample=False,
                    early_stopping=False,
                    length_penalty=1.0,
                    **extra,
                )
            for row in generated.tolist():
                tokens = [t for t in row[1:] if t != self.pad]
                out.append(tokens[: tokens.index(self.eos) + 1] if self.eos in tokens else tokens)
        return out


class CTranslate2:
    """CTranslate2; with `streams` > 1, inter_threads: that many sub-batches decode at once, the cores shared."""

    def __init__(
        self,
        ct2_dir: Path,
        compute_type: str,
        pieces: list[str],
        device: str = "cpu",
        streams: int = 1,
        threads: int = THREADS,
        use_vmap: bool = False,
    ) -> None:
        import ctranslate2

        self.translator = ctranslate2.Translator(
            str(ct2_dir), device=device, compute_type=compute_type, inter_threads=streams, intra_threads=threads
        )
        self.pieces, self.ids = pieces, {p: i for i, p in enumerate(pieces)}
        self.streams = streams
        self.use_vmap = use_vmap  # its model folder's vmap.txt: the batch's candidates only (bench.shortlist)

    def translate(self, sources: list[list[int]], beam: int, batch: int, forced: int | None) -> list[list[int]]:
        tokens = [[self.pieces[i] for i in s] for s in sources]
        extra = {"min_decoding_length": forced} if forced else {}
        results = self.translator.translate_batch(
            tokens,
            max_batch_size=max(1, batch // self.streams),
            beam_size=beam,
            max_decoding_length=forced or 256,
            length_penalty=1.0,
            use_vmap=self.use_vmap,
            **extra,
        )
        return [[self.ids[p] for p in r.hypotheses[0]] for r in results]


def worker(kind: str, args: dict[str, Any], conn: Any) -> None:
    """Loads one engine, then runs what the parent sends until it sends None."""
    try:
        engine = {"ours": Ours, "transformers": Transformers, "ctranslate2": CTranslate2}[kind](**args)
    except (Exception, SystemExit) as error:  # noqa: BLE001 - any engine's failure to load, reported, not hung on
        conn.send(f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
        return
    conn.send(rss_mb("VmRSS"))  # resident once loaded (loading's own transient peak shows in the peaks)
    while (job := conn.recv()) is not None:
        if job[0] == "alone":
            conn.send(one_at_a_time(engine, job[1]))
            continue
        sources, beam, batch, forced, warm_up = job
        if warm_up:
            engine.translate(sources[:batch], beam, batch, forced)  # at this shape, before a round's first turn
        started, cpu = time.perf_counter(), time.process_time()
        outputs = engine.translate(sources, beam, batch, forced)
        conn.send((time.perf_counter() - started, outputs, rss_mb(), time.process_time() - cpu))


def one_at_a_time(
    engine: Ours | Transformers | CTranslate2, sources: list[list[int]]
) -> tuple[list[float], list[list[int]]]:
    """Each source translated alone (greedy, batch 1, the engine's own stopping): the seconds each took, and its
    output."""
    seconds, outputs = [], []
    for source in sources:
        started = time.perf_counter()
        outputs += engine.translate([source], 1, 1, None)
        seconds.append(time.perf_counter() - started)
    return seconds, outputs


class Engine:
    """The parent's handle on one worker process."""

    def __init__(self, name: str, kind: str, **args: Any) -> None:
        self.name = name
        self.streams: int = args.get("streams", 1)
        self.conn, child = mp.get_context("spawn").Pipe()
        self.process = mp.get_context("spawn").Process(target=worker, args=(kind, args, child), daemon=True)
        self.process.start()
        child.close()  # the worker holds the only other end: its death ends our recv
        loaded = self.conn.recv()
        if isinstance(loaded, str):
            self.process.join(timeout=30)
            raise RuntimeError(loaded)
        self.loaded_rss_mb: float = loaded

    def run(
        self, sources: list[list[int]], setting: Setting, forced: int | None, warm_up: bool = True
    ) -> tuple[Result, list[list[int]]]:
        """The first `setting.sentences` sources, timed; `warm_up`: a batch of them untimed first."""
        self.conn.send((sources[: setting.sentences], setting.beam, setting.batch, forced, warm_up))
        seconds, outputs, rss, cpu = self.conn.recv()
        tokens = sum(len(o) for o in outputs)
        result = Result(self.name, setting.beam, setting.batch, setting.sentences, tokens, seconds, rss, cpu)
        return result, outputs

    def alone(self, sources: list[list[int]]) -> tuple[list[float], list[list[int]]]:
        """one_at_a_time in the worker."""
        self.conn.send(("alone", sources))
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(timeout=30)


# -- model preparation (cached under runs/bench/) ------------------------------------------------


def run_command(*args: str) -> None:
    print("$", " ".join(args), flush=True)
    subprocess.run(args, check=True, cwd=ROOT)


def marian_vocabulary(size: int, pad: int, eos: int, unk: int) -> dict[str, int]:
    special = {eos: "</s>", unk: "<unk>", pad: "<pad>"}
    return {special.get(i, f"▁w{i}"): i for i in range(size)}


def make_random_marian(hf_dir: Path, seed: int) -> None:
    """A paper-size Marian-shaped model (d_model 512, 6 + 6 layers, vocab 59,514) with random weights."""
    import torch
    from transformers import MarianConfig, MarianMTModel

    from tests.factories import train_sentencepiece

    vocab, pad, eos, unk = 59514, 59513, 0, 1
    config = MarianConfig(
        vocab_size=vocab,
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        activation_function="swish",
        scale_embedding=True,
        max_position_embeddings=512,
        pad_token_id=pad,
        eos_token_id=eos,
        decoder_start_token_id=pad,
        bad_words_ids=[[pad]],
        share_encoder_decoder_embeddings=True,
    )
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    hf_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(hf_dir)
    spm_model = train_sentencepiece()
    for name in ("source.spm", "target.spm"):
        (hf_dir / name).write_bytes(spm_model)
    (hf_dir / "vocab.json").write_text(json.dumps(marian_vocabulary(vocab, pad, eos, unk)), encoding="utf-8")
    tokenizer_config = {
        "source_lang": "en",
        "target_lang": "fr",
        "model_max_length": 512,
        "tokenizer_class": "MarianTokenizer",
        "pad_token": "<pad>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
    }
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")


def convert_peers(base: Path, engines: list[str]) -> None:
    """Our folder with the variants `engines` run, and the CTranslate2 models they run (ct2-int8 its int8 model;
    the others its float32 model, converted to float16 or int8_float16 at load), from the Hugging Face folder."""
    hf, ours = base / "hf", base / "ours"
    engines = [name.partition("@")[0] for name in engines]  # a layout (ours-int8@2x1) runs its engine's model
    if not written_by_this_exporter(ours):
        shutil.rmtree(ours, ignore_errors=True)
        run_command(
            sys.executable,
            "-m",
            "model_export",
            "convert-marian",
            "--hf-dir",
            str(hf),
            "--out",
            str(ours),
            "--source-language",
            "en",
            "--target-languages",
            "fr",
        )
    variants = json.loads((ours / "manifest.json").read_text(encoding="utf-8"))["variants"]
    for variant, command in (("int8", "quantize"), ("fp16", "half")):
        if any(e.startswith(f"ours-{variant}") for e in engines) and variant not in variants:
            run_command(sys.executable, "-m", "model_export", command, "--model-dir", str(ours))
    per_tensor = base / "ours-per-tensor"  # the same fp32 graphs, int8 with one activation scale per tensor
    if "ours-int8-per-tensor" in engines and not (written_by_this_exporter(per_tensor) and has_int8(per_tensor)):
        shutil.rmtree(per_tensor, ignore_errors=True)
        shutil.copytree(ours, per_tensor, ignore=shutil.ignore_patterns("*.int8.*", "embeddings.*", "*fp16*"))
        manifest = json.loads((per_tensor / "manifest.json").read_text(encoding="utf-8"))
        manifest["variants"] = {"fp32": manifest["variants"]["fp32"]}
        manifest["default_variant"] = "fp32"
        manifest["files"] = {n: e for n, e in manifest["files"].items() if (per_tensor / n).exists()}
        (per_tensor / "manifest.json").write_text(json.dumps(manifest, indent=2), encoding="utf-8")
        quantize = [sys.executable, "-m", "model_export", "quantize", "--model-dir", str(per_tensor)]
        run_command(*quantize, "--activation-scales", "per-tensor")
    converter = [sys.executable, "-m", "ctranslate2.converters.transformers"]  # ct2-transformers-converter
    needed = {"int8" if name == "ct2-int8" else "float32" for name in engines if name.startswith("ct2-")}
    for quantization in sorted(needed):
        target = base / f"ct2-{quantization}"
        if not (target / "model.bin").exists():
            run_command(
                *converter, "--model", str(hf), "--output_dir", str(target), "--quantization", quantization, "--force"
            )


def has_int8(folder: Path) -> bool:
    return "int8" in json.loads((folder / "manifest.json").read_text(encoding="utf-8"))["variants"]


def written_by_this_exporter(folder: Path) -> bool:
    """A model folder of the current format and graph revision (an older one is rebuilt: the server would refuse
    another format, and graphs built before a change of structure would measure the old graphs)."""
    manifest = folder / "manifest.json"
    if not manifest.exists():
        return False
    written = json.loads(manifest.read_text(encoding="utf-8"))
    revision = written.get("provenance", {}).get("exporter", {}).get("graphs")
    return written.get("format_version") == graph_io.FORMAT_VERSION and revision == graph_io.GRAPHS_REVISION


def prepare_paper(seed: int, engines: list[str]) -> Path:
    base = WORK / "paper"
    if not (base / "hf" / "config.json").exists():
        make_random_marian(base / "hf", seed)
    convert_peers(base, engines)
    return base


def prepare_default(checkpoint: Path | None) -> Path:
    """Our shipped model as it is; its checkpoint's weights in the Marian layout (transformers) and as
    CTranslate2 models written through CTranslate2's spec API (its Marian converter cannot take ours). Without
    the checkpoint (a fresh clone), the weights are rebuilt, exactly, from the shipped folder's fp32 graphs."""
    base = WORK / "default"
    export = [sys.executable, "-m", "model_export"]
    trained = ROOT / "runs" / "en-fr" / "final.pt"
    if checkpoint is not None and not checkpoint.is_file():
        raise SystemExit(f"--checkpoint {checkpoint}: no such file")
    if checkpoint is None and not trained.is_file():
        checkpoint = base / "from-folder.pt"  # built once, as the Marian and CTranslate2 copies below are
        if not checkpoint.is_file():
            print(f"{trained} not found: rebuilding the default model's weights from models/en-fr into {checkpoint}")
            run_command(*export, "from-folder", "--model-dir", str(ROOT / "models" / "en-fr"), "--out", str(checkpoint))
    checkpoint = checkpoint or trained
    if not (base / "hf" / "config.json").exists():
        run_command(*export, "to-marian", "--checkpoint", str(checkpoint), "--out", str(base / "hf"))
    ours = base / "ours"
    if not ours.exists():
        ours.symlink_to(ROOT / "models" / "en-fr")
    for quantization in ("float32", "int8"):
        target = base / f"ct2-{quantization}"
        if not (target / "model.bin").exists():
            run_command(
                *export,
                "to-ctranslate2",
                "--checkpoint",
                str(checkpoint),
                "--out",
                str(target),
                "--quantization",
                quantization,
            )
    return base


def vocabulary_pieces(hf_dir: Path) -> list[str]:
    vocab = json.loads((hf_dir / "vocab.json").read_text(encoding="utf-8"))
    pieces = [""] * (max(vocab.values()) + 1)
    for piece, i in vocab.items():
        pieces[i] = piece
    return pieces


def random_sources(hf_dir: Path, n: int, length: int, seed: int) -> list[list[int]]:
    """n sources of `length` ids (the last is EOS), drawn from the ordinary vocabulary."""
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    special = {config["pad_token_id"], config["eos_token_id"], config.get("decoder_start_token_id")}
    ordinary = np.array([i for i in range(config["vocab_size"]) if i not in special])
    rng = np.random.default_rng(seed)
    return [[int(t) for t in rng.choice(ordinary, size=length - 1)] + [config["eos_token_id"]] for _ in range(n)]


# -- the benchmark ------------------------------------------------------------------------------


CPU_ENGINES = (
    "ours-int8,ours-fp32,ct2-int8,ct2-float32,transformers-fp32,ours-int8@2x1,ct2-int8@2x1,ours-int8@1x1,ct2-int8@1x1"
)
GPU_ENGINES = "ours-fp16,ours-fp32,ct2-float16,ct2-int8_float16,ct2-float32,transformers-fp16,transformers-fp32"
REFERENCE = {"cpu": "ours-int8", "cuda": "ours-fp16"}  # the engine each table's ratios divide


def split_layout(name: str) -> tuple[str, int, int]:
    """"ct2-int8@2x1" -> ("ct2-int8", 2, 1): two sub-batches at once on one thread each (for batch 32, two of 16:
    CTranslate2's inter_threads=2, intra_threads=1); "@1x1": one batch on one thread; no suffix: one batch on
    every thread (THREADS)."""
    engine, _, layout = name.partition("@")
    if not layout:
        return engine, 1, THREADS
    streams, _, threads = layout.partition("x")
    if not (streams.isdigit() and threads.isdigit() and 1 <= int(streams) * int(threads) <= THREADS):
        raise SystemExit(f"{name}: a layout is @STREAMSxTHREADS using at most {THREADS} threads in all, e.g. @2x1")
    return engine, int(streams), int(threads)


def start_engines(base: Path, which: list[str], device: str) -> list[Engine]:
    pieces = vocabulary_pieces(base / "hf")
    specs = {
        "ours-int8": ("ours", {"folder": base / "ours", "variant": "int8"}),
        # the cost of batch invariance: the same int8 weights with one activation scale per tensor, and the faster
        # graphs (dense for static batches, one-row) that MT_BATCH_INVARIANT=false runs
        "ours-int8-per-tensor": ("ours", {"folder": base / "ours-per-tensor", "variant": "int8", "invariant": False}),
        "ours-int8-fast": ("ours", {"folder": base / "ours", "variant": "int8", "invariant": False}),
        "ours-fp32": ("ours", {"folder": base / "ours", "variant": "fp32"}),
        "ours-fp16": ("ours", {"folder": base / "ours", "variant": "fp16"}),
        "ct2-int8": ("ctranslate2", {"ct2_dir": base / "ct2-int8", "compute_type": "int8", "pieces": pieces}),
        "transformers-fp32": ("transformers", {"hf_dir": base / "hf"}),
        "transformers-fp16": ("transformers", {"hf_dir": base / "hf", "dtype": "float16"}),
    }
    for compute_type in ("float32", "float16", "int8_float16"):  # the float32 model, converted at load
        args = {"ct2_dir": base / "ct2-float32", "compute_type": compute_type, "pieces": pieces}
        specs[f"ct2-{compute_type}"] = ("ctranslate2", args)
    engines = []
    for name in which:
        engine, streams, threads = split_layout(name)
        if engine not in specs:
            raise SystemExit(f"unknown engine {engine}; known: {', '.join(sorted(specs))}")
        kind, args = specs[engine]
        if (streams, threads) != (1, THREADS) and kind == "transformers":
            raise SystemExit(f"{name}: layouts are for ours and ct2 engines")
        try:
            layout = {"streams": streams, "threads": threads} if kind != "transformers" else {}
            engines.append(Engine(name, kind, device=device, **layout, **args))
        except (RuntimeError, EOFError) as error:
            print(f"skipped {name}: it did not load ({error or 'the worker died'})", flush=True)
            continue
        print(f"loaded {name}: {engines[-1].loaded_rss_mb:.0f} MB", flush=True)
    if not engines:
        raise SystemExit("no engine loaded")
    return engines


TURN_SENTENCES = 8  # the fewest sentences an engine translates before the next takes its turn (batch 1)
TURN_BATCHES = 2  # ... and batches, at larger batches


def turn_size(setting: Setting) -> int:
    """Sentences an engine translates in one turn: engines take turns within a round, so that a drift of the
    machine's speed over a setting's seconds falls on every engine alike (8 sentences at batch 1, 64 at 32)."""
    return max(TURN_SENTENCES, TURN_BATCHES * setting.batch)


def benchmark(engines: list[Engine], sources: list[list[int]], settings: list[Setting], rounds: int) -> list[Result]:
    """Every setting, engines taking turns (`turn_size` sentences each, the order rotating each turn and round),
    each engine's turns of a round summed; the best round per engine, with every round's speed (`rounds`: the
    ratios of two engines round by round show how far the machine moved them)."""
    best: dict[tuple[str, int, int], Result] = {}
    speeds: dict[tuple[str, int, int], list[float]] = {}
    for setting in settings:
        size = turn_size(setting)
        for round_ in range(rounds):
            summed: dict[str, Result] = {}
            for turn, start in enumerate(range(0, setting.sentences, size)):
                part = replace(setting, sentences=min(size, setting.sentences - start))
                for engine in rotated(engines, round_ + turn):
                    if setting.batch % engine.streams:
                        continue  # a batch too small to split: the engine without a layout is that setting's figure
                    result, outputs = engine.run(sources[start:], part, FORCED, warm_up=turn == 0)
                    if any(len(o) != FORCED for o in outputs):
                        raise SystemExit(f"{engine.name} did not produce {FORCED} tokens per sentence")
                    summed[engine.name] = combined(summed[engine.name], result) if engine.name in summed else result
            for name, result in summed.items():
                key = (name, setting.beam, setting.batch)
                if key not in best or result.seconds < best[key].seconds:
                    best[key] = result
                speed = result.tokens_per_second
                speeds.setdefault(key, []).append(speed)
                print(f"  {name:18} beam {setting.beam} batch {setting.batch:2}: {speed:8,.0f} tok/s", flush=True)
    return [replace(result, rounds=tuple(speeds[key])) for key, result in best.items()]


def combined(first: Result, then: Result) -> Result:
    """Two turns of one engine at one setting as one result: sentences, tokens and seconds (wall and CPU) added,
    the peak kept."""
    return replace(
        first,
        sentences=first.sentences + then.sentences,
        tokens=first.tokens + then.tokens,
        seconds=first.seconds + then.seconds,
        peak_rss_mb=max(first.peak_rss_mb, then.peak_rss_mb),
        cpu_seconds=first.cpu_seconds + then.cpu_seconds,
    )


def same_layout(engine: str, reference: str) -> str:
    """`reference` in `engine`'s layout (ct2-int8@2x1 -> ours-int8@2x1): what a ratio sets `engine` against."""
    layout = engine.partition("@")[2]
    return f"{reference}@{layout}" if layout else reference


def table(results: list[Result], reference: str = "ours-int8") -> str:
    by = {(r.engine, r.beam, r.batch): r for r in results}
    lines = [
        f"| engine | search | batch | sentences/s | target tok/s | cores | {reference} (same layout) ÷ this |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for r in sorted(results, key=lambda r: (r.beam, r.batch, -r.tokens_per_second)):
        ours = by.get((same_layout(r.engine, reference), r.beam, r.batch))  # a layout's ratio: ours in it
        ratio = f"{ours.tokens_per_second / r.tokens_per_second:.2f}" if ours else "-"
        search = "greedy" if r.beam == 1 else f"beam {r.beam}"
        lines.append(
            f"| {r.engine} | {search} | {r.batch} | {r.sentences / r.seconds:,.1f} | {r.tokens_per_second:,.0f} "
            f"| {r.cores:.2f} | {ratio} |"
        )
    return "\n".join(lines)


def best_layouts(results: list[Result], ours: str, peer: str) -> str:
    """Per setting, each of two engines in its fastest layout (what a deployment tuned for this machine gets), the
    ratio of their best rounds, and their ratio in each round (the two layouts' turns alternated within it)."""
    lines = [
        f"| search | batch | {ours} | layout | {peer} | layout | ratio | each round |",
        "|---|---:|---:|---|---:|---|---:|---|",
    ]
    for beam, batch in sorted({(r.beam, r.batch) for r in results}):
        best = []
        for family in (ours, peer):
            runs = [r for r in results if r.engine.partition("@")[0] == family and (r.beam, r.batch) == (beam, batch)]
            best.append(max(runs, key=lambda r: r.tokens_per_second) if runs else None)
        if None in best:
            continue
        cells = [f"{r.tokens_per_second:,.0f} | {r.engine.partition('@')[2] or f'1x{THREADS}'}" for r in best]
        ratio = best[0].tokens_per_second / best[1].tokens_per_second
        each = ", ".join(f"{a / b:.2f}" for a, b in zip(best[0].rounds, best[1].rounds, strict=False)) or "-"
        search = "greedy" if beam == 1 else f"beam {beam}"
        lines.append(f"| {search} | {batch} | {cells[0]} | {cells[1]} | {ratio:.2f} | {each} |")
    return "\n".join(lines)


def memory_table(results: list[Result], loaded: dict[str, float]) -> str:
    """Each worker's resident memory after loading, and its peak over the whole workload (VmHWM)."""
    peaks = {name: max([r.peak_rss_mb for r in results if r.engine == name] + [rss]) for name, rss in loaded.items()}
    lines = ["| engine | RSS after load MB | peak RSS MB | peak ÷ ct2-int8's |", "|---|---:|---:|---:|"]
    for name in sorted(peaks, key=peaks.get):
        ratio = f"{peaks[name] / peaks['ct2-int8']:.2f}" if "ct2-int8" in peaks else "-"
        lines.append(f"| {name} | {loaded[name]:,.0f} | {peaks[name]:,.0f} | {ratio} |")
    return "\n".join(lines)


def real_text(engines: list[Engine], corpus: Path, rounds: int, alone: int | None = None) -> str:
    """The default model's test set, greedy, each engine's own stopping: in batches of 32 (speed and BLEU/chrF),
    then its first `alone` sentences (default all; 0: none) one at a time (`alone_latencies`)."""
    import sacrebleu

    from service.model.folder import load_model_folder
    from service.model.tokenizer import Tokenizer

    folder = load_model_folder(ROOT / "models" / "en-fr", verify_checksums=False)
    tokenizer, eos = Tokenizer.from_folder(folder), folder.manifest.special_ids.eos
    sources = (corpus / "test.en").read_text(encoding="utf-8").splitlines()
    references = (corpus / "test.fr").read_text(encoding="utf-8").splitlines()
    ids = [tokenizer.encode(s, "fr") for s in sources]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # length-sorted batches, as a server would
    setting = Setting(beam=1, batch=32, sentences=len(ids))
    rows: dict[str, tuple[float, float, float, float]] = {}
    for round_ in range(rounds):
        for engine in rotated(engines, round_):
            result, outputs = engine.run([ids[i] for i in order], setting, None)
            tokens = target_tokens(outputs, eos)
            texts = [""] * len(ids)
            for i, output in zip(order, outputs, strict=True):
                texts[i] = tokenizer.decode(output)
            speed = tokens / result.seconds
            if engine.name not in rows or speed > rows[engine.name][2]:
                bleu = sacrebleu.corpus_bleu(texts, [references]).score
                rows[engine.name] = (bleu, sacrebleu.corpus_chrf(texts, [references]).score, speed, result.cores)
    text = "Real text: the default model's test set, greedy, batch 32\n" + real_text_table(rows)
    if alone == 0:
        return text
    latencies = alone_latencies(engines, ids[:alone], eos)
    if not latencies:
        return f"{text}\n\nNo engine of one stream in this run: no one-at-a-time table (a batch of one does not split)"
    which = "the whole test set" if alone is None else f"the test set's first {min(alone, len(ids)):,} sentences"
    heading = f"Real text, one sentence at a time: {which}, greedy, batch 1"
    return f"{text}\n\n{heading}\n{latency_table(latencies)}"


ALONE_BLOCK = 100  # sentences one engine translates alone before the next takes its turn
ALONE_WARM_UP = 16  # sentences each engine translates alone, untimed, first


def alone_latencies(
    engines: list[Engine], sources: list[list[int]], eos: int, block: int = ALONE_BLOCK
) -> dict[str, tuple[list[float], int]]:
    """Every source translated alone by every engine of one stream (the others split batches, and a batch of one
    does not split), in the sources' order, the engines taking turns a block at a time (the order rotating each
    block) after a warm-up: engine -> (each sentence's seconds, target tokens without eos)."""
    single = [engine for engine in engines if engine.streams == 1]
    for engine in single:
        engine.alone(sources[:ALONE_WARM_UP])
    seconds: dict[str, list[float]] = {engine.name: [] for engine in single}
    tokens = dict.fromkeys(seconds, 0)
    for turn, start in enumerate(range(0, len(sources), block)):
        for engine in rotated(single, turn):
            taken, outputs = engine.alone(sources[start : start + block])
            seconds[engine.name] += taken
            tokens[engine.name] += target_tokens(outputs, eos)
    return {name: (seconds[name], tokens[name]) for name in seconds}


def rotated(engines: list[Engine], turn: int) -> list[Engine]:
    """The engines in the order of this turn: the first one moves to the end at each turn, so that none always
    runs first (after a rest) or last."""
    shift = turn % len(engines) if engines else 0
    return engines[shift:] + engines[:shift]


def target_tokens(outputs: list[list[int]], eos: int) -> int:
    """The target tokens of these outputs, eos left out (each engine's own stopping: some give it, some not)."""
    return sum(len([t for t in output if t != eos]) for output in outputs)


def latency_table(rows: dict[str, tuple[list[float], int]], reference: str = "ours-int8") -> str:
    """`alone_latencies`' rows, fastest first: a sentence's latency (ms) at p50, p95 and p99, p99 ÷ p50 (how far
    the test set's lengths spread the latencies of one engine with nothing else running), the mean, target tok/s,
    and how many times faster `reference` (in the same layout) is on average."""
    lines = [
        "| engine | p50 ms | p95 ms | p99 ms | p99 ÷ p50 | mean ms | target tok/s "
        f"| {reference} (same layout) ÷ this |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    means = {name: float(np.mean(seconds)) for name, (seconds, _) in rows.items()}
    for name, (seconds, tokens) in sorted(rows.items(), key=lambda kv: means[kv[0]]):
        p50, p95, p99 = (1000 * float(np.percentile(seconds, q)) for q in (50, 95, 99))
        ours = means.get(same_layout(name, reference))
        ratio = f"{means[name] / ours:.2f}" if ours else "-"
        lines.append(
            f"| {name} | {p50:.2f} | {p95:.2f} | {p99:.2f} | {p99 / p50:.2f} | {1000 * means[name]:.2f} "
            f"| {tokens / sum(seconds):,.0f} | {ratio} |"
        )
    return "\n".join(lines)


def real_text_table(rows: dict[str, tuple[float, float, float, float]], reference: str = "ours-int8") -> str:
    """The real-text run's rows (engine: BLEU, chrF, target tok/s, cores kept busy), fastest first, each against
    `reference` in its own layout; tok/s per core says what a layout's second core brought (two streams of one
    engine that take more CPU than its one stream for the same pass lose to the memory both cores share)."""
    head = f"| engine | BLEU | chrF | target tok/s | cores | tok/s a core | {reference} (same layout) ÷ this |"
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|"]
    for name, (bleu, chrf, speed, cores) in sorted(rows.items(), key=lambda kv: -kv[1][2]):
        ours = rows.get(same_layout(name, reference))
        ratio = f"{ours[2] / speed:.2f}" if ours else "-"
        per_core = f"{speed / cores:,.0f}" if cores else "-"
        lines.append(f"| {name} | {bleu:.1f} | {chrf:.1f} | {speed:,.0f} | {cores:.2f} | {per_core} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.engine", description=description_of(__doc__))
    parser.add_argument("model", choices=["paper", "default"])
    parser.add_argument("--engines", help=f"comma-separated; default on cpu: {CPU_ENGINES}; on cuda: {GPU_ENGINES}")
    parser.add_argument("--sentences", type=positive_int, default=256, help="sources at batch 32")
    parser.add_argument("--sentences-batch-1", type=positive_int, default=32, help="sources at batch 1 (slow engines)")
    parser.add_argument("--rounds", type=positive_int, default=2)
    parser.add_argument(
        "--checkpoint", type=Path, help="default: runs/en-fr/final.pt, else rebuilt from models/en-fr (from-folder)"
    )
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--corpus", type=Path, default=ROOT / "data" / "corpus", help="default: real-text run")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: every engine on the GPU")
    parser.add_argument("--skip-forced", action="store_true", help="default: only the real-text run")
    parser.add_argument("--skip-real-text", action="store_true", help="default: only the forced workload")
    parser.add_argument("--beams", type=positive_ints, default=[1, 4], help="the forced workload's beam sizes")
    parser.add_argument("--batches", type=positive_ints, default=[32, 1], help="the forced workload's batch sizes")
    parser.add_argument(
        "--alone-sentences",
        type=non_negative_int,
        help="the real-text run's second part, each sentence alone on every engine of one stream: its first N"
        " sentences (default: the whole test set; 0: none)",
    )
    args = parser.parse_args(argv)
    beams, batches = args.beams, args.batches
    machine = describe(args.device)
    print(headline(machine), flush=True)
    which = (args.engines or (GPU_ENGINES if args.device == "cuda" else CPU_ENGINES)).split(",")
    real_text_run = args.model == "default" and not args.skip_real_text and (args.corpus / "test.en").is_file()
    if args.model == "default" and not args.skip_real_text and not real_text_run:
        print(f"{args.corpus / 'test.en'} not found: no real-text run (python -m model_export.corpus build makes it)")
    base = prepare_paper(args.seed, which) if args.model == "paper" else prepare_default(args.checkpoint)
    sources = random_sources(base / "hf", max(args.sentences, args.sentences_batch_1), 24, args.seed)
    settings = [
        Setting(beam, batch, args.sentences if batch > 1 else args.sentences_batch_1)
        for beam in beams
        for batch in batches
    ]
    engines = start_engines(base, which, args.device)
    try:
        results = [] if args.skip_forced else benchmark(engines, sources, settings, args.rounds)
        real = real_text(engines, args.corpus, args.rounds, args.alone_sentences) if real_text_run else ""
    finally:
        for engine in engines:
            engine.close()
    loaded = {e.name: e.loaded_rss_mb for e in engines}
    print(table(results, REFERENCE[args.device]))
    if args.device == "cpu":
        print("\nEach in its fastest layout\n" + best_layouts(results, "ours-int8", "ct2-int8"))
    print("\nMemory\n" + memory_table(results, loaded))
    if real:
        print("\n" + real)
    out = WORK / f"engine-{args.model}{'-cuda' if args.device == 'cuda' else ''}.json"
    result = {"machine": machine, "results": [asdict(r) for r in results], "loaded_rss_mb": loaded}
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
