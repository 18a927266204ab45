"""Runs a model folder's two graphs with ONNX Runtime: `encode` once per sentence, `step` once per token.

Input and output names come from the manifest's roles; buffers come from the DecoderCache. It knows
nothing of requests, searches or batching policy: the scheduler decides which rows run.

ONNX Runtime is imported where sessions are made, not with this module: a server whose models run in engine
processes (service/scheduling/engine_process.py) never loads it in its own process (18 MB).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import logging
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import numpy as np

from service.engine.decoding import rows_per_sentence
from service.engine.kv_cache import DecoderCache
from service.engine.shortlist import Shortlist, load_shortlist
from service.errors import ModelFolderError
from service.model.folder import GRAPHS, GraphSpec, ModelFolder, VariantSpec, check_graph_io

if TYPE_CHECKING:
    import onnxruntime as ort

log = logging.getLogger(__name__)


# The dense step graph's fewest rows: below them its ~30 more small nodes a step cost more than its self-attention
# saves (the default model, int8, one thread, 8-32 slots, dense ÷ step graph: 1.05x the time a step at 1 row, 1.11x
# at 2, 1.13x at 4, 0.96x at 8, 0.93x at 16, 0.84x at 32)
DENSE_STEP_ROWS = 8


@dataclass(frozen=True)
class SessionSettings:
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    intra_op_threads: int = 0  # 0: one per core the process may use
    inter_op_threads: int = 1
    allow_spinning: bool = False  # busy-waiting threads fight every other thread on a small CPU
    encoder_threads: int = 0  # intra-op threads of the encoder's session; 0: as intra_op_threads
    ragged_step: bool = True  # open the folder's ragged step graph (format 5), if it has one: see OnnxRuntime.step
    # (the server decides by the decoder's size: service/translation/translator.py, ragged_step)
    single_row_step: bool = True  # open the folder's step graph for one row (format 6), if it has one (CPU only)
    single_row_rows: int = 1  # ... and run it for steps of at most this many rows (the server decides by the
    # decoder's size: service/translation/translator.py, single_row_rows)
    dense_step: bool = False  # open the folder's step graph for static batches (format 10), if it has one, in place
    # of the ragged one, for steps of at least dense_step_rows rows; this runtime's caches then grow with their rows
    # (dense). For runtimes whose every batch runs to completion (translation/translator.py: static batching; the
    # offline evaluation; bench.engine)
    dense_step_rows: int = DENSE_STEP_ROWS
    shared_arena: bool = True  # CPU sessions draw on one process-wide arena (share_cpu_arena), not one each
    profile_prefix: str | None = None  # ONNX Runtime's profiler on, its JSON files named so (bench/step.py)
    shortlist: bool = False  # every step runs the folder's shortlist step graph over each sentence's candidates


CPU_DISABLED_FUSIONS = ["SkipLayerNormFusion"]


class Memory(NamedTuple):
    """The encoder's output for b sentences: cross-attention keys and values of every decoder layer."""

    keys: np.ndarray  # (L, b, H, S, Dh)
    values: np.ndarray  # (L, b, H, S, Dh)
    candidates: np.ndarray | None = None  # (b, C) each sentence's candidate ids, with a shortlist (else None)


DEFAULT_CANDIDATES = 17  # clean candidates per row when a caller of `step` does not say (beam 8's)
# The ragged step graph runs when at most this share of the source positions the step graph would attend are real
# (the rest padding). Its cross-attention reads only the real ones but has a few more nodes: at 32 clients of real
# text (a share of 0.31) the default model's server ran 1.035-1.075x faster with it; on length-sorted batches (~0.9)
# it was 1-5 % slower. Standalone, at 28 sentences, its attention costs 126 against 306 us at 0.32, 77 against 84
# at ~0.6.
RAGGED_FILL = 0.5


class StepOutput(NamedTuple):
    top_log_probs: np.ndarray  # (B, K) each row's K best next-token log-probs, best first (pad/start excluded);
    # the logits, in the same order, from a step asked not to normalise (log_softmax=False) whose graph can skip it
    top_ids: np.ndarray  # (B, K) their token ids (K: the candidates asked for, or fewer if the graph has no more)
    log_probs: np.ndarray | None = None  # (B, V) the whole distribution, only when asked (verification)


@dataclass(frozen=True)
class Binding:
    """A cache's IO binding for the step graph (see OnnxRuntime._bind), kept in the cache until its arrays change."""

    full: bool  # log_probs bound too
    width: int  # candidates per row the graph returns, the banned ids among them
    graph: str  # the step graph bound: decoder_step, decoder_step_ragged, _single or _dense
    binding: StepBinding
    input_ids: np.ndarray  # (B,) bound; each step copies its tokens in
    outputs: tuple[np.ndarray, ...]  # top_log_probs, top_ids (B, width)[, log_probs (B, V)], bound
    per_step: tuple[tuple[str, np.ndarray], ...]  # (name, array): the inputs changed in place each step
    attention_lengths: tuple[np.ndarray, np.ndarray] | None  # seqlens_k (B,), total_sequence_length () int32, bound
    log_softmax: np.ndarray | None  # () bool, bound (format 8): set by each step

    @property
    def ragged(self) -> bool:
        """The ragged step graph's binding (cross-attention caches bound as its outputs too)."""
        return self.graph == "decoder_step_ragged"


class Runtime(Protocol):
    """What the decoding loop needs from a model; tests substitute a fake."""

    n_layers: int
    n_heads: int
    head_dim: int

    def encode(self, src_ids: np.ndarray, src_mask: np.ndarray) -> Memory: ...

    def new_cache(self) -> DecoderCache:
        """An empty cache in the dtype and the memory (host or GPU) that `step` binds."""
        ...

    def step(
        self,
        input_ids: np.ndarray,
        cache: DecoderCache,
        full: bool = False,
        candidates: int = DEFAULT_CANDIDATES,
        log_softmax: bool = True,
    ) -> StepOutput:
        """One token per row; the row's key and value of this step end up in `cache`, which counts the step.
        `candidates`: the most any row's search takes (greedy 2, beam k 2k + 1); the graph may return more.
        `log_softmax` False: no row needs log-probabilities, only the order of its candidates (greedy rows whose
        scores nobody reads); the candidates' values may then be logits."""
        ...


@functools.cache
def _warn_missing(provider: str) -> None:
    """Once a process, not once a session (a model opens four)."""
    log.warning("execution provider %s is not available in this onnxruntime build; skipping it", provider)


def usable_providers(requested: tuple[str, ...]) -> list[str]:
    """The requested providers this onnxruntime build has, CPU last as the fallback."""
    import onnxruntime as ort  # here, not at the top: see the module docstring

    available = set(ort.get_available_providers())
    chosen = [p for p in requested if p in available]
    for missing in (p for p in requested if p not in available):
        _warn_missing(missing)
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    return chosen


def shared_initializers(folder: ModelFolder, variant: VariantSpec) -> dict[str, dict[str, ort.OrtValue]]:
    """Per graph, the constants its variant shares with the other graph, each read once into one buffer (the
    embedding table of a model with shared embeddings: 30 MB int8 at the paper's size)."""
    shared: dict[str, dict[str, ort.OrtValue]] = {graph: {} for graph in GRAPHS}
    for spec in variant.shared_initializers:
        path = folder.file(spec.file)
        try:
            table = np.fromfile(path, dtype=np.dtype(spec.dtype).newbyteorder("<")).reshape(spec.shape)
        except ValueError:
            raise ModelFolderError(f"{path}: does not hold a {spec.dtype} tensor of shape {spec.shape}") from None
        value = ortvalue(np.ascontiguousarray(table, dtype=spec.dtype))
        for graph, name in spec.names.items():
            shared[graph][name] = value
    return shared


@dataclass(frozen=True)
class Candidates:
    """What a step graph's top-K gives each row. Format 4 returns as many candidates as its `top_k` input asks
    for, and the runtime asks for what the step's searches take: ONNX Runtime's TopK costs more the more it keeps
    (28 rows of 8,000: 134 us for 4, 238 us for 19). Format 3 always returns its fixed width (19)."""

    banned: np.ndarray  # (b,) ids the top-K may hold but no search may take: pad and the decoder start
    is_banned: np.ndarray  # (V,) bool, True at the banned ids: one lookup per step finds them among the top-K
    most: int  # candidates per row left, at most, once the banned ones are dropped
    chosen: bool  # the graph has a `top_k` input (format 4)

    def width(self, candidates: int) -> int:
        """The graph's top-K width for `candidates` clean candidates per row (the banned ones may be among them)."""
        return min(candidates, self.most) + len(self.banned) if self.chosen else self.most + len(self.banned)


def step_candidates(folder: ModelFolder, variant: VariantSpec) -> Candidates:
    ids = folder.manifest.special_ids
    banned = np.array(sorted({ids.pad, ids.decoder_start}), np.int64)
    chosen = any(s.role == "top_k" for s in variant.decoder_step.inputs)
    width = next(s for s in variant.decoder_step.outputs if s.role == "top_ids").shape[1]  # "top_k", or fixed
    vocabulary = folder.manifest.config.tgt_vocab_size
    is_banned = np.zeros(vocabulary, np.bool_)  # (V,)
    is_banned[banned] = True
    most = vocabulary if chosen else int(width)
    return Candidates(banned, is_banned, most - len(banned), chosen)


def gpu_array_module(providers: list[str], cache_dtype: str, lengths_given: bool, where: Path) -> ModuleType | None:
    """CuPy, where the cache must live in GPU memory: the step graph runs on CUDA and its self-attention
    (GroupQueryAttention) has a CUDA kernel for the cache's dtype (float16; float32 runs on the CPU provider, beside
    a host cache). None: a host (numpy) cache. A float16 step on CUDA is refused, with what to do, when its graph
    computes GroupQueryAttention's lengths itself (before format 7: on CUDA it wrote every row at slot 0, as for a
    prompt's first step, docs/performance.md "GPU"), or when CuPy is missing (a host cache bound to a CUDA node is
    copied to the GPU when it is bound, not at each step)."""
    if providers[0] != "CUDAExecutionProvider" or cache_dtype != "float16":
        return None
    if not lengths_given:
        raise ModelFolderError(
            f"{where}: this float16 step graph (format 6 or older) translates wrong on CUDA: export the model folder "
            "again with this version (format 7 or later) and add its fp16 variant, or run variant fp32 with "
            "MT_PROVIDERS=cuda"
        )
    try:
        import cupy
    except ImportError:
        raise ModelFolderError(
            f"{where}: a float16 variant on CUDA keeps the decoder cache in GPU memory, through CuPy: install "
            "cupy-cuda13x (or cupy-cuda12x, as your CUDA), or run variant fp32 with MT_PROVIDERS=cuda"
        ) from None
    return cupy


def ortvalue(array: np.ndarray) -> ort.OrtValue:
    import onnxruntime as ort  # here, not at the top: see the module docstring

    return ort.OrtValue.ortvalue_from_numpy(array)


class StepBinding:
    """A graph's IO binding (a step graph's; the encoder's, for its outputs: `encode`), made through the object that
    ONNX Runtime's own `IOBinding` wraps (its pybind11 `SessionIOBinding`): each bind is one call into ONNX Runtime.
    The wrapper adds checks for WebGPU graph capture and session-scoped values, and looks its device up anew at every
    OrtValue, to each of the ~30 binds of a step graph (and to each run): a binding of the default model's 28 rows
    took 95-110 us through it, 57-60 directly. A continuous batch binds anew at nearly every step. Holds every array
    it binds (the C++ values do not): they live as long as the binding."""

    def __init__(self, session: ort.InferenceSession) -> None:
        from onnxruntime.capi import _pybind_state  # here, not at the top: see the module docstring

        self._c = _pybind_state
        self._session = session._sess  # the pybind11 session the public InferenceSession wraps
        self._binding = _pybind_state.SessionIOBinding(self._session)
        self._held: list[object] = []

    def host_input(self, name: str, array: np.ndarray) -> None:
        """A host array the graph only reads, by reference (IOBinding.bind_cpu_input); on CUDA, ONNX Runtime copies
        it to the GPU here, not at each run."""
        self._binding.bind_input(name, array)
        self._held.append(array)

    def host_output(self, name: str, array: np.ndarray) -> None:
        """A host array the graph writes its output into."""
        self._binding.bind_ortvalue_output(name, self._value(array))

    def host_in_place(self, name: str, present: str, array: np.ndarray) -> None:
        """A host array the graph reads as input `name` and writes as output `present`: one value bound as both."""
        value = self._value(array)
        self._binding.bind_ortvalue_input(name, value)
        self._binding.bind_ortvalue_output(present, value)

    def device_input(self, name: str, device: int, array: Any, present: str | None = None) -> None:
        """A CuPy array in GPU memory, by device pointer; with `present`, also written as that output in place."""
        where = gpu_device(device)
        args = (where, array.dtype, list(array.shape), array.data.ptr)
        self._binding.bind_input(name, *args)
        if present is not None:
            self._binding.bind_output(present, *args)
        self._held.append(array)

    def run(self) -> None:
        self._session.run_with_iobinding(self._binding, None)

    def _value(self, array: np.ndarray) -> object:
        value = self._c.OrtValue.ortvalue_from_numpy(array, host_device())  # over the array's memory, no copy
        self._held.append((value, array))
        return value


@functools.cache
def host_device() -> object:
    """ONNX Runtime's (pybind11) CPU device, made once: the public OrtDevice.make resolves vendor aliases each call."""
    import onnxruntime as ort  # here, not at the top: see the module docstring

    return ort.OrtDevice.make("cpu", 0)._get_c_device()


@functools.cache
def gpu_device(device: int) -> object:
    """As host_device, for CUDA device `device`."""
    import onnxruntime as ort  # here, not at the top: see the module docstring

    return ort.OrtDevice.make("cuda", device)._get_c_device()


_arena_lock = threading.Lock()
_arena_shared = False


def share_cpu_arena() -> None:
    """Registers one CPU arena allocator in ONNX Runtime's environment, once per process; sessions opened with
    `session.use_env_allocators` draw their activations from it instead of an arena each. An arena keeps every
    chunk it has grown to for the process's life, so with one per session the engine holds the largest step of
    each graph it has run: with the ragged step graph (format 5) a second arena of 45-55 MB on the default
    model after a long load (bench.soak). One arena serves the encoder's passes and both step graphs' steps from
    the same chunks. Its price is one lock for the encoder thread and the decoding thread: served, 1-2.5 % of the
    default model's throughput; the step graphs alone sharing it (the encoder on its own) kept that but not the
    soak flat (docs/performance.md, the change table)."""
    global _arena_shared  # noqa: PLW0603 - ONNX Runtime's environment is process-wide too
    import onnxruntime as ort  # here, not at the top: see the module docstring

    with _arena_lock:
        if not _arena_shared:
            cpu = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
            ort.create_and_register_allocator(cpu, None)  # ONNX Runtime's default arena settings
            _arena_shared = True


def open_session(
    folder: ModelFolder,
    graph: GraphSpec,
    settings: SessionSettings,
    initializers: dict[str, ort.OrtValue] | None = None,
) -> ort.InferenceSession:
    import onnxruntime as ort  # here, not at the top: see the module docstring

    ort.disable_telemetry_events()  # a translation server sends nothing anywhere
    options = ort.SessionOptions()
    for name, value in (initializers or {}).items():
        options.add_initializer(name, value)  # used in place of the graph's own copy; the caller keeps it alive
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = settings.inter_op_threads
    if settings.inter_op_threads > 1:  # the only mode that runs independent nodes side by side, hence uses them
        options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # Memory patterns pay off for fixed shapes; the step graph sees new ones every step (rows, cache capacity),
    # and without them the paper-size int8 model peaks 30-80 MB lower at batch 32 for the same speed.
    options.enable_mem_pattern = False
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if settings.allow_spinning else "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "1" if settings.allow_spinning else "0")
    if settings.profile_prefix:
        options.enable_profiling, options.profile_file_prefix = True, f"{settings.profile_prefix}-{graph.file}"
    path, providers = folder.file(graph.file), usable_providers(settings.providers)
    if settings.shared_arena and providers == ["CPUExecutionProvider"]:
        share_cpu_arena()
        options.add_session_config_entry("session.use_env_allocators", "1")
    # On CPU, ONNX Runtime's fused SkipLayerNormalization is slower than the Add + LayerNormalization it replaces
    # once there are many rows: the encoder at 32 x 16 tokens runs 18 % (paper size) to 22 % (default model)
    # faster without it; decoder steps are unchanged. Other providers keep their fused kernel.
    disabled = CPU_DISABLED_FUSIONS if providers == ["CPUExecutionProvider"] else []
    try:
        session = ort.InferenceSession(str(path), options, providers=providers, disabled_optimizers=disabled)
    except Exception as error:  # noqa: BLE001 - ORT raises several unrelated types for a bad file
        raise ModelFolderError(f"{path}: ONNX Runtime cannot load it: {str(error).splitlines()[0]}") from None
    check_graph_io(graph, session.get_inputs(), session.get_outputs(), path)
    return session


def release_freed_memory() -> None:
    """Hands the heap's free pages back to the system (glibc's malloc_trim). A session frees each weight it has
    prepacked, but glibc keeps those pages: on the paper-size int8 model that is 62 MB of 268 MB resident
    after loading. Elsewhere than glibc this does nothing."""
    name = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None) if name else None
    if trim is not None:
        trim(0)


class OnnxRuntime:
    def __init__(self, folder: ModelFolder, variant: str | None = None, settings: SessionSettings | None = None):
        settings = settings or SessionSettings()
        spec = folder.variant(variant)
        cfg = folder.manifest.config
        self.n_layers, self.n_heads, self.head_dim = cfg.n_decoder_layers, cfg.n_heads, cfg.head_dim
        self.shared = shared_initializers(folder, spec)  # referenced by both sessions for their whole life
        encoder_settings = replace(settings, intra_op_threads=settings.encoder_threads or settings.intra_op_threads)
        self.encoder = open_session(folder, spec.encoder, encoder_settings, self.shared["encoder"])
        release_freed_memory()
        self.decoder = open_session(folder, spec.decoder_step, settings, self.shared["decoder_step"])
        release_freed_memory()
        self.providers = self.decoder.get_providers()  # those it has: CUDA asked for and absent runs on the CPU
        on_cpu = self.providers == ["CPUExecutionProvider"]
        # the dense graph was measured on CPUs only
        dense = spec.decoder_step_dense if settings.dense_step and on_cpu else None  # format 10, and wanted
        self.dense_decoder: ort.InferenceSession | None = None
        if dense is not None:
            self.dense_decoder = open_session(folder, dense, settings, self.shared["decoder_step_dense"])
            release_freed_memory()
        self._dense_rows = settings.dense_step_rows
        # the ragged graph serves continuous batches' ragged sources; a static runtime holds the dense one instead
        ragged = spec.decoder_step_ragged if settings.ragged_step and dense is None else None  # format 5, and wanted
        self.ragged: ort.InferenceSession | None = None
        self._ragged_present: dict[str, list[str]] = {}  # role -> present_cross_{role}_i, in layer order
        if ragged is not None:
            self.ragged = open_session(folder, ragged, settings, self.shared["decoder_step_ragged"])
            release_freed_memory()
            self._ragged_present = {role: ragged.named(f"present_cross_{role}") for role in ("key", "value")}
        # ONNX Runtime copies a host input that a CUDA node reads when it is bound (IOBinding.bind_cpu_input), not
        # when the graph runs: on CUDA, step() binds again those that change in place every step (the others
        # change only with a new binding: DecoderCache._changed)
        self._rebind_host_inputs = not on_cpu
        single = spec.decoder_step_single if settings.single_row_step and on_cpu else None  # format 6, and wanted
        self.single: ort.InferenceSession | None = None
        if single is not None:
            self.single = open_session(folder, single, settings, self.shared["decoder_step_single"])
            release_freed_memory()
        self._single_rows = settings.single_row_rows
        self.shortlist: Shortlist | None = None
        self.shortlist_decoder: ort.InferenceSession | None = None
        if settings.shortlist:
            self.shortlist, self.shortlist_decoder = self._open_shortlist(folder, spec, settings)
        self.steps = {
            "decoder_step": self.decoder,
            "decoder_step_ragged": self.ragged,
            "decoder_step_single": self.single,
            "decoder_step_dense": self.dense_decoder,
            "decoder_step_shortlist": self.shortlist_decoder,
        }
        enc, dec = spec.encoder, spec.decoder_step
        self._enc_in = (enc.one("src_ids"), enc.one("src_mask"))
        self._enc_out = enc.named("cross_key") + enc.named("cross_value")
        self._memory_dtype = next(s.dtype for s in enc.outputs if s.role == "cross_key")
        self._bind_memory = self.encoder.get_providers() == ["CPUExecutionProvider"]  # see encode
        self._dec_in = {role: dec.named(role) for role in ("self_key", "self_value", "cross_key", "cross_value")}
        self._dec_present = {role: dec.named(f"present_{role}") for role in ("key", "value")}
        self._dec_one = {
            role: dec.one(role) for role in ("input_ids", "positions", "src_mask", "sentence_rows", "row_slots")
        }
        if spec.decoder_step_shortlist is not None:
            self._dec_one["candidate_ids"] = spec.decoder_step_shortlist.one("candidate_ids")
        outputs = {s.name: s for s in dec.outputs}
        self._dec_out = {role: outputs[dec.one(role)] for role in ("top_log_probs", "top_ids", "log_probs")}
        self.candidates = step_candidates(folder, spec)  # what the step's top-K gives each row
        self._dec_top_k = dec.one("top_k") if self.candidates.chosen else None
        lengths = ("seqlens_k", "total_sequence_length")  # format 7: given, not computed in the graph
        self._dec_lengths = tuple(dec.one(role) for role in lengths) if dec.named("seqlens_k") else None
        self._dec_log_softmax = dec.one("log_softmax") if dec.named("log_softmax") else None  # format 8, not fp16
        self.cache_dtype = next(s.dtype for s in dec.inputs if s.role == "self_key")
        self.gpu = gpu_array_module(self.providers, self.cache_dtype, self._dec_lengths is not None, folder.path)
        self._reserve = cfg.max_positions if on_cpu else None  # see new_cache (a dense cache reserves nothing)

    def _open_shortlist(
        self, folder: ModelFolder, spec: VariantSpec, settings: SessionSettings
    ) -> tuple[Shortlist, ort.InferenceSession]:
        """The folder's shortlist and the variant's shortlist step graph; ModelFolderError where it has none."""
        if spec.decoder_step_shortlist is None:
            raise ModelFolderError(
                f"{folder.path}: variant {spec.precision!r} has no shortlist step graph (decoder_step_shortlist): "
                "`python -m model_export shortlist` adds one, or turn MT_SHORTLIST off"
            )
        shortlist = load_shortlist(folder)
        session = open_session(folder, spec.decoder_step_shortlist, settings, self.shared["decoder_step_shortlist"])
        release_freed_memory()
        return shortlist, session

    @property
    def dense(self) -> bool:
        """This runtime runs the dense step graph (format 10): its caches are dense (new_cache)."""
        return self.dense_decoder is not None

    def new_cache(self) -> DecoderCache:
        """On the CPU provider the cache reserves its self-attention's time axis, as long as the model's positions,
        as address space (engine/kv_cache.py: no regrowths); a cache beside CUDA nodes grows it as rows need (a host
        cache bound to them is copied when it is bound, and the reservation was measured on the CPU only). Beside
        the dense step graph (format 10), whose self-attention reads every slot of the time axis, the axis grows
        with the rows and is zeroed past what they wrote (`dense`): a static batch's rows all have the same length."""
        xp = self.gpu or np
        return DecoderCache(
            self.n_layers, self.n_heads, self.head_dim, self.cache_dtype, xp, self._rebind_host_inputs, self._reserve,
            dense=self.dense,
        )

    def encode(self, src_ids: np.ndarray, src_mask: np.ndarray) -> Memory:
        """The sources' cross-attention keys and values. On the CPU the encoder writes each layer's straight into
        its place in one (2, L, b, H, S, Dh) array, bound as its outputs: no stacking copy, and a cache that starts
        from this memory takes the layers as its buffers (DecoderCache.add; the default model's test set in batches
        of 32: the copies were 2.5-3 % of the run). Elsewhere its outputs are stacked."""
        inputs = (np.ascontiguousarray(src_ids), np.ascontiguousarray(src_mask))  # (b, S) each
        candidates = None if self.shortlist is None else self.shortlist.candidates(*inputs)  # (b, C)
        if not self._bind_memory:
            outputs = self.encoder.run(self._enc_out, dict(zip(self._enc_in, inputs, strict=True)))
            keys, values = np.stack(outputs[: self.n_layers]), np.stack(outputs[self.n_layers :])  # (L, b, H, S, Dh)
            return Memory(keys, values, candidates)
        b, s = src_ids.shape
        memory = np.empty((2, self.n_layers, b, self.n_heads, s, self.head_dim), self._memory_dtype)
        binding = StepBinding(self.encoder)
        for name, array in zip(self._enc_in, inputs, strict=True):
            binding.host_input(name, array)
        for name, layer in zip(self._enc_out, memory.reshape(2 * self.n_layers, b, self.n_heads, s, -1), strict=True):
            binding.host_output(name, layer)  # (b, H, S, Dh): keys' layers, then values'
        binding.run()
        return Memory(memory[0], memory[1], candidates)  # (L, b, H, S, Dh) each

    def step(
        self,
        input_ids: np.ndarray,
        cache: DecoderCache,
        full: bool = False,
        candidates: int = DEFAULT_CANDIDATES,
        log_softmax: bool = True,
    ) -> StepOutput:
        """One token per row. The graph writes each row's key and value of this step into the cache's own buffers
        (bound as both its self_key_i input and its present_key_i output), then the cache counts the step. The
        (B, V) log-probs leave the graph only if `full`: searches need `candidates` per row, best first.
        When every sentence has one row (greedy rows: rows == sentences) and the folder has a ragged step graph
        (format 5), that graph runs instead when the sources are ragged enough (RAGGED_FILL): the same outputs, its
        cross-attention over each sentence's own source length rather than the widest live one (at 32 clients of
        real text, 16 positions against 52). A step of one row (up to `single_row_rows`) runs the folder's step graph
        for one row (format 6) if it has one: the same outputs, its products over 8-bit weights in blocks, which
        ONNX Runtime reads faster for one row, and on a decoder whose weights stream from memory for a few (the
        paper-size model: 1.40x at 2 rows, 1.09x at 4, 0.95x at 6; the default model 0.96x at 2), unless its
        searches will hold more rows than that at the next step (a beam's first step: `_step_graph`). The choice
        is made when the cache's arrays are bound: rows, sentences, sources and the top-K's width change only with
        a new binding.
        `log_softmax` False (and not `full`): a graph of format 8 skips the log-softmax over the vocabulary, and
        its candidates' values are the logits, in the same order; older graphs, and float16 ones, always normalise."""
        if full and self.shortlist is not None:
            raise ValueError("a shortlist step scores each row's candidates only: it has no whole distribution")
        longest = cache.make_room()  # a free slot per row, before the buffers are bound
        width = self.candidates.width(candidates)
        bound = cache.bound  # the cache drops it whenever the arrays it binds change
        if bound is None or bound.full != full or bound.width != width:
            bound = cache.bound = self._bind(cache, full, width, self._step_graph(cache, candidates))
        bound.input_ids[:] = input_ids  # (B,)
        if bound.attention_lengths is not None:
            seqlens_k, total = bound.attention_lengths
            np.copyto(seqlens_k, cache.lengths, casting="unsafe")  # (B,) int32: each row's cached steps
            total[...] = longest + 1  # () the longest row with this step
        if bound.log_softmax is not None:
            bound.log_softmax[...] = log_softmax or full  # ()
        if self._rebind_host_inputs:
            for name, array in bound.per_step:
                bound.binding.host_input(name, array)  # copied to the GPU here, not at the run
        if cache.on_gpu:
            cache.xp.cuda.get_current_stream().synchronize()  # the cache's copies are done before the graph reads
        bound.binding.run()
        top_log_probs, top_ids, *rest = (array.copy() for array in bound.outputs)  # the next step rewrites them
        cache.advance(input_ids)  # (B,) recorded by a host cache: beams that share a prefix copy only the rest
        kept = min(candidates, self.candidates.most)
        top_log_probs, top_ids = drop_banned(top_log_probs, top_ids, self.candidates.is_banned, kept)
        return StepOutput(top_log_probs, top_ids, *rest)

    def _step_graph(self, cache: DecoderCache, candidates: int) -> str:
        """Which step graph runs this cache's steps (see step). The one-row graph only where the searches stay
        within its rows: a beam's first step has one row a sentence and its next ones k (rows_per_sentence). Run
        for that one step, its weights push the step graph's out of the caches before the steps that follow (the
        default model, beam 4 at batch 1, on the step graph throughout: 0.93-0.97x the time a sentence of 32 tokens,
        0.81-0.96x of 8, 6 rounds alternating in one process). The dense step graph (a static runtime's, beside
        its dense caches) from dense_step_rows rows."""
        if self.shortlist is not None:
            return "decoder_step_shortlist"
        rows = max(cache.rows, cache.sentences * rows_per_sentence(candidates))  # (the most, this step or next)
        if self.single is not None and rows <= self._single_rows:  # opened on CPU only: a host cache
            return "decoder_step_single"
        if self.dense_decoder is not None and cache.dense and rows >= self._dense_rows:
            return "decoder_step_dense"
        return "decoder_step_ragged" if self._ragged_fits(cache) else "decoder_step"

    def _ragged_fits(self, cache: DecoderCache) -> bool:
        """Whether the ragged step graph can run this cache's step (one row per sentence, host memory) and pays: at
        most RAGGED_FILL of the (sentences x source axis) positions are real."""
        if self.ragged is None or cache.rows != cache.sentences or cache.on_gpu:  # rows == sentences: one row each
            return False
        real = np.count_nonzero(cache.src_mask)  # the mask's mean() took ~30 us at 30 x 52, at nearly every step
        return real <= RAGGED_FILL * cache.src_mask.size

    def _bind(self, cache: DecoderCache, full: bool, width: int, graph: str) -> Binding:
        """The step's inputs and outputs bound to the cache's arrays and to output arrays of its rows: valid, and
        reused, until the cache's arrays change (rows joining or leaving, a buffer resized). In between, a step
        copies its tokens in and reads the outputs: `positions` is the cache's own `lengths`, which it counts in
        place, and the graph writes the cache's buffers in place (present_key_i bound to self_key_i's memory).
        `width`: the top-K's candidates per row, the banned ids among them (format 4 is told; format 3's is fixed).
        `graph`: the step graph to bind (see step); the ragged one also takes the cross-attention caches as outputs
        (in place)."""
        binding = StepBinding(self.steps[graph])
        ragged = graph == "decoder_step_ragged"
        # Inputs the graph only reads are bound by reference (host_input), as an OrtValue would be, at 1.7 us where
        # an OrtValue and its binding took 4.7
        if self._dec_top_k is not None:
            binding.host_input(self._dec_top_k, np.array([width], np.int64))  # (1,)
        input_ids = np.zeros(cache.rows, np.int64)  # (B,) each step's tokens, copied in
        host_inputs = (
            ("input_ids", input_ids),  # (B,)
            ("positions", cache.lengths),  # (B,) = each row's cached steps, counted in place by `advance`
            ("src_mask", cache.src_mask),  # (N, S)
            ("sentence_rows", cache.sentence_rows),  # (N, G)
            ("row_slots", cache.row_slots),  # (B,)
        )
        per_step = [(self._dec_one[role], array) for role, array in host_inputs[:2]]  # input_ids, positions
        lengths = None
        if self._dec_lengths is not None:
            lengths = (np.zeros(cache.rows, np.int32), np.zeros((), np.int32))  # (B,), (): set by each step
            for name, array in zip(self._dec_lengths, lengths, strict=True):
                binding.host_input(name, array)
                per_step.append((name, array))
        log_softmax = None
        if self._dec_log_softmax is not None:
            log_softmax = np.ones((), np.bool_)  # () set by each step
            binding.host_input(self._dec_log_softmax, log_softmax)
            per_step.append((self._dec_log_softmax, log_softmax))
        if graph == "decoder_step_shortlist":
            host_inputs += (("candidate_ids", cache.candidates),)  # (N, C)
        for role, array in host_inputs:
            if not array.flags.c_contiguous:  # bound by reference: a contiguous copy would not see later updates
                raise ValueError(f"{role} must be a contiguous array")
            binding.host_input(self._dec_one[role], array)
        outputs = self._outputs(cache.rows, full, width)  # (B, width) twice [, (B, V)]: the graph writes them
        for name, array in outputs.items():
            binding.host_output(name, array)  # host memory; no OrtValues to fetch afterwards
        if cache.on_gpu:
            bind_gpu_cache(binding, self._dec_in, self._dec_present, cache)
        else:
            bind_host_cache(binding, self._dec_in, self._dec_present, cache, self._ragged_present if ragged else {})
        return Binding(
            full, width, graph, binding, input_ids, tuple(outputs.values()), tuple(per_step), lengths, log_softmax
        )

    def _outputs(self, rows: int, full: bool, width: int) -> dict[str, np.ndarray]:
        """Host arrays for the step's outputs, by name, top_log_probs and top_ids first; log_probs only if `full`.
        Bound before the run, they save fetching ONNX Runtime's own (all of them, the cache's presents too)."""
        widths = {"top_log_probs": width, "top_ids": width, "log_probs": self._dec_out["log_probs"].shape[1]}
        roles = ("top_log_probs", "top_ids", "log_probs") if full else ("top_log_probs", "top_ids")
        specs = [self._dec_out[role] for role in roles]
        return {s.name: np.empty((rows, int(widths[s.role])), s.dtype) for s in specs}  # (B, width) or (B, V)


def bind_host_cache(
    binding: StepBinding, inputs: dict, presents: dict, cache: DecoderCache, cross_presents: dict
) -> None:
    """The cache's numpy buffers as the step's inputs, and each self-attention buffer also as its present output:
    the graph writes each row's new key and value into it, in place. `cross_presents` (the ragged step graph's):
    the cross-attention buffers' present outputs, bound to the same memory likewise."""
    for role, layers in (("key", cache.cross_keys), ("value", cache.cross_values)):
        outputs = cross_presents.get(role, [None] * len(layers))
        for name, present, layer in zip(inputs[f"cross_{role}"], outputs, layers, strict=True):
            if present is None:
                binding.host_input(name, layer)  # (N, H, S, Dh) a contiguous view, not copied
            else:  # (N, H, S, Dh): read, and its last source position rewritten as it was
                binding.host_in_place(name, present, layer)
    for role, layers in (("key", cache.self_keys), ("value", cache.self_values)):
        for past, present, layer in zip(inputs[f"self_{role}"], presents[role], layers, strict=True):
            binding.host_in_place(past, present, layer)  # (B, H, T, Dh): read, and written at each row's slot


def bind_gpu_cache(binding: StepBinding, inputs: dict, presents: dict, cache: DecoderCache) -> None:
    """As bind_host_cache, for CuPy buffers in GPU memory: bound by device pointer, never copied to the host."""
    device = cache.xp.cuda.Device().id
    for role, layers in (("cross_key", cache.cross_keys), ("cross_value", cache.cross_values)):
        for name, layer in zip(inputs[role], layers, strict=True):
            binding.device_input(name, device, layer)  # (N, H, S, Dh) contiguous
    for role, layers in (("key", cache.self_keys), ("value", cache.self_values)):
        for past, present, layer in zip(inputs[f"self_{role}"], presents[role], layers, strict=True):
            binding.device_input(past, device, layer, present)  # (B, H, T, Dh): read, and written at each row's slot


def drop_banned(top_log_probs: np.ndarray, top_ids: np.ndarray, is_banned: np.ndarray, k: int) -> tuple:
    """Each row's best k candidates without the banned ids, still best first: (B, K + b) -> (B, k). `is_banned`
    (V,): one lookup finds them (a comparison per banned id and their union took 2.4x as long)."""
    bad = is_banned[top_ids]  # (B, K + b)
    if not np.count_nonzero(bad):  # (a quarter of bad.any()'s ~1 us on arrays this small)
        return top_log_probs[:, :k], top_ids[:, :k]
    order = np.argsort(bad, axis=1, kind="stable")[:, :k]  # (B, k) the allowed ones, in their order
    return np.take_along_axis(top_log_probs, order, axis=1), np.take_along_axis(top_ids, order, axis=1)
