"""Every Prometheus metric of the service, defined in one place on an injectable registry.

Names carry their unit (`_seconds`, `_total`); labels are small fixed sets (route, status, model,
reason). Other modules call these objects; none defines a metric of its own.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
REJECTION_REASONS = ("queue_full", "too_many_requests", "too_large", "not_ready", "shutting_down")
TRANSLATE_STATUSES = ("200", "500", "503", "504")  # /translate's answers that alerts divide: present from the start


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.http_requests = Counter(
            "mt_http_requests_total",
            "HTTP requests by route, method and status code.",
            ["route", "method", "status"],
            registry=r,
        )
        self.http_duration = Histogram(
            "mt_http_request_duration_seconds",
            "Time from request received to response sent.",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "mt_requests_in_flight", "Translation requests admitted and not yet answered.", registry=r
        )
        self.queue_depth = Gauge("mt_queue_depth", "Sentences waiting to join a batch.", ["model"], registry=r)
        self.queue_capacity = Gauge(
            "mt_queue_capacity_sentences",
            "Sentences a model's queue holds before it refuses requests (MT_MAX_QUEUE_SENTENCES).",
            ["model"],
            registry=r,
        )
        self.expected_queue_wait = Gauge(
            "mt_queue_expected_wait_seconds",
            "Waiting sentences / measured throughput: the wait a new request can expect (admission compares it "
            "with MT_MAX_QUEUE_WAIT_SECONDS); 0 when nothing waits, -1 while the throughput is not known.",
            ["model"],
            registry=r,
        )
        self.queue_wait = Histogram(
            "mt_queue_wait_seconds",
            "Time from a sentence's arrival to its admission to a batch. With one decoding stream and a short queue "
            "its encoder pass starts at arrival (an early pass) and runs within this wait.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.join_wait = Histogram(
            "mt_join_wait_seconds",
            "Time from a sentence's admission to its first decoder step: the wait for the encoder thread, its encoder "
            "pass unless an early one had finished, and the wait for the step in progress.",
            ["model"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.decoding = Histogram(
            "mt_decoding_seconds",
            "Time a sentence spent in the decoder batch: from its first step to its last.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.encoder_duration = Histogram(
            "mt_encoder_duration_seconds",
            "Duration of one encoder graph run.",
            ["model"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.step_duration = Histogram(
            "mt_decoder_step_duration_seconds",
            "Duration of one decoder step (graph run, search, rows leaving and joining after it).",
            ["model"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.step_rows = Histogram(
            "mt_decoder_step_rows",
            "Rows (sentences x beams) in one decoder step: the batch size.",
            ["model"],
            buckets=ROW_BUCKETS,
            registry=r,
        )
        self.sentences = Counter(
            "mt_sentences_total",
            "Sentences the decoder finished (one decoded again without its placeholders counts twice).",
            ["model"],
            registry=r,
        )
        self.input_tokens = Counter(
            "mt_input_tokens_total",
            "Source tokens encoded, once per sentence (as it joins a batch).",
            ["model"],
            registry=r,
        )
        self.generated_tokens = Counter(
            "mt_generated_tokens_total",
            "Target tokens generated (best hypothesis, EOS included).",
            ["model"],
            registry=r,
        )
        self.truncated = Counter(
            "mt_truncated_sentences_total",
            "Sentences whose translation stopped at its length cap (max_length, MT_MAX_OUTPUT_TOKENS, "
            "MT_MAX_OUTPUT_RATIO) before the model ended it.",
            ["model"],
            registry=r,
        )
        self.rejected = Counter(
            "mt_rejected_requests_total",
            "Requests refused before any work: queue_full, too_many_requests, too_large, not_ready, shutting_down.",
            ["reason"],
            registry=r,
        )
        self.deadline_expired = Counter(
            "mt_deadline_expired_total", "Requests that passed their deadline (504).", ["model"], registry=r
        )
        self.cancelled = Counter(
            "mt_cancelled_requests_total",
            "Requests whose client went away; their rows were dropped.",
            ["model"],
            registry=r,
        )
        self.inference_errors = Counter(
            "mt_inference_errors_total",
            "Batches whose graph run failed (their requests got 500).",
            ["model"],
            registry=r,
        )
        self.model_info = Gauge(
            "mt_model_info", "Loaded models (value 1).", ["model", "version", "variant", "provider"], registry=r
        )
        self.ready = Gauge("mt_ready", "1 when warmed up and admitting requests.", registry=r)
        # every count an alert or a rate reads exists from the start, at 0: a series that first appears at 6 has no
        # increase to Prometheus, so the first burst of errors after a start went unseen
        for reason in REJECTION_REASONS:
            self.rejected.labels(reason)
        for status in TRANSLATE_STATUSES:
            self.http_requests.labels("/translate", "POST", status)

    def add_model(self, model: str, queue_capacity: int) -> None:
        """A loaded model's series, its counts at 0 (see above), its queue empty and its queue's capacity."""
        for counter in (
            self.sentences,
            self.input_tokens,
            self.generated_tokens,
            self.truncated,
            self.deadline_expired,
            self.cancelled,
            self.inference_errors,
        ):
            counter.labels(model)
        self.queue_depth.labels(model).set(0)  # an alert on a full queue reads "empty", not "no data", until then
        self.queue_capacity.labels(model).set(queue_capacity)
