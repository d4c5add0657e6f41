"""When a refused caller may come back: google.rpc.RetryInfo in the status's details (AIP-193).

gRPC clients read the wait from there (grpc-status's rpc_status.from_call), not from the message text;
the HTTP edge turns it into Retry-After (server/edge/gateway.py CallFailed.retry_after). Used by the rate
limiter's refusals (server/security/auth.py) and by every ServiceError that names a wait (the memory
budget's, server/frontend/memory_budget.py).
"""
from __future__ import annotations

from google.rpc import code_pb2, error_details_pb2, status_pb2

DETAILS_KEY = "grpc-status-details-bin"  # where gRPC carries a google.rpc.Status


def retry_status(message: str, seconds: float) -> status_pb2.Status:
    """A RESOURCE_EXHAUSTED google.rpc.Status whose RetryInfo says `seconds`."""
    status = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message=message)
    info = error_details_pb2.RetryInfo()
    info.retry_delay.FromNanoseconds(round(seconds * 1e9))
    status.details.add().Pack(info)
    return status


def retry_trailer(message: str, seconds: float) -> tuple:
    """Trailing metadata carrying retry_status."""
    return ((DETAILS_KEY, retry_status(message, seconds).SerializeToString()),)
