"""What a burst of large HTTP bodies takes from the frontend, and how soon it is given back (issue 62).

    python -m benchmarks.memory_burst [--bodies 64] [--concurrency 8] [--texts 140] [--text-chars 24000]
        [--after-s 30] [--rounds 3] [--before ../before] [--out docs/benchmarks/memory_burst.md] [-- server flags...]

A sidecar's frontend is measured by what it holds once a burst is over, not only at its peak: a burst
of large bodies (here native-API bodies of --texts texts of --text-chars characters, 3.4 MB by default,
each parsed whole and refused for holding more texts than a request may) grew a fresh frontend from
134 to 292 MB and it kept that (docs/memory.md). Each round starts the server with default flags (plus
any after `--`), warms it (a small call and a large body, three times: the lazily loaded language
identifier and the JSON path are part of "at rest"), reads the frontend's resident memory at rest, sends
the burst, then samples it every 0.25 s for --after-s seconds. Reported per round: at rest, peak, the
end, the end over at rest, and how long after the burst's last answer the frontend came back within 10%
of at rest; a plot of every round's samples beside the table.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Optional

import httpx

from benchmarks.harness import ServerProcess, commit_of, date_line, machine_line
from server.observability.memory import resident_bytes

WITHIN = 1.10  # "back": within 10% of at rest (the target)
EVERY_S = 0.25


def burst_round(args, flags: list[str], root: Optional[Path] = None) -> dict:
    body = json.dumps({"texts": ["A dog runs in the park. " * (args.text_chars // 24)] * args.texts}).encode()
    small = {"texts": ["A dog runs in the park."]}
    server = ServerProcess(*flags, http_port=0, metrics=False, **({"root": root} if root else {})).start()
    try:
        url, pid = server.http_url + "/v1/translate", server.pid
        with httpx.Client(timeout=120) as http:
            for _ in range(3):
                http.post(url, json=small)
                http.post(url, content=body, headers={"Content-Type": "application/json"})
        time.sleep(2.0)
        rest = resident_bytes(pid)
        samples: list[tuple[float, int]] = []
        stop = threading.Event()
        t0 = time.monotonic()

        def sample() -> None:
            while not stop.is_set():
                rss = resident_bytes(pid)
                if rss is not None:
                    samples.append((time.monotonic() - t0, rss))
                stop.wait(EVERY_S)
        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        with httpx.Client(timeout=120) as http, cf.ThreadPoolExecutor(args.concurrency) as pool:
            statuses = list(pool.map(lambda _: http.post(url, content=body, headers={
                "Content-Type": "application/json"}).status_code, range(args.bodies)))
        ended = time.monotonic() - t0
        time.sleep(args.after_s)
        stop.set()
        sampler.join()
    finally:
        server.stop()
    after = [(t, rss) for t, rss in samples if t >= ended]
    back = next((t - ended for t, rss in after if rss <= WITHIN * rest), None)
    return {"rest_mb": rest / 2**20, "peak_mb": max(r for _, r in samples) / 2**20, "end_mb": samples[-1][1] / 2**20,
            "back_s": back, "burst_s": ended, "statuses": sorted(set(statuses)), "body_mb": len(body) / 2**20,
            "samples": [(round(t, 3), rss) for t, rss in samples]}


def render(rounds: list[dict], args, argv: list[str]) -> str:
    def cell(x: Optional[float], fmt: str = "{:.1f}") -> str:
        return "not within --after-s" if x is None else fmt.format(x)
    lines = ["# A burst of large bodies: what the frontend takes and gives back (benchmarks/memory_burst.py)", "",
             date_line(), machine_line(), "",
             f"Command: `{' '.join(['python -m benchmarks.memory_burst', *argv])}`", "",
             f"Burst: {args.bodies} native-API bodies of {rounds[0]['body_mb']:.1f} MB ({args.texts} texts of "
             f"{args.text_chars:,} characters), {args.concurrency} at a time, each parsed whole and refused "
             f"(HTTP {', '.join(map(str, rounds[0]['statuses']))}); the frontend's resident memory (VmRSS) every "
             f"{EVERY_S} s until {args.after_s:.0f} s after the last answer. At rest: after three small calls and "
             "three such bodies, 2 s idle.", "",
             "| side | round | at rest MB | peak MB | end MB | end / at rest | back within 10% after |",
             "|---|---|---|---|---|---|---|"]
    for r in rounds:
        lines.append(f"| {r['side']} | {r['round']} | {r['rest_mb']:.0f} | {r['peak_mb']:.0f} | {r['end_mb']:.0f} | "
                     f"{r['end_mb'] / r['rest_mb']:.2f} | {cell(r['back_s'], '{:.2f} s')} |")
    lines.append("")
    for side in dict.fromkeys(r["side"] for r in rounds):
        ratios = [r["end_mb"] / r["rest_mb"] for r in rounds if r["side"] == side]
        lines.append(f"- {side}: median end / at rest {statistics.median(ratios):.2f} (target: <= {WITHIN:.2f} "
                     "within 30 s).")
    return "\n".join(lines) + "\n"


def plot(rounds: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 4))
    for r in rounds:
        ax.plot([t for t, _ in r["samples"]], [rss / 2**20 for _, rss in r["samples"]],
                label=f"{r['side']}, round {r['round']}", linestyle="-" if r["side"] == "this checkout" else ":")
        ax.axhline(r["rest_mb"] * WITHIN, color="grey", linewidth=0.5, linestyle="--")
        ax.axvline(r["burst_s"], color="grey", linewidth=0.5)
    ax.set_xlabel("seconds from the burst's first body (vertical lines: its last answer)")
    ax.set_ylabel("frontend resident MB")
    ax.set_title("A burst of large bodies, and what the frontend keeps (dashed: at rest + 10%)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Optional[list[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[argv.index("--") + 1:] if "--" in argv else []
    ours = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bodies", type=int, default=64, help="bodies in the burst")
    p.add_argument("--concurrency", type=int, default=8, help="bodies in flight at once")
    p.add_argument("--texts", type=int, default=140, help="texts per body (over --max-texts-per-request: refused)")
    p.add_argument("--text-chars", type=int, default=24_000, help="characters per text")
    p.add_argument("--after-s", type=float, default=30.0, help="seconds sampled after the burst's last answer")
    p.add_argument("--rounds", type=int, default=3, help="a fresh server each round")
    p.add_argument("--before", type=Path, help="an earlier checkout (a git worktree) measured in the same rounds")
    p.add_argument("--out", type=Path, help="write the table here (markdown), the samples (.json) and a plot (.png)")
    args = p.parse_args(ours)
    sides = [("this checkout", None)] + ([(f"before ({commit_of(args.before)})", args.before.resolve())] if args.before else [])
    rounds = []
    for i in range(args.rounds):
        for side, root in (sides if i % 2 == 0 else sides[::-1]):  # the order alternates by round
            r = burst_round(args, flags, root)
            r.update(side=side, round=i + 1)
            rounds.append(r)
            print(f"{side}, round {i + 1}: at rest {r['rest_mb']:.0f} MB, peak {r['peak_mb']:.0f}, end "
                  f"{r['end_mb']:.0f}, back within 10% after {r['back_s']} s", flush=True)
    text = render(rounds, args, ours)
    print(text)
    if args.out:
        args.out.write_text(text + f"\n![the frontend's memory over each round]({args.out.with_suffix('.png').name})\n")
        args.out.with_suffix(".json").write_text(json.dumps(rounds, indent=1))
        plot(rounds, args.out.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
