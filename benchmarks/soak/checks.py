"""The soak harness's verdict: what the client saw, what the server reported, and the checks on both.

A check is gating (it decides the exit code) unless it depends on the speed of
the machine: health latency is compared with its 50 ms target and reported, and
it gates only with --strict-timing, so a busy shared machine cannot fail a run
whose server is correct. A health check slower than 1 s while only the large
requests run is no hiccup but a blocked event loop: that one always gates. (On
the shared 2-core machine, CPU contention alone has delayed one by 0.3 s; an
event loop that tokenised the 3.8 MB request itself stopped answering for 2-3 s.)
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from benchmarks.soak.traffic import ALWAYS_FAIL, EXPECTED, Record

# Categories where the client stops waiting on purpose: the server may have finished (counted OK, or
# refused) before it noticed, so its count and the client's may differ by up to these calls.
RACY = {"deadline_short", "stream_cancel", "channel_close"}
DRAIN = {"drain_stream", "drain_inflight", "drain_new"}


@dataclass
class Check:
    name: str
    ok: Optional[bool]  # None: not run in this mode (e.g. no drain against --target)
    detail: str
    gating: bool = True

    def as_dict(self) -> dict:
        return asdict(self)


def code_table(records: list[Record]) -> dict[str, dict[str, int]]:
    table: dict[str, Counter] = {}
    for r in records:
        table.setdefault(r.category, Counter())[r.code] += 1
    return {cat: dict(sorted(c.items())) for cat, c in sorted(table.items())}


def allowed_table(records: list[Record]) -> dict[str, list[str]]:
    """Per category, every code some call of it may get (per-case categories: the union)."""
    out: dict[str, set] = {}
    for r in records:
        out.setdefault(r.category, set()).update(r.allowed)
    return {cat: sorted(codes) for cat, codes in sorted(out.items())}


def latency_stats(latencies: list[float], slo_ms: Optional[float] = None) -> dict:
    if not latencies:
        return {"n": 0}
    ms = np.array(latencies) * 1e3
    out = {"n": len(ms), "p50_ms": round(float(np.percentile(ms, 50)), 2),
           "p99_ms": round(float(np.percentile(ms, 99)), 2), "max_ms": round(float(ms.max()), 2)}
    if slo_ms is not None:
        out["over_slo"] = int((ms >= slo_ms).sum())
    return out


def client_counts(records: list[Record]) -> dict[str, Counter]:
    """The client's view in nmt_requests_total terms: per RPC, per code (a malformed OK answer is OK)."""
    out: dict[str, Counter] = {}
    for r in records:
        if r.rpc != "Check":
            out.setdefault(r.rpc, Counter())["OK" if r.code == "BAD_RESPONSE" else r.code] += 1
    return out


def metrics_consistency(records: list[Record], server: dict[str, dict[str, int]]) -> list[str]:
    """Where nmt_requests_total disagrees with what the client saw, beyond what races allow.

    OK: the server counts a call before the client has its answer, so it has at least the client's
    OKs, and at most those plus the calls the client gave up on. INVALID_ARGUMENT / NOT_FOUND /
    DEADLINE_EXCEEDED: the server cannot have more than the client saw (raw payloads may be refused
    before the servicer and go uncounted). CANCELLED: at most the client's, plus a quarter of its
    deadlines (a deadline's cancellation can reach the server a moment before its own timer fires).
    INTERNAL / UNKNOWN / UNAVAILABLE: none before the drain.
    """
    client = client_counts(records)
    racy, raw = Counter(), sum(r.category == "fuzz_raw" for r in records)
    for r in records:
        if (r.category in RACY and r.code != "OK") or r.code == "HANG":
            racy[r.rpc] += 1
    problems = []
    for rpc in sorted(set(client) | set(server)):
        c, s = client.get(rpc, Counter()), Counter(server.get(rpc, {}))

        def outside(code: str, lo: float, hi: float) -> None:
            if not lo <= s[code] <= hi:
                problems.append(f"{rpc} {code}: server counted {s[code]}, client saw {c[code]} "
                                f"(consistent: {lo:g}..{hi:g})")
        outside("OK", c["OK"], c["OK"] + racy[rpc])
        outside("INVALID_ARGUMENT", c["INVALID_ARGUMENT"] - (raw if rpc == "Translate" else 0), c["INVALID_ARGUMENT"])
        outside("NOT_FOUND", c["NOT_FOUND"], c["NOT_FOUND"])
        outside("DEADLINE_EXCEEDED", 0, c["DEADLINE_EXCEEDED"])
        outside("RESOURCE_EXHAUSTED", 0, c["RESOURCE_EXHAUSTED"] + racy[rpc])
        outside("CANCELLED", 0, c["CANCELLED"] + max(2, c["DEADLINE_EXCEEDED"] // 4))
        for code in sorted(set(s) - {"OK", "INVALID_ARGUMENT", "NOT_FOUND", "DEADLINE_EXCEEDED",
                                     "RESOURCE_EXHAUSTED", "CANCELLED"}):
            problems.append(f"{rpc} {code}: server counted {s[code]} (client saw {c[code]}); none expected")
    return problems


def golden_compare(sentences: list[str], rest: list[Optional[str]], load: list[Optional[str]]) -> dict:
    mismatches = [{"source": s, "at_rest": a, "under_load": b}
                  for s, a, b in zip(sentences, rest, load) if a is not None and b is not None and a != b]
    missing = [s for s, a, b in zip(sentences, rest, load) if a is None or b is None]
    return {"sentences": len(sentences), "compared": len(sentences) - len(missing), "mismatches": mismatches,
            "missing": missing}


def evaluate(s: dict, strict_timing: bool, health_slo_ms: float, stall_ms: float,
             max_rss_growth: Optional[float]) -> list[Check]:
    """Every check, from the run summary built by benchmarks/soak/__main__.py."""
    records: list[Record] = s["_records"]
    bad = [r for r in records if r.unexpected]
    fatal = [r for r in records if r.code in ALWAYS_FAIL]
    server_fatal = {f"{rpc}:{code}": n for rpc, codes in (s["metrics"] or {}).get("server_counts", {}).items()
                    for code, n in codes.items() if code in ALWAYS_FAIL}
    hangs = [r for r in records if r.code == "HANG"]
    expected_categories = set(EXPECTED) - (set() if s["drain"] else DRAIN)
    missing_cats = sorted(expected_categories - {r.category for r in records})
    g = s["golden"]
    checks = [
        Check("no INTERNAL / UNKNOWN", not fatal and not server_fatal,
              f"client: {dict(Counter(f'{r.category}:{r.code}' for r in fatal))}; server: {server_fatal}"),
        Check("no hangs", not hangs, f"{len(hangs)} calls without an answer within deadline + 10 s"
              + (f": {dict(Counter(r.category for r in hangs))}" if hangs else "")),
        Check("every code expected for its category", not bad,
              f"{len(bad)} unexpected: {dict(Counter(f'{r.category}:{r.code}' for r in bad))}" if bad
              else "all calls got a code their category allows"),
        Check("every category exercised", not missing_cats, f"missing: {missing_cats}" if missing_cats
              else f"{len(expected_categories)} categories"),
        Check("greedy outputs equal at rest and under load", not g["mismatches"] and not g["missing"]
              and g["compared"] > 0, f"{g['compared']} compared, {len(g['mismatches'])} differ, "
              f"{len(g['missing'])} without an answer"),
    ]
    m = s["metrics"]
    if m is None:
        checks += [Check("gauges settle to 0", None, "no metrics endpoint (--metrics-url)"),
                   Check("nmt_requests_total matches the client", None, "no metrics endpoint")]
    else:
        checks += [Check("gauges settle to 0", m["settled"], f"{m['gauges']} after {m['settle_seconds']} s"),
                   Check("nmt_requests_total matches the client", not m["consistency"],
                         "; ".join(m["consistency"]) or "within the races' allowance")]
    d = s["drain"]
    checks.append(Check("SIGTERM drain", None, "not run against --target") if d is None else Check(
        "SIGTERM drain", d["ok"], f"exit code {d['exit_code']} {d['exit_seconds_after_sigterm']} s after SIGTERM "
        f"(grace {d['grace_period_s']} s), health then {d['health_after_sigterm']}, streams in flight: "
        f"{d['streams_in_flight_at_sigterm']}, codes {d['codes']}"))
    h = s["health"]["large"]
    # Twenty times the target is no scheduling hiccup on a quiet window: the server's event loop was blocked.
    checks.append(Check(f"no event-loop stall: health < {stall_ms:g} ms during large requests",
                        h.get("n", 0) > 0 and h.get("max_ms", stall_ms) < stall_ms,
                        f"slowest of {h.get('n', 0)} checks: {h.get('max_ms')} ms"))
    checks.append(Check(f"health < {health_slo_ms:g} ms during large requests",
                        h.get("n", 0) > 0 and h.get("over_slo", 1) == 0,
                        f"{h.get('n', 0)} checks, p50 {h.get('p50_ms')} ms, p99 {h.get('p99_ms')} ms, max "
                        f"{h.get('max_ms')} ms, {h.get('over_slo')} at or over target", gating=strict_timing))
    burst = s["codes"].get("burst", {})
    checks.append(Check("burst past the queue limit refused some calls", burst.get("RESOURCE_EXHAUSTED", 0) > 0,
                        f"burst codes {burst}", gating=False))
    rss = s["rss"]
    growth = rss.get("growth_pct_after_warmup") if rss else None
    if growth is not None:
        limit = max_rss_growth
        checks.append(Check("RSS growth after warm-up" + (f" <= {limit:g}%" if limit is not None else ""),
                            growth <= limit if limit is not None else True,
                            f"{rss['after_warmup_mb']:.0f} MB -> {rss['end_mb']:.0f} MB ({growth:+.1f}%), "
                            f"peak {rss['peak_mb']:.0f} MB", gating=limit is not None))
    return checks


def verdict(checks: list[Check]) -> bool:
    return all(c.ok is not False for c in checks if c.gating)
