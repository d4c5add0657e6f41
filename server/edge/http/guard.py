"""The HTTP port's outermost layer: no client input gets a 500, every response is counted, and an
error response says whether the connection stays open.

Measured by an outside soak (issue 33) before this layer: a body nested 10,000 levels deep and a
LibreTranslate `alternatives: 1e999` reached the handlers' exception handler, whose 500 Starlette
sends and then re-raises, so uvicorn closed the keep-alive connection without `Connection: close`
(the client's next call on it failed, /healthz included: 25-40 resets per run), and those 500s were
missing from nmt_http_requests_total; 20,000- and 60,000-byte headers got 200 (h11's limit applies
only to a head that arrives in pieces); a malformed chunk size, answered 400 by uvicorn, was logged
as a 500 with two tracebacks.

The design, one ASGI middleware inside Starlette's error middleware, around the routes:
  * headers over --http-max-header-bytes get 431 with `Connection: close`, before any handler;
  * an exception from a handler becomes a 500 in the API's own error shape (never re-raised, so
    the connection survives); a client that went away mid-body is logged at INFO, not as a bug;
  * an error answer sent before the request body was read to its end carries `Connection: close`
    (the rest of the body is still on the wire: uvicorn must close, and now says so), and lingers:
    its bytes go out at once, then the rest of the body is read and dropped (up to LINGER_BYTES,
    LINGER_S) before the answer ends and uvicorn closes. Closing on unread bytes makes the kernel
    send a reset, which destroys the answer the client has not read yet: the soak's 13 MB upload
    against the 10 MB file limit got a reset instead of its 413 (nginx lingers for the same reason);
  * a body that declares BODY_RESERVE_BYTES or more is admitted against the memory budget
    (--memory-limit) by its size before it is read: a call whose body the budget could not hold while it
    is parsed gets the API's own "overloaded, retry" answer (429 with Retry-After) instead of growing the
    server past its limit; the reservation lasts until the response ends (server/frontend/memory_budget.py);
  * a response no handler counted (a 404, a 405, a 500 from here) is counted by API and status.
The body parsers' own limits (depth, numbers) are server/edge/http/body.py's.
"""
from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from typing import Callable, Optional

from starlette.requests import ClientDisconnect

log = logging.getLogger(__name__)
LINGER_S = 5.0  # at most this long reading an unread body's rest after an early error answer
LINGER_BYTES = 64 << 20  # and at most this much of it; past either, uvicorn closes (a reset, then)
BODY_RESERVE_BYTES = 256 << 10  # bodies this large or larger are admitted against the memory budget

# Set per request by the guard, marked by Edge.count: whether a handler counted its response.
COUNTED: contextvars.ContextVar[Optional[list]] = contextvars.ContextVar("nmt_http_counted", default=None)


def api_of(path: str) -> str:
    """The API a path belongs to (the `api` label of nmt_http_requests_total)."""
    if path.startswith("/v1/") or path == "/openapi.json":
        return "native"
    if path.startswith(("/v2/", "/v3/")):
        return "deepl"
    if path in ("/healthz", "/readyz"):
        return "health"
    if path in ("/", "/status", "/favicon.ico") or path.startswith("/web/"):
        return "web"  # the pages (server/edge/http/pages.py); their errors take the native shape
    return "libretranslate"


def error_body(api: str, status: int, code: str, message: str) -> bytes:
    """An error in the shape the path's API uses: DeepL's {"message"}, LibreTranslate's {"error"},
    the native API's google.rpc.Status mapping."""
    if api == "deepl":
        body = {"message": message}
    elif api == "libretranslate":
        body = {"error": message}
    else:
        body = {"error": {"code": status, "status": code, "message": message}}
    return json.dumps(body).encode()


class HttpGuard:
    def __init__(self, app, max_header_bytes: int, count: Callable[[str, str, int], None], budget=None):
        self.app, self.max_header_bytes, self.count = app, max_header_bytes, count
        self.budget = budget  # server/frontend/memory_budget.py MemoryBudget, or None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        api = api_of(scope.get("path", ""))
        head = len(scope.get("raw_path", b"")) + len(scope.get("query_string", b"")) + \
            sum(len(k) + len(v) + 4 for k, v in scope.get("headers", ()))
        if head > self.max_header_bytes:
            await _answer(send, 431, error_body(api, 431, "INVALID_ARGUMENT",
                                                f"request line and headers of {head} bytes; the limit is "
                                                f"{self.max_header_bytes}"), close=True)
            self.count(api, "headers", 431)
            return
        # Whether the body was read to its end: a request without one has nothing left on the wire.
        headers = dict(scope.get("headers", ()))
        state = {"body_done": headers.get(b"content-length", b"0") == b"0"
                 and b"transfer-encoding" not in headers, "started": False, "status": 0}
        counted: list = []
        token = COUNTED.set(counted)

        async def receive_tracked():
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                state["body_done"] = True
            elif message["type"] == "http.disconnect":
                state["body_done"] = True  # nothing more will come; the connection is gone anyway
            return message

        async def send_tracked(message):
            if message["type"] == "http.response.start":
                state["started"], state["status"] = True, message["status"]
                if message["status"] >= 400 and not state["body_done"]:
                    state["linger"] = True
                    message = dict(message, headers=[*message.get("headers", []), (b"connection", b"close")])
            elif message["type"] == "http.response.body" and state.get("linger") and not message.get("more_body"):
                await send(dict(message, more_body=True))  # the whole answer is on its way...
                await _drain(receive_tracked, state)  # ...while the rest of the body is read and dropped
                message = {"type": "http.response.body", "body": b""}
            await send(message)

        declared = headers.get(b"content-length", b"0")
        reserved = int(declared) if declared.isdigit() and int(declared) >= BODY_RESERVE_BYTES else 0
        if reserved and self.budget is not None and not self.budget.reserve(reserved):
            message = f"the server is at its memory limit: no room for a body of {reserved} bytes now; retry in a moment"
            await _answer(send_tracked, 429, error_body(api, 429, "RESOURCE_EXHAUSTED", message),
                          close=False, retry_after=1)
            COUNTED.reset(token)
            self.count(api, "memory", 429)
            return
        try:
            await self.app(scope, receive_tracked, send_tracked)
        except ClientDisconnect:
            log.info("HTTP %s %s: the client went away before its body arrived", scope["method"], scope["path"])
            state["status"] = state["status"] or 499
        except Exception as e:  # noqa: BLE001 (a handler's bug: a 500 for this request, the port serves on)
            log.exception("HTTP %s %s failed", scope["method"], scope["path"])
            if not state["started"]:
                await _answer(send, 500, error_body(api, 500, "INTERNAL", f"internal error ({type(e).__name__}); "
                                                    "see the server log"), close=not state["body_done"])
            state["status"] = 500
        finally:
            COUNTED.reset(token)
            if reserved and self.budget is not None:
                self.budget.release(reserved)
        if not counted and state["status"]:
            self.count(api, "other", state["status"])


async def _drain(receive, state: dict) -> None:
    """Read and drop what is left of the request body, within LINGER_S and LINGER_BYTES."""
    end, size = time.monotonic() + LINGER_S, 0
    while not state["body_done"] and size <= LINGER_BYTES:
        try:
            message = await asyncio.wait_for(receive(), max(end - time.monotonic(), 0.001))
        except (asyncio.TimeoutError, ClientDisconnect):
            return
        size += len(message.get("body", b""))


async def _answer(send, status: int, body: bytes, close: bool, retry_after: Optional[int] = None) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if close:
        headers.append((b"connection", b"close"))
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
