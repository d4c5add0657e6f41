"""Resuming: the input's fingerprint, the output's complete lines, the progress sidecar."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from .settings import Settings, UsageError

if TYPE_CHECKING:
    from .runner import Stats

SIDECAR_VERSION = 1
HEAD_BYTES = 1 << 20  # the input fingerprint hashes this much of its head


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


def write_sidecar(s: Settings, scan: dict, stats: Stats) -> None:
    """OUTPUT.progress: what a rerun checks before it resumes, and how far this run got."""
    if s.output is None:
        return
    done = stats.resumed_from + stats.lines
    write_json_atomic(sidecar_path(s.output), {
        "version": SIDECAR_VERSION, "input": str(s.input.resolve()), "input_bytes": scan["bytes"],
        "input_head_sha256": scan["head_sha256"], "input_lines": stats.total_lines,
        "settings": s.shaping(), "lines_done": done, "complete": done >= stats.total_lines,
        "errors": stats.errors_before + stats.errors})
