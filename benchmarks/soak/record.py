"""What each call of the soak may get back, and how it is recorded (the calls: traffic.py).

Every call goes through `Recorder.call`, which gives it a client deadline, waits
at most that deadline + HANG_GRACE seconds (longer counts as a hang, and the
call is cancelled, so nothing can stall the harness), and records category,
status code, latency and phase. Answers that are OK are also checked for shape
(one translation per text, a final stream message, ...): a malformed answer is
recorded as BAD_RESPONSE, which no category allows. HTTP calls (http_traffic.py, http_hostile.py) are
recorded the same way with codes "HTTP <status>", "SSE <gRPC code>" (an error event), RESET (the
connection failed without the server announcing its close) or CLOSED; extreme-but-valid decoding
settings are extreme.py's.
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Optional

import grpc

HANG_GRACE = 10.0  # seconds past its deadline before a call counts as hung
GOOD = frozenset({"OK", "RESOURCE_EXHAUSTED"})  # a legal call may always meet a full queue
EXPECTED: dict[str, frozenset] = {
    "translate_one": GOOD, "translate_many": GOOD, "stream": GOOD, "embed": GOOD,
    "list_models": frozenset({"OK"}), "health": frozenset({"OK"}),
    "slow_reader": GOOD, "burst": GOOD,
    # The client gives up or cancels; the call may still have finished first.
    "stream_cancel": GOOD | {"CANCELLED"}, "channel_close": GOOD | {"CANCELLED"},
    "deadline_short": GOOD | {"DEADLINE_EXCEEDED"},
    "fuzz_raw": frozenset({"INVALID_ARGUMENT"}),
    "fuzz_options": frozenset(),  # per case: FuzzCase.expect
    "large_request": frozenset(),  # per request (benchmarks/soak/__main__.py)
    "golden_rest": frozenset({"OK"}), "golden_load": GOOD,  # refused attempts under load are retried
    "health_probe": frozenset({"OK"}), "health_large": frozenset({"OK"}),
    # Streams that have sent a message before SIGTERM must finish whole (the drain's promise); unary
    # calls sent just before it finish or are refused; calls after NOT_SERVING are refused: UNAVAILABLE,
    # or CANCELLED for one grpc core had not yet handed to a handler when the drain ended and the server
    # closed (docs/deployment.md; on two loaded cores that took two of five in ~1 of 10 runs). Both are
    # retried by the client library; tests/system/test_lifecycle.py checks the UNAVAILABLE refusal alone.
    "drain_stream": frozenset({"OK"}), "drain_inflight": frozenset({"OK", "UNAVAILABLE"}),
    "drain_new": frozenset({"UNAVAILABLE", "CANCELLED"}),
    "extreme": frozenset(),  # per case: extreme.ExtremeCase.expect
}
# The HTTP port (run when the harness knows its URL): a full queue is 429 on every API.
HTTP_OK, HTTP_GOOD = frozenset({"HTTP 200"}), frozenset({"HTTP 200", "HTTP 429"})
HTTP_EXPECTED: dict[str, frozenset] = {
    "http_native": HTTP_GOOD, "http_sse": HTTP_GOOD, "http_sse_drop": HTTP_GOOD, "http_deepl": HTTP_GOOD,
    "http_libre": HTTP_GOOD, "http_languages": HTTP_OK, "http_health": HTTP_OK, "http_health_probe": HTTP_OK,
    "http_hostile": frozenset(),  # per case: http_hostile.HostileCase.expect
    "http_document": HTTP_GOOD, "http_glossary": HTTP_GOOD,
    "http_large": frozenset(),  # per call: refused as its API refuses a body of too many texts (400), or 429
}
EXPECTED.update(HTTP_EXPECTED)
ALWAYS_FAIL = frozenset({"INTERNAL", "UNKNOWN"})


def fatal(code: str) -> bool:
    """Never right for any call: INTERNAL / UNKNOWN (also as an SSE error event), any HTTP 5xx, a reset."""
    return code.split()[-1] in ALWAYS_FAIL or code.startswith("HTTP 5") or code == "RESET"


class BadResponse(Exception):
    """An OK answer of the wrong shape."""


class Outcome(Exception):
    """How a call ended, with a note for the report: raised by HTTP calls for codes that need explaining
    (a reset, an error event mid-stream)."""

    def __init__(self, code: str, note: str = ""):
        super().__init__(note)
        self.code, self.note = code, note


@dataclass
class Record:
    category: str
    rpc: str
    code: str  # a grpc.StatusCode name, HANG, BAD_RESPONSE or CLIENT_ERROR
    t: float  # start, seconds since the run began
    latency: float
    phase: str
    allowed: frozenset
    detail: str = ""  # decoding mode, fuzz case or large-request name
    note: str = ""  # status details, for the report

    @property
    def unexpected(self) -> bool:
        return self.code not in self.allowed or fatal(self.code)

    def as_dict(self) -> dict:
        return {"category": self.category, "rpc": self.rpc, "code": self.code, "t": round(self.t, 3),
                "latency_ms": round(1e3 * self.latency, 2), "phase": self.phase, "detail": self.detail,
                "allowed": sorted(self.allowed), "note": self.note}


class Recorder:
    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.records: list[Record] = []
        self.phase = "start"
        self.phases: list[dict] = []  # {name, start, end} in seconds since t0, for the report's plot
        self.started = 0
        self.in_flight = 0

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def enter(self, phase: str) -> None:
        now = round(self.elapsed(), 2)
        if self.phases:
            self.phases[-1]["end"] = now
        self.phases.append({"name": phase, "start": now, "end": now})
        self.phase = phase

    async def call(self, category: str, rpc: str, timeout: float, fn: Callable[[], Awaitable[Optional[str]]],
                   allowed: Optional[frozenset] = None, detail: str = "") -> Record:
        """Run fn (it returns None for OK, or a status code name it observed) and record the outcome."""
        self.started += 1
        self.in_flight += 1
        phase, t0 = self.phase, time.monotonic()
        note = ""
        try:
            code = await asyncio.wait_for(fn(), timeout + HANG_GRACE) or "OK"
        except TimeoutError:
            code, note = "HANG", f"no answer {timeout + HANG_GRACE:.1f} s after the start (deadline {timeout:.3f} s)"
        except grpc.aio.AioRpcError as e:
            code, note = e.code().name, (e.details() or "")[:300]
        except BadResponse as e:
            code, note = "BAD_RESPONSE", str(e)[:300]
        except Outcome as e:
            code, note = e.code, e.note[:300]
        except asyncio.CancelledError:
            if asyncio.current_task().cancelling():
                raise  # the harness itself is stopping this task
            code, note = "CANCELLED", "the call raised asyncio.CancelledError"  # e.g. its channel closed
        except Exception as e:  # noqa: BLE001 (a client-side failure is a finding, not a crash)
            code, note = "CLIENT_ERROR", f"{type(e).__name__}: {e}"[:300]
        finally:
            self.in_flight -= 1
        rec = Record(category, rpc, code, t0 - self.t0, time.monotonic() - t0, phase,
                     EXPECTED[category] if allowed is None else allowed, detail, note)
        self.records.append(rec)
        return rec
