"""One record per RPC, from TranslatorService._guard's entry to its end: the access log.

`begin` opens the record and makes it the running call's (a contextvar: grpc.aio runs each RPC
in its own task, so no other call sees it). The request id is the client's `x-request-id` when
it sent a sane one, else a fresh uuid4 hex; it goes back in the trailing metadata, and logs.py
stamps it on every log line written while the call runs. The handlers add what only they know
through the module functions below, which find the record themselves — `note` (model, texts,
sentences, generated tokens), `submitted` (the engine jobs: source tokens and, read when the
call ends, the engine's timings) — so nothing is passed down the call chain, and code that runs
outside an RPC (a unit test, the warm-up) records nothing. `Call.end` writes the access-log line
(logger `nmt.access`, INFO) and ends the trace span, if tracing is on (tracing.py).
"""
from __future__ import annotations

import contextvars
import logging
import re
import time
import uuid
from typing import TYPE_CHECKING, Iterable, NamedTuple, Optional

if TYPE_CHECKING:  # annotations only: logs.py imports this module in the engine core, which has no grpc
    import grpc

access_log = logging.getLogger("nmt.access")
log = logging.getLogger(__name__)

SERVICE = "nmt.v1.Translator"
REQUEST_ID = "x-request-id"
FORWARDED_FOR = "x-forwarded-for"
# A client's id is kept when it is visible ASCII and bounded: it then fits any log line and any
# metadata as it is. Anything else is replaced by a fresh id (the client finds it in the trailers).
_SANE_ID = re.compile(r"[\x21-\x7e]{1,128}")
_SANE_ADDRESSES = re.compile(r"[\x20-\x7e]{1,256}")

_current: contextvars.ContextVar[Optional["Call"]] = contextvars.ContextVar("nmt_call", default=None)
# The authenticated API key id of the running call: set by server/security/auth.py's interceptor before the
# servicer runs ("" without keys). Declared here, with the rest of the call's context, so that this module
# imports nothing from security.
CALLER_KEY_ID: contextvars.ContextVar[str] = contextvars.ContextVar("nmt_caller_key_id", default="")


class Phases(NamedTuple):
    """A call's engine timeline (time.monotonic), over all of its jobs: the first arrival, the
    first and last scheduling (left the queue, encoder pass), the first token, the last finish."""
    arrival: float
    first_scheduled: Optional[float]
    last_scheduled: Optional[float]
    first_token: Optional[float]
    finished: Optional[float]


class Call:
    __slots__ = ("rpc", "request_id", "peer", "forwarded_for", "started", "model", "texts", "sentences",
                 "input_tokens", "output_tokens", "jobs", "span", "tracer", "_token")

    def __init__(self, rpc: str, request_id: str, peer: str = "", forwarded_for: str = ""):
        self.rpc, self.request_id, self.peer, self.forwarded_for = rpc, request_id, peer, forwarded_for
        self.started = time.perf_counter()
        self.model = ""
        self.texts = self.sentences = self.input_tokens = self.output_tokens = 0
        self.jobs: list = []  # Job / EmbedJob: their Timing objects are filled in by the engine thread
        self.span = self.tracer = None
        self._token = None

    def phases(self) -> Optional[Phases]:
        if not self.jobs:
            return None
        timings = [job.timing for job in self.jobs]
        scheduled = [t.scheduled for t in timings if t.scheduled is not None]
        firsts = [t.first_token for t in timings if t.first_token is not None]
        finished = [t.finished for t in timings if t.finished is not None]
        return Phases(min(t.arrival for t in timings), min(scheduled, default=None), max(scheduled, default=None),
                      min(firsts, default=None), max(finished, default=None))

    def trace_id(self) -> str:
        return self.tracer.trace_id(self.span) if self.span is not None else ""

    def fields(self, code: grpc.StatusCode, seconds: float) -> dict:
        """The access-log line's fields: always the same keys (null where a value does not apply)."""
        queue_s = first_token_s = None
        if self.jobs:
            now = time.monotonic()
            # The longest any of the call's sentences waited (until the call ended, for one never scheduled),
            # and the first token of any of them; as the response's Timings count them for one text.
            queue_s = max((t.scheduled or now) - t.arrival for t in (job.timing for job in self.jobs))
            p = self.phases()
            first_token_s = None if p.first_token is None else p.first_token - p.arrival
        out = {"event": "rpc", "service": SERVICE, "method": self.rpc, "code": code.name,
               "model": self.model or None, "texts": self.texts, "sentences": self.sentences,
               "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
               "queue_s": _rounded(queue_s), "first_token_s": _rounded(first_token_s), "total_s": _rounded(seconds),
               "key_id": caller_key_id(), "request_id": self.request_id, "peer": self.peer}
        if self.forwarded_for:
            out["forwarded_for"] = self.forwarded_for
        if self.span is not None:
            out["trace_id"] = self.trace_id()
        return out

    def end(self, code: grpc.StatusCode, seconds: Optional[float] = None) -> None:
        """Write the access-log line and end the span. Never raises: the RPC's outcome is already decided."""
        seconds = time.perf_counter() - self.started if seconds is None else seconds
        try:
            if access_log.isEnabledFor(logging.INFO):
                access_log.info("%s %s %.3f s", self.rpc, code.name, seconds, extra=self.fields(code, seconds))
            if self.span is not None:
                self.tracer.finish(self, code)
        except Exception:  # noqa: BLE001 (a bug here must not turn an answered call into an error)
            log.warning("could not record the end of a %s call", self.rpc, exc_info=True)
        finally:
            if self._token is not None:
                try:
                    _current.reset(self._token)
                except ValueError:  # ended from another context than the one that began it
                    pass
                self._token = None


def begin(rpc: str, context, tracer=None) -> Call:
    """Open the record of an RPC that starts now, in the current task, and echo its request id."""
    given = forwarded = ""
    metadata = context.invocation_metadata() or ()
    for key, value in metadata:
        if key == REQUEST_ID:
            given = value
        elif key == FORWARDED_FOR:
            forwarded = value
    rid = given if isinstance(given, str) and _SANE_ID.fullmatch(given) else uuid.uuid4().hex
    if forwarded and not (isinstance(forwarded, str) and _SANE_ADDRESSES.fullmatch(forwarded)):
        forwarded = "(unprintable)"
    call = Call(rpc, rid, context.peer() or "", forwarded)
    _echo(context, rid)
    if tracer is not None:
        call.tracer, call.span = tracer, tracer.start(rpc, metadata)
    call._token = _current.set(call)
    return call


def _echo(context, rid: str) -> None:
    """x-request-id in the trailing metadata, next to whatever trailers are already set."""
    try:
        kept = tuple(m for m in (context.trailing_metadata() or ()) if m[0] != REQUEST_ID)
    except AttributeError:  # a context without the accessor (older grpc): ours is the only trailer then
        kept = ()
    try:
        context.set_trailing_metadata(kept + ((REQUEST_ID, rid),))
    except Exception:  # noqa: BLE001 (the call still runs, and is logged, without the echo)
        log.debug("could not set the x-request-id trailer", exc_info=True)


def current() -> Optional[Call]:
    return _current.get()


def note(**values) -> None:
    """Set fields of the running call's record (model, texts, sentences, output_tokens); none: no-op."""
    call = _current.get()
    if call is not None:
        for name, value in values.items():
            setattr(call, name, value)


def submitted(jobs: Iterable) -> None:
    """The engine jobs of the running call: their source tokens count now, their timings at the end."""
    call = _current.get()
    if call is not None:
        for job in jobs:
            call.jobs.append(job)
            call.input_tokens += len(job.src_ids)


def decoded(results: Iterable) -> None:
    """Finished translations (FinishEvents) of the running call: their generated tokens."""
    call = _current.get()
    if call is not None:
        call.output_tokens += sum(len(r.hypotheses[0].tokens) for r in results)


def caller_key_id() -> str:
    """The authenticated API key id of the running call (server/security), "" without one."""
    return CALLER_KEY_ID.get()


def _rounded(seconds: Optional[float]) -> Optional[float]:
    return None if seconds is None else round(seconds, 6)
