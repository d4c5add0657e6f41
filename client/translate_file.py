"""`python -m client translate-file`: translate a whole file through one or more servers.

    python -m client translate-file corpus.txt -o corpus.de.txt --target a:50051,b:50051 --concurrency 8
    python -m client translate-file docs.jsonl --field body --output-field body_de
    python -m client translate-file pairs.tsv --column src      # a header name: the first row is a header

Input formats (--format, `auto` picks by extension: .jsonl/.ndjson, .tsv, else text):
  text   one document per line; --whole-file makes the whole file one text
  jsonl  one JSON object per line; translates --field, writes the object back with --output-field set
  tsv    tab-separated rows; translates --column (1-based, as `cut -f`, or a header name) and appends
         the translation as a new last column

Every input line gives exactly one output line, in input order; empty lines and empty texts pass
through untranslated. Requests carry --batch-size texts each, at most --concurrency in flight,
spread round-robin over the targets. UNAVAILABLE and RESOURCE_EXHAUSTED are retried (--retries,
exponential back-off with jitter, on another target when there is one); when the retries run
out the run stops there (exit 1) and a rerun resumes. Any other error fails only the lines
concerned: each is written to OUTPUT.errors.jsonl, the output gets a placeholder (an empty line,
an empty TSV cell, a JSON null) so that lines stay aligned, and the run exits 1.

Resuming: the output is written in input order as lines complete, so its number of complete
lines is the number of input lines done. A rerun with the same INPUT and OUTPUT cuts any partial
last line, skips that many input lines and appends; OUTPUT.progress records the input's size and
checksum and the settings that shape the output, and a rerun with different ones is refused
(exit 2) unless --overwrite, which starts over. See docs/translate_file.md.
"""
from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import os
import sys
import time
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import grpc

from client import client as library
from client.client import AsyncTranslatorClient, _backoff

# Retried here, on the next target when there is one; every other code fails the lines concerned.
RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)
SIDECAR_VERSION = 1
HEAD_BYTES = 1 << 20  # the input fingerprint hashes this much of its head
MAX_ERROR_TEXT = 10_000  # characters of a failed text kept in its error record
MAX_LISTED_ERRORS = 100  # error line numbers listed in the summary
# The global options that shape a channel (TLS, API key), passed on to each target's client when given.
CHANNEL_ARGS = ("tls", "ca_file", "cert_file", "key_file", "server_name", "api_key")


class UsageError(Exception):
    """Arguments or files that make the run impossible: exit 2 before any request."""


# ---------------------------------------------------------------------------------------------
# Arguments

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="INPUT", help="file to translate")
    p.add_argument("-o", "--output", help="output file ('-' = stdout: no resume); "
                                          "default: INPUT with '.translated' before its extension")
    p.add_argument("--format", choices=("auto", "text", "jsonl", "tsv"), default="auto",
                   help="input format; auto: .jsonl/.ndjson = jsonl, .tsv = tsv, anything else = text")
    p.add_argument("--whole-file", action="store_true", help="text: the whole file is one text")
    p.add_argument("--field", default="text", help="jsonl: the field to translate")
    p.add_argument("--output-field", default="translation",
                   help="jsonl: the field the translation goes to (added or overwritten); tsv: the header "
                        "of the appended column")
    p.add_argument("--column", default="1",
                   help="tsv: the column to translate, 1-based (as cut -f) or a header name (then the first "
                        "row is a header)")
    p.add_argument("--header", action="store_true",
                   help="tsv: the first row is a header (implied by a --column name); it gets --output-field "
                        "appended")
    p.add_argument("--target", dest="file_targets", action="append", metavar="HOST:PORT",
                   help="server; repeat or comma-separate for several (requests go round-robin); "
                        "default: the global --target")
    p.add_argument("--concurrency", type=int, default=4, help="Translate calls in flight")
    p.add_argument("--batch-size", type=int, default=16, help="texts per Translate call")
    p.add_argument("--model", default="", help="model name; empty = the server's default")
    p.add_argument("--beam", type=int, default=0, help="beam size; 0 = greedy")
    p.add_argument("--source-language", default="")
    p.add_argument("--target-language", default="")
    p.add_argument("--timeout", dest="file_timeout", type=float, metavar="SECONDS",
                   help="deadline of each attempt in seconds; default: the global --timeout")
    p.add_argument("--retries", type=int, default=10,
                   help="retries of a call after UNAVAILABLE or RESOURCE_EXHAUSTED")
    p.add_argument("--backoff", type=float, default=0.2,
                   help="first back-off in seconds; doubles per retry, with jitter (x0.5-1)")
    p.add_argument("--max-backoff", type=float, default=10.0, help="longest back-off in seconds")
    p.add_argument("--max-lines", type=int, help="stop after this many input lines in this run (resumable)")
    p.add_argument("--max-errors", type=int, default=0,
                   help="stop dispatching once this many lines failed in this run; 0 = never")
    p.add_argument("--overwrite", action="store_true", help="start over instead of resuming")
    p.add_argument("--errors-file", help="failed lines as JSON records (default OUTPUT.errors.jsonl; "
                                         "with -o -: none, the summary lists them)")
    p.add_argument("--summary-json", help="also write the summary to this file as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    p.add_argument("--progress-interval", type=float, default=10.0,
                   help="seconds between progress lines when stderr is not a terminal")


@dataclass
class Settings:
    input: Path
    output: Optional[Path]  # None = stdout
    format: str
    whole_file: bool
    field: str
    output_field: str
    column: str
    header: bool
    targets: list[str]
    concurrency: int
    batch_size: int
    model: str
    beam: int
    source_language: str
    target_language: str
    timeout: Optional[float]
    retries: int
    backoff: float
    max_backoff: float
    max_lines: Optional[int]
    max_errors: int
    overwrite: bool
    errors_file: Optional[Path]
    summary_json: Optional[Path]
    progress: bool
    progress_interval: float
    channel: dict = dc_field(default_factory=dict)  # CHANNEL_ARGS given on the command line

    def shaping(self) -> dict:
        """The settings that decide what the output holds: a resumed run must have the same ones."""
        return dict(format=self.format, whole_file=self.whole_file, field=self.field,
                    output_field=self.output_field, column=self.column, header=self.header, model=self.model,
                    beam=self.beam, source_language=self.source_language, target_language=self.target_language)


def settings_from_args(args: argparse.Namespace) -> Settings:
    src = Path(args.input)
    if not src.is_file():
        raise UsageError(f"{src}: not a regular file (the input is read twice: stdin and pipes will not do)"
                         if src.exists() else f"{src}: no such file")
    fmt = args.format
    if fmt == "auto":
        fmt = {".jsonl": "jsonl", ".ndjson": "jsonl", ".tsv": "tsv"}.get(src.suffix.lower(), "text")
    if args.whole_file and fmt != "text":
        raise UsageError("--whole-file is for the text format")
    if args.output == "-":
        out = None
    elif args.output:
        out = Path(args.output)
    else:
        out = src.with_name(f"{src.stem}.translated{src.suffix}")
    if out is not None and out.exists() and out.resolve() == src.resolve():
        raise UsageError("OUTPUT is INPUT")
    targets = [t.strip() for spec in (args.file_targets or [args.target]) for t in spec.split(",") if t.strip()]
    if not targets:
        raise UsageError("no --target")
    for name in ("concurrency", "batch_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be >= 1")
    if args.retries < 0 or args.backoff < 0 or args.max_backoff < 0:
        raise UsageError("--retries, --backoff and --max-backoff must be >= 0")
    if args.max_lines is not None and args.max_lines < 0:
        raise UsageError("--max-lines must be >= 0")
    header = args.header or (fmt == "tsv" and not args.column.isdigit())
    if fmt == "tsv" and args.column.isdigit() and int(args.column) < 1:
        raise UsageError("--column counts from 1")
    errors = Path(args.errors_file) if args.errors_file else \
        (None if out is None else out.with_name(out.name + ".errors.jsonl"))
    return Settings(input=src, output=out, format=fmt, whole_file=args.whole_file, field=args.field,
                    output_field=args.output_field, column=args.column, header=header, targets=targets,
                    concurrency=args.concurrency, batch_size=args.batch_size, model=args.model, beam=args.beam,
                    source_language=args.source_language, target_language=args.target_language,
                    timeout=args.file_timeout if args.file_timeout is not None else args.timeout,
                    retries=args.retries, backoff=args.backoff, max_backoff=args.max_backoff,
                    max_lines=args.max_lines, max_errors=args.max_errors, overwrite=args.overwrite,
                    errors_file=errors, summary_json=Path(args.summary_json) if args.summary_json else None,
                    progress=not args.no_progress, progress_interval=args.progress_interval,
                    channel={k: v for k in CHANNEL_ARGS if (v := getattr(args, k, None))})


# ---------------------------------------------------------------------------------------------
# Formats: one input line -> a Unit (a text to translate, or a finished output line), and back

@dataclass
class Unit:
    index: int  # 0-based input line
    text: Optional[str] = None  # to translate; None = `line` is final
    line: Optional[str] = None  # the output line (no newline) once known
    error: Optional[dict] = None  # set when the line failed
    state: Any = None  # what the format needs to render the line: the raw line, a parsed object
    render: Optional[Callable[[Optional[str]], str]] = None  # translation (None = failed) -> output line
    output_tokens: int = 0


def _flat(text: str, *, tabs: bool = False) -> str:
    """A translation on one line (and one TSV cell): line breaks (and tabs) become spaces."""
    for ch in ("\r\n", "\n", "\r", "\t") if tabs else ("\r\n", "\n", "\r"):
        text = text.replace(ch, " ")
    return text


def _failed(index: int, code: str, message: str, text: Optional[str]) -> dict:
    rec = {"line": index + 1, "code": code, "message": message}
    if text is not None:
        rec["text"] = text if len(text) <= MAX_ERROR_TEXT else text[:MAX_ERROR_TEXT] + "…"
    return rec


class TextFormat:
    def unit(self, index: int, raw: str) -> Unit:
        if not raw.strip():
            return Unit(index, line=raw)
        return Unit(index, text=raw, render=lambda t: "" if t is None else _flat(t))


class JsonlFormat:
    def __init__(self, field: str, output_field: str):
        self.field, self.output_field = field, output_field

    def unit(self, index: int, raw: str) -> Unit:
        if not raw.strip():
            return Unit(index, line=raw)
        try:
            obj = json.loads(raw)
        except ValueError as e:
            return Unit(index, line=raw, error=_failed(index, "BAD_INPUT", f"not JSON: {e}", None))
        if not isinstance(obj, dict):
            return Unit(index, line=raw, error=_failed(index, "BAD_INPUT", "not a JSON object", None))
        value = obj.get(self.field)
        problem = f"no field {self.field!r}" if self.field not in obj else \
            None if isinstance(value, str) else f"field {self.field!r} is not a string"
        if problem:
            obj[self.output_field] = None
            return Unit(index, line=self._dump(obj), error=_failed(index, "BAD_INPUT", problem, None))
        if not value.strip():
            obj[self.output_field] = ""
            return Unit(index, line=self._dump(obj))

        def render(t: Optional[str]) -> str:
            obj[self.output_field] = t  # None (null) when the line failed
            return self._dump(obj)
        return Unit(index, text=value, render=render)

    @staticmethod
    def _dump(obj: dict) -> str:
        return json.dumps(obj, ensure_ascii=False)  # escapes line breaks: one object stays one line


class TsvFormat:
    def __init__(self, column: int, header: bool, output_field: str):
        self.column, self.header, self.output_field = column, header, output_field

    def unit(self, index: int, raw: str) -> Unit:
        if index == 0 and self.header:
            return Unit(index, line=f"{raw}\t{self.output_field}")
        if not raw:
            return Unit(index, line=raw)
        cells = raw.split("\t")
        if self.column >= len(cells):
            return Unit(index, line=raw + "\t", error=_failed(
                index, "BAD_INPUT", f"row has {len(cells)} columns; --column is {self.column + 1}", raw))
        text = cells[self.column]
        if not text.strip():
            return Unit(index, line=raw + "\t")
        return Unit(index, text=text, render=lambda t: raw + "\t" + ("" if t is None else _flat(t, tabs=True)))


def tsv_column(s: Settings) -> int:
    """--column as a 0-based index; a name is looked up in the header (the input's first line)."""
    if s.column.isdigit():
        return int(s.column) - 1
    with open(s.input, "rb") as f:
        first = _decode(f.readline(), 0)
    names = first.split("\t")
    if s.column not in names:
        raise UsageError(f"--column {s.column!r} is not in the header: {names}")
    return names.index(s.column)


def _decode(raw: bytes, index: int) -> str:
    """One input line as text: without its line ending (\\n or \\r\\n), the file's BOM dropped."""
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if raw.endswith(b"\r"):
        raw = raw[:-1]
    text = raw.decode("utf-8")
    return text[1:] if index == 0 and text.startswith("\ufeff") else text


def read_units(s: Settings, fmt, skip: int) -> Iterator[Unit]:
    with open(s.input, "rb") as f:
        for index, raw in enumerate(f):
            if index < skip:
                continue
            try:
                text = _decode(raw, index)
            except UnicodeDecodeError as e:
                yield Unit(index, line="", error=_failed(index, "BAD_INPUT", f"not UTF-8: {e}", None))
                continue
            yield fmt.unit(index, text)


def whole_file_unit(s: Settings) -> Unit:
    raw = s.input.read_bytes()
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        return Unit(0, line="", error=_failed(0, "BAD_INPUT", f"not UTF-8: {e}", None))
    if not text.strip():
        return Unit(0, line=text.rstrip("\n"))
    return Unit(0, text=text, render=lambda t: "" if t is None else t.rstrip("\n"))


# ---------------------------------------------------------------------------------------------
# Files: the input's fingerprint, the output's complete lines, the progress sidecar

def scan_input(path: Path) -> dict:
    """Lines (a last line without a newline counts), size and a checksum of the head."""
    lines = size = 0
    head = hashlib.sha256()
    last = b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            if size < HEAD_BYTES:
                head.update(chunk[:HEAD_BYTES - size])
            lines += chunk.count(b"\n")
            size += len(chunk)
            last = chunk[-1:]
    if last != b"\n":
        lines += 1
    return {"bytes": size, "head_sha256": head.hexdigest(), "lines": lines}


def complete_lines(path: Path) -> tuple[int, int]:
    """(newline-terminated lines, the byte offset just past the last of them)."""
    lines = end = pos = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n = chunk.count(b"\n")
            if n:
                lines += n
                end = pos + chunk.rindex(b"\n") + 1
            pos += len(chunk)
    return lines, end


def sidecar_path(out: Path) -> Path:
    return out.with_name(out.name + ".progress")


def write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def prepare_output(s: Settings, scan: dict) -> tuple[int, int]:
    """Where this run starts: (input lines already done, error records kept). Cuts a partial last
    line off the output, drops error records past it; refuses a resume that would mix settings."""
    out, side = s.output, sidecar_path(s.output)
    fresh = s.overwrite or not out.exists() or (out.stat().st_size == 0 and not side.exists())
    if fresh:
        for p in (out, side) + ((s.errors_file,) if s.errors_file else ()):
            if p.exists():
                p.unlink()
        return 0, 0
    if not side.exists():
        raise UsageError(f"{out} exists and has no {side.name} (not written by translate-file): "
                         "use --overwrite to replace it, or another -o")
    try:
        state = json.loads(side.read_text(encoding="utf-8"))
    except ValueError as e:
        raise UsageError(f"{side}: unreadable ({e}); use --overwrite") from None
    mine = {"input": str(s.input.resolve()), "input_bytes": scan["bytes"], "input_head_sha256": scan["head_sha256"],
            "settings": s.shaping()}
    theirs = {k: state.get(k) for k in mine}
    if theirs != mine:
        diff = [k for k in mine if theirs[k] != mine[k]]
        if "settings" in diff:
            diff += [f"{k}: {state['settings'].get(k)!r} -> {v!r}" for k, v in s.shaping().items()
                     if (state.get("settings") or {}).get(k) != v]
        raise UsageError(f"{out} was written from another input or with other settings ({', '.join(diff)}); "
                         "use --overwrite to start over")
    if s.whole_file:
        if state.get("complete"):
            return 1, _keep_errors(s, 1)
        out.unlink()
        return 0, _keep_errors(s, 0)
    done, end = complete_lines(out)
    if done > scan["lines"]:
        raise UsageError(f"{out} has {done} lines, more than {s.input} ({scan['lines']}); use --overwrite")
    with open(out, "r+b") as f:
        f.truncate(end)
    return done, _keep_errors(s, done)


def _keep_errors(s: Settings, done: int) -> int:
    """Error records of lines the output already holds stay; later ones go (those lines run again)."""
    if not s.errors_file or not s.errors_file.exists():
        return 0
    kept = []
    for line in s.errors_file.read_text(encoding="utf-8").splitlines():
        try:
            if json.loads(line)["line"] <= done:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue  # a record cut short by a kill
    if kept:
        s.errors_file.write_text("".join(x + "\n" for x in kept), encoding="utf-8")
    else:
        s.errors_file.unlink()
    return len(kept)


# ---------------------------------------------------------------------------------------------
# Calls: per-target clients, round-robin, retries with back-off

class Targets:
    """One AsyncTranslatorClient (one channel) per target, taken round-robin. A target that answered
    UNAVAILABLE or RESOURCE_EXHAUSTED is passed over for a back-off that doubles with each failure
    in a row, while another one is available; the client library's own retries are off (retries=0)
    so that a retry can go to another target."""

    def __init__(self, s: Settings):
        self.s = s
        self.clients = [AsyncTranslatorClient(t, timeout=s.timeout, retries=0, **s.channel) for t in s.targets]
        self.names = list(s.targets)
        self.turn = 0
        self.down_until = [0.0] * len(self.clients)
        self.failures = [0] * len(self.clients)
        self.retries = 0
        self.calls = [0] * len(self.clients)

    def pause(self, attempt: int) -> float:
        """The client library's back-off (base x 2^attempt x U(0.5, 1)), capped at --max-backoff."""
        attempt = min(attempt, 60)
        if self.s.backoff * 2 ** attempt <= self.s.max_backoff:
            return _backoff(attempt, self.s.backoff)
        return _backoff(0, self.s.max_backoff)

    @staticmethod
    def advised(err) -> Optional[float]:
        """The wait a RESOURCE_EXHAUSTED's google.rpc.RetryInfo asks for, read by the client library
        where it can (client.client.retry_delay); None without one (a full queue gives none)."""
        read = getattr(library, "retry_delay", None)
        if read is None or err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            return None
        try:
            return read(err)
        except Exception:  # noqa: BLE001 (malformed details: no advice, the back-off still applies)
            return None

    def pick(self) -> int:
        now = time.monotonic()
        n = len(self.clients)
        for k in range(n):
            i = (self.turn + k) % n
            if self.down_until[i] <= now:
                break
        else:
            i = min(range(n), key=self.down_until.__getitem__)
        self.turn = (i + 1) % n
        return i

    async def translate(self, texts: list[str]):
        s = self.s
        attempt = 0
        while True:
            i = self.pick()
            self.calls[i] += 1
            try:
                resp = await self.clients[i].translate(
                    texts, model=s.model, timeout=s.timeout, source_language=s.source_language,
                    target_language=s.target_language, beam_size=s.beam)
                self.failures[i] = 0
                return resp
            except grpc.aio.AioRpcError as e:
                if e.code() not in RETRY_CODES or attempt >= s.retries:
                    raise
                self.down_until[i] = time.monotonic() + self.pause(self.failures[i])
                self.failures[i] += 1
                self.retries += 1
                attempt += 1
                advised = self.advised(e)  # a rate limit's RetryInfo: its wait is the least we wait
                if advised or all(t > time.monotonic() for t in self.down_until):
                    await asyncio.sleep(max(self.pause(attempt - 1), advised or 0.0))

    async def close(self) -> None:
        for c in self.clients:
            await c.close()


# ---------------------------------------------------------------------------------------------
# The run

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
                u.error = _failed(u.index, e.code().name, e.details() or "", u.text)
                u.line = u.render(None)
                self.done(u)
            return
        if len(resp.translations) != len(units):
            for u in units:
                u.error = _failed(u.index, "BAD_RESPONSE", f"{len(resp.translations)} translations for "
                                  f"{len(units)} texts", u.text)
                u.line = u.render(None)
                self.done(u)
            return
        for u, tr in zip(units, resp.translations):
            if not tr.hypotheses:
                u.error = _failed(u.index, "BAD_RESPONSE", "no hypothesis", u.text)
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

    async def report(self, sidecar: Optional[Callable[[], None]]) -> None:
        """Every --progress-interval: a progress line (when stderr is no terminal) and the sidecar."""
        s, st = self.s, self.stats
        every = max(s.progress_interval, 0.05) if self.bar is None and s.progress else 2.0
        while True:
            await asyncio.sleep(every)
            if sidecar is not None:
                sidecar()
            if self.bar is not None:
                self.bar.set_postfix(errors=st.errors, retries=self.targets.retries)
            elif s.progress:
                rate = st.lines / max(time.monotonic() - st.started, 1e-9)
                done = st.resumed_from + st.lines
                print(f"translate-file: {done}/{st.total_lines} lines ({100 * done / max(st.total_lines, 1):.1f}%), "
                      f"{rate:.1f} lines/s, {st.errors} errors, {self.targets.retries} retries",
                      file=sys.stderr, flush=True)

    async def run(self, units: Iterator[Unit], sidecar: Optional[Callable[[], None]]) -> None:
        try:
            self.targets = Targets(self.s)
        except (OSError, ValueError) as e:  # an unreadable --ca-file, --cert-file without --key-file
            raise UsageError(f"channel options: {e}") from None
        reporter = asyncio.create_task(self.report(sidecar))
        try:
            queue: asyncio.Queue = asyncio.Queue(maxsize=self.s.concurrency)
            async with asyncio.TaskGroup() as tg:
                for _ in range(self.s.concurrency):
                    tg.create_task(self.worker(queue))
                tg.create_task(self.produce(units, queue))
        finally:
            reporter.cancel()
            await self.targets.close()


def _progress_bar(s: Settings, stats: Stats):
    if not s.progress or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the client installs without it: progress lines instead
        return None
    return tqdm(total=stats.total_lines, initial=stats.resumed_from, unit="line", file=sys.stderr,
                dynamic_ncols=True, desc="translate-file")


def translate_file(s: Settings) -> dict:
    """Run one translate-file job; returns the summary (raises UsageError before any request)."""
    stats = Stats()
    scan = scan_input(s.input)
    stats.total_lines = 1 if s.whole_file else scan["lines"]
    fmt = None
    if not s.whole_file:
        fmt = {"text": lambda: TextFormat(), "jsonl": lambda: JsonlFormat(s.field, s.output_field),
               "tsv": lambda: TsvFormat(tsv_column(s), s.header, s.output_field)}[s.format]()
    if s.output is not None:
        stats.resumed_from, stats.errors_before = prepare_output(s, scan)
    elif s.errors_file is not None and s.errors_file.exists():
        s.errors_file.unlink()

    out = open(s.output, "a", encoding="utf-8", newline="") if s.output is not None else sys.stdout
    errors_out = open(s.errors_file, "a", encoding="utf-8", newline="") if s.errors_file is not None else None
    run = Run(s, stats, out, errors_out)

    def sidecar() -> None:
        if s.output is None:
            return
        done = stats.resumed_from + stats.lines
        write_json_atomic(sidecar_path(s.output), {
            "version": SIDECAR_VERSION, "input": str(s.input.resolve()), "input_bytes": scan["bytes"],
            "input_head_sha256": scan["head_sha256"], "input_lines": stats.total_lines,
            "settings": s.shaping(), "lines_done": done, "complete": done >= stats.total_lines,
            "errors": stats.errors_before + stats.errors})

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
    run.bar = _progress_bar(s, stats)
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
    summary = _summary(s, stats, run)
    summary["interrupted"] = interrupted
    return summary


def _summary(s: Settings, st: Stats, run: Run) -> dict:
    done = st.resumed_from + st.lines
    return {
        "input": str(s.input), "output": str(s.output) if s.output is not None else "-",
        "format": "text (whole file)" if s.whole_file else s.format, "targets": s.targets,
        "calls_per_target": dict(zip(run.targets.names, run.targets.calls)) if run.targets else {},
        "lines": st.lines, "translated": st.translated, "passed_through": st.passthrough,
        "input_characters": st.input_characters, "output_tokens": st.output_tokens,
        "seconds": round(st.seconds, 3), "lines_per_second": round(st.lines / st.seconds, 1) if st.seconds else 0.0,
        "errors": st.errors, "errors_total": st.errors_before + st.errors,
        "retries": run.targets.retries if run.targets else 0, "unwritten": st.unwritten,
        "resumed_from": st.resumed_from, "lines_done": done, "input_lines": st.total_lines,
        "complete": done >= st.total_lines, "stopped": st.stopped, "retries_exhausted": st.unavailable,
        "errors_file": str(s.errors_file) if s.errors_file and s.errors_file.exists() else None,
        "error_records": st.error_lines,
    }


def print_summary(summary: dict) -> None:
    sm = summary
    state = "complete" if sm["complete"] else f"{sm['lines_done']} of {sm['input_lines']} lines done" + \
        (f", stopped: {sm['stopped']}" if sm["stopped"] else "")
    print(f"translate-file: {sm['lines']} lines in {sm['seconds']:.1f} s ({sm['lines_per_second']} lines/s): "
          f"{sm['translated']} translated, {sm['passed_through']} passed through, {sm['errors']} errors, "
          f"{sm['retries']} retries; {sm['input_characters']} input characters, {sm['output_tokens']} output "
          f"tokens", file=sys.stderr)
    resumed = f", resumed at line {sm['resumed_from'] + 1}" if sm["resumed_from"] else ""
    unwritten = f" ({sm['unwritten']} lines done out of order not written: a rerun sends them again)" \
        if sm["unwritten"] else ""
    print(f"translate-file: {sm['output']}: {state}{resumed}{unwritten}", file=sys.stderr)
    if sm["errors_total"]:
        where = sm["errors_file"] or "not written (no errors file)"
        print(f"translate-file: {sm['errors_total']} failed lines; records: {where}", file=sys.stderr)
        for rec in sm["error_records"][:10]:
            print(f"  line {rec['line']}: {rec['code']}: {rec['message'][:200]}", file=sys.stderr)


def main_args(args: argparse.Namespace) -> int:
    """The CLI's translate-file command: 0 done, 1 lines failed, 2 bad arguments, 130 interrupted."""
    try:
        s = settings_from_args(args)
        summary = translate_file(s)
    except UsageError as e:
        print(f"translate-file: {e}", file=sys.stderr)
        return 2
    print_summary(summary)
    if s.summary_json is not None:
        write_json_atomic(s.summary_json, summary)
    if summary["interrupted"]:
        return 130
    return 1 if summary["errors_total"] or summary["retries_exhausted"] or \
        summary["stopped"].startswith("--max-errors") else 0
