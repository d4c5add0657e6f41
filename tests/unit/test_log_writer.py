"""The log writer thread (server/observability/logs.py _Writer): every record written, in order, a burst
in a few writes rather than one per record, what is queued written out at shutdown, and a record that
cannot be formatted reported without losing the others."""
from __future__ import annotations

import io
import json
import logging

from server.observability import logs


class CountingStream(io.StringIO):
    """A real text stream that also counts the writes it gets."""

    def __init__(self):
        super().__init__()
        self.writes = 0

    def write(self, s: str) -> int:
        self.writes += 1
        return super().write(s)


def logged(emit) -> tuple[list[dict], int]:
    stream = CountingStream()
    logs.configure("json", "info", stream=stream)
    try:
        emit(logging.getLogger("tests.log_writer"))
    finally:
        logs.shutdown()  # writes out what is queued
        logs.configure("json", "info")
    return [json.loads(line) for line in stream.getvalue().splitlines()], stream.writes


def test_a_burst_is_written_whole_in_order_and_in_a_few_writes():
    def emit(log):
        for i in range(300):
            log.info("record %d", i, extra={"event": "burst", "n": i})
    records, writes = logged(emit)
    assert [r["n"] for r in records if r.get("event") == "burst"] == list(range(300))
    # 300 records logged in a few ms: one write per gathered batch (BATCH_S), not one per record
    assert writes <= 30


def test_what_is_queued_at_shutdown_is_written():
    records, _ = logged(lambda log: log.warning("the last words", extra={"event": "last"}))
    assert [r["message"] for r in records if r.get("event") == "last"] == ["the last words"]


def test_a_record_that_cannot_be_formatted_costs_only_itself(capsys):
    class Unprintable:
        def __str__(self):
            raise ValueError("no text")

    def emit(log):
        log.info("before", extra={"event": "ok"})
        log.info("%s", Unprintable())
        log.info("after", extra={"event": "ok"})
    records, _ = logged(emit)
    assert [r["message"] for r in records if r.get("event") == "ok"] == ["before", "after"]
