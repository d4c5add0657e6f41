"""translate-file for document formats: read here with the server's own readers, translated over gRPC.

    python -m client translate-file report.docx -o report.de.docx --target-language de

.docx .pptx .xlsx .odt .odp .ods .srt .xlf/.xliff .po/.pot .html/.htm (`--format document`, chosen
by extension; .txt stays the line format, `--format document` reads it as one document). The file
is checked and read by server/files/ in this process (the same checks and formatting rules as the
server's /v2/document, /translate_file and /v1/files), its segments are sent in Translate calls
of --batch-size texts, --concurrency at a time, over the targets (mime_type text/html: each
segment carries its formatting runs as inline tags the server keeps), with the usual retries,
and the file is rebuilt and written once, whole (a temporary file renamed over OUTPUT): no resume.
A segment whose call fails for another reason than UNAVAILABLE/RESOURCE_EXHAUSTED stays in its
source language, is listed in the summary and makes the exit status 1.

Why here rather than through the HTTP upload: the client speaks gRPC to one or more targets with
TLS and keys already, and a document is only its segments for the server; the HTTP endpoints are
for clients of DeepL's and LibreTranslate's APIs and for callers without this client.
"""
from __future__ import annotations

import asyncio
import sys
import time

import grpc

from .output import write_output
from .settings import Settings, UsageError
from .targets import RETRY_CODES, Targets

BATCH_CHARS = 6_000


def translate_document(s: Settings) -> dict:
    if s.server_side:
        from .server_side import translate_on_server
        return translate_on_server(s)
    try:
        from server.files import FileError, read
    except ImportError as e:
        raise UsageError(f"document formats need the serve extra (pip install 'nmt-serve[serve]'): {e}") from None
    if s.output is not None and s.output.exists() and not s.overwrite:
        raise UsageError(f"{s.output} exists: a document is written whole, once (no resume); use --overwrite")
    try:
        document = read(s.input.name, s.input.read_bytes())
    except FileError as e:
        raise UsageError(f"{s.input}: {e}") from None
    started = time.monotonic()
    out = list(document.segments)
    errors: list[dict] = []
    interrupted, exhausted, stopped = False, False, ""
    targets = None

    async def run() -> None:
        nonlocal targets, exhausted, stopped
        targets = Targets(s)
        gate = asyncio.Semaphore(s.concurrency)
        texts = document.texts()
        wanted = [i for i, t in enumerate(texts) if t.strip()]
        batches, current, size = [], [], 0
        for i in wanted:
            if current and (len(current) >= s.batch_size or size + len(out[i]) > BATCH_CHARS):
                batches.append(current)
                current, size = [], 0
            current.append(i)
            size += len(out[i])
        if current:
            batches.append(current)
        mime = "text/html" if document.markup else ""

        async def one(batch: list[int]) -> None:
            nonlocal exhausted, stopped
            async with gate:
                if exhausted:
                    return
                try:
                    resp = await targets.translate([document.segments[i] for i in batch], mime_type=mime)
                except grpc.aio.AioRpcError as e:
                    if e.code() in RETRY_CODES:
                        exhausted, stopped = True, f"{e.code().name} after {s.retries} retries: {e.details()}"
                        return
                    if len(batch) > 1:
                        for i in batch:
                            await one_alone(i)
                        return
                    errors.append({"line": batch[0] + 1, "code": e.code().name, "message": e.details() or "",
                                   "text": texts[batch[0]][:200]})
                    return
            for i, tr in zip(batch, resp.translations):
                if tr.hypotheses:
                    out[i] = tr.hypotheses[0].text

        async def one_alone(i: int) -> None:
            try:
                resp = await targets.translate([document.segments[i]], mime_type=mime)
                if resp.translations and resp.translations[0].hypotheses:
                    out[i] = resp.translations[0].hypotheses[0].text
            except grpc.aio.AioRpcError as e:
                errors.append({"line": i + 1, "code": e.code().name, "message": e.details() or "",
                               "text": texts[i][:200]})
        try:
            await asyncio.gather(*(one(b) for b in batches))
        finally:
            await targets.close()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        interrupted, stopped = True, "interrupted"
    written = not interrupted and not exhausted
    if written:
        write_output(document.rebuild(out, s.target_language), s.output)
    seconds = time.monotonic() - started
    total = len(document.segments)
    translated = sum(1 for t in document.texts() if t.strip()) - len(errors) if written else 0
    return {"document": True, "input": str(s.input), "output": str(s.output) if s.output is not None else "-",
            "format": "document", "targets": s.targets, "segments": total, "translated": translated,
            "characters": sum(map(len, document.texts())), "seconds": round(seconds, 3),
            "errors": len(errors), "errors_total": len(errors),
            "error_records": sorted(errors, key=lambda r: r["line"]),
            "retries": targets.retries if targets else 0, "retries_exhausted": exhausted, "stopped": stopped,
            "complete": written, "interrupted": interrupted}


def print_document_summary(sm: dict) -> None:
    print(f"translate-file: {sm['input']}: {sm['segments']} segments ({sm['characters']} characters), "
          f"{sm['translated']} translated in {sm['seconds']:.1f} s, {sm['errors']} errors, {sm['retries']} retries",
          file=sys.stderr)
    state = "written" if sm["complete"] else f"not written ({sm['stopped']})"
    print(f"translate-file: {sm['output']}: {state}", file=sys.stderr)
    for rec in sm["error_records"][:10]:
        print(f"  segment {rec['line']}: {rec['code']}: {rec['message'][:200]} (left untranslated)", file=sys.stderr)
