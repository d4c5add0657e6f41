"""One change against the commit before it: two checkouts' servers served the same loads, alternating.

    git worktree add ../before HEAD~1
    python -m benchmarks.checkout_ab --before ../before [--after .] [--rounds 4] [--seconds 12]
        [--levels stream:1,stream:8,stream:64,unary:4] [--flags "--engine-replicas 1"]
        [--before-flags ...] [--after-flags ...] [--loadgen-args "--max-output-tokens 1"] [--out FILE.json]

The question every performance change has to answer on a noisy shared machine: is it faster than the
commit before, by more than the machine moves between runs? Each round starts each checkout's server
(default flags, or --flags for both) with the harness, warms it with 3 s of 8 streams, then serves each
level with `python -m client.loadgen` for --seconds (stream:N = N concurrent streams; unary:N = N
clients sending 32-text Translate calls; rate:R = streams arriving at R calls per second, the same
Poisson arrivals for both sides) and reads the server's CPU time from /proc over the level
(every process of it: frontend and engine replicas). The order alternates by round (ABBA for even
--rounds), so neither side always runs first on a machine that drifts. Prints one line per level and
round, then each level's per-round figures and medians, side by side. One checkout on both sides with
--before-flags / --after-flags compares a setting instead of a change.

Closed loops (stream:N, unary:N) offer a faster server more work: its latencies are then measured on a
busier machine than the slower side's. Compare latencies (TTFT) at rate:R levels, where both sides are
offered the same calls at the same moments.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from benchmarks.harness import (ServerProcess, cpu_seconds, date_line, machine_line, parse_levels, rotations,
                                serve_level)

ROOT = Path(__file__).resolve().parents[1]
WARM_S = 3


def serve_levels(root: Path, flags: list[str], levels: list[str], seconds: float,
                 extra: tuple[str, ...] = ()) -> dict[str, dict]:
    """Start the server of checkout `root`, warm it, serve every level; {level: figures}."""
    results = {}
    with ServerProcess(*flags, metrics=False, root=root) as server:
        serve_level(server.target, "stream:8", WARM_S)
        for level in levels:
            before = cpu_seconds(server.pid)
            figures = serve_level(server.target, level, seconds, extra)
            cpu = cpu_seconds(server.pid) - before
            tokens = figures["output_tokens"]
            results[level] = {"tokens_per_s": figures["tokens_per_s"], "errors": figures["errors"],
                              "cpu_us_per_token": 1e6 * cpu / max(tokens, 1),
                              "ttft_p50_ms": (figures.get("ttft_ms") or {}).get("p50"),
                              "ttft_p90_ms": (figures.get("ttft_ms") or {}).get("p90")}
    return results


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.checkout_ab", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--before", required=True, type=Path, help="the checkout to compare against (a git worktree)")
    p.add_argument("--after", default=ROOT, type=Path, help="the checkout with the change (default: this one)")
    p.add_argument("--rounds", type=int, default=4, help="rounds; each serves both checkouts, order alternating")
    p.add_argument("--seconds", type=float, default=12.0, help="seconds of load per level")
    p.add_argument("--levels", default="stream:1,stream:8,stream:64,unary:4",
                   help="comma-separated stream:N (N streams), unary:N (N clients of 32-text calls) and rate:R "
                        "(streams arriving at R calls per second, Poisson, the same arrivals for both sides)")
    p.add_argument("--flags", default="", help="server flags for both sides (default: none, the defaults)")
    p.add_argument("--before-flags", default="", help="more server flags for the before side only")
    p.add_argument("--after-flags", default="", help="more server flags for the after side only (a flag's A/B: "
                   "--before . --after-flags \"--max-batch-size 32\")")
    p.add_argument("--loadgen-args", default="", help='more client.loadgen flags for every level, e.g. '
                   '"--max-output-tokens 1" (every call one token: the figures become costs per call)')
    p.add_argument("--out", type=Path, help="write every round's figures here as JSON")
    args = p.parse_args()
    sides = {"before": args.before.resolve(), "after": args.after.resolve()}
    levels = parse_levels(p, args.levels, args.seconds)
    runs: dict[str, dict[str, list[dict]]] = {side: {level: [] for level in levels} for side in sides}
    print(date_line(), machine_line(), sep="\n", flush=True)
    for number, order in enumerate(rotations(list(sides), args.rounds), 1):
        for side in order:
            flags = args.flags.split() + (args.before_flags if side == "before" else args.after_flags).split()
            for level, figures in serve_levels(sides[side], flags, levels, args.seconds,
                                               tuple(args.loadgen_args.split())).items():
                runs[side][level].append(figures)
                print(f"round {number} {side:6s} {level:10s} {figures['tokens_per_s']:9,.0f} tokens/s  "
                      f"{figures['cpu_us_per_token']:6,.0f} µs CPU/token  TTFT p50/p90 {figures['ttft_p50_ms']} / "
                      f"{figures['ttft_p90_ms']} ms  errors {figures['errors']}", flush=True)
    print()
    for level in levels:
        for side in sides:
            rounds = runs[side][level]
            tps = [r["tokens_per_s"] for r in rounds]
            ttft = [r["ttft_p50_ms"] for r in rounds if r["ttft_p50_ms"] is not None]
            print(f"{level:10s} {side:6s} tokens/s {' / '.join(f'{t:,.0f}' for t in tps)} (median "
                  f"{statistics.median(tps):,.0f}); µs CPU/token "
                  f"{' / '.join(format(r['cpu_us_per_token'], ',.0f') for r in rounds)}"
                  + (f"; TTFT p50 ms {' / '.join(f'{t:.1f}' for t in ttft)} (median {statistics.median(ttft):.1f})"
                     if ttft else ""))
        ratio = statistics.median(r["tokens_per_s"] for r in runs["after"][level]) / \
            statistics.median(r["tokens_per_s"] for r in runs["before"][level])
        print(f"{level:10s} after/before (medians) {ratio:.2f}x")
    if args.out:
        args.out.write_text(json.dumps({"sides": {k: str(v) for k, v in sides.items()}, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
