"""translate-file's settings: the parsed arguments checked and resolved (format, output, targets)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Optional

# The global options that shape a channel (TLS, API key), passed on to each target's client when given.
CHANNEL_ARGS = ("tls", "ca_file", "cert_file", "key_file", "server_name", "api_key")


class UsageError(Exception):
    """Arguments or files that make the run impossible: exit 2 before any request."""


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
    server_side: bool = False  # a document sent whole to TranslateFile (server_side.py)

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
    server_side = getattr(args, "server_side", False)
    if server_side:  # the server reads the file, by its extension: a document whatever it is here
        if fmt not in ("auto", "document"):
            raise UsageError("--server-side sends a document file whole: it is for --format auto or document")
        fmt = "document"
    if fmt == "auto":
        fmt = {".jsonl": "jsonl", ".ndjson": "jsonl", ".tsv": "tsv"}.get(src.suffix.lower(), "text")
        if fmt == "text" and src.suffix.lower() in document_extensions():
            fmt = "document"
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
                    channel={k: v for k in CHANNEL_ARGS if (v := getattr(args, k, None))}, server_side=server_side)


def document_extensions() -> set[str]:
    """Extensions the auto format reads as documents (.txt stays the line format)."""
    try:
        from server.files import extensions
    except ImportError:  # the client installed without the serve extra: no document formats
        return set()
    return {e for e in extensions() if e != ".txt"}
