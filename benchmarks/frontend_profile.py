"""Where the server's CPU goes under load, by thread and by component: the frontend's share measured.

    python -m benchmarks.frontend_profile [--streams 64] [--unary-clients 4] [--seconds 20]

Starts the server (shipped model, default settings, gRPC only), drives it with the load
generator in another process — streams (`--rpc stream --concurrency N`, one message per token)
and unary calls of 32 texts — and samples the server with py-spy (`record --subprocesses
--threads --function --format raw`, 100 Hz, each process paused per sample) over a window in the
middle of the load: the frontend and, in the default layout, the engine core processes (replicas)
it started. Over the same window it reads the CPU time of that whole process tree (/proc/PID/stat)
and its generated tokens (nmt_output_tokens_total), so each component's share becomes microseconds
of server CPU per output token.

A sample is charged to the innermost frame we can name (self time): ONNX Runtime, grpc
(grpc.aio and its Cython core), protobuf, the asyncio machinery, prometheus_client, logging,
numpy, or a module of this repository. Samples where no Python frame is on the CPU (a native
thread of grpc's core or ONNX Runtime's pool) are counted per thread under "native". The event
loop's thread (the frontend: gRPC handlers, the relay, detokenisation, documents) and the
engine thread are reported apart, and the loop thread's time is also split by the
repository function it is under (inclusive), to say which stage of a request costs what. Samples whose innermost frame is a known blocking wait
(an idle executor worker, select, a condition wait) are dropped: py-spy's idle detection misses
those.
Writes docs/benchmarks/frontend_profile.md.
"""
from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Sequence

from benchmarks.harness import TEST_SOURCES, ServerProcess, cpu_seconds, date_line, machine, machine_line

ROOT = Path(__file__).resolve().parents[1]
RATE = 100  # py-spy samples per second
SRC = TEST_SOURCES
FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^():]+)(?::\d+)?\)$")
# (label, predicate on the frame's file) — first match wins; order from most to least specific.
COMPONENTS = (
    ("onnxruntime", lambda f: "onnxruntime" in f),
    ("grpc", lambda f: "grpc" in f or f.endswith(".pyx") or f.endswith(".pxi")),
    ("protobuf", lambda f: "google/protobuf" in f or "protos/nmt" in f),
    ("prometheus_client", lambda f: "prometheus_client" in f),
    ("logging", lambda f: f.startswith("logging/") or "/logging/" in f or "pythonjsonlogger" in f),
    ("asyncio", lambda f: "asyncio/" in f or f in ("selectors.py", "contextvars.py")),
    ("numpy", lambda f: "numpy" in f),
    ("threading", lambda f: f in ("threading.py", "queue.py")),
)


def component(file: str) -> str:
    for label, match in COMPONENTS:
        if match(file):
            return label
    if file.startswith(("server/", "models/", "client/")):
        return file
    return "other Python"


def parse(raw: str) -> list[tuple[str, list[tuple[str, str]], int]]:
    """py-spy's raw lines -> (thread name, [(function, file)], samples). With --subprocesses a stack starts
    with its processes ('process PID:"command line"', outermost first); a thread of an engine core process
    (server.coreprocess) is named "core/<its name>"."""
    out = []
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        core = False
        while frames and frames[0].startswith("process "):
            core = "server.coreprocess" in frames.pop(0)  # the innermost process decides
        if not frames:
            continue
        thread = frames[0].split(": ", 1)[-1] if frames[0].startswith("thread") and ": " in frames[0] else "?"
        thread = f"core/{thread}" if core else thread
        parsed = []
        for frame in frames[1:]:
            m = FRAME.match(frame)
            parsed.append((m["func"], m["file"]) if m else (frame, ""))
        out.append((thread, parsed, int(count)))
    return out


# Leaf frames that are a thread blocked in a C call (a queue, a lock, select): py-spy's idle
# detection misses these, so they are dropped here rather than charged as CPU.
IDLE = {("_worker", "concurrent/futures/thread.py"), ("_PollLikeSelector.select", "selectors.py"),
        ("EpollSelector.select", "selectors.py"), ("Condition.wait", "threading.py"), ("Event.wait", "threading.py"),
        ("Thread.run", "threading.py"), ("Scheduler.wait_for_work", "server/core/scheduler.py")}


# A request's pipeline stages, for the table over every thread: a sample goes to the stage of the
# innermost repository frame on its stack (first matching rule), so ONNX Runtime's time under the
# encoder call is "encode", the tokenizer's under admission is "tokenise", logging under the call's
# record is "log and metrics". No repository frame: grpc.aio and asyncio between handlers.
STAGES = (
    ("tokenise", lambda func, file: file == "models/core/tokenizer.py" and "decode" not in func
     and "pieces_to_text" not in func),
    ("detokenise", lambda func, file: file in ("models/core/tokenizer.py", "server/frontend/detok.py")),
    ("encode (encoder pass)", lambda func, file: ("encode" in func or "embed" in func)
     and file in ("models/core/runtime.py", "server/core/engine.py")),
    ("decode (steps, token choice, bookkeeping)", lambda func, file: file.startswith(
        ("models/core/inplace_step.py", "models/core/static_decode.py", "models/core/kv_cache.py",
         "models/core/runtime.py", "server/core/engine.py", "server/core/chooser.py", "server/core/greedy.py",
         "server/core/row_controls.py",
         "server/core/runaway.py", "server/core/loop.py"))
     or (file == "server/core/scheduler.py" and func.split(".")[-1].lstrip("_") not in ("schedule", "submit"))),
    ("split into sentences", lambda func, file: file.startswith(("server/texts/segment.py",
                                                                "server/texts/plan.py",
                                                                "server/texts/placeholders.py"))),
    ("assemble the answer", lambda func, file: file.startswith("server/texts/")),
    ("route and check (admission, language id)", lambda func, file: file in ("server/frontend/admission.py",
                                                                             "server/frontend/language_id.py")),
    ("queue (submit, schedule)", lambda func, file: file in ("server/frontend/hosted.py", "server/core/scheduler.py",
                                                             "server/core/request.py")),
    ("hop (relay, core link)", lambda func, file: file == "server/core/relay.py" or file.startswith("server/coreprocess/")),
    ("log and metrics", lambda func, file: file.startswith(("server/observability/", "server/observability/metrics.py"))),
    ("handler and response messages", lambda func, file: file.startswith(("server/edge/servicer.py", "server/edge/wire.py",
                                                                          "server/edge/gateway.py"))),
)


def stage_of(frames: list[tuple[str, str]]) -> str:
    for func, file in reversed(frames):
        if file.startswith(("server/", "models/")) and file != "server/__main__.py":
            return next((label for label, match in STAGES if match(func, file)), f"other ({file})")
    return "grpc.aio and asyncio between handlers"


def thread_kind(name: str) -> str:
    if name.startswith(("engine-", "core/engine-")):
        return "engine thread"
    if name.startswith("core/"):  # a replica's main thread (its frontends' requests, the answers), its log writer
        return "engine core, other threads"
    if name.startswith("MainThread"):
        return "event loop (frontend)"
    if name.startswith("nmt-prep"):
        return "admission workers"
    if "_poll_wrapper" in name:
        return "grpc poller"
    return "other threads"


def summarise(samples) -> dict:
    by_thread: collections.Counter = collections.Counter()
    by_component: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    stages: collections.Counter = collections.Counter()
    pipeline: collections.Counter = collections.Counter()  # every thread, by request stage
    idle = 0
    for thread, frames, n in samples:
        if frames and frames[-1] in IDLE:
            idle += n
            continue
        kind = thread_kind(thread)
        by_thread[kind] += n
        leaf = frames[-1][1] if frames else ""
        by_component[kind][component(leaf) if leaf else "native"] += n
        pipeline[stage_of(frames)] += n
        if kind == "event loop (frontend)":
            # The innermost repository function on the stack: the stage of a request that was running
            # (with whatever grpc, protobuf or asyncio code it called).
            ours = [f"{func} ({file})" for func, file in frames
                    if file.startswith(("server/", "models/")) and file != "server/__main__.py"]
            stages[ours[-1] if ours else "grpc.aio and asyncio between handlers"] += n
    return {"threads": by_thread, "components": by_component, "stages": stages, "pipeline": pipeline, "idle": idle}


def output_tokens(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("nmt_output_tokens_total{"))


def finished_calls(metrics_port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("nmt_requests_total{"))


def profile(load: list[str], seconds: float, py_spy: str) -> dict:
    server = ServerProcess("--log-level", "warning").start()
    port, metrics_port = server.port, server.metrics_port
    try:
        client = subprocess.Popen([sys.executable, "-m", "client.loadgen", "--target", f"127.0.0.1:{port}",
                                   "--src-file", str(SRC), "--duration", str(seconds + 10), "--quiet", *load],
                                  cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(5)  # past the ramp-up
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "raw.txt"
            cpu0, tok0, t0 = cpu_seconds(server.pid), output_tokens(metrics_port), time.perf_counter()
            calls0 = finished_calls(metrics_port)
            spy = subprocess.run([py_spy, "record", "--pid", str(server.pid), "--subprocesses", "--duration", str(int(seconds)),
                                  "--rate", str(RATE), "--format", "raw", "--threads", "--function", "-o", str(out)],
                                 check=True, capture_output=True, text=True)
            cpu1, tok1, t1 = cpu_seconds(server.pid), output_tokens(metrics_port), time.perf_counter()
            calls = finished_calls(metrics_port) - calls0
            samples = parse(out.read_text())
            if "behind" in spy.stdout + spy.stderr:
                print("  warning: py-spy fell behind its sampling rate; the µs figures are low", file=sys.stderr)
        client.wait(seconds + 120)
    finally:
        server.stop()
    tokens = tok1 - tok0
    # A sample is one 10 ms tick (100 Hz) of one thread on a CPU: ticks x 10 ms = that thread's CPU time.
    tick_s = 1 / RATE
    return {"summary": summarise(samples), "cpu_s": cpu1 - cpu0, "tokens": tokens, "wall_s": t1 - t0,
            "calls": calls, "tokens_per_call": tokens / max(calls, 1),
            "us_per_token": 1e6 * (cpu1 - cpu0) / max(tokens, 1), "us_per_sample_token": 1e6 * tick_s / max(tokens, 1)}


def render(results: dict, argv: Sequence[str]) -> str:
    m = machine()
    out = ["# Where the server's CPU goes under load", "",
           f"Command: `python -m benchmarks.frontend_profile {' '.join(argv)}`", "",
           date_line(m), "", machine_line("shared by the server and the load generator", m), "",
           "Shipped model (en->de), default settings, py-spy at 100 Hz over the window (the server pauses per sample: absolute rates are a little "
           "low, shares are what matter).", ""]
    for name, r in results.items():
        s = r["summary"]
        total = sum(s["threads"].values())
        per = r["us_per_sample_token"]  # µs of CPU per output token that one sample stands for
        visible = per * total
        native = r['us_per_token'] - visible
        split = (f"{visible:.0f} µs in threads running Python (sampled; {s['idle']:,} samples of threads blocked in a "
                 f"queue, lock or select dropped) and {native:.0f} µs in native threads (ONNX Runtime's intra-op pool, "
                 "grpc's core)") if native >= 0 else \
            (f"the sampled Python threads stand for {visible:.0f} µs, more than the CPU time: py-spy also counts a "
             "thread waiting for the interpreter lock as running, so read the shares, not the sum")
        out += [f"## {name}", "",
                f"{r['tokens']:,.0f} output tokens in {r['wall_s']:.1f} s ({r['tokens'] / r['wall_s']:,.0f} tokens/s); "
                f"server CPU {r['cpu_s']:.1f} s = **{r['us_per_token']:.0f} µs per output token**; {split}.",
                "", "| thread | share of Python samples | µs per token |", "|---|---|---|"]
        for kind, n in s["threads"].most_common():
            out.append(f"| {kind} | {100 * n / total:.1f}% | {per * n:.0f} |")
        for kind in ("event loop (frontend)", "engine thread", "engine core, other threads", "admission workers",
                     "other threads"):
            comp = s["components"].get(kind)
            if not comp:
                continue
            out += ["", f"{kind}, self time by component:", "", "| component | share of Python samples | µs per token |",
                    "|---|---|---|"]
            for label, n in comp.most_common(14):
                out.append(f"| {label} | {100 * n / total:.1f}% | {per * n:.0f} |")
        tpc = r.get("tokens_per_call", 0.0)
        out += ["", f"Every thread, by the request's stage (the innermost repository function on the stack; "
                f"{r.get('calls', 0):,.0f} calls of {tpc:.1f} output tokens each in the window):", "",
                "| stage | share of Python samples | µs per token | µs per call |", "|---|---|---|---|"]
        for label, n in s["pipeline"].most_common():
            out.append(f"| {label} | {100 * n / total:.1f}% | {per * n:.1f} | {per * n * tpc:,.0f} |")
        out += ["", "event loop, by the innermost repository function on the stack (the request's stage, with the "
                "grpc/protobuf/asyncio code it called):", "",
                "| stage | share of Python samples | µs per token |", "|---|---|---|"]
        for label, n in s["stages"].most_common(16):
            out.append(f"| `{label}` | {100 * n / total:.1f}% | {per * n:.1f} |")
        out.append("")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=int, default=64)
    p.add_argument("--unary-clients", type=int, default=4)
    p.add_argument("--seconds", type=float, default=20)
    p.add_argument("--model", default="multi30k-en-de-small",
                   help="the model every call names, as benchmarks.serving_compare does (so the server identifies "
                        "no language); '' names none")
    p.add_argument("--out", default="docs/benchmarks/frontend_profile.md")
    args = p.parse_args(argv)
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        p.error("py-spy is needed: pip install py-spy")
    loads = {f"{args.streams} streams, a message per token": (args.streams, ["--rpc", "stream", "--concurrency",
                                                                           str(args.streams)]),
             f"unary, {args.unary_clients} clients x 32 texts": (args.unary_clients, [
                 "--rpc", "unary", "--texts-per-call", "32", "--concurrency", str(args.unary_clients)])}
    named = ["--model", args.model] if args.model else []
    loads = {name: load + named for name, (callers, load) in loads.items() if callers > 0}  # 0: that load is skipped
    results = {}
    for name, load in loads.items():
        print(f"profiling: {name}", file=sys.stderr)
        results[name] = profile(load, args.seconds, py_spy)
        print(f"  {results[name]['us_per_token']:.0f} µs of server CPU per token", file=sys.stderr)
    report = render(results, list(argv if argv is not None else sys.argv[1:]))
    Path(args.out).write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
