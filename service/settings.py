"""The service's settings: one pydantic-settings class, every field settable as an `MT_*` environment
variable (lists as JSON or comma-separated). Built once at start and passed into `create_app`.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import os
from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.engine.decoding import BEAM_SIZE_LIMIT, MAX_OUTPUT_RATIO, MAX_OUTPUT_TOKENS
from service.errors import SettingsError
from service.scheduling.placement import CLAIMS, allowed_cores

SHIPPED_MODELS = Path(__file__).resolve().parent.parent / "models"
PREFIX = "MT_"
LOG_LEVELS = tuple(logging.getLevelNamesMapping())  # Python's: CRITICAL FATAL ERROR WARN WARNING INFO DEBUG NOTSET
SECRETS = frozenset(["api_keys", "metadata_api_keys"])  # their values never reach a log line, nor an error
A_DAY = 86_400.0  # the longest timeout taken: beyond it time arithmetic overflows (a time_t), and no request waits so
# docker-compose.yml's own variables, which the compose file reads and the server never sees
COMPOSE_VARIABLES = frozenset(
    ["MT_PORT", "MT_BIND_ADDRESS", "MT_CPUS", "MT_MEMORY", "MT_IMAGE", "MT_IMAGE_CUDA", "MT_STOP_GRACE_PERIOD"]
) | {"MT_REPLICAS"}  # docker-compose.scale.yml's


def available_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may use, at least 1: the CPUs it may run on (affinity, cpusets), capped by a cgroup
    CPU quota (a container's `cpus:` limit, which affinity does not show), rounded up."""
    cores = len(allowed_cores()) or os.cpu_count() or 1  # affinity, where the OS says it (Linux)
    quota = cpu_quota(cgroup)
    return max(1, min(cores, math.ceil(quota)) if quota else cores)


def cpu_quota(cgroup: Path) -> float | None:
    """CPUs' worth of time per period the cgroup may use (v2 `cpu.max`, v1 `cpu.cfs_quota_us`), None if unlimited."""
    try:
        if (cgroup / "cpu.max").is_file():
            quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        else:
            quota = (cgroup / "cpu" / "cpu.cfs_quota_us").read_text().strip()
            period = (cgroup / "cpu" / "cpu.cfs_period_us").read_text().strip()
        return None if quota in ("max", "-1") else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def _split_list(value: object) -> object:
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            return json.loads(text)
        return [item.strip() for item in text.split(",") if item.strip()]
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=PREFIX, extra="forbid", allow_inf_nan=False)

    # -- models --------------------------------------------------------------------------------
    models_dir: Path = Field(SHIPPED_MODELS, description="folder whose subfolders are model folders")
    models: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="subfolders of models_dir to load (empty: every model folder there)"
    )
    variant: str | None = Field(
        None,
        description="graph variant to run (fp32, int8, fp16 where `half` added it); default: each manifest's, except "
        "that with CUDA among the providers an int8 default (whose products have no CUDA kernel) gives way to fp16 "
        "where it can run there, else fp32; the log and /v1/models say which",
    )
    glossary_file: Path | None = Field(
        None,
        description='a JSON file of glossaries by language pair, {"en": {"fr": {"Files": "Files", "file": "fichier"}}}'
        ", read at start: each request of a pair gets its terms (a request's own glossary adds to them, its "
        "translation of a term in both winning), as LibreTranslate clients, which send no glossary, need",
    )
    verify_checksums: bool = Field(True, description="check every file's sha256 against the manifest at start")

    # -- ONNX Runtime --------------------------------------------------------------------------
    providers: Annotated[list[Literal["cpu", "cuda"]], NoDecode] = Field(
        default_factory=lambda: ["cpu"], description="execution providers in order; CUDA falls back to CPU"
    )
    intra_op_threads: int = Field(
        0,
        ge=0,
        description="threads inside one graph run; 0: per model, one per core when its decoder costs at least "
        "16 M multiply-adds per token, else 1 (a small model's steps are too short to share between cores)",
    )
    inter_op_threads: int = Field(
        1, ge=1, description="ONNX Runtime's inter-op threads: independent nodes of one graph run at once beyond 1"
    )
    ragged_step: bool | None = Field(
        None,
        description="open a model folder's ragged step graph (format 5) beside its step graph and run it for greedy "
        "steps over ragged sources: its cross-attention reads each sentence's own source, not the widest live one. "
        "Its session holds a second copy of the decoder's prepacked weights (5 MB for the default model, 53 MB "
        "int8 and 319 MB fp32 at the paper's size). Unset: where that graph's file is at most 64 MiB",
    )
    single_row_step: bool = Field(
        True,
        description="open a model folder's step graph for one row (format 6, int8 variants) beside its step graph "
        "and run it for steps of one row (one sentence, greedy; up to 4 rows for a decoder of at least 16 M "
        "multiply-adds per token, whose weights stream from memory, on a CPU with VNNI, AMX or ARM's dot "
        "products): its products read 8-bit weights in blocks of 128 (4-bit in blocks of 32 with quantize "
        "--single-row-bits 4, as the default model's), which ONNX Runtime reads faster for one row "
        "(a greedy step at batch 1: 0.77x the default model's time, 0.64x the paper size's). Its session holds its "
        "own copy of the decoder's weights (5 MB for the default model, ~60 MB at the paper's size). CPU only",
    )
    encoder_threads: int = Field(
        0,
        ge=0,
        description="threads inside one encoder pass; 0: 1 under continuous batching (the passes run beside the "
        "decoder steps, which have intra_op_threads), else intra_op_threads",
    )

    decoder_streams: int = Field(
        0,
        ge=0,
        description="decoding streams per model: each its own batch (max_batch_rows, max_batch_tokens each), cache "
        "and threads, all fed from one queue and sharing the model's sessions; intra_op_threads 0 splits the cores "
        "between them (CTranslate2's inter_threads). 0: per model, 2 for a decoder of at least 16 M multiply-adds "
        "per token on 2 or more cores (CPU), else 1",
    )
    pin_cores: bool = Field(
        True,
        description="python -m service on Linux: when every decoding stream runs one thread and the streams leave "
        "a core free (and no CPU quota is smaller than the cores allowed), pin each stream to a core of its own and "
        "every other thread (HTTP, encoder passes) to the cores left; otherwise, or false, the kernel places every "
        "thread (CPU only)",
    )
    pin_claims_dir: Path = Field(
        CLAIMS,
        description="where the servers of one machine claim the cores they pin streams to (a lock file per core), "
        "so that a second server pins to other cores; servers that share cores must share it",
    )
    engine_batch_scheduling: bool = Field(
        True,
        description="Linux: the engine processes' threads run under SCHED_BATCH, so that one they wake (a request "
        "read from the pipe, a sentence for the encoder, results for the outbox) waits for the HTTP process's turn "
        "on a shared core instead of preempting it; false: the kernel's default policy for them too",
    )
    engine_process: bool = Field(
        True,
        description="run each model's scheduler and ONNX Runtime sessions in a process of their own, so that the "
        "decoding loop and the HTTP handling do not take turns on one GIL; false: threads of the server process",
    )

    # -- batching ------------------------------------------------------------------------------
    batching: Literal["continuous", "static"] = Field(
        "continuous", description="continuous: sentences join and leave between decoder steps; static: run to end"
    )
    batch_invariant: bool = Field(
        True,
        description="a sentence's translation, scores and alternatives are the same whatever shares its batch "
        "(for a given model folder, variant, decoding options, ONNX Runtime version and thread settings): only the "
        "step graph runs, and a model folder whose variant was written before batch-invariant graphs (format 12) "
        "is refused. false: also run the folder's faster graphs for some batches (the ragged, one-row and dense "
        "step graphs), whose numbers differ from the step graph's, so a translation can change with its company",
    )
    shortlist: bool = Field(
        False,
        description="score each sentence's candidate target tokens only (the model folder's vocabulary shortlist: "
        "`python -m model_export shortlist --model-dir models/en-fr --corpus data/corpus`), not the whole "
        "vocabulary: faster steps on a large vocabulary; scores and alternatives are over the candidates, and a "
        "sentence's candidates depend on its source alone",
    )
    max_batch_rows: int = Field(64, ge=1, description="rows (sentences x beams) in one decoder step")
    max_batch_tokens: int = Field(
        16384, ge=1, description="sum over running rows of source length + maximum output length"
    )
    max_queue_sentences: int = Field(2048, ge=1, description="sentences waiting; beyond it requests get 503")
    max_queue_wait_seconds: float = Field(
        10.0,
        ge=0,
        le=A_DAY,
        description="expected wait in the queue (waiting sentences / measured throughput) beyond which requests "
        "get 503; 0: off, only max_queue_sentences bounds the queue",
    )
    max_concurrent_requests: int = Field(
        256, ge=1, description="/translate requests handled at once (reading, queued or running); beyond it 503"
    )
    request_timeout_seconds: float = Field(30.0, gt=0, le=A_DAY, description="deadline of a request; 504 after it")
    retry_after_seconds: int = Field(1, ge=1, description="Retry-After sent with 503")

    # -- connections and shutdown --------------------------------------------------------------
    body_timeout_seconds: float = Field(
        10.0, gt=0, le=A_DAY, description="time from a request's headers to the end of its body; 408 after it"
    )
    max_connections: int = Field(
        1024, ge=1, description="open connections and tasks beyond which uvicorn answers 503 (limit_concurrency)"
    )
    keep_alive_seconds: int = Field(5, ge=1, description="an idle keep-alive connection is closed after this")
    shutdown_grace_seconds: float = Field(
        30.0, ge=0, le=A_DAY, description="after SIGTERM: time for requests in flight to finish before exiting"
    )

    # -- decoding defaults and limits ----------------------------------------------------------
    default_beam_size: int = Field(
        1,
        ge=1,
        le=BEAM_SIZE_LIMIT,
        description="beams for a request that gives no beam_size (1: greedy); at most max_beam_size",
    )
    max_beam_size: int = Field(
        8,
        ge=1,
        le=BEAM_SIZE_LIMIT,
        description="the largest beam_size, and alternatives + 1, a request may ask (400 beyond it)",
    )
    default_length_penalty: float = Field(1.0, ge=0.0, le=5.0, description="as a request's length_penalty: 0 to 5")
    max_output_tokens: int = Field(
        MAX_OUTPUT_TOKENS, ge=1, description="absolute cap on generated tokens per sentence"
    )
    max_output_ratio: float = Field(
        MAX_OUTPUT_RATIO, gt=0, le=100, description="relative cap: ratio x source tokens + 10"
    )
    max_sentence_tokens: int = Field(200, ge=8, description="longer sentences are split at punctuation/spaces")
    mask_symbols: bool = Field(
        True,
        description="inside a sentence, each run of symbols (emoji, €, °) or of characters the model's vocabulary "
        "lacks goes to the model as a placeholder %1, %2, ..., put back in its translation (text/placeholders.py)",
    )
    html_attributes: bool = Field(
        True,
        description="in HTML, translate the values of attributes people read (alt, title, placeholder, aria-label, "
        "a button's value, a meta description: text/markup.py ATTRIBUTES) besides the text between tags, and a "
        "lang attribute of the source language says the target's (and the page's dir its direction)",
    )
    max_request_chars: int = Field(50_000, ge=1, description="total characters of q in one request (413)")
    max_request_items: int = Field(128, ge=1, description="strings in one request's q list (413)")
    max_request_sentences: int = Field(512, ge=1, description="sentences in one request after splitting (413)")
    max_body_bytes: int = Field(1_000_000, ge=1, description="request body size (413)")

    # -- confidence and guards ------------------------------------------------------------------
    low_confidence: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="a translation whose confidence (/translate's `confidence`) is below this is low-confidence: "
        "counted in mt_low_confidence_total, and in /translate_file marked for review whatever `fuzzy` says (a .po "
        "entry fuzzy, an XLIFF unit's review state); 0: none is. With a calibrated model (its manifest's "
        "`confidence`) a confidence is the chance that the translation is good on the dev set's measure: 0.5 "
        "marks those more likely poor than good",
    )
    guards: bool = Field(
        True,
        description="check each sentence's translation for degenerate output (an n-gram repeated 4 times in a row, "
        "a length below 0.25 or above 3 times the source's tokens, a copy of a source of 4 words or more): a "
        "greedy one is searched again with 4 beams, and the beams' best kept where it passes; each one found is "
        "counted in mt_degenerate_outputs_total",
    )

    # -- language detection --------------------------------------------------------------------
    detect_languages: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="languages (ISO 639-1) /detect and source 'auto' know besides those the loaded models translate "
        "from and into, so that a text in one of them is named, not taken for a served one (about 30 MB each with "
        "high accuracy)",
    )
    detect_accuracy: Literal["high", "low"] = Field(
        "high",
        description="high: lingua's 1- to 5-gram models, right on short strings (95-97 % of the default model's "
        "test strings; ~140 MB for two languages); low: trigrams only, ~40 MB for sixteen, weaker on short text",
    )
    detect_refuse_confidence: float = Field(
        0.8,
        ge=0.0,
        le=1.0,
        description="with source 'auto', a text detected with this confidence or more as a language no model "
        "translates into the target is refused (400); below it, it goes to the likeliest served source",
    )

    # -- files (POST /translate_file) ----------------------------------------------------------
    max_file_bytes: int = Field(10_000_000, ge=1, description="size of a file sent to /translate_file (413)")
    max_file_units: int = Field(20_000, ge=1, description="strings (units) in one file to translate (413)")
    file_fuzzy: bool = Field(
        True,
        description="mark machine-translated entries as needing review where the format can (a .po entry fuzzy, "
        "an XLIFF target's state); a request's `fuzzy` field overrides it",
    )
    file_store_dir: Path | None = Field(
        None,
        description="where translated files wait for download (translatedFileUrl); replicas behind one balancer "
        "share it so that any of them serves a download; unset: a folder of its own under the system's temp dir",
    )
    file_store_seconds: float = Field(
        900.0, gt=0, le=A_DAY, description="how long a translated file can be downloaded; then it is deleted"
    )
    file_store_bytes: int = Field(
        512_000_000, ge=1, description="the most bytes of translated files kept; the oldest go first"
    )

    # -- access --------------------------------------------------------------------------------
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="if set, /translate needs one of these keys (api_key field)"
    )
    metadata_api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="if set, /metrics and /v1/models need one of these keys (X-API-Key or Authorization: Bearer)",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list, description="CORS off when empty")
    log_level: str = Field(
        "INFO", description="Python's level names, any case; every line carries the request id (X-Request-ID)"
    )
    access_log: bool = Field(
        default=True, description="a line a request at INFO (method, path, status, ms); false: none, other logs kept"
    )

    @field_validator(
        "models", "providers", "api_keys", "metadata_api_keys", "cors_origins", "detect_languages", mode="before"
    )
    @classmethod
    def _lists(cls, value: object, info: ValidationInfo) -> object:
        """A list from its variable's text. Set, MT_PROVIDERS and the key lists hold something: an empty
        MT_API_KEYS (a secret missing in a deployment) would turn the keys off without a word."""
        items = _split_list(value)
        if isinstance(value, str) and not items and info.field_name in ("providers", *SECRETS):
            raise ValueError("is set but lists nothing; give at least one, or unset it for the default")
        if info.field_name in SECRETS and isinstance(items, list):
            if any(not isinstance(key, str) for key in items):
                raise ValueError("lists something that is not text: give each key as a string")
            if any(not key.strip() for key in items):
                raise ValueError("holds an empty key (which a request without a key would match); remove it")
            return [key.strip() for key in items]
        return items

    @field_validator("models")
    @classmethod
    def _plain_names(cls, value: list[str]) -> list[str]:
        for name in value:
            if name in (".", "..") or "/" in name or "\\" in name:
                raise ValueError(f"{name!r} is not a folder name in MT_MODELS_DIR; give subfolders' names")
        if len(set(value)) < len(value):
            raise ValueError("names a folder twice")
        return value

    @field_validator("models_dir", "pin_claims_dir", "glossary_file", mode="before")
    @classmethod
    def _not_blank(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, str) and not value.strip():
            what = "a file" if info.field_name == "glossary_file" else "a folder"
            raise ValueError(f"is empty; give {what}, or unset it for the default")
        return value

    @field_validator("log_level")
    @classmethod
    def _log_level(cls, value: str) -> str:
        if value.upper() not in LOG_LEVELS:
            raise ValueError(f"must be one of {', '.join(LOG_LEVELS)} (any case)")
        return value.upper()

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        """Values that contradict each other: a request that gives no beam size must be one the server serves."""
        if self.default_beam_size > self.max_beam_size:
            raise ValueError(
                f"MT_DEFAULT_BEAM_SIZE ({self.default_beam_size}) is over MT_MAX_BEAM_SIZE ({self.max_beam_size}): "
                "every request without a beam_size would be refused"
            )
        if self.default_beam_size > self.max_batch_rows:
            raise ValueError(
                f"MT_DEFAULT_BEAM_SIZE ({self.default_beam_size}) is over MT_MAX_BATCH_ROWS ({self.max_batch_rows}): "
                "a sentence's beams must fit one decoder step"
            )
        return self

    @classmethod
    def variable(cls, field: str) -> str:
        return f"{PREFIX}{field.upper()}"

    def ort_providers(self) -> tuple[str, ...]:
        names = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
        return tuple(names[p] for p in self.providers)

    @property
    def overlap_encoder(self) -> bool:
        """Encoder passes run on a thread of their own beside the decoder steps (continuous batching)."""
        return self.batching == "continuous"

    def encoder_session_threads(self) -> int:
        """The encoder session's intra-op threads (0: as intra_op_threads): one when it runs beside the decoder."""
        return self.encoder_threads or (1 if self.overlap_encoder else 0)


def load_settings() -> Settings:
    """The settings from the environment; SettingsError naming each bad value's variable."""
    try:
        return Settings()
    except ValidationError as error:
        raise SettingsError("; ".join(_problem(e) for e in error.errors())) from None


def _problem(error: dict) -> str:
    message = str(error["msg"]).removeprefix("Value error, ")
    if not error["loc"]:  # a model validator's: it names its variables
        return message
    field = str(error["loc"][0])
    variable, shown = Settings.variable(field), isinstance(error["input"], str) and field not in SECRETS
    if field in SECRETS:  # the parser's own words may quote the value ("Expecting value: ... ['s3cret', oops")
        message = message.split(":")[0] if message.startswith("Expecting") else message
    return f"{variable}={error['input']!r}: {message}" if shown else f"{variable}: {message}"


def unknown_variables(environ: dict[str, str] | None = None) -> list[str]:
    """MT_* variables that are no setting (a misspelt one is otherwise ignored without a word), each with the
    setting it is closest to, if any: "MT_MAX_BEAMSIZE (did you mean MT_MAX_BEAM_SIZE?)"."""
    known = {Settings.variable(name) for name in Settings.model_fields} | COMPOSE_VARIABLES
    lines = []  # pydantic-settings reads names in any case: MT_log_level is MT_LOG_LEVEL
    for name in sorted(n for n in (os.environ if environ is None else environ) if n.upper().startswith(PREFIX)):
        if name.upper() not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1)
            lines.append(f"{name} (did you mean {close[0]}?)" if close else name)
    return lines


def warn_unknown_variables(log: logging.Logger) -> None:
    for line in unknown_variables():
        log.warning("%s is not a setting and is ignored (docs/configuration.md)", line)
