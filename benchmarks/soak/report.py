"""The soak harness's outputs: Markdown report, JSON summary and a PNG of RSS and RPC rate over time."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from benchmarks.harness import date_line, machine_line
from benchmarks.soak.record import Record


def timeline(records: list[Record], seconds: float) -> dict:
    """Answers per second (by completion time), all and not-OK."""
    n = int(seconds) + 2
    total, failed = [0] * n, [0] * n
    for r in records:
        i = min(int(r.t + r.latency), n - 1)
        total[i] += 1
        failed[i] += r.code != "OK"
    return {"second": list(range(n)), "answers": total, "not_ok": failed}


def plot(summary: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6), sharex=True)
    rss = (summary["rss"] or {}).get("samples", [])
    if rss:
        top.plot([s["t"] for s in rss], [s["rss_mb"] for s in rss], "-", color="tab:blue", label="RSS, summed")
        if "pss_mb" in rss[0]:
            top.plot([s["t"] for s in rss], [s["pss_mb"] for s in rss], "-", color="tab:purple", label="PSS, summed")
        top.legend(fontsize=8)
    top.set_ylabel("server memory (MB)")
    tl = summary["timeline"]
    bottom.plot(tl["second"], tl["answers"], "-", label="answers/s", color="tab:green")
    bottom.plot(tl["second"], tl["not_ok"], "-", label="not OK/s", color="tab:red", alpha=0.7)
    bottom.set_ylabel("RPCs per second")
    bottom.set_xlabel("seconds since the server was SERVING")
    bottom.legend(fontsize=8)
    for ax in (top, bottom):
        for i, ph in enumerate(summary["phases"]):
            ax.axvspan(ph["start"], ph["end"], color=f"C{i % 10}", alpha=0.08)
        ax.grid(alpha=0.3)
    span = max((ph["end"] for ph in summary["phases"]), default=1.0) or 1.0
    for ph in summary["phases"]:
        if ph["end"] - ph["start"] < 0.04 * span:
            continue  # too narrow for its name (settle, done)
        top.text((ph["start"] + ph["end"]) / 2, 1.01, ph["name"], transform=top.get_xaxis_transform(),
                 ha="center", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _codes(codes: dict) -> str:
    return ", ".join(f"{c} {n}" for c, n in sorted(codes.items(), key=lambda kv: -kv[1]))


def _cell(text: str, n: int = 120) -> str:
    return text.replace("|", "\\|").replace("\n", " ")[:n]


def per_case(records: list[Record], category: str, title: str, intro: str) -> list[str]:
    """One row per case of a per-case category (http_hostile, extreme): its codes, what it allows, and the
    first unexpected answer's note."""
    cases: dict[str, list[Record]] = {}
    for r in records:
        if r.category == category:
            cases.setdefault(r.detail, []).append(r)
    if not cases:
        return []
    lines = [f"## {title}", "", intro, "", "| case | calls | codes | allowed | first unexpected answer |",
             "|---|---|---|---|---|"]
    for name, rs in sorted(cases.items(), key=lambda kv: (not any(r.unexpected for r in kv[1]), kv[0])):
        bad = next((r for r in rs if r.unexpected), None)
        codes = Counter(r.code for r in rs)
        lines.append(f"| {_cell(name)} | {len(rs)} | {_codes(codes)} | {', '.join(sorted(rs[0].allowed))} | "
                     f"{'**' + bad.code + '**: ' + _cell(bad.note) if bad else ''} |")
    return lines + [""]


def http_section(s: dict, records: list[Record]) -> list[str]:
    http = [r for r in records if r.rpc.startswith("HTTP ")]
    if not http:
        return []
    five = sum(r.code.startswith("HTTP 5") for r in http)
    resets = sum(r.code == "RESET" for r in http)
    lines = ["## HTTP outcomes", "", f"{len(http)} HTTP calls to {s['http']['url']}: **{five}** answered 5xx, "
             f"**{resets}** connection resets (a connection that failed without the server saying "
             "`Connection: close`).", "", "| category | endpoint | outcomes |", "|---|---|---|"]
    rows: dict[tuple, Counter] = {}
    for r in http:
        rows.setdefault((r.category, r.rpc[5:]), Counter())[r.code] += 1
    lines += [f"| {cat} | `{ep}` | {_codes(c)} |" for (cat, ep), c in sorted(rows.items())]
    server = (s["metrics"] or {}).get("http_counts")
    if server:
        lines += ["", "Server side (nmt_http_requests_total, requests that reached an endpoint): "
                  + "; ".join(f"{op}: {_codes(st)}" for op, st in sorted(server.items())) + "."]
    return lines + [""]


def render(s: dict, png_name: str) -> str:
    cfg, records = s["config"], s["_records"]
    lines = ["# Soak and fuzz run", "",
             f"Verdict: **{'PASS' if s['passed'] else 'FAIL'}** (exit code {0 if s['passed'] else 1}).", "",
             f"Command: `python -m benchmarks.soak {' '.join(cfg['argv'])}`. Target {cfg['target']}"
             f"{' (started by the harness: ' + ' '.join(cfg['server_flags']) + ')' if cfg['server_flags'] else ''}; "
             f"{cfg['duration']} s of load at concurrency {cfg['concurrency']}, seed {cfg['seed']}, "
             f"{len(records)} calls in {s['wall_seconds']:.0f} s.", "",
             date_line(), "", machine_line(cfg["machine"]), "",
             "## Checks", "", "| check | result | gates the exit code | detail |", "|---|---|---|---|"]
    for c in s["checks"]:
        result = {True: "pass", False: "**FAIL**", None: "skipped"}[c["ok"]]
        lines.append(f"| {c['name']} | {result} | {'yes' if c['gating'] else 'no'} | {c['detail']} |")
    lines += ["", "## Status codes per category", "",
              "| category | calls | codes | allowed | unexpected | latency p50 / p99 / max (ms) |", "|---|---|---|---|---|---|"]
    by_cat: dict[str, list[Record]] = {}
    for r in records:
        by_cat.setdefault(r.category, []).append(r)
    for cat, rs in sorted(by_cat.items()):
        lat = sorted(r.latency * 1e3 for r in rs)
        pct = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
        bad = sum(r.unexpected for r in rs)
        lines.append(f"| {cat} | {len(rs)} | {_codes(s['codes'][cat])} | {', '.join(s['allowed'][cat])} | "
                     f"{'**' + str(bad) + '**' if bad else 0} | {pct(0.5):.1f} / {pct(0.99):.1f} / {lat[-1]:.1f} |")
    modes = Counter(r.detail for r in records if r.category in ("translate_one", "translate_many", "stream"))
    lines += ["", f"Decoding modes of translate_one / translate_many / stream: {_codes(modes)}.", ""]
    bad = [r for r in records if r.unexpected]
    if bad:
        lines += ["## Unexpected answers (first 30 of each category and code)", "",
                  "| category | case | code | allowed | t (s) | details |", "|---|---|---|---|---|---|"]
        seen: Counter = Counter()
        for r in bad:
            seen[r.category, r.code] += 1
            if seen[r.category, r.code] <= 30:
                note = r.note.replace("|", "\\|").replace("\n", " ")[:160]
                detail = r.detail.replace("|", "\\|")
                lines.append(f"| {r.category} | {detail} | {r.code} | {', '.join(sorted(r.allowed))} | "
                             f"{r.t:.1f} | {note} |")
        lines.append("")
    lines += http_section(s, records)
    lines += per_case(records, "http_hostile", "Hostile HTTP cases (benchmarks/soak/http_hostile.py)",
                      "Each on a raw connection; after a 4xx without `Connection: close` the same connection must "
                      "serve GET /healthz (else RESET).")
    lines += per_case(records, "extreme", "Extreme but valid settings (benchmarks/soak/extreme.py)",
                      "gRPC calls with every decoding option at an edge admission accepts: OK (or "
                      "RESOURCE_EXHAUSTED for a full queue), never INTERNAL.")
    g = s["golden"]
    lines += ["## Greedy outputs at rest vs under load", "",
              f"{g['sentences']} test sentences, one per call, greedy: {g['compared']} compared, "
              f"{len(g['mismatches'])} differ, {len(g['missing'])} without an answer.", ""]
    for mm in g["mismatches"][:10]:
        lines += [f"- `{mm['source']}`: at rest `{mm['at_rest']}`, under load `{mm['under_load']}`"]
    eq = s["extreme"]["greedy_equivalence"]
    lines += ["", f"Extreme settings that are greedy in disguise (temperature 5e-324 = 0 in float32, top_k 1, "
              f"top_p 1e-9) against greedy at rest: {eq['compared']} compared, {eq['n_differ']} differ.", ""]
    for d in eq["differ"][:5]:
        lines += [f"- {d['case']}: `{d['source']}`: `{d['output']}` vs greedy `{d['greedy_at_rest']}`"]
    rss = s["rss"]
    if rss:
        growth = rss["growth_pct_after_warmup"]
        target = next((c for c in s["checks"] if c["name"].startswith("RSS growth")), None)
        lines += ["", "## Server memory (VmRSS)", "", "| start | after warm-up | peak | end | growth after warm-up |",
                  "|---|---|---|---|---|",
                  f"| {rss['start_mb']:.0f} MB | {rss['after_warmup_mb']:.0f} MB | {rss['peak_mb']:.0f} MB | "
                  f"{rss['end_mb']:.0f} MB | {'' if growth is None else f'{growth:+.1f}%'} |"]
        pss = rss.get("pss")
        if pss and pss["after_warmup_mb"]:
            pg = pss["growth_pct_after_warmup"]
            lines += [f"| PSS: {pss['start_mb']:.0f} MB | {pss['after_warmup_mb']:.0f} MB | {pss['peak_mb']:.0f} MB | "
                      f"{pss['end_mb']:.0f} MB | {'' if pg is None else f'{pg:+.1f}%'} |"]
        procs = rss.get("processes") or {}
        if procs:
            pids = sorted({pid for by_pid in procs.values() for pid in by_pid})
            lines += ["", "Each process's RSS (MB) at the marks (pids in start order; the first is the frontend):", "",
                      "| mark | " + " | ".join(str(p) for p in pids) + " |", "|---" * (len(pids) + 1) + "|"]
            for mark, by_pid in procs.items():
                lines.append(f"| {mark} | " + " | ".join(f"{by_pid[p]:.0f}" if p in by_pid else "" for p in pids) + " |")
        lines += ["", "RSS sums each process's VmRSS, so a library the processes share counts once per process "
                  "(an upper bound); PSS splits each shared page among the processes mapping it (their sum is "
                  "what the tree holds). The targets read RSS."]
        if target:
            lines += ["", f"Target: {target['name']}: **{'pass' if target['ok'] else 'FAIL'}** "
                      f"({'gates the exit code' if target['gating'] else 'reported; gates with --strict-memory'})."]
    m = s["metrics"]
    if m:
        lines += ["", "## Metrics after the load settled", "",
                  f"Gauges: {m['gauges']} (settled: {m['settled']}, after {m['settle_seconds']} s).", "",
                  "| rpc | server nmt_requests_total | client saw |", "|---|---|---|"]
        for rpc in sorted(set(m["server_counts"]) | set(m["client_counts"])):
            lines.append(f"| {rpc} | {_codes(m['server_counts'].get(rpc, {}))} | "
                         f"{_codes(m['client_counts'].get(rpc, {}))} |")
    h = s["health"]
    lines += ["", "## Health-check latency", "", "| when | checks | p50 (ms) | p99 (ms) | max (ms) |", "|---|---|---|---|---|"]
    for when, key in (("during the mixed load (a check every 100 ms)", "under_load"),
                      ("during the mixed load, HTTP GET /healthz (every 100 ms)", "http_under_load"),
                      ("during large requests only (a check every 10 ms)", "large")):
        st = h.get(key, {})
        lines.append(f"| {when} | {st.get('n', 0)} | {st.get('p50_ms', '')} | {st.get('p99_ms', '')} | "
                     f"{st.get('max_ms', '')} |")
    lines += ["", f"Large requests in that window: {s['large_requests']}.", ""]
    if s["drain"]:
        d = s["drain"]
        lines += ["## SIGTERM drain", "", f"In flight at SIGTERM: {d['streams_in_flight_at_sigterm']}; health after "
                  f"SIGTERM: {d['health_after_sigterm']}; codes: {d['codes']}; exit code {d['exit_code']} "
                  f"{d['exit_seconds_after_sigterm']} s after SIGTERM (grace {d['grace_period_s']} s).", ""]
    if s.get("server_log"):
        found = s.get("server_log_findings") or {}
        lines += [f"Server log: `{s['server_log']}` ({s['server_tracebacks']} tracebacks, "
                  f"{found.get('errors', 0)} ERROR lines).", ""]
        lines += [f"- {n} x `{_cell(m, 160)}`" for m, n in (found.get("messages") or {}).items()]
        lines += [""] if found.get("messages") else []
    lines += [f"![RSS and RPC rate]({png_name})", ""]
    return "\n".join(lines) + "\n"


def write(summary: dict, out: Path, json_path: Path | None) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    plot(summary, png)
    out.write_text(render(summary, png.name), encoding="utf-8")
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        public = {k: v for k, v in summary.items() if not k.startswith("_")}
        public["unexpected_calls"] = [r.as_dict() for r in summary["_records"] if r.unexpected][:500]
        json_path.write_text(json.dumps(public, indent=1, default=str), encoding="utf-8")
