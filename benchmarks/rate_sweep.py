"""The shipped model's saturation knee and goodput at an SLO: an open-loop rate sweep with client.loadgen.

    python -m benchmarks.rate_sweep [--rates 5,10,20,40,60,80,100,120] [--duration 30] \\
        [--slo-ttft-ms 200] [--slo-e2e-ms 1000] [--out docs/benchmarks/rate_sweep.md]

Starts `python -m server` (the default model and settings) on loopback, then runs the
load generator against it: Poisson arrivals of greedy TranslateStream calls over
test_2016_flickr.en at each rate, a warm-up, the server's /metrics sampled during
each level. The knee is the highest offered rate the server still keeps up with
(achieved within 5% of offered and the TTFT SLO met at p90); beyond it requests
queue and goodput falls while throughput flattens. Writes the Markdown table, the load generator's JSON and its report
(latency CDFs, throughput and p90 TTFT against offered rate, per-window series).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Sequence

from benchmarks.harness import TEST_SOURCES, ServerProcess, date_line, machine_line

ROOT = Path(__file__).resolve().parents[1]


def knee(levels: list[dict], slo_ttft_ms: float) -> dict | None:
    """The highest offered rate that is fully served within the TTFT objective."""
    ok = [lv for lv in levels if lv["achieved_rps"] >= 0.95 * lv["offered_rps"]
          and (lv["ttft_ms"]["p90"] or 0) <= slo_ttft_ms]
    return max(ok, key=lambda lv: lv["offered_rps"]) if ok else None


def render(result: dict, args, argv: list[str]) -> str:
    levels = result["levels"]
    k = knee(levels, args.slo_ttft_ms)
    best = max(levels, key=lambda lv: lv["goodput_rps"])
    lines = ["# Rate sweep of the shipped model: saturation knee and goodput", "",
             f"Command: `python -m benchmarks.rate_sweep {' '.join(argv)}`", "",
             date_line(), "",
             machine_line("server and load generator share it"), "",
             "Server: `python -m server` with its defaults (model multi30k-en-de-small, fp32, 64 decode slots). "
             f"Load: open loop, Poisson arrivals, greedy TranslateStream, one test_2016_flickr.en sentence per "
             f"call, {args.duration:g} s per level after a warm-up. SLO: TTFT ≤ {args.slo_ttft_ms:g} ms and "
             f"end-to-end ≤ {args.slo_e2e_ms:g} ms.", "",
             "| offered req/s | achieved req/s | goodput req/s | output tok/s | TTFT p50 / p90 / p99 (ms) | "
             "e2e p50 / p90 (ms) | errors | server: queue mean (ms), rows per step, most waiting |",
             "|---|---|---|---|---|---|---|---|"]
    for lv in levels:
        t, e, sm = lv["ttft_ms"], lv["e2e_ms"], lv.get("server") or {}
        server = (f"{sm['queue_ms_mean']:.0f}, {sm['decode_batch_mean']:.1f}, {sm['waiting_max']:.0f}"
                  if sm.get("queue_ms_mean") is not None else "-")
        lines.append(f"| {lv['offered_rps']:g} | {lv['achieved_rps']:.1f} | {lv['goodput_rps']:.1f} | "
                     f"{lv['output_tokens_per_s']:,.0f} | {t['p50']:.0f} / {t['p90']:.0f} / {t['p99']:.0f} | "
                     f"{e['p50']:.0f} / {e['p90']:.0f} | {lv['errors']} | {server} |")
    lines += [""]
    if k:
        lines.append(f"**Knee: {k['offered_rps']:g} requests/s** ({k['output_tokens_per_s']:,.0f} output tokens/s, "
                     f"TTFT p90 {k['ttft_ms']['p90']:.0f} ms): the highest offered rate served in full within "
                     f"the TTFT objective.")
    else:
        lines.append("No level was served in full within the TTFT objective: lower the rates.")
    lines += [f"Best goodput: {best['goodput_rps']:.1f} requests/s at {best['offered_rps']:g} offered.", "",
              "![throughput, goodput and p90 latency against offered rate](rate_sweep/saturation.png)", "",
              "![latency distributions per rate](rate_sweep/latency_cdf.png)", "",
              "Raw result: `rate_sweep.json`; full report: `rate_sweep/index.html`.", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src-file", default=str(TEST_SOURCES))
    p.add_argument("--rates", default="5,10,20,40,60,80,100,120")
    p.add_argument("--duration", type=float, default=30.0, help="seconds per level")
    p.add_argument("--slo-ttft-ms", type=float, default=200.0)
    p.add_argument("--slo-e2e-ms", type=float, default=1000.0)
    p.add_argument("--server-flags", default="", help="extra flags for python -m server")
    p.add_argument("--out", default=str(ROOT / "docs/benchmarks/rate_sweep.md"))
    args = p.parse_args(argv)
    if not Path(args.src_file).exists():
        args.src_file = str(ROOT / "tests/data/test_2016_flickr.head200.en")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(*args.server_flags.split()).launch()
    port, metrics_port = server.port, server.metrics_port
    result_path = out.with_suffix(".json")
    try:
        cmd = [sys.executable, "-m", "client.loadgen", "--target", f"127.0.0.1:{port}", "--src-file", args.src_file,
               "--rate", args.rates, "--arrival", "poisson", "--duration", str(args.duration), "--warmup", "5s",
               "--timeout", "60", "--seed", "0", "--metrics-url", f"127.0.0.1:{metrics_port}",
               "--slo-ttft-ms", str(args.slo_ttft_ms), "--slo-e2e-ms", str(args.slo_e2e_ms),
               "--json", str(result_path), "--report", str(out.with_suffix(""))]
        subprocess.run(cmd, cwd=ROOT, check=True)
    finally:
        server.stop()
    out.write_text(render(json.loads(result_path.read_text()), args, argv))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
