"""Service errors. Each names its gRPC status; service.py maps them in one place."""
from __future__ import annotations

import grpc


class ServiceError(Exception):
    code = grpc.StatusCode.INTERNAL


class InvalidArgument(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ServiceError):
    code = grpc.StatusCode.NOT_FOUND


class ResourceExhausted(ServiceError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(ServiceError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(ServiceError):
    code = grpc.StatusCode.CANCELLED


class Internal(ServiceError):
    """An engine failure; the requests in flight fail with it and the loop keeps serving."""
    code = grpc.StatusCode.INTERNAL


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
