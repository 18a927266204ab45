"""Reads and checks a model folder: its manifest (the only contract with model_export), the
checksums of its files, and that each graph's inputs and outputs are those the manifest declares.

Knows the folder layout and the manifest schema, and how the manifest's calibration turns a translation's mean
token log-probability into a confidence; knows nothing of sessions, requests or text.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from service.errors import ModelFolderError

MANIFEST = "manifest.json"
FORMAT = "transformer-mt-model"
# 2: cross-attention keys/values per sentence, rows grouped by sentence_rows/row_slots; 3: self-attention writes
# the cache in place (present_key_i/present_value_i), self_mask and step_keys/step_values gone; 4: the step graph's
# `top_k` input says how many candidates per row it returns (3: always 19); 5: a second step graph, for batches whose
# sentences have one row each, whose cross-attention reads each sentence's own source length (`decoder_step_ragged`,
# optional); 6: a third step graph, for steps of one row, whose products read 8-bit weights in blocks
# (`decoder_step_single`, optional, int8 variants); 7: GroupQueryAttention's lengths given (`seqlens_k`,
# `total_sequence_length`); 8: the step graphs' `log_softmax` input says whether to normalise the distribution
# (the fp16 variant's step graph, for GPUs, always does and has no such input); 9: the tokenizer may name the
# letters the model's training sources held too seldom for it to read (`rare_letters`, optional); 10: a fourth step
# graph, for static batches, whose self-attention reads the whole time axis of a cache as long as its rows
# (`decoder_step_dense`, optional, int8 variants; model_export/quantize.py); 11: an int8 variant may say how many
# bits its products' weights take (`weight_bits`: 7 from `quantize` since this format; none said: 8; engine/cpu.py).
# 12: a variant may say its graphs are batch-invariant (`batch_invariant`: a row's numbers depend on that row alone:
# int8 activations quantized row by row, the step graph's cross-attention in plain operators; none said: not).
# 13: the manifest may say how to turn a translation's mean token log-probability into a calibrated confidence
# (`confidence`, optional; model_export calibrate; none said: exp of the mean log-probability, uncalibrated), and may
# hold a vocabulary shortlist (`shortlist`, optional) with, per variant, the step graph that scores each row's
# candidates only (`decoder_step_shortlist`, optional; model_export/shortlist.py).
# model_export writes FORMAT_VERSION (graph_io); the server reads every format from OLDEST_FORMAT_VERSION on
# (service/engine/runtime.py: step_candidates, OnnxRuntime).
FORMAT_VERSION = 13
OLDEST_FORMAT_VERSION = 3
# a variant's graphs, as VariantSpec's fields: the encoder and the step graph, then the optional ragged (format 5),
# one-row (format 6), dense (format 10) and shortlist step graphs
GRAPHS = (
    "encoder", "decoder_step", "decoder_step_ragged", "decoder_step_single", "decoder_step_dense",
    "decoder_step_shortlist",
)
GraphName = Literal[
    "encoder", "decoder_step", "decoder_step_ragged", "decoder_step_single", "decoder_step_dense",
    "decoder_step_shortlist",
]
SHORTLIST_FEWEST = 64  # candidates per sentence, at least: the step's top-K (beam k: 2k + 3) must fit among them
ORT_DTYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(int64)": "int64",
    "tensor(int32)": "int32",
    "tensor(bool)": "bool",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorSpec(_Strict):
    name: str
    role: str
    dtype: Literal["float32", "float16", "int64", "int32", "bool"]
    shape: list[str | int]
    layer: int | None = None


class GraphSpec(_Strict):
    file: str
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]

    def named(self, role: str) -> list[str]:
        """Names of the tensors with this role, in layer order."""
        found = [s for s in self.inputs + self.outputs if s.role == role]
        return [s.name for s in sorted(found, key=lambda s: -1 if s.layer is None else s.layer)]

    def one(self, role: str) -> str:
        names = self.named(role)
        if len(names) != 1:
            raise ModelFolderError(f"{self.file}: the manifest declares {len(names)} tensors with role {role!r}")
        return names[0]


class SharedInitializer(_Strict):
    """One constant that several graphs of a variant hold as ONNX external data in one raw file (little-endian,
    C order), so that a runtime can keep one copy in memory for all of them: names[graph] is its name there."""

    file: str
    dtype: Literal["uint8", "int8", "float32"]
    shape: list[int]
    names: dict[GraphName, str]


class VariantSpec(_Strict):
    precision: str
    encoder: GraphSpec
    decoder_step: GraphSpec
    decoder_step_ragged: GraphSpec | None = None  # format 5: the step for batches whose sentences have one row each
    decoder_step_single: GraphSpec | None = None  # format 6: the step for one row (the step graph's inputs and outputs)
    decoder_step_dense: GraphSpec | None = None  # format 10: the step for static batches (the same contract)
    # the step whose output projection scores each row's own candidates (its sentence's `candidate_ids`, (N, C)),
    # its log_probs (B, C) over them and its top_ids vocabulary ids; the folder's `shortlist` gives the candidates
    decoder_step_shortlist: GraphSpec | None = None
    # format 11, int8 variants: the bits of the DynamicQuantizeMatMul products' weights (7: their pairs of products
    # fit the 16-bit sums of a CPU without VNNI; none stated: 8, as `quantize` wrote them before format 11)
    weight_bits: Literal[7, 8] | None = None
    # format 12: whether a row's numbers in every graph but the optional fast ones (ragged, one-row, dense) depend on
    # that row alone, whatever shares its batch (model_export: onnx_graphs._padded_cross_attention and
    # quantize.to_per_row_products); the server refuses a variant without it unless MT_BATCH_INVARIANT is off
    batch_invariant: bool = False
    # format 12, int8 variants: how the products' activations are quantized, each row with its own scale (per-row,
    # batch-invariant) or each tensor with one (per-tensor, ONNX Runtime's dynamic quantization; none said: so)
    activation_scales: Literal["per-row", "per-tensor"] | None = None
    shared_initializers: list[SharedInitializer] = []


class TokenizerSpec(_Strict):
    kind: Literal["sentencepiece"]
    source_model: str
    target_model: str
    vocabulary: str | None = None
    append_eos: bool = True
    target_tokens: dict[str, str] = {}
    # format 9: letters the model's training sources held too seldom for it to read or copy (model_export letters);
    # the server gives a word that holds one to the model as a placeholder, as it does a letter its vocabulary lacks
    rare_letters: str = ""

    @field_validator("rare_letters")
    @classmethod
    def _letters(cls, value: str) -> str:
        odd = sorted({c for c in value if not c.isalpha()})
        if odd:
            raise ValueError(f"rare_letters holds characters that are not letters: {''.join(odd)!r}")
        return value


class ShortlistSpec(_Strict):
    """The folder's vocabulary shortlist (service/engine/shortlist.py reads the file): for each source token id the
    target ids it makes likely, and the ids every sentence's candidates hold."""

    file: str
    candidates: int = Field(ge=SHORTLIST_FEWEST)  # C: candidates per sentence, padded with pad (the graphs' axis)
    copy_source: bool = False  # a sentence's source ids are candidates too (source and target ids are one vocabulary)


class Architecture(BaseModel):
    """The fields of the model config the server uses; the manifest keeps all of them."""

    model_config = ConfigDict(extra="allow", frozen=True)
    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int
    n_heads: int
    d_ff: int
    n_encoder_layers: int
    n_decoder_layers: int
    max_positions: int
    pad_id: int
    decoder_start_id: int
    eos_id: int
    unk_id: int

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads


class SpecialIds(_Strict):
    pad: int
    decoder_start: int
    eos: int
    unk: int


class FileEntry(_Strict):
    sha256: str
    bytes: int


class Calibration(_Strict):
    """Format 13: a Platt sigmoid over a translation's mean token log-probability m (its log-probability over its
    tokens, EOS included): confidence = 1 / (1 + exp(-(a * m + b))), the probability that the translation meets
    `label` (`model_export calibrate` fits a and b on the dev set and writes `fitted_on`, its measures there)."""

    method: Literal["platt"]
    feature: Literal["mean_token_logprob"]
    a: float
    b: float
    label: str
    fitted_on: dict[str, Any] = {}

    def confidence(self, mean_log_prob: float) -> float:
        return platt(mean_log_prob, self.a, self.b)


def platt(m: float, a: float, b: float) -> float:
    """1 / (1 + exp(-(a m + b))), without overflow at either end."""
    z = a * m + b
    if z >= 0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def uncalibrated(mean_log_prob: float) -> float:
    """A folder without calibration: the geometric mean of its tokens' probabilities, exp(m), in [0, 1]."""
    return math.exp(min(0.0, mean_log_prob))


class Manifest(_Strict):
    format: Literal["transformer-mt-model"]
    format_version: int
    name: str
    version: str
    source_language: str = Field(min_length=1)
    target_languages: list[str] = Field(min_length=1)  # a folder with none can translate nothing
    config: Architecture
    special_ids: SpecialIds
    tokenizer: TokenizerSpec
    opset: int
    variants: dict[str, VariantSpec]
    default_variant: str
    files: dict[str, FileEntry]
    provenance: dict[str, Any]
    shortlist: ShortlistSpec | None = None
    confidence: Calibration | None = None  # format 13

    @field_validator("format_version", mode="before")
    @classmethod
    def _whole_number(cls, value: Any) -> Any:
        if isinstance(value, bool):  # pydantic would read true as 1
            raise ValueError(f"must be a whole number, not {str(value).lower()}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Manifest:
        if self.format_version < OLDEST_FORMAT_VERSION:
            raise ValueError(
                f"format_version {self.format_version} is older than {OLDEST_FORMAT_VERSION}, the oldest this server "
                "reads: export the model folder again with this version's model_export"
            )
        if self.format_version > FORMAT_VERSION:
            raise ValueError(
                f"format_version {self.format_version} is newer than {FORMAT_VERSION}, the one this server reads: "
                "run a server as new as the model_export that wrote the folder"
            )
        if self.confidence is not None and self.format_version < 13:
            raise ValueError(f"confidence is a field of format 13, not of format_version {self.format_version}")
        if self.default_variant not in self.variants:
            raise ValueError(f"default_variant {self.default_variant!r} is not among variants {sorted(self.variants)}")
        cfg, ids = self.config, self.special_ids
        if (ids.pad, ids.decoder_start, ids.eos, ids.unk) != (cfg.pad_id, cfg.decoder_start_id, cfg.eos_id, cfg.unk_id):
            raise ValueError("special_ids disagree with the config's pad/decoder_start/eos/unk ids")
        self._shortlist_graphs_fit()
        missing = sorted(set(self.referenced_files()) - set(self.files))
        if missing:
            raise ValueError(f"files referenced but not listed with a checksum: {', '.join(missing)}")
        return self

    def _shortlist_graphs_fit(self) -> None:
        """A shortlist step graph needs the folder's shortlist, and its candidate axis is the shortlist's size."""
        for name, variant in self.variants.items():
            graph = variant.decoder_step_shortlist
            if graph is None:
                continue
            if self.shortlist is None:
                raise ValueError(f"variant {name!r} has a decoder_step_shortlist but the folder has no shortlist")
            axis = next((s.shape[1] for s in graph.inputs if s.role == "candidate_ids"), None)
            if axis != self.shortlist.candidates:
                raise ValueError(
                    f"variant {name!r}: decoder_step_shortlist's candidate_ids axis is {axis}, the shortlist's "
                    f"candidates {self.shortlist.candidates}"
                )

    def confidence_of(self, mean_log_prob: float) -> float:
        """A translation's confidence in [0, 1] from its mean token log-probability: the calibration's, or
        uncalibrated (exp of it) for a folder without one."""
        if self.confidence is None:
            return uncalibrated(mean_log_prob)
        return self.confidence.confidence(mean_log_prob)

    def referenced_files(self) -> list[str]:
        tok = self.tokenizer
        names = [tok.source_model, tok.target_model] + ([tok.vocabulary] if tok.vocabulary else [])
        names += [self.shortlist.file] if self.shortlist else []
        for variant in self.variants.values():
            graphs = [getattr(variant, name) for name in GRAPHS]
            names += [graph.file for graph in graphs if graph] + [i.file for i in variant.shared_initializers]
        return names


@dataclass(frozen=True)
class ModelFolder:
    path: Path
    manifest: Manifest

    def file(self, name: str) -> Path:
        return self.path / name

    def variant(self, name: str | None = None) -> VariantSpec:
        chosen = name or self.manifest.default_variant
        if chosen not in self.manifest.variants:
            raise ModelFolderError(f"{self.path}: no variant {chosen!r}; it has {sorted(self.manifest.variants)}")
        return self.manifest.variants[chosen]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def load_model_folder(path: Path, verify_checksums: bool = True) -> ModelFolder:
    """Parse and check a folder; every problem is a ModelFolderError naming the file and what is wrong."""
    if not path.is_dir():
        raise ModelFolderError(f"model folder not found: {path}")
    manifest = _read_manifest(path / MANIFEST)
    for name, entry in manifest.files.items():
        _check_file(path, name, entry, verify_checksums)
    return ModelFolder(path, manifest)


def _read_manifest(path: Path) -> Manifest:
    if not path.is_file():
        raise ModelFolderError(
            f"{path}: missing: {path.parent} is not a model folder (`python -m model_export export` writes one)"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ModelFolderError(f"{path}: not valid JSON ({error})") from None
    try:
        return Manifest.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "manifest"
        raise ModelFolderError(f"{path}: {where}: {first['msg']}") from None


def _check_file(folder: Path, name: str, entry: FileEntry, verify_checksum: bool) -> None:
    path = folder / name
    if Path(name).is_absolute() or ".." in Path(name).parts:
        raise ModelFolderError(f"{folder / MANIFEST}: file name {name!r} leaves the model folder")
    if not path.is_file():
        raise ModelFolderError(f"{path}: missing (listed in {MANIFEST})")
    size = path.stat().st_size
    if size != entry.bytes:
        raise ModelFolderError(f"{path}: {size} bytes, the manifest says {entry.bytes} (truncated or replaced)")
    if verify_checksum and sha256_of(path) != entry.sha256:
        raise ModelFolderError(f"{path}: checksum mismatch (sha256 differs from the manifest): the file was altered")


class NodeArg(Protocol):
    """What an ONNX Runtime session reports of one input or output."""

    name: str
    type: str
    shape: list[Any]


def check_graph_io(graph: GraphSpec, inputs: Iterable[NodeArg], outputs: Iterable[NodeArg], where: Path) -> None:
    """The graph's real inputs and outputs must be the manifest's: same names, dtypes and ranks."""
    for declared, actual, kind in ((graph.inputs, list(inputs), "input"), (graph.outputs, list(outputs), "output")):
        real = {arg.name: arg for arg in actual}
        if set(real) != {s.name for s in declared}:
            extra = sorted(set(real) - {s.name for s in declared})
            absent = sorted({s.name for s in declared} - set(real))
            raise ModelFolderError(
                f"{where}: {kind}s do not match the manifest (graph only: {extra}; manifest only: {absent})"
            )
        for spec in declared:
            arg = real[spec.name]
            if ORT_DTYPES.get(arg.type) != spec.dtype or len(arg.shape) != len(spec.shape):
                raise ModelFolderError(
                    f"{where}: {kind} {spec.name} is {arg.type} of rank {len(arg.shape)} in the graph, "
                    f"{spec.dtype} of rank {len(spec.shape)} in the manifest"
                )
