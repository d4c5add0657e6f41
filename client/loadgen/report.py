"""What a person sees: the live progress line, a line per finished level, the final table, the JSON.

Progress goes to stderr (tqdm when installed, else a plain line that rewrites itself on a
terminal and prints every few seconds in a log), so stdout carries only the table.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

from client.loadgen.measure import LATE_S, Sample

try:
    from tqdm import tqdm
except ImportError:  # optional: the plain line below does the same job
    tqdm = None


class Progress:
    """Requests done (of the planned count when known), errors, in flight, late sends."""

    def __init__(self, label: str, enabled: bool = True, stream=None):
        self.label, self.enabled, self.stream = label, enabled, stream or sys.stderr
        self.total: Optional[int] = None
        self.done = self.errors = self.late = self.inflight = 0
        self.t0 = self._last = time.perf_counter()
        self._bar = None

    def set_total(self, total: Optional[int]) -> None:
        self.total = total
        if self.enabled and tqdm is not None:
            self._bar = tqdm(total=total, desc=self.label, unit="req", file=self.stream, leave=False,
                             dynamic_ncols=True, mininterval=0.25)

    def update(self, sample: Sample, inflight: int) -> None:
        self.done += 1
        self.errors += not sample.ok
        self.late += sample.lag > LATE_S
        self.inflight = inflight
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix(err=self.errors, inflight=inflight, late=self.late, refresh=False)
            return
        now = time.perf_counter()
        tty = self.stream.isatty()
        if now - self._last >= (0.25 if tty else 5.0):  # a log file gets a line every 5 s, not a flood
            self._last = now
            self.stream.write(("\r" if tty else "") + self._line(now) + ("" if tty else "\n"))
            self.stream.flush()

    def _line(self, now: float) -> str:
        of = f"/{self.total}" if self.total else ""
        return (f"{self.label}: {self.done}{of} done, {self.errors} errors, {self.inflight} in flight, "
                f"{self.late} late, {now - self.t0:.1f} s")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        elif self.enabled and self.stream.isatty():
            self.stream.write("\r\033[K")
            self.stream.flush()


# A client whose own loop runs later than this (p99) is measuring itself as well as the server.
CLIENT_LAG_MS = 20.0


def label(lv: dict) -> str:
    return f"c={lv['concurrency']}" if lv.get("mode", "closed") == "closed" else f"{lv['offered_rps']:g} rps"


def _f(x, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _pair(stats: Optional[dict]) -> str:
    stats = stats or {}
    return f"{_f(stats.get('p50'))}/{_f(stats.get('p90'))}"


def level_line(lv: dict) -> str:
    return (f"{label(lv)}: {lv['requests']} ok, {lv['errors']} errors, {_f(lv['achieved_rps'], 2)} req/s, "
            f"{_f(lv['output_tokens_per_s'], 0)} tok/s, TTFT p50/p90 {_pair(lv['ttft_ms'])} ms, "
            f"TPOT p50/p90 {_pair(lv['tpot_ms'])} ms, e2e p50/p90 {_pair(lv['e2e_ms'])} ms"
            + (f", {lv['late_sends']} late sends" if lv.get("late_sends") else ""))


COLUMNS = ("level", "sent", "ok", "err", "req/s", "goodput", "tok/s", "TTFT p50/p90", "TPOT p50/p90",
           "ITL p50/p90", "e2e p50/p90", "late", "queue ms", "batch", "KV mean")


def rows(levels: list[dict]) -> list[list[str]]:
    out = []
    for lv in levels:
        srv = lv.get("server") or {}
        kv = (srv.get("kv_cache_usage") or {}).get("mean")
        out.append([label(lv), str(lv.get("sent", lv["requests"] + lv["errors"])), str(lv["requests"]),
                    str(lv["errors"]), _f(lv.get("achieved_rps"), 2), _f(lv.get("goodput_rps"), 2),
                    _f(lv.get("output_tokens_per_s", lv.get("tokens_per_s")), 0), _pair(lv.get("ttft_ms")),
                    _pair(lv.get("tpot_ms")), _pair(lv.get("itl_ms")), _pair(lv.get("e2e_ms")),
                    str(lv.get("late_sends", "-")), _f(srv.get("queue_ms_mean")), _f(srv.get("decode_batch_mean")),
                    "-" if kv is None else f"{100 * kv:.0f}%"])
    return out


def table(levels: list[dict]) -> str:
    """Fixed-width table (latencies in ms), then the notes a reader must not miss."""
    body = rows(levels)
    widths = [max(len(c), *(len(r[i]) for r in body)) if body else len(c) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(COLUMNS, widths))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in body]
    for lv in levels:
        errors = {k: v for k, v in lv.get("codes", {}).items() if k != "OK"}
        if errors:
            lines.append(f"{label(lv)}: errors by code {errors}")
        if lv.get("stability"):
            lines.append(f"{label(lv)}: {lv['stability']}")
        lag = (lv.get("client_loop_lag_ms") or {}).get("p99")
        if lag is not None and lag > CLIENT_LAG_MS:
            lines.append(f"{label(lv)}: this client's event loop ran up to {lag:.0f} ms late (p99): the latencies "
                         "include the load generator's own wait (give it a machine or more processes)")
        srv = lv.get("server") or {}
        if srv.get("matches_client") is False:
            lines.append(f"{label(lv)}: server counted {srv.get('requests')} but the client {lv.get('calls')} "
                         "(other clients, a proxy, or retries in between?)")
        if srv.get("note"):
            lines.append(f"{label(lv)}: server: {srv['note']}")
    return "\n".join(lines)


def write_json(path: str | Path, result: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    # allow_nan=False: every number must be valid JSON for the tools that read it next.
    Path(path).write_text(json.dumps(result, indent=1, allow_nan=False) + "\n", encoding="utf-8")
