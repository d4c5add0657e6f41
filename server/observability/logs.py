"""Logging for `python -m server`: one line per record on stderr, JSON (the default) or text.

Everything goes through the standard `logging` module, so grpc's, onnxruntime's and every other
library's records come out in the same format as the server's own. JSON lines are rendered by
python-json-logger (docs/observability.md says why that library); each has `time` (UTC, ISO 8601),
`level`, `logger`, `message`, the record's structured fields (`event`, and those of the event),
and, while an RPC is being handled, its `request_id` (and `trace_id` with tracing on).

The event loop never writes to stderr itself: records are handed to a writer thread
(QueueHandler, then `_Writer`), so a slow reader of the server's output (a full pipe, a stalled
log shipper) cannot stall every RPC. The hand-off queue is bounded; past it records are dropped
and the next one written says how many.

The writer takes records in batches: woken by the first record after a quiet spell, it lets the
others gather for BATCH_S and writes them all with one write. Measured problem (2026-11-28, 2-core
AMD EPYC, benchmarks/studies/thread_cpu.py): the standard QueueListener woke once per record, and
with one access-log line per call it cost 58-64 µs of CPU per call on its own thread (1.6-2.1
sleeps and wake-ups per call), which a wake-up's price on a virtual machine (~16 µs of CPU each,
docs/serving_speed.md) makes most of. Lines reach stderr at most BATCH_S late; shutdown writes out
what is queued.
"""
from __future__ import annotations

import atexit
import copy
import dataclasses
import datetime
import json
import logging
import logging.handlers
import queue
import re
import sys
import threading
import time
from typing import Optional, TextIO

from server.observability import calls

FORMATS = ("json", "text")
LEVELS = ("debug", "info", "warning", "error", "critical")
QUEUE_RECORDS = 10_000
BATCH_S = 0.02  # how long the writer lets records gather once one has come (see the module docstring)

# LogRecord attributes that are not structured fields (the text format appends the others as key=value).
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}
# Settings whose value may be a secret: shown as "<redacted>" in the start-up summary.
_SECRET_NAME = re.compile(r"(^|_)(api_?keys?|keys?|secrets?|passwords?|token|credentials?|auth)(_|$)")
_URL_USERINFO = re.compile(r"(?<=//)[^/@\s]+@")


def _iso(created: float) -> str:
    return datetime.datetime.fromtimestamp(created, tz=datetime.timezone.utc).isoformat(timespec="milliseconds")


class CallContext(logging.Filter):
    """Stamps the running RPC's request id (and trace id) on each record written while it runs,
    whatever the logger; runs in the writing thread, where the call's contextvar is visible."""

    def filter(self, record: logging.LogRecord) -> bool:
        call = calls.current()
        if call is not None:
            if not hasattr(record, "request_id"):
                record.request_id = call.request_id
            if call.span is not None and not hasattr(record, "trace_id"):
                record.trace_id = call.trace_id()
        return True


def json_formatter() -> logging.Formatter:
    from pythonjsonlogger.json import JsonFormatter  # the `serve` extra; imported only when JSON is chosen

    class Formatter(JsonFormatter):
        def formatTime(self, record, datefmt=None):  # noqa: N802 (logging's name)
            return _iso(record.created)

    return Formatter(["asctime", "levelname", "name", "message"], json_ensure_ascii=False,
                     rename_fields={"asctime": "time", "levelname": "level", "name": "logger"})


class TextFormatter(logging.Formatter):
    """`time level logger: message key=value ...`: the structured fields after the message."""

    def __init__(self):
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record, datefmt=None):  # noqa: N802
        return _iso(record.created)

    def formatMessage(self, record):  # noqa: N802 (the traceback, if any, follows the fields)
        extra = " ".join(f"{k}={_text(v)}" for k, v in vars(record).items() if k not in _STANDARD)
        line = super().formatMessage(record)
        return f"{line} {extra}" if extra else line


def _text(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value if value and re.fullmatch(r"[^\s\"=]+", value) else json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, float, bool)):
        return str(value)
    return json.dumps(value, ensure_ascii=False, default=str, separators=(",", ":"))


class _Handoff(logging.handlers.QueueHandler):
    """Puts records on the writer thread's queue with the message and traceback already rendered
    (the arguments may be objects the caller changes right after), dropping them when it is full."""

    def __init__(self, q: queue.Queue):
        super().__init__(q)
        self.dropped = 0
        self._plain = logging.Formatter()

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        record = copy.copy(record)
        record.message = record.getMessage()
        record.msg, record.args = record.message, None
        if record.exc_info:
            record.exc_text = record.exc_text or self._plain.formatException(record.exc_info)
            record.exc_info = None
        if self.dropped:
            record.dropped_log_records, self.dropped = self.dropped, 0
        return record

    def enqueue(self, record: logging.LogRecord) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1


class ClientGone(logging.Filter):
    """grpc's asyncio server logs an ERROR with a traceback when it cannot send a unary call's answer
    because the call is already over: the client cancelled, hung up or reached its deadline between the
    handler's return and grpc's send (grpc/grpc#32551 made that a log line instead of an unhandled
    exception). The service checks just before it returns (service.py `_guard`), which leaves a window
    of microseconds; the soak still met it once in ~25,000 calls. A client going away is not a server
    fault: one INFO line, no traceback."""

    PREFIX = "ExecuteBatchError raised in core by servicer method"

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(self.PREFIX):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = "the client went away before its answer was sent " + message[len(self.PREFIX):].strip()
            record.args, record.exc_info, record.exc_text = (), None, None
        return True


_CLIENT_GONE = ClientGone()
GRPC_CORE_LOGGER = "grpc._cython.cygrpc"


class _Writer:
    """The thread that formats the hand-off queue's records and writes them, a batch at a time."""

    _STOP = object()

    def __init__(self, q: queue.Queue, handler: logging.StreamHandler):
        self.queue, self.handler = q, handler
        self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Write out everything queued so far, then end the thread."""
        self.queue.put(self._STOP)  # blocks only while the queue is full (the writer is draining it)
        self._thread.join()

    def _run(self) -> None:
        while True:
            batch = [self.queue.get()]  # an idle server's writer sleeps here: no wake-up without a record
            if batch[0] is not self._STOP:
                time.sleep(BATCH_S)  # the records of a busy server gather: one wake-up and one write for them
            while batch[-1] is not self._STOP:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
            self._write([r for r in batch if r is not self._STOP])
            if batch[-1] is self._STOP:
                return

    def _write(self, records: list[logging.LogRecord]) -> None:
        handler, lines = self.handler, []
        for record in records:
            if not handler.filter(record):
                continue
            try:
                lines.append(handler.format(record))
            except Exception:  # noqa: BLE001 (as logging does: report it on stderr, keep the others)
                handler.handleError(record)
        if not lines:
            return
        try:
            handler.stream.write(handler.terminator.join(lines) + handler.terminator)
            handler.flush()
        except Exception:  # noqa: BLE001 (a closed or broken stream: logging's own report, once)
            handler.handleError(records[-1])


_writer: Optional[_Writer] = None


def configure(fmt: str = "auto", level: str = "info", stream: Optional[TextIO] = None) -> None:
    """Route every logger through the root logger to `stream` (stderr), in `fmt`, from `level` up.
    Unknown values fall back to json/info here; ServerConfig.problems() reports them."""
    global _writer
    output = logging.StreamHandler(stream or sys.stderr)
    if fmt == "auto":  # text for a person at a terminal, JSON for a log collector
        fmt = "text" if getattr(output.stream, "isatty", lambda: False)() else "json"
    missing = None
    try:
        output.setFormatter(TextFormatter() if fmt == "text" else json_formatter())
    except ImportError as e:  # an environment installed before the serve extra had it
        output.setFormatter(TextFormatter())
        missing = e.name
    # No formatter here reads a record's source line, thread or process: skip looking them up for every
    # record (logging's documented optimisations; findCaller walks the stack, on the event loop, once a call).
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handoff = _Handoff(queue.Queue(QUEUE_RECORDS))
    handoff.addFilter(CallContext())
    logging.getLogger(GRPC_CORE_LOGGER).addFilter(_CLIENT_GONE)  # one instance: configure may run twice
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.addHandler(handoff)
    root.setLevel(level.upper() if level.lower() in LEVELS else logging.INFO)
    logging.captureWarnings(True)
    shutdown()
    _writer = _Writer(handoff.queue, output)
    _writer.start()
    atexit.register(shutdown)
    if missing:
        logging.getLogger(__name__).warning("JSON logs need python-json-logger (pip install -e '.[serve]'): "
                                            "logging as text", extra={"event": "log_format_unavailable",
                                                                      "missing": missing})


def shutdown() -> None:
    """Write out what is queued and stop the writer thread (at exit)."""
    global _writer
    if _writer is not None:
        _writer.stop()
        _writer = None


def config_summary(cfg) -> dict:
    """The settings for the start-up event, without secrets: values of settings named like a
    key, secret, password or token are redacted, and so is the user part of any URL."""
    out = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if isinstance(value, str) and value and _SECRET_NAME.search(f.name):
            value = "<redacted>"
        elif isinstance(value, str):
            value = _URL_USERINFO.sub("<redacted>@", value)
        out[f.name] = value
    return out
