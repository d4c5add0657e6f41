"""What every HTTP API shares: the gateway into the servicer, the caller's identity, the status table,
the served languages, and the request counter.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Optional

import grpc
from starlette.requests import Request
from starlette.responses import Response

from server.edge.gateway import Caller, CallFailed, Gateway
from server.frontend.admission import Admission
from server.edge.http.guard import COUNTED

# gRPC status -> HTTP status, as grpc-gateway and Google's HTTP APIs map them.
HTTP_STATUS = {
    grpc.StatusCode.OK: 200, grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.DEADLINE_EXCEEDED: 504, grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409, grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429, grpc.StatusCode.FAILED_PRECONDITION: 400, grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400, grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.DATA_LOSS: 500, grpc.StatusCode.UNAUTHENTICATED: 401,
}
TIMEOUT_HEADER = "x-request-timeout"  # seconds the call may take, like gRPC's deadline (optional)


def http_status(code: grpc.StatusCode) -> int:
    return HTTP_STATUS.get(code, 500)


def retry_headers(failure: CallFailed) -> Optional[dict]:
    """Retry-After (whole seconds, rounded up) when a refusal says how long to wait."""
    retry = failure.retry_after
    return {"Retry-After": str(max(1, math.ceil(retry)))} if retry is not None else None


@functools.lru_cache(maxsize=512)
def language_name(code: str) -> str:
    """English name of an ISO 639 code (pycountry's ISO 639-3 table), else the code itself."""
    import pycountry  # imported on first use: a few MB of tables
    base = code.split("-")[0].split("_")[0].lower()
    entry = (pycountry.languages.get(alpha_2=base) if len(base) == 2 else pycountry.languages.get(alpha_3=base)) \
        if base else None
    return getattr(entry, "name", code) if entry is not None else code


@dataclass
class Edge:
    gateway: Gateway
    admission: Admission  # the models, the default one, the language identifier, character usage
    metrics: object
    max_body_bytes: int
    body_timeout_s: float
    keys: object = None  # server.security.keys.KeyStore, or None when auth is off

    def caller(self, request: Request, key: Optional[str] = None) -> Caller:
        """The Caller of an HTTP request; `key` is the API key when the API carries it elsewhere than
        `Authorization: Bearer`. A bad timeout header is ignored rather than refused."""
        if key is None:
            scheme, _, value = request.headers.get("authorization", "").strip().partition(" ")
            key = value.strip() if scheme.lower() == "bearer" and value.strip() else None
        timeout = None
        if TIMEOUT_HEADER in request.headers:
            try:
                timeout = float(request.headers[TIMEOUT_HEADER])
            except ValueError:
                timeout = None
            timeout = timeout if timeout is not None and 0 < timeout < 86_400 else None
        client = request.client
        return Caller(key=key, request_id=request.headers.get("x-request-id", ""),
                      peer=f"http:{client.host}:{client.port}" if client else "http",
                      forwarded_for=request.headers.get("x-forwarded-for", ""), timeout=timeout)

    def count(self, api: str, operation: str, response: Response) -> Response:
        self.metrics.http_requests.labels(api, operation, str(response.status_code)).inc()
        counted = COUNTED.get()
        if counted is not None:  # the guard counts what no handler did (server/edge/http/guard.py)
            counted.append(True)
        return response

    def key_id(self, key: Optional[str]) -> Optional[str]:
        """The id of a valid key; "" when auth is off; None for a missing or unknown key."""
        if self.keys is None:
            return ""
        found = self.keys.find(key) if key else None
        return found.key_id if found is not None else None
