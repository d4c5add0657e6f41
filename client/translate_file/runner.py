"""The run: input Units batched to --concurrency workers over the targets, output in input order."""
from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
from dataclasses import dataclass
from dataclasses import field as dc_field
from typing import Callable, Iterator, Optional

import grpc

from .formats import Unit, error_record, input_format, read_units, whole_file_unit
from .report import build_summary, progress_bar, progress_lines
from .resume import prepare_output, scan_input, write_sidecar
from .settings import Settings, UsageError
from .targets import RETRY_CODES, Targets

MAX_LISTED_ERRORS = 100  # error line numbers listed in the summary


@dataclass
class Stats:
    total_lines: int = 0
    resumed_from: int = 0  # lines already in the output when this run started
    lines: int = 0  # lines written by this run
    translated: int = 0
    passthrough: int = 0
    input_characters: int = 0
    output_tokens: int = 0
    errors: int = 0  # lines that failed in this run
    errors_before: int = 0  # failed lines kept from earlier runs
    unwritten: int = 0  # lines finished behind a line that never finished (the run stopped): not written
    error_lines: list = dc_field(default_factory=list)
    stopped: str = ""  # why the run stopped before the end of the input
    unavailable: bool = False  # stopped because retries ran out (UNAVAILABLE / RESOURCE_EXHAUSTED)
    started: float = dc_field(default_factory=time.monotonic)
    seconds: float = 0.0


class Run:
    def __init__(self, s: Settings, stats: Stats, out, errors_out):
        self.s, self.stats = s, stats
        self.out, self.errors_out = out, errors_out
        self.results: dict[int, Unit] = {}
        self.next_write = stats.resumed_from
        self.advanced = asyncio.Event()
        self.stop = False
        self.bar = None
        self.targets: Optional[Targets] = None

    def halt(self, reason: str) -> None:
        """No more reading or sending: calls in flight finish, queued batches are dropped."""
        self.stop = True
        self.stats.stopped = reason
        self.advanced.set()  # the reader may be waiting for the writer, which may never move again

    # -- writing, in input order
    def done(self, unit: Unit) -> None:
        self.results[unit.index] = unit
        self.drain()

    def drain(self) -> None:
        wrote = 0
        while (u := self.results.pop(self.next_write, None)) is not None:
            if u.error is not None:
                self.stats.errors += 1
                if len(self.stats.error_lines) < MAX_LISTED_ERRORS:
                    self.stats.error_lines.append(u.error)
                if self.errors_out is not None:  # before its output line: a resume never loses a record
                    self.errors_out.write(json.dumps(u.error, ensure_ascii=False) + "\n")
                    self.errors_out.flush()
                if self.s.max_errors and self.stats.errors >= self.s.max_errors and not self.stop:
                    self.halt(f"--max-errors {self.s.max_errors} reached")
            elif u.text is None:
                self.stats.passthrough += 1
            else:
                self.stats.translated += 1
                self.stats.input_characters += len(u.text)
                self.stats.output_tokens += u.output_tokens
            self.out.write(u.line + "\n")
            self.next_write += 1
            wrote += 1
        if wrote:
            self.out.flush()
            self.stats.lines += wrote
            if self.bar is not None:
                self.bar.update(wrote)
            self.advanced.set()

    # -- translating
    async def batch(self, units: list[Unit]) -> None:
        if self.stop:
            return  # not written: a rerun does these lines
        try:
            resp = await self.targets.translate([u.text for u in units])
        except grpc.aio.AioRpcError as e:
            if e.code() in RETRY_CODES:
                # Retries spent: no server can take the work now. Nothing is written from this batch
                # on (the output stays a prefix of the input), the run stops, and a rerun resumes here.
                if not self.stop:
                    self.stats.unavailable = True
                    self.halt(f"{e.code().name} after {self.s.retries} retries: {e.details() or ''}; "
                              "rerun to resume")
                return
            if len(units) > 1:
                for u in units:  # find the line(s) at fault: the others still get translated
                    await self.batch([u])
                return
            for u in units:
                u.error = error_record(u.index, e.code().name, e.details() or "", u.text)
                u.line = u.render(None)
                self.done(u)
            return
        if len(resp.translations) != len(units):
            for u in units:
                u.error = error_record(u.index, "BAD_RESPONSE", f"{len(resp.translations)} translations for "
                                  f"{len(units)} texts", u.text)
                u.line = u.render(None)
                self.done(u)
            return
        for u, tr in zip(units, resp.translations):
            if not tr.hypotheses:
                u.error = error_record(u.index, "BAD_RESPONSE", "no hypothesis", u.text)
                u.line = u.render(None)
            else:
                u.line = u.render(tr.hypotheses[0].text)
                u.output_tokens = tr.output_tokens
            self.done(u)

    async def worker(self, queue: asyncio.Queue) -> None:
        while (units := await queue.get()) is not None:
            await self.batch(units)

    async def produce(self, units: Iterator[Unit], queue: asyncio.Queue) -> None:
        s = self.s
        window = max(4 * s.concurrency * s.batch_size, 256)  # lines read ahead of the last one written
        pending: list[Unit] = []
        for unit in units:
            if self.stop:
                break
            while unit.index - self.next_write >= window and not self.stop:
                if pending:  # it may hold the line the writer waits for
                    await queue.put(pending)
                    pending = []
                self.advanced.clear()
                await self.advanced.wait()
            if self.stop:
                break
            if unit.text is None:
                self.done(unit)
                continue
            pending.append(unit)
            if len(pending) == s.batch_size:
                await queue.put(pending)
                pending = []
        if pending and not self.stop:
            await queue.put(pending)
        for _ in range(s.concurrency):
            await queue.put(None)

    async def run(self, units: Iterator[Unit], sidecar: Optional[Callable[[], None]]) -> None:
        try:
            self.targets = Targets(self.s)
        except (OSError, ValueError) as e:  # an unreadable --ca-file, --cert-file without --key-file
            raise UsageError(f"channel options: {e}") from None
        reporter = asyncio.create_task(progress_lines(self, sidecar))
        try:
            queue: asyncio.Queue = asyncio.Queue(maxsize=self.s.concurrency)
            async with asyncio.TaskGroup() as tg:
                for _ in range(self.s.concurrency):
                    tg.create_task(self.worker(queue))
                tg.create_task(self.produce(units, queue))
        finally:
            reporter.cancel()
            await self.targets.close()


def translate_file(s: Settings) -> dict:
    """Run one translate-file job; returns the summary (raises UsageError before any request)."""
    stats = Stats()
    scan = scan_input(s.input)
    stats.total_lines = 1 if s.whole_file else scan["lines"]
    fmt = None
    if not s.whole_file:
        fmt = input_format(s)
    if s.output is not None:
        stats.resumed_from, stats.errors_before = prepare_output(s, scan)
    elif s.errors_file is not None and s.errors_file.exists():
        s.errors_file.unlink()

    out = open(s.output, "a", encoding="utf-8", newline="") if s.output is not None else sys.stdout
    errors_out = open(s.errors_file, "a", encoding="utf-8", newline="") if s.errors_file is not None else None
    run = Run(s, stats, out, errors_out)

    def sidecar() -> None:
        write_sidecar(s, scan, stats)

    if s.whole_file:
        units: Iterator[Unit] = iter([] if stats.resumed_from else [whole_file_unit(s)])
    else:
        units = read_units(s, fmt, stats.resumed_from)
    if s.max_lines is not None:
        remaining = stats.total_lines - stats.resumed_from
        if s.max_lines < remaining:
            stats.stopped = f"--max-lines {s.max_lines}"
        units = itertools.islice(units, s.max_lines)
    sidecar()
    run.bar = progress_bar(s, stats)
    interrupted = False
    stats.started = time.monotonic()
    try:
        asyncio.run(run.run(units, sidecar if s.output is not None else None))
    except KeyboardInterrupt:
        interrupted = True
        stats.stopped = "interrupted"
    finally:
        run.drain()
        stats.unwritten = len(run.results)
        stats.seconds = time.monotonic() - stats.started
        if run.bar is not None:
            run.bar.close()
        if out is not sys.stdout:
            out.close()
        else:
            out.flush()
        if errors_out is not None:
            errors_out.close()
            if s.errors_file.stat().st_size == 0:
                s.errors_file.unlink()
        sidecar()
    summary = build_summary(s, stats, run)
    summary["interrupted"] = interrupted
    return summary
