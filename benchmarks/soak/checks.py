"""The soak harness's verdict: what the client saw, what the server reported, and the checks on both.

A check is gating (it decides the exit code) unless it depends on the speed of
the machine: health latency is compared with its 50 ms target and reported, and
it gates only with --strict-timing, so a busy shared machine cannot fail a run
whose server is correct. A health check slower than 1 s while only the large
requests run is no hiccup but a blocked event loop: that one always gates. (On
the shared 2-core machine, CPU contention alone has delayed one by 0.3 s; an
event loop that tokenised the 3.8 MB request itself stopped answering for 2-3 s.) The same holds for
the health p99 under load (gRPC and HTTP), and the memory targets (RSS growth after warm-up < 5%,
peak <= 600 MB) gate only with --strict-memory: on a short run the growth mostly measures the step
from the warm-up's low concurrency to full load.

HTTP: no call may get a 5xx (client or nmt_http_requests_total) and no connection may be reset
without the server announcing its close; the server's log may hold no ERROR line and no traceback.
"""
from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np

from benchmarks.soak.record import EXPECTED, HTTP_EXPECTED, Record, fatal

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


def case_table(records: list[Record], categories: tuple = ("http_hostile", "extreme")) -> dict:
    """Per case of the per-case categories: {category: {case: {"codes": {code: n}, "allowed": [...]}}}."""
    out: dict[str, dict[str, dict]] = {}
    for r in records:
        if r.category in categories:
            entry = out.setdefault(r.category, {}).setdefault(r.detail, {"codes": Counter(), "allowed": r.allowed})
            entry["codes"][r.code] += 1
    return {cat: {case: {"codes": dict(e["codes"]), "allowed": sorted(e["allowed"])}
                  for case, e in sorted(cases.items())} for cat, cases in sorted(out.items())}


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
        if r.rpc != "Check" and not r.rpc.startswith("HTTP "):
            out.setdefault(r.rpc, Counter())["OK" if r.code == "BAD_RESPONSE" else r.code] += 1
    return out


# HTTP endpoints that run an RPC through the in-process gateway: those count in nmt_requests_total too. The
# client cannot tell which of its HTTP calls got that far (a body refused unread runs none; a DeepL or
# LibreTranslate call runs one per detected source language, at most one per text), so they widen the range.
HTTP_RPC = {"/v1/translate": "Translate", "/v2/translate": "Translate", "/translate": "Translate",
            "/v1/translate:stream": "TranslateStream", "/v1/embed": "Embed", "/v1/models": "ListModels"}


def http_slack(records: list[Record]) -> Counter:
    """Per RPC, how many server-side calls the client's HTTP calls may have made."""
    out: Counter = Counter()
    for r in records:
        if r.rpc.startswith("HTTP "):
            rpc = HTTP_RPC.get(r.rpc.split()[-1])
            if rpc:
                out[rpc] += 16 if r.category in ("http_deepl", "http_libre") else 1  # <= 16 texts a call
    return out


def metrics_consistency(records: list[Record], server: dict[str, dict[str, int]]) -> list[str]:
    """Where nmt_requests_total disagrees with what the client saw, beyond what races allow.

    OK: the server counts a call before the client has its answer, so it has at least the client's
    OKs, and at most those plus the calls the client gave up on. INVALID_ARGUMENT / NOT_FOUND /
    DEADLINE_EXCEEDED: the server cannot have more than the client saw (raw payloads may be refused
    before the servicer and go uncounted). CANCELLED: at most the client's, plus a quarter of its
    deadlines (a deadline's cancellation can reach the server a moment before its own timer fires).
    INTERNAL / UNKNOWN / UNAVAILABLE: none before the drain. HTTP calls run their RPCs through the
    in-process gateway, counted there too: each code may exceed the client's gRPC view by what they ran.
    """
    client = client_counts(records)
    racy, raw = Counter(), sum(r.category == "fuzz_raw" for r in records)
    for r in records:
        if (r.category in RACY and r.code != "OK") or r.code == "HANG":
            racy[r.rpc] += 1
    http = http_slack(records)
    problems = []
    for rpc in sorted(set(client) | set(server)):
        c, s = client.get(rpc, Counter()), Counter(server.get(rpc, {}))

        def outside(code: str, lo: float, hi: float) -> None:
            if not lo <= s[code] <= hi:
                problems.append(f"{rpc} {code}: server counted {s[code]}, client saw {c[code]} "
                                f"(consistent: {lo:g}..{hi:g})")
        outside("OK", c["OK"], c["OK"] + racy[rpc] + http[rpc])
        outside("INVALID_ARGUMENT", c["INVALID_ARGUMENT"] - (raw if rpc == "Translate" else 0),
                c["INVALID_ARGUMENT"] + http[rpc])
        outside("NOT_FOUND", c["NOT_FOUND"], c["NOT_FOUND"] + http[rpc])
        outside("DEADLINE_EXCEEDED", 0, c["DEADLINE_EXCEEDED"] + http[rpc])
        outside("RESOURCE_EXHAUSTED", 0, c["RESOURCE_EXHAUSTED"] + racy[rpc] + http[rpc])
        outside("CANCELLED", 0, c["CANCELLED"] + max(2, c["DEADLINE_EXCEEDED"] // 4) + http[rpc])
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


def log_findings(log: str) -> dict:
    """ERROR / CRITICAL lines of the server's log (JSON lines, or text) and its tracebacks, with the distinct
    messages (first 10)."""
    messages: Counter = Counter()
    for line in log.splitlines():
        try:
            entry = json.loads(line)
            level, message = entry.get("level", ""), str(entry.get("message", ""))
        except (ValueError, AttributeError):
            level = next((w for w in ("CRITICAL", "ERROR") if f" {w} " in line), "")
            message = line
        if level in ("ERROR", "CRITICAL"):
            messages[message[:160]] += 1
    return {"errors": sum(messages.values()), "tracebacks": log.count("Traceback (most recent call last)"),
            "messages": dict(messages.most_common(10))}


def by_case(records: list[Record]) -> dict[str, int]:
    return dict(Counter(f"{r.category}:{r.detail or r.rpc}:{r.code}" for r in records).most_common(12))


def evaluate(s: dict, args) -> list[Check]:
    """Every check, from the run summary built by benchmarks/soak/__main__.py and its arguments."""
    strict_timing, health_slo_ms, stall_ms = args.strict_timing, args.health_slo_ms, args.stall_ms
    records: list[Record] = s["_records"]
    bad = [r for r in records if r.unexpected]
    fatals = [r for r in records if fatal(r.code) and r.code.split()[-1] in ("INTERNAL", "UNKNOWN")]
    server_fatal = {f"{rpc}:{code}": n for rpc, codes in (s["metrics"] or {}).get("server_counts", {}).items()
                    for code, n in codes.items() if code in ("INTERNAL", "UNKNOWN")}
    hangs = [r for r in records if r.code == "HANG"]
    http = s["http"]["url"] is not None
    expected_categories = set(EXPECTED) - (set() if s["drain"] else DRAIN) - (set() if http else set(HTTP_EXPECTED))
    missing_cats = sorted(expected_categories - {r.category for r in records})
    g = s["golden"]
    beside = s["extreme"]["beside_golden"]["served"]
    five = [r for r in records if r.code.startswith("HTTP 5")]
    server_five = {f"{op}:{status}": n for op, st in (s["metrics"] or {}).get("http_counts", {}).items()
                   for status, n in st.items() if status.startswith("5")}
    resets = [r for r in records if r.code == "RESET"]
    checks = [
        Check("no INTERNAL / UNKNOWN", not fatals and not server_fatal,
              f"client: {by_case(fatals)}; server: {server_fatal}"),
        Check("no HTTP 5xx", not five and not server_five, f"client: {len(five)} {by_case(five)}; server "
              f"nmt_http_requests_total: {server_five}" if http else "no HTTP port"),
        Check("no connection resets", not resets, f"{len(resets)} {by_case(resets)}" if http else "no HTTP port"),
        Check("no hangs", not hangs, f"{len(hangs)} calls without an answer within deadline + 10 s"
              + (f": {dict(Counter(r.category for r in hangs))}" if hangs else "")),
        Check("every code expected for its category", not bad,
              f"{len(bad)} unexpected: {dict(Counter(f'{r.category}:{r.code}' for r in bad))}" if bad
              else "all calls got a code their category allows"),
        Check("every category exercised", not missing_cats, f"missing: {missing_cats}" if missing_cats
              else f"{len(expected_categories)} categories"),
        Check("greedy outputs equal at rest and under load", not g["mismatches"] and not g["missing"]
              and g["compared"] > 0, f"{g['compared']} compared, {len(g['mismatches'])} differ, "
              f"{len(g['missing'])} without an answer; {beside} extreme-setting calls served beside them"),
    ]
    logged = s.get("server_log_findings")
    if logged is not None and s.get("server_log"):
        checks.append(Check("server log: no ERROR line, no traceback",
                            not logged["errors"] and not logged["tracebacks"],
                            f"{logged['errors']} ERROR lines, {logged['tracebacks']} tracebacks"
                            + (f": {logged['messages']}" if logged["messages"] else "")))
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
    loads = [("gRPC", s["health"]["under_load"]), ("HTTP /healthz", s["health"].get("http_under_load", {}))]
    loads = [(name, h) for name, h in loads if h.get("n")]
    checks.append(Check(f"health p99 < {health_slo_ms:g} ms under load", bool(loads) and all(
        h["p99_ms"] < health_slo_ms for _, h in loads), "; ".join(
        f"{name}: {h['n']} checks, p50 {h['p50_ms']} ms, p99 {h['p99_ms']} ms, max {h['max_ms']} ms"
        for name, h in loads), gating=strict_timing))
    ext = s["extreme"]["greedy_equivalence"]
    checks.append(Check("extreme settings that are greedy in disguise equal greedy at rest", not ext["n_differ"],
                        f"{ext['compared']} compared, {ext['n_differ']} differ"
                        + (f": {ext['differ'][:2]}" if ext["differ"] else ""), gating=False))
    burst = s["codes"].get("burst", {})
    checks.append(Check("burst past the queue limit refused some calls", burst.get("RESOURCE_EXHAUSTED", 0) > 0,
                        f"burst codes {burst}", gating=False))
    rss = s["rss"]
    growth = rss.get("growth_pct_after_warmup") if rss else None
    if growth is not None:
        limit = 5.0 if args.max_rss_growth is None else args.max_rss_growth
        checks.append(Check(f"RSS growth after warm-up < {limit:g}% and peak <= {args.max_rss_mb:g} MB",
                            growth < limit and rss["peak_mb"] <= args.max_rss_mb,
                            f"{rss['after_warmup_mb']:.0f} MB -> {rss['end_mb']:.0f} MB ({growth:+.1f}%), "
                            f"peak {rss['peak_mb']:.0f} MB",
                            gating=args.strict_memory or args.max_rss_growth is not None))
    return checks


def verdict(checks: list[Check]) -> bool:
    return all(c.ok is not False for c in checks if c.gating)
