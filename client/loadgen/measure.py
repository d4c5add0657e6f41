"""Per-request records and the statistics of a level: percentiles, goodput, windows, stability.

Everything here works on finished `Sample`s and plain numbers, no gRPC and no clock, so the
same summary comes out of a live run, a test, or the in-process benchmark.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Optional, Sequence

import numpy as np

# Percentile grid stored per level so latency CDFs can be redrawn from the JSON alone.
CDF_POINTS = np.linspace(0, 100, 101)
# The last this many full windows must agree (within STABLE_SPREAD) for the level to count as steady.
STABLE_WINDOWS = 3
STABLE_SPREAD = 0.10
# An open-loop send this much behind its schedule counts as late: the client, not the server, was the bottleneck.
LATE_S = 0.010


@dataclass
class Sample:
    """One request as the client saw it. Times in seconds.

    The first four fields are positional so older callers (benchmarks/serving_load.py builds
    `Sample(ttft, gaps, total, tokens)` from in-process events) keep working.
    """

    ttft: Optional[float]  # send -> first message carrying tokens; None for unary calls and failures
    gaps: list[float]  # between consecutive token-carrying stream messages
    total: float  # send -> end of the call (status received)
    tokens: int  # output tokens the server reported (0 on failure)
    code: str = "OK"  # gRPC status name, or CLIENT_ERROR for an exception that is not an RPC error
    rpc: str = "TranslateStream"
    kind: str = ""  # the mix entry that produced it
    texts: int = 1
    target: str = ""
    sent_at: float = 0.0  # from the level start
    lag: float = 0.0  # open loop: actual send time minus scheduled send time

    @property
    def ok(self) -> bool:
        return self.code == "OK"

    @property
    def tpot(self) -> Optional[float]:
        """Time per output token after the first: (e2e - ttft) / (tokens - 1)."""
        if self.ttft is None or self.tokens < 2:
            return None
        return (self.total - self.ttft) / (self.tokens - 1)

    @property
    def done_at(self) -> float:
        return self.sent_at + self.total


@dataclass
class Slo:
    """Latency objectives in milliseconds; None = not given. A request meets the SLO when it
    finished OK and every objective that applies to it holds: unary calls have no TTFT or
    TPOT, so only the e2e objective can fail them."""

    ttft_ms: Optional[float] = None
    tpot_ms: Optional[float] = None
    e2e_ms: Optional[float] = None

    def met(self, s: Sample) -> bool:
        if not s.ok:
            return False
        checks = ((self.ttft_ms, s.ttft), (self.tpot_ms, s.tpot), (self.e2e_ms, s.total))
        return all(limit is None or value is None or value * 1e3 <= limit for limit, value in checks)

    def as_dict(self) -> dict:
        return {"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms, "e2e_ms": self.e2e_ms}


def _r(x: float, digits: int = 3) -> float:
    return round(float(x), digits)


def stats_ms(values: Sequence[float]) -> dict:
    """n, mean, std, p50/p90/p99 of seconds, reported in ms. Empty input gives None values (valid
    JSON, unlike NaN) so a level without streams still has the same keys."""
    if len(values) == 0:
        return {"n": 0, "mean": None, "std": None, "p50": None, "p90": None, "p99": None}
    a = np.asarray(values, dtype=float) * 1e3
    p50, p90, p99 = np.percentile(a, (50, 90, 99))
    return {"n": int(a.size), "mean": _r(a.mean()), "std": _r(a.std()), "p50": _r(p50), "p90": _r(p90),
            "p99": _r(p99)}


def cdf_ms(values: Sequence[float]) -> list[float]:
    return [_r(v) for v in np.percentile(np.asarray(values) * 1e3, CDF_POINTS)] if len(values) else []


def auto_window(duration: float) -> float:
    """About ten windows per level, never under a second (fewer requests than that make p90 noise)."""
    return max(1.0, round(duration / 10, 1))


def windows(samples: Sequence[Sample], width: float, horizon: float) -> list[dict]:
    """Requests grouped by completion time into `width`-second windows over [0, horizon)."""
    count = max(1, math.ceil(horizon / width - 1e-9))
    buckets: list[list[Sample]] = [[] for _ in range(count)]
    for s in samples:  # one pass, not one per window: long runs have thousands of windows
        k = min(int(s.done_at // width), count - 1) if s.done_at <= horizon + 1e-9 else count
        if s.ok and 0 <= k < count:
            buckets[k].append(s)
    out = []
    for k, inside in enumerate(buckets):
        lo, hi = k * width, min((k + 1) * width, horizon)
        span = max(hi - lo, 1e-9)
        ttft = [s.ttft for s in inside if s.ttft is not None]
        out.append({"start_s": _r(lo), "end_s": _r(hi), "full": hi - lo >= width - 1e-9, "requests": len(inside),
                    "rps": _r(len(inside) / span), "output_tokens_per_s": _r(sum(s.tokens for s in inside) / span),
                    "ttft_p90_ms": _r(np.percentile(ttft, 90) * 1e3) if ttft else None,
                    "e2e_p90_ms": _r(np.percentile([s.total for s in inside], 90) * 1e3) if inside else None})
    return out


def stability(wins: Sequence[dict], sending_until: float) -> Optional[str]:
    """None when the last full windows of the sending phase agree within 10% on throughput and
    p90 e2e; otherwise a note. Windows after the last send are left out: a closed loop running
    out of requests (or an open loop draining) always slows down, and that says nothing about
    the steady state."""
    full = [w for w in wins if w["full"] and w["end_s"] <= sending_until + 1e-9]
    if len(full) < STABLE_WINDOWS:
        return f"only {len(full)} full window(s) while sending: too short to judge steadiness"
    last = full[-STABLE_WINDOWS:]
    notes = []
    for key, label in (("output_tokens_per_s", "throughput (tok/s)"), ("e2e_p90_ms", "p90 e2e (ms)")):
        vals = [w[key] for w in last if w[key] is not None]
        if len(vals) < STABLE_WINDOWS:
            continue
        mean = sum(vals) / len(vals)
        spread = (max(vals) - min(vals)) / mean if mean > 0 else 0.0
        if spread > STABLE_SPREAD:
            notes.append(f"{label} varies {100 * spread:.0f}% ({min(vals):.1f}..{max(vals):.1f})")
    if not notes:
        return None
    return (f"last {STABLE_WINDOWS} windows disagree: " + "; ".join(notes)
            + " - not a steady state; run longer or add --warmup")


def count_calls(samples: Iterable[Sample]) -> dict[str, dict[str, int]]:
    """rpc -> status name -> count: the same shape as the server's nmt_requests_total deltas."""
    out: dict[str, Counter] = {}
    for s in samples:
        out.setdefault(s.rpc, Counter())[s.code] += 1
    return {rpc: dict(sorted(c.items())) for rpc, c in sorted(out.items())}


@dataclass
class LevelStats:
    """Inputs of `summarize` besides the samples, bundled so the call sites stay readable."""

    duration: float  # first send to last completion
    sending_until: float  # last send, from the level start
    slo: Slo = field(default_factory=Slo)
    window_s: float = 0.0  # 0 = auto


def summarize(samples: Sequence[Sample], ls: LevelStats) -> dict:
    ok = [s for s in samples if s.ok]
    dur = max(ls.duration, 1e-9)
    ttft = [s.ttft for s in ok if s.ttft is not None]
    itl = [g for s in ok for g in s.gaps]
    tpot = [t for t in (s.tpot for s in ok) if t is not None]
    e2e = [s.total for s in ok]
    met = sum(ls.slo.met(s) for s in samples)
    tokens = sum(s.tokens for s in ok)
    width = ls.window_s or auto_window(ls.duration)
    wins = windows(samples, width, ls.duration)
    lags = [s.lag for s in samples]
    return {
        "sent": len(samples), "requests": len(ok), "errors": len(samples) - len(ok),
        "codes": dict(sorted(Counter(s.code for s in samples).items())),
        "calls": count_calls(samples),
        "targets": dict(sorted(Counter(s.target for s in samples if s.target).items())),
        "late_sends": sum(lag > LATE_S for lag in lags),
        "max_send_lag_ms": _r(max(lags, default=0.0) * 1e3),
        "duration_s": _r(ls.duration), "output_tokens": tokens, "texts": sum(s.texts for s in ok),
        "achieved_rps": _r(len(ok) / dur), "output_tokens_per_s": _r(tokens / dur),
        "goodput_rps": _r(met / dur),
        "slo": {**ls.slo.as_dict(), "met": met, "met_ratio": _r(met / len(samples)) if samples else None},
        "ttft_ms": stats_ms(ttft), "itl_ms": stats_ms(itl), "tpot_ms": stats_ms(tpot), "e2e_ms": stats_ms(e2e),
        "quantiles_ms": {"ttft": cdf_ms(ttft), "tpot": cdf_ms(tpot), "e2e": cdf_ms(e2e)},
        "window_s": width, "windows": wins, "stability": stability(wins, ls.sending_until),
        # Names the pre-package tool used, kept for benchmarks/serving_load.py and old result readers.
        "tokens": tokens, "tokens_per_s": _r(tokens / dur), "seconds": _r(ls.duration),
    }
