"""translate-file --server-side: the whole file sent in one TranslateFile call; the server reads, translates
and rebuilds it, and streams its progress.

    python -m client translate-file report.docx -o report.de.docx --target-language de --server-side

Beside the default document path (document.py: the file read here, its texts sent in Translate
calls): nothing of the server is needed here (no serve extra), the file crosses the network once
each way instead of as texts, and the server's document bounds and job queue apply. What it gives
up: one call to one server for the whole file (--timeout bounds all of it), no per-segment errors
(a file either comes back whole or the call fails), and files up to the server's file limit.
"""
from __future__ import annotations

import sys
import time

import grpc

from protos.nmt.v1 import translator_pb2 as pb

from .output import write_output
from .settings import Settings, UsageError


def translate_on_server(s: Settings) -> dict:
    from client.client import TranslatorClient
    if s.output is not None and s.output.exists() and not s.overwrite:
        raise UsageError(f"{s.output} exists: a document is written whole, once (no resume); use --overwrite")
    data = s.input.read_bytes()
    started = time.monotonic()
    last: dict = {"segments": 0, "characters": 0, "done": 0, "line": 0.0, "shown": None}

    def progress(message) -> None:
        last.update(segments=message.segments_total, characters=message.billed_characters,
                    done=message.segments_done)
        if not s.progress:
            return
        now = time.monotonic()
        shown = (message.status, message.segments_done)
        done = message.status == pb.FILE_STATUS_DONE
        if shown != last["shown"] and (last["shown"] is None or done or now - last["line"] >= s.progress_interval):
            last["shown"], last["line"] = shown, now
            status = pb.FileStatus.Name(message.status).removeprefix("FILE_STATUS_").lower()
            print(f"translate-file: {status}: {message.segments_done}/{message.segments_total} segments, "
                  f"~{message.seconds_remaining} s left", file=sys.stderr)

    stopped, interrupted, content = "", False, None
    target = ",".join(s.targets)  # several: balanced by the client's channel, as any call
    try:
        with TranslatorClient(target, timeout=s.timeout, retries=s.retries, backoff=s.backoff, **s.channel) as c:
            content = c.translate_file(s.input.name, data, target_language=s.target_language,
                                       source_language=s.source_language, timeout=s.timeout, progress=progress)
    except grpc.RpcError as e:
        stopped = f"{e.code().name}: {e.details()}"
    except KeyboardInterrupt:
        interrupted, stopped = True, "interrupted"
    if content is not None:
        write_output(content, s.output)
    written = content is not None
    return {"document": True, "server_side": True, "input": str(s.input),
            "output": str(s.output) if s.output is not None else "-", "format": "document", "targets": s.targets,
            "segments": last["segments"], "translated": last["done"] if written else 0,
            "characters": last["characters"], "seconds": round(time.monotonic() - started, 3),
            "errors": 0 if written or interrupted else 1, "errors_total": 0 if written or interrupted else 1,
            "error_records": [], "retries": 0, "retries_exhausted": False, "stopped": stopped,
            "complete": written, "interrupted": interrupted}
