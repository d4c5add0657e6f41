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
