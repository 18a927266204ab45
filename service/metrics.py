"""Every Prometheus metric of the service, defined in one table on an injectable registry.

Names carry their unit (`_seconds`, `_total`); labels are small fixed sets (route, status, model,
reason, kind, outcome). Other modules call these objects; none defines a metric of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
REJECTION_REASONS = ("queue_full", "too_many_requests", "too_large", "not_ready", "shutting_down")
TRANSLATE_STATUSES = ("200", "500", "503", "504")  # /translate's answers that alerts divide: present from the start

Kind = Literal["counter", "gauge", "histogram"]
KINDS = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}


@dataclass(frozen=True)
class Spec:
    """One metric: the attribute that holds it, its kind, name, help and labels; `buckets` for a histogram;
    `per_model`: a counter whose series for each loaded model exists from the start, at 0 (Metrics.add_model)."""

    attribute: str
    kind: Kind
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] | None = None
    per_model: bool = False


M = ("model",)
SPECS = (
    Spec("http_requests", "counter", "mt_http_requests_total", "HTTP requests by route, method and status code.",
         ("route", "method", "status")),
    Spec("http_duration", "histogram", "mt_http_request_duration_seconds",
         "Time from request received to response sent.", ("route",), LATENCY_BUCKETS),
    Spec("in_flight", "gauge", "mt_requests_in_flight", "Translation requests admitted and not yet answered."),
    Spec("queue_depth", "gauge", "mt_queue_depth", "Sentences waiting to join a batch.", M),
    Spec("queue_capacity", "gauge", "mt_queue_capacity_sentences",
         "Sentences a model's queue holds before it refuses requests (MT_MAX_QUEUE_SENTENCES).", M),
    Spec("expected_queue_wait", "gauge", "mt_queue_expected_wait_seconds",
         "Waiting sentences / measured throughput: the wait a new request can expect (admission compares it "
         "with MT_MAX_QUEUE_WAIT_SECONDS); 0 when nothing waits, -1 while the throughput is not known.", M),
    Spec("queue_wait", "histogram", "mt_queue_wait_seconds",
         "Time from a sentence's arrival to its admission to a batch. With one decoding stream and a short queue "
         "its encoder pass starts at arrival (an early pass) and runs within this wait.", M, LATENCY_BUCKETS),
    Spec("join_wait", "histogram", "mt_join_wait_seconds",
         "Time from a sentence's admission to its first decoder step: the wait for the encoder thread, its encoder "
         "pass unless an early one had finished, and the wait for the step in progress.", M, STEP_BUCKETS),
    Spec("decoding", "histogram", "mt_decoding_seconds",
         "Time a sentence spent in the decoder batch: from its first step to its last.", M, LATENCY_BUCKETS),
    Spec("encoder_duration", "histogram", "mt_encoder_duration_seconds", "Duration of one encoder graph run.",
         M, STEP_BUCKETS),
    Spec("step_duration", "histogram", "mt_decoder_step_duration_seconds",
         "Duration of one decoder step (graph run, search, rows leaving and joining after it).", M, STEP_BUCKETS),
    Spec("step_rows", "histogram", "mt_decoder_step_rows",
         "Rows (sentences x beams) in one decoder step: the batch size.", M, ROW_BUCKETS),
    Spec("sentences", "counter", "mt_sentences_total",
         "Sentences the decoder finished (one decoded again without its placeholders, or by a guard, counts twice).", M,
         per_model=True),
    Spec("input_tokens", "counter", "mt_input_tokens_total",
         "Source tokens encoded, once per sentence (as it joins a batch).", M, per_model=True),
    Spec("generated_tokens", "counter", "mt_generated_tokens_total",
         "Target tokens generated (best hypothesis, EOS included).", M, per_model=True),
    Spec("truncated", "counter", "mt_truncated_sentences_total",
         "Sentences whose translation stopped at its length cap (max_length, MT_MAX_OUTPUT_TOKENS, "
         "MT_MAX_OUTPUT_RATIO) before the model ended it.", M, per_model=True),
    Spec("low_confidence", "counter", "mt_low_confidence_total",
         "Translated texts whose confidence was below MT_LOW_CONFIDENCE (none while it is 0).", M, per_model=True),
    Spec("degenerate", "counter", "mt_degenerate_outputs_total",
         "Sentences whose translation a guard found degenerate (MT_GUARDS), by kind (repetition, length, copy) and "
         "outcome: retried_fixed (searched again with 4 beams, whose best passed), retried_kept (the first kept), "
         "not_retried (a beam search already, or one the limits could not search again).",
         ("model", "kind", "outcome")),
    Spec("rejected", "counter", "mt_rejected_requests_total",
         "Requests refused before any work: queue_full, too_many_requests, too_large, not_ready, shutting_down.",
         ("reason",)),
    Spec("deadline_expired", "counter", "mt_deadline_expired_total", "Requests that passed their deadline (504).",
         M, per_model=True),
    Spec("cancelled", "counter", "mt_cancelled_requests_total",
         "Requests whose client went away; their rows were dropped.", M, per_model=True),
    Spec("inference_errors", "counter", "mt_inference_errors_total",
         "Batches whose graph run failed (their requests got 500).", M, per_model=True),
    Spec("files", "counter", "mt_files_total",
         "Files sent to /translate_file, by format (their extension) and outcome: translated, refused (4xx), failed.",
         ("format", "outcome")),
    Spec("model_info", "gauge", "mt_model_info", "Loaded models (value 1).", ("model", "version", "variant",
         "provider")),
    Spec("ready", "gauge", "mt_ready", "1 when warmed up and admitting requests."),
)


class Metrics:
    """The SPECS' metrics as attributes, registered on `registry` (a fresh one by default: each test its own)."""

    http_requests: Counter
    http_duration: Histogram
    in_flight: Gauge
    queue_depth: Gauge
    queue_capacity: Gauge
    expected_queue_wait: Gauge
    queue_wait: Histogram
    join_wait: Histogram
    decoding: Histogram
    encoder_duration: Histogram
    step_duration: Histogram
    step_rows: Histogram
    sentences: Counter
    input_tokens: Counter
    generated_tokens: Counter
    truncated: Counter
    low_confidence: Counter
    degenerate: Counter
    rejected: Counter
    deadline_expired: Counter
    cancelled: Counter
    inference_errors: Counter
    files: Counter
    model_info: Gauge
    ready: Gauge

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        for spec in SPECS:
            setattr(self, spec.attribute, _made(spec, self.registry))
        # every count an alert or a rate reads exists from the start, at 0: a series that first appears at 6 has no
        # increase to Prometheus, so the first burst of errors after a start would go unseen
        for reason in REJECTION_REASONS:
            self.rejected.labels(reason)
        for status in TRANSLATE_STATUSES:
            self.http_requests.labels("/translate", "POST", status)

    def add_model(self, model: str, queue_capacity: int) -> None:
        """A loaded model's series, its counts at 0 (see above), its queue empty and its queue's capacity."""
        for spec in SPECS:
            if spec.per_model:
                getattr(self, spec.attribute).labels(model)
        self.queue_depth.labels(model).set(0)  # an alert on a full queue reads "empty", not "no data", until then
        self.queue_capacity.labels(model).set(queue_capacity)


def _made(spec: Spec, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
    """The prometheus_client object of `spec`, registered on `registry`."""
    extra = {"buckets": spec.buckets} if spec.buckets is not None else {}
    return KINDS[spec.kind](spec.name, spec.help, list(spec.labels), registry=registry, **extra)
