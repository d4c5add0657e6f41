"""Where each thread's CPU goes, per output token and per call: our server against the tuned CTranslate2 peer.

    python -m benchmarks.studies.thread_cpu [--precision fp32] [--streams 64] [--max-output-tokens 0]
        [--seconds 12] [--ct2-config 2x1] [--rounds 2]

The question: our server spends more CPU per output token than the peer at 64 streams, while its
decoder alone is no slower; which threads of which processes pay for it, and is it paid per token or
per call? Each server (ours with its default layout, the peer behind benchmarks/ct2_server.py at one
--ct2-config setting, as benchmarks.serving_compare starts them) serves `python -m client.loadgen
--rpc stream` at --streams streams for --seconds; over that window this reads every thread of the
server's processes from /proc: CPU time (utime + stime) and voluntary context switches (each one a
sleep, and so a wake-up later: on a virtual machine a cross-thread wake-up costs tens of µs). Threads
are named by role where /proc says it (ZMQbg/IO, event_engine) and by their tid otherwise; a process's
first thread is its main thread. `--max-output-tokens 1` makes every call one token long, so the same
figures become costs per call (the peer's and ours differ most there).
Servers alternate over --rounds; each round prints a table per server.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from benchmarks.harness import serve_level, descendants, machine, rotations, wait_serving
from benchmarks.serving_compare import prepare, start

ROOT = Path(__file__).resolve().parents[2]


def threads(pid: int) -> dict[tuple[int, int], tuple[str, float, int]]:
    """(process, thread) -> (role, CPU seconds, voluntary context switches) for `pid` and its descendants;
    the role names the process too (an engine core, or the server)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for proc in [pid, *descendants(pid)]:
        try:
            core = b"server.coreprocess" in Path(f"/proc/{proc}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        what = f"engine core {proc}" if core else f"server {proc}"
        for task in Path(f"/proc/{proc}/task").glob("*"):
            try:
                stat = (task / "stat").read_text()
                status = (task / "status").read_text()
            except (FileNotFoundError, ProcessLookupError):
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat.rsplit(")", 1)[1].split()
            switches = int(status.split("voluntary_ctxt_switches:")[1].split()[0])
            tid = int(task.name)
            role = "main" if tid == proc else (name if name not in ("python", "python3") else f"thread {tid}")
            out[(proc, tid)] = (f"{what} | {role}", (int(fields[11]) + int(fields[12])) / tick, switches)
    return out


def loadgen_flags(args) -> list[str]:
    """The study's model (named: neither server identifies languages) and its output budget."""
    return ["--model", "multi30k-en-de-small"] + (["--max-output-tokens", str(args.max_output_tokens)]
                                                   if args.max_output_tokens else [])


async def _serving(target: str) -> None:
    from client.client import AsyncTranslatorClient
    async with AsyncTranslatorClient(target, timeout=60, retries=0) as client:
        await wait_serving(client)


def measure(kind: str, paths: dict, args) -> str:
    stop, pid, target = start(kind, args.precision, paths, SimpleNamespace(
        ours_flags="", before_flags="", max_batch_size=64))
    try:
        asyncio.run(_serving(target))
        level = f"stream:{args.streams}"
        serve_level(target, level, 3, loadgen_flags(args))  # warm-up
        before = threads(pid)
        figures = serve_level(target, level, args.seconds, loadgen_flags(args))
        after = threads(pid)
    finally:
        stop()
    tokens, calls = figures["output_tokens"], figures["requests"]
    rows, total_cpu, total_sw = [], 0.0, 0
    by_process = collections.defaultdict(list)
    for key, (role, cpu, sw) in after.items():
        _, cpu0, sw0 = before.get(key, (role, 0.0, 0))
        by_process[key[0]].append((role, cpu - cpu0, sw - sw0))
    for proc, items in by_process.items():
        for role, cpu, sw in sorted(items, key=lambda x: -x[1]):
            total_cpu, total_sw = total_cpu + cpu, total_sw + sw
            if cpu >= 0.005 * args.seconds:
                rows.append(f"| {role} | {1e6 * cpu / tokens:.1f} | {1e6 * cpu / calls:.0f} | {sw / calls:.2f} |")
    head = (f"\n{kind}: {figures['output_tokens_per_s']:.0f} tokens/s, {calls / figures['duration_s']:.0f} calls/s, "
            f"{tokens / calls:.1f} tokens per call; server CPU {1e6 * total_cpu / tokens:.1f} µs per token, "
            f"{1e6 * total_cpu / calls:.0f} µs per call, {total_sw / calls:.2f} voluntary switches per call\n\n"
            "| process | thread | µs per token | µs per call | switches per call |\n|---|---|---|---|---|")
    return "\n".join([head, *rows])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precision", default="fp32", choices=["fp32", "int8"])
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--max-output-tokens", type=int, default=0, help="0: as the model decides (1: costs per call)")
    p.add_argument("--seconds", type=float, default=12.0)
    p.add_argument("--ct2-config", default="2x1", help="the peer's setting (benchmarks.serving_compare's form)")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="thread-cpu-"))
    paths = prepare(work, [args.precision])[args.precision]
    m = machine()
    print(f"`python -m benchmarks.studies.thread_cpu {' '.join(argv or sys.argv[1:])}`; {m['cpu']} ({m['features']}), "
          f"{m['cores']} cores; {time.strftime('%Y-%m-%d')}")
    for kinds in rotations(["ours", f"ct2:{args.ct2_config}"], args.rounds):
        for kind in kinds:
            print(measure(kind, paths, args), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
