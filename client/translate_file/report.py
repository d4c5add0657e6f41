"""Reporting: the progress bar or progress lines while a run goes, and its summary."""
from __future__ import annotations

import asyncio
import sys
import time
from typing import TYPE_CHECKING, Callable, Optional

from .settings import Settings

if TYPE_CHECKING:
    from .runner import Run, Stats


async def progress_lines(run: Run, sidecar: Optional[Callable[[], None]]) -> None:
    """Every --progress-interval: a progress line (when stderr is no terminal) and the sidecar."""
    s, st = run.s, run.stats
    every = max(s.progress_interval, 0.05) if run.bar is None and s.progress else 2.0
    while True:
        await asyncio.sleep(every)
        if sidecar is not None:
            sidecar()
        if run.bar is not None:
            run.bar.set_postfix(errors=st.errors, retries=run.targets.retries)
        elif s.progress:
            rate = st.lines / max(time.monotonic() - st.started, 1e-9)
            done = st.resumed_from + st.lines
            print(f"translate-file: {done}/{st.total_lines} lines ({100 * done / max(st.total_lines, 1):.1f}%), "
                  f"{rate:.1f} lines/s, {st.errors} errors, {run.targets.retries} retries",
                  file=sys.stderr, flush=True)


def progress_bar(s: Settings, stats: Stats):
    if not s.progress or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:  # the client installs without it: progress lines instead
        return None
    return tqdm(total=stats.total_lines, initial=stats.resumed_from, unit="line", file=sys.stderr,
                dynamic_ncols=True, desc="translate-file")


def build_summary(s: Settings, st: Stats, run: Run) -> dict:
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
