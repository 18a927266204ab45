"""The ONNX Runtime sessions a model folder opens under the settings: its variant, its step graphs, its threads and
decoding streams, and what an operator is warned of about them."""

from __future__ import annotations

import importlib.util

from service.engine.cpu import this_cpu_has_int8_dot_products
from service.engine.runtime import DENSE_STEP_ROWS, OnnxRuntime, SessionSettings
from service.errors import ModelFolderError
from service.model.folder import Architecture, ModelFolder
from service.settings import Settings, available_cores

# Measured on 2 cores (docs/performance.md): the default model (4.8 M multiply-adds per decoder token) served at 32
# clients gives 90 % of its engine's batch-32 throughput with one intra-op thread and 77 % with two in one run (94 and
# 81 % in another): its steps of ~4 ms gain 5-14 % from a second thread alone and lose more to the server and the
# encoder passes on the same cores. The paper-size model (52.5 M) steps 1.43x faster with two, and served gives 93 %
# with two, 76 % with one. The threshold lies between the two, at their geometric mean.
SHARED_STEP_MACS = 16_000_000
# The most bytes the ragged step graph's own copy of the decoder's weights may take for the server to open it unasked
# (its session cannot share the step graph's prepacked weights): the default model's int8 graph is 5 MB, the paper
# size's 54 MB int8 and 333 MB fp32. Served at 32 clients of real text on the AMX Xeon, the paper size's int8 ran
# 1.07x faster with it (docs/performance.md, the change table), for ~53 MB more resident memory.
RAGGED_COPY_BYTES = 64 * 2**20


def decoder_macs_per_token(cfg: Architecture) -> int:
    """Multiply-adds of one decoder step per row: the projections, the FFN and the vocabulary projection."""
    d = cfg.d_model
    return cfg.n_decoder_layers * (6 * d * d + 2 * d * cfg.d_ff) + d * cfg.tgt_vocab_size


def ragged_graph_bytes(folder: ModelFolder, variant: str) -> int | None:
    """The size of the variant's ragged step graph file (format 5), None without one: what its session costs."""
    ragged = folder.variant(variant).decoder_step_ragged
    return None if ragged is None else folder.manifest.files[ragged.file].bytes


def ragged_step(graph_bytes: int | None, settings: Settings) -> bool:
    """Whether to open the ragged step graph's session (format 5), whose file is `graph_bytes` (None: the folder has
    none): as set, or when its own copy of the weights is at most RAGGED_COPY_BYTES. Its cross-attention reads each
    sentence's own source, where the step graph's reads the widest live one: on ragged real text the default model
    served at 32 clients ran 1.03-1.08x faster with it, the paper size's int8 1.07x."""
    if graph_bytes is None:
        return False
    return settings.ragged_step if settings.ragged_step is not None else graph_bytes <= RAGGED_COPY_BYTES


def single_row_rows(cfg: Architecture) -> int:
    """The most rows a step may have to run the one-row step graph (format 6). Its products (MatMulNBits) read the
    weights faster than DynamicQuantizeMatMul for one row; on a decoder of at least SHARED_STEP_MACS, whose weights
    stream from memory every step, for a few (measured on 2 cores with VNNI, the step graph's time over the one-row
    graph's: the paper-size model 1.40x at 2 rows, 1.23x at 3, 1.09x at 4, 0.95x at 6, 0.87x at 8; the default model
    1.28x at 1 row, 0.96x at 2, 0.83x at 3). On a CPU without VNNI (engine/cpu.py) MatMulNBits' int8 kernel is the
    slower from 2 rows (4 rows of the paper size's products 1.9-2.1x DynamicQuantizeMatMul's time, its beam 4 at
    batch 1 on one thread 0.7x the speed; at one row level with it, both models): one row only."""
    large = decoder_macs_per_token(cfg) >= SHARED_STEP_MACS
    return 4 if large and this_cpu_has_int8_dot_products() else 1


def weight_bits_warnings(folder: ModelFolder, variant: str) -> list[str]:
    """What an operator should change for the model to run as measured: an int8 variant whose products' weights
    take 8 bits (quantized before format 11) on a CPU without an int8 dot-product instruction (service/engine/cpu.py).
    There ONNX Runtime adds each two products in 16 bits, which such weights can overflow (on an AVX2-only Zen 3, 8
    bits against 7: the default model's encoder output 4.4 against 2.7 % RMS from fp32's, a tiny model's step
    log-probs 4.6 against under 1 off: docs/performance.md). Its products run on the CPU whatever the providers."""
    spec = folder.variant(variant)
    if spec.precision != "int8" or (spec.weight_bits or 8) <= 7 or this_cpu_has_int8_dot_products():
        return []
    return [
        f"variant {variant}'s int8 weights take 8 bits, which this CPU (without VNNI or AMX) multiplies in 16-bit "
        "sums that they can overflow: its translations can drift from fp32's; quantize the folder again for 7-bit "
        f"weights (python -m model_export quantize --model-dir {folder.path}) or run MT_VARIANT=fp32"
    ]


def check_batch_invariant(folder: ModelFolder, variant: str, settings: Settings) -> None:
    """ModelFolderError where MT_BATCH_INVARIANT holds and the variant's graphs were written before batch-invariant
    ones (format 12), with the commands that rebuild the folder and the setting that serves it as it is."""
    if not settings.batch_invariant or folder.variant(variant).batch_invariant:
        return
    path = folder.path
    raise ModelFolderError(
        f"{path}: variant {variant} was written before batch-invariant graphs (model folder format 12): its "
        "translations would change with what shares their batch. Rebuild the folder: python -m model_export "
        f"from-folder --model-dir {path} --out rebuilt.pt && python -m model_export export --checkpoint rebuilt.pt "
        f"--out {path}-rebuilt && python -m model_export quantize --model-dir {path}-rebuilt (for int8); or serve "
        "it as it is with MT_BATCH_INVARIANT=false"
    )


def batch_variance_warnings(settings: Settings) -> list[str]:
    """The warning of a server that runs its faster graphs (MT_BATCH_INVARIANT=false)."""
    if settings.batch_invariant:
        return []
    return [
        "MT_BATCH_INVARIANT=false: the ragged, one-row and dense step graphs run for some batches, so a sentence's "
        "translation can change with what shares its batch"
    ]


def step_graph_options(folder: ModelFolder, variant: str, settings: Settings) -> dict[str, bool | int]:
    """SessionSettings' step-graph fields as the server sets them (open_runtime; bench.engine measures the same):
    with MT_BATCH_INVARIANT (the default) none but the step graph, else the ragged graph (ragged_step), the one-row
    graph (MT_SINGLE_ROW_STEP) for steps of up to single_row_rows, and under static batching the dense step graph
    (format 10) in place of the ragged one, for steps of 8 rows or more (DENSE_STEP_ROWS): a static batch's rows all
    have the same length, which its self-attention reads faster (model_export/quantize.py, to_dense_self_attention);
    a continuous batch's rows each have their own, which the step graph reads alone, over a cache that reserves its
    time axis. With MT_SHORTLIST the shortlist step graph runs every step, and none of these is opened."""
    # each of these graphs gives a row other numbers than the step graph
    fast = not settings.batch_invariant and not settings.shortlist
    return {
        "ragged_step": fast and ragged_step(ragged_graph_bytes(folder, variant), settings),
        "single_row_step": fast and settings.single_row_step,
        "single_row_rows": single_row_rows(folder.manifest.config),
        "dense_step": fast and settings.batching == "static",
        "shortlist": settings.shortlist,
    }


def step_graphs(folder: ModelFolder, settings: Settings) -> list[str]:
    """The step graphs the model's engine opens, for its start-up line: the step graph, the ragged one (format 5,
    ragged_step), the one-row one (format 6, an int8 variant on CPU, MT_SINGLE_ROW_STEP); for an int8 folder from
    before format 6, the command that adds the one-row graph."""
    name = chosen_variant(folder, settings)
    variant = folder.variant(name)
    options = step_graph_options(folder, name, settings)  # what open_runtime gives the runtime
    graphs = ["step"]
    if variant.decoder_step_dense is not None and options["dense_step"] and not cuda_present(settings):
        graphs.append(f"dense (static batches of {DENSE_STEP_ROWS} rows or more)")  # (CPU-only sessions: OnnxRuntime)
    elif options["ragged_step"]:
        graphs.append("ragged")
    wanted = bool(options["single_row_step"]) and not cuda_present(settings)  # CUDA asked for but absent: CPU's
    if variant.decoder_step_single is not None and wanted:
        rows = single_row_rows(folder.manifest.config)
        graphs.append("one-row" if rows == 1 else f"one-row (steps of up to {rows} rows)")
    elif wanted and variant.precision == "int8":  # a folder from before format 6
        graphs.append(f"no one-row graph in the folder (`python -m model_export quantize --model-dir {folder.path}`)")
    return graphs


def intra_op_threads(cfg: Architecture, settings: Settings) -> int:
    """MT_INTRA_OP_THREADS, or for 0: a model whose steps are worth sharing gets every core, split between its
    decoding streams; a smaller one, one thread."""
    if settings.intra_op_threads:
        return settings.intra_op_threads
    if decoder_macs_per_token(cfg) < SHARED_STEP_MACS:
        return 1
    return max(1, available_cores() // decoder_streams(cfg, settings))


def decoder_streams(cfg: Architecture, settings: Settings) -> int:
    """MT_DECODER_STREAMS, or for 0: two for a model whose steps are worth sharing (measured on 2 cores, paper-size
    model served at 32 clients: 1.23x the throughput of one stream on both cores), else one (the default model:
    0.90x at 32 clients; the encoder thread and the HTTP side need the second core). One on a GPU (not measured);
    CUDA asked for on an onnxruntime without it runs on the CPU, and is laid out as the CPU is."""
    if settings.decoder_streams:
        return settings.decoder_streams
    large = decoder_macs_per_token(cfg) >= SHARED_STEP_MACS
    return 2 if large and available_cores() >= 2 and not cuda_present(settings) else 1


def chosen_variant(folder: ModelFolder, settings: Settings) -> str:
    """MT_VARIANT, or the manifest's default; but where CUDA is asked for and ONNX Runtime has it, an int8 default
    (whose products, DynamicQuantizeMatMul, have no CUDA kernel and run on the CPU) gives way to fp16 where it can
    run on CUDA (format 7, CuPy: runtime.gpu_array_module; 2.2x fp32's throughput on an H200, docs/performance.md
    "GPU"), else to fp32."""
    manifest = folder.manifest
    if settings.variant:
        return settings.variant
    default = manifest.default_variant
    if not cuda_present(settings) or manifest.variants[default].precision != "int8":
        return default
    fp16 = manifest.variants.get("fp16")
    if fp16 is not None and fp16.decoder_step.named("seqlens_k") and has_cupy():  # format 7, as the runtime asks
        return "fp16"
    return "fp32" if "fp32" in manifest.variants else default


def cuda_present(settings: Settings) -> bool:
    """CUDA is asked for (MT_PROVIDERS) and this onnxruntime build has it."""
    if "cuda" not in settings.providers:
        return False
    import onnxruntime as ort  # only here: a CPU server's own process never loads it (service/engine/runtime.py)

    return "CUDAExecutionProvider" in ort.get_available_providers()


def has_cupy() -> bool:
    return importlib.util.find_spec("cupy") is not None


def open_runtime(folder: ModelFolder, settings: Settings) -> OnnxRuntime:
    session = SessionSettings(
        settings.ort_providers(),
        intra_op_threads(folder.manifest.config, settings),
        settings.inter_op_threads,
        encoder_threads=settings.encoder_session_threads(),
        **step_graph_options(folder, variant := chosen_variant(folder, settings), settings),
    )
    return OnnxRuntime(folder, variant, session)
