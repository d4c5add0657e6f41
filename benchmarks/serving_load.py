"""Serving throughput and latency: the engine in-process vs the same engine behind gRPC.

    python -m benchmarks.serving_load [--repository model_repository] [--concurrency 1,8,32,64]

Both modes run the same HostedModel code with the same settings, each in its
own process: "in-process" drives the scheduler directly from asyncio (what
the servicer does, minus gRPC); "grpc" starts `python -m server` and drives it
with client/loadgen.py over loopback. Same sentences (test_2016_flickr.en),
same request count per level. Writes docs/benchmarks/serving_load.md and a
PNG of the latency distributions.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np

from client.loadgen import Sample, grpc_stream, run_level

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_flags(args) -> list[str]:
    return ["--model-repository", args.repository, "--max-batch-size", str(args.max_batch_size),
            "--max-queue-size", "1024", "--intra-op-threads", str(args.threads)]


async def inprocess(args, texts) -> dict:
    from server.bundle import discover
    from server.config import ServerConfig
    from server.hosted import HostedModel
    from server.metrics import Metrics
    from server.relay import relay_for
    from server.request import DecodingParams, ErrorEvent, FinishEvent, TokenEvent
    cfg = ServerConfig.from_args(server_flags(args))
    model = HostedModel(discover(args.repository)[0], cfg, Metrics())
    model.start()
    loop = asyncio.get_running_loop()

    async def stream(text: str) -> Sample:
        t0 = time.perf_counter()
        events: asyncio.Queue = asyncio.Queue()
        (job,) = model.jobs([text], DecodingParams(), relay_for(loop).sink(events.put_nowait), None,
                              stream=True)
        model.scheduler.submit([job])
        first, last, gaps = None, None, []
        while True:
            ev = await events.get()
            now = time.perf_counter()
            if isinstance(ev, TokenEvent):
                if first is None:
                    first = now - t0
                else:
                    gaps.append(now - last)
                last = now
            elif isinstance(ev, FinishEvent):
                return Sample(first if first is not None else now - t0, gaps, now - t0,
                              len(ev.hypotheses[0].token_ids))
            elif isinstance(ev, ErrorEvent):
                raise ev.error
    # Component times for the TTFT target: one encoder pass and one decode step at batch 1.
    from server.static_decode import pad_batch
    ids, mask = pad_batch([model.tok.encode(texts[0])], 0)
    enc, step = [], []
    s = model.runtime.spec
    for _ in range(30):
        t = time.perf_counter()
        _, ck, cv = model.runtime.encode(ids, mask)
        enc.append(time.perf_counter() - t)
        past = np.zeros((s.n_dec_layers, 1, s.n_heads, 5, s.head_dim), np.float32)
        t = time.perf_counter()
        model.runtime.decode_step(np.array([[5]]), np.array([[5]]), past, past, np.ones((1, 5), bool), ck, cv, mask)
        step.append(time.perf_counter() - t)
    levels = await run_all(stream, texts, args)
    model.stop(5)
    return {"levels": levels, "encode_ms": 1e3 * float(np.median(enc)), "step_ms": 1e3 * float(np.median(step))}


async def through_grpc(args, texts) -> dict:
    from client.client import AsyncTranslatorClient
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", str(port),
                             "--metrics-port", "-1", *server_flags(args)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        async with AsyncTranslatorClient(f"127.0.0.1:{port}", timeout=300, retries=0) as client:
            for _ in range(600):
                try:
                    if await client.health() == "SERVING":
                        break
                except Exception:  # noqa: BLE001 (not up yet)
                    await asyncio.sleep(0.2)
            return {"levels": await run_all(grpc_stream(client), texts, args)}
    finally:
        proc.terminate()
        proc.wait(60)


async def run_all(stream, texts, args) -> list[dict]:
    await run_level(stream, texts, 4, 8, 60)  # warm-up
    out = []
    for c in args.concurrency:
        res = await run_level(stream, texts, c, max(args.requests, 2 * c), args.max_seconds)
        out.append(res.summary())
        print(f"  c={c}: {out[-1]['tokens_per_s']:.0f} tok/s", file=sys.stderr, flush=True)
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for mode, style in (("inprocess", "o-"), ("grpc", "s--")):
        levels = results[mode]["levels"]
        c = [lv["concurrency"] for lv in levels]
        axes[0].plot(c, [lv["tokens_per_s"] for lv in levels], style, label=mode)
        for q, alpha in ((50, 1.0), (90, 0.6), (99, 0.3)):
            axes[1].plot(c, [lv["ttft_ms"][f"p{q}"] for lv in levels], style, alpha=alpha, label=f"{mode} p{q}")
            axes[2].plot(c, [lv["itl_ms"][f"p{q}"] for lv in levels], style, alpha=alpha, label=f"{mode} p{q}")
    for ax, title in zip(axes, ("throughput (target tokens/s)", "time to first token (ms)",
                                "inter-token latency (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def render(results: dict, args, argv) -> str:
    ip, gr = results["inprocess"]["levels"], results["grpc"]["levels"]
    import onnxruntime
    lines = ["# Serving throughput and latency", "",
             f"Greedy streams over test_2016_flickr.en, {args.requests}+ requests per level, model "
             f"`{results['model']}`, decode slots {args.max_batch_size}, ONNX Runtime "
             f"{onnxruntime.__version__} intra-op threads {args.threads or 'default'}.",
             f"Machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}. "
             "Client and server share the machine.", "",
             f"Command: `python -m benchmarks.serving_load {' '.join(argv)}`", "",
             "| streams | in-process tok/s | gRPC tok/s | gRPC / in-process | TTFT p50 / p90 (ms) | "
             "ITL p50 / p90 (ms) | e2e p50 / p90 (ms) | errors |",
             "|---|---|---|---|---|---|---|---|"]
    for a, b in zip(ip, gr):
        lines.append(f"| {a['concurrency']} | {a['tokens_per_s']:,.0f} | {b['tokens_per_s']:,.0f} | "
                     f"{b['tokens_per_s'] / a['tokens_per_s']:.2f} | "
                     f"{b['ttft_ms']['p50']:.1f} / {b['ttft_ms']['p90']:.1f} | {b['itl_ms']['p50']:.1f} / {b['itl_ms']['p90']:.1f} | "
                     f"{b['e2e_ms']['p50']:.0f} / {b['e2e_ms']['p90']:.0f} | {a['errors'] + b['errors']} |")
    by_c = {lv["concurrency"]: lv for lv in gr}
    by_ci = {lv["concurrency"]: lv for lv in ip}
    enc, step = results["inprocess"]["encode_ms"], results["inprocess"]["step_ms"]
    lines += ["", "Targets:", ""]
    if 1 in by_c and 32 in by_c:
        r = by_c[32]["tokens_per_s"] / by_c[1]["tokens_per_s"]
        lines.append(f"- 32 streams vs 1 (gRPC): {r:.1f}x throughput (target >= 8x): {'met' if r >= 8 else 'missed'}")
    top = max(args.concurrency)
    gap = 1 - by_c[top]["tokens_per_s"] / by_ci[top]["tokens_per_s"]
    lines.append(f"- gRPC vs in-process at {top} streams: {100 * gap:.1f}% below (target <= 10%): "
                 f"{'met' if gap <= 0.10 else 'missed'}")
    if 1 in by_c:
        bound = enc + step + 3.0
        t = by_c[1]["ttft_ms"]["p50"]
        lines.append(f"- TTFT p50 at 1 stream (gRPC): {t:.1f} ms vs encoder {enc:.1f} ms + one step {step:.1f} ms "
                     f"+ 3 ms = {bound:.1f} ms: {'met' if t <= bound else 'missed'}")
    lines += ["", "![latency](serving_load.png)", ""]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repository", default=str(ROOT / "model_repository"))
    p.add_argument("--src-file", default=str(ROOT.parent / "shared/data/multi30k/test_2016_flickr.en"))
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64])
    p.add_argument("--requests", type=int, default=96)
    p.add_argument("--max-seconds", type=float, default=90.0)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0 = default)")
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "serving_load.md"))
    p.add_argument("--mode", choices=["inprocess", "grpc"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    texts = Path(args.src_file).read_text(encoding="utf-8").splitlines()
    if args.mode:
        fn = inprocess if args.mode == "inprocess" else through_grpc
        print(json.dumps(asyncio.run(fn(args, texts))))
        return 0
    from server.bundle import discover
    results = {"model": discover(args.repository)[0].name}
    for mode in ("inprocess", "grpc"):
        print(f"{mode}:", file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, "-m", "benchmarks.serving_load", *argv, "--mode", mode], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True, check=True)
        results[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    plot(results, out.with_suffix(".png"))
    out.write_text(render(results, args, argv))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
