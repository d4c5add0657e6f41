"""Service errors as plain kinds. Each names its status (a gRPC status code's name, as a string);
the service edge maps it to the wire in one place (service.py `_guard`), so the engine core that
raises them (scheduler, loop, hosted models) imports no grpc."""
from __future__ import annotations


class ServiceError(Exception):
    code = "INTERNAL"
    retry_after: float | None = None  # seconds a refused caller should wait (RetryInfo, HTTP Retry-After)


class InvalidArgument(ServiceError):
    code = "INVALID_ARGUMENT"


class NotFound(ServiceError):
    code = "NOT_FOUND"


class ResourceExhausted(ServiceError):
    code = "RESOURCE_EXHAUSTED"


class MemoryFull(ResourceExhausted):
    """The server is at its memory budget (--memory-limit): new work waits; running work and health go on."""
    retry_after = 1.0


class Unavailable(ServiceError):
    code = "UNAVAILABLE"


class DeadlineExceeded(ServiceError):
    code = "DEADLINE_EXCEEDED"


class Cancelled(ServiceError):
    code = "CANCELLED"


class Internal(ServiceError):
    """An engine failure; the requests in flight fail with it and the loop keeps serving."""
    code = "INTERNAL"


# Error messages travel in gRPC trailing metadata (grpc-message), which peers cap at
# a few KB: echoing a 20,000-character model name made the reply itself fail.
MAX_ECHO = 64
MAX_MESSAGE = 1024


def shown(value: object, limit: int = MAX_ECHO) -> str:
    """repr() of a client-supplied value, cut to `limit` characters with the full length noted."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f" ({len(value)} characters)" if isinstance(value, str) else ""
    return text[:limit] + "…" + size


def bounded(message: str) -> str:
    """A status message short enough for any peer's metadata limit."""
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + "…"
