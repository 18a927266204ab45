"""The service's one exception tree; HTTP statuses are assigned to it in exactly one place (the API).

ServiceError
├── SettingsError        MT_* settings that cannot work (a value, or values that contradict each other, or a model's
│                        needs): the start stops with its message
├── ModelFolderError     a model folder that cannot be served: the start stops with its message
├── RequestError         the client must change the request
│   ├── InvalidRequest   400: unsupported language pair, option or format
│   ├── Forbidden        403: missing or wrong API key
│   ├── NotFound         404: an unknown model
│   ├── RequestTimeout   408: the body did not arrive within the body timeout (a slow or stalled client)
│   └── TooLarge         413: text, list or sentence over a limit (the message states it)
├── Overloaded           503 with Retry-After: the queue is full or too long to wait in, too many requests
│                        at once, not ready yet, or shutting down
├── DeadlineExceeded     504: the request's deadline passed before its translation finished
└── InferenceError       500: the graphs failed on this request's batch; other batches go on
"""

from __future__ import annotations


class ServiceError(Exception):
    """Base of every error the service raises on purpose."""


class SettingsError(ServiceError):
    """An MT_* setting the server cannot start with; the message names the variable."""


class ModelFolderError(ServiceError):
    """A missing, truncated, altered or inconsistent model folder."""


class RequestError(ServiceError):
    """The request cannot be served as sent."""


class InvalidRequest(RequestError):
    pass


class Forbidden(RequestError):
    pass


class NotFound(RequestError):
    pass


class RequestTimeout(RequestError):
    pass


class TooLarge(RequestError):
    pass


class Overloaded(ServiceError):
    def __init__(self, message: str, reason: str = "queue_full", retry_after_seconds: int = 1) -> None:
        super().__init__(message)
        self.reason = reason  # queue_full, too_many_requests, shutting_down, not_ready: the rejection metric's label
        self.retry_after_seconds = retry_after_seconds


class DeadlineExceeded(ServiceError):
    pass


class InferenceError(ServiceError):
    pass
