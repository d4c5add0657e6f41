"""Serving throughput and latency: the engine in-process vs the same engine behind gRPC.

    python -m benchmarks.serving_load [--repository model_repository] [--concurrency 1,8,32,64]
        [--requests 1000] [--stream-intervals 1,4] [--repeats 3]

Both modes run the same HostedModel code with the same settings, each in its
own process: "in-process" drives the scheduler directly from asyncio (what
the servicer does, minus gRPC); "grpc" starts `python -m server` and drives it
with client/loadgen/ over loopback. Same sentences (test_2016_flickr.en),
same request count per level. Writes docs/benchmarks/serving_load.md and a
PNG of the latency distributions.
"""
from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Optional, Sequence

import numpy as np

from benchmarks.harness import TEST_SOURCES, ServerProcess, cpu_seconds, date_line, machine_line, wait_serving
from client.loadgen import Sample, grpc_stream, run_level

ROOT = Path(__file__).resolve().parents[1]


def server_flags(args) -> list[str]:
    return ["--model-repository", args.repository, "--max-batch-size", str(args.max_batch_size),
            "--max-queue-size", "1024", "--intra-op-threads", str(args.threads),
            "--stream-interval", str(args.stream_interval), "--provider", args.provider, "--variant", args.variant,
            "--decoder", args.decoder, "--engine-core", args.engine_core,
            *(["--frontends", str(args.frontends)] if args.engine_core == "process" else []),
            *args.server_flags.split()]


def component_costs(runtime, tok, texts: Sequence[str], out_len: float) -> dict:
    """ONNX Runtime alone, no serving code: the per-token cost of one stream vs 32 in one batch.

    One stream pays a batch-1 decode step per token plus its encoder pass spread over its
    output; 32 streams share each step and encode side by side. The ratio of the two is the
    most that 32 streams can gain over one on this machine, whatever the server does.
    """
    from models.core.static_decode import pad_batch
    s = runtime.spec
    sources = [tok.encode(t) for t in texts[:32]]
    past_len = max(1, int(out_len / 2))  # the average step sees half the output as past

    def timed(fn, reps=30) -> float:
        fn()
        ts = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return float(np.median(ts))

    out = {}
    for b in (1, 32):
        ids, mask = pad_batch(sources[:b], s.pad_id)
        _, ck, cv = runtime.encode(ids, mask)
        past = np.zeros((s.n_dec_layers, b, s.n_heads, past_len, s.head_dim), np.float32)
        tokens, positions = np.full((b, 1), 5), np.full((b, 1), past_len)
        out[f"encode_{b}_ms"] = 1e3 * timed(lambda: runtime.encode(ids, mask))
        out[f"step_{b}_ms"] = 1e3 * timed(lambda: runtime.decode_step(
            tokens, positions, past, past, np.ones((b, past_len), bool), ck, cv, mask))
    one = out["step_1_ms"] + out["encode_1_ms"] / out_len
    many = (out["step_32_ms"] + out["encode_32_ms"] / out_len) / 32
    out.update(output_tokens=out_len, ceiling_32_vs_1=one / many)
    # The TTFT bound: what a lone request's first token needs, i.e. the encoder pass and the first
    # decode step (empty past) of each test sentence in turn. Repeating one sentence understates it:
    # every new source length is a new shape for ONNX Runtime (~20% slower than a repeated one).
    enc, first = [], []
    empty = np.zeros((s.n_dec_layers, 1, s.n_heads, 0, s.head_dim), np.float32)
    for src in [tok.encode(t) for t in texts[:64]]:
        ids, mask = pad_batch([src], s.pad_id)
        t = time.perf_counter()
        _, ck, cv = runtime.encode(ids, mask)
        enc.append(time.perf_counter() - t)
        t = time.perf_counter()
        runtime.decode_step(np.array([[s.bos_id]]), np.zeros((1, 1), np.int64), empty, empty,
                            np.ones((1, 0), bool), ck, cv, mask)
        first.append(time.perf_counter() - t)
    out.update(ttft_encode_ms=1e3 * float(np.median(enc)), ttft_step_ms=1e3 * float(np.median(first)))
    return out


def time_inside(*sessions) -> Callable[[], float]:
    """Wrap the sessions' run methods; returns a reader of the seconds spent inside them so far.

    A serving or decoding loop's wall time over this is what its own code (scheduler, sampler,
    relays, numpy) costs on top of ONNX Runtime running the very same shapes.
    """
    spent = [0.0]

    def timed(session, method: str) -> None:
        inner = getattr(session, method)

        def run(*a, **kw):
            t = time.perf_counter()
            try:
                return inner(*a, **kw)
            finally:
                spent[0] += time.perf_counter() - t
        setattr(session, method, run)
    for session in sessions:
        for method in ("run", "run_with_iobinding"):
            timed(session, method)
    return lambda: spent[0]


async def inprocess(args, texts) -> dict:
    from models.core.bundle import discover
    from server.config import ServerConfig
    from server.frontend.hosted import HostedModel
    from server.observability.metrics import Metrics
    from server.core.relay import relay_for
    from server.core.request import DecodingParams, ErrorEvent, FinishEvent, TokenEvent
    cfg = ServerConfig.from_args(server_flags(args))
    model = HostedModel(discover(args.repository)[0], cfg, Metrics())
    runtime = model.here.runtime
    inside_ort = time_inside(runtime.encoder, runtime.inplace if runtime.inplace is not None else runtime.decoder)
    model.here.start()
    loop = asyncio.get_running_loop()

    async def stream(text: str) -> Sample:
        t0 = time.perf_counter()
        events: asyncio.Queue = asyncio.Queue()
        (job,) = model.jobs([text], DecodingParams(), relay_for(loop).sink(events.put_nowait), None,
                              stream=True)
        model.here.scheduler.submit([job])
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
                              len(ev.hypotheses[0].tokens))
            elif isinstance(ev, ErrorEvent):
                raise ev.error
    levels = await run_all(stream, texts, args, cpu_seconds, inside_ort)
    model.here.stop(5)
    # The TTFT bound (one encoder pass + one step at batch 1) and the scaling ceiling, from ORT alone.
    out_len = sum(lv["tokens"] for lv in levels) / sum(lv["requests"] for lv in levels)
    return {"levels": levels, "components": component_costs(model.here.runtime, model.tok, texts, out_len)}


async def through_grpc(args, texts) -> dict:
    from client.client import AsyncTranslatorClient
    from models.core.bundle import discover
    server = ServerProcess(*server_flags(args), metrics=False).launch()
    clients = [AsyncTranslatorClient(server.target, timeout=300, retries=0, own_connection=args.connections > 1)
               for _ in range(args.connections)]
    try:
        await wait_serving(clients[0])
        cpu = lambda: (cpu_seconds(), cpu_seconds(server.pid))  # noqa: E731 (client, server and its children)
        # Every call names the model the in-process engine runs (the repository's first): the same work
        # on both sides. A call naming no model, with several loaded, is also routed by language
        # identification (server/frontend/admission.py), which the in-process path never does.
        name = discover(args.repository)[0].name
        streams, turn = [grpc_stream(c, model=name) for c in clients], itertools.count()

        def stream(text: str):  # round the connections (frontend processes, with --frontends)
            return streams[next(turn) % len(streams)](text)
        return {"levels": await run_all(stream, texts, args, cpu)}
    finally:
        for c in clients:
            await c.close()
        server.stop()


async def run_all(stream, texts, args, cpu, inside_ort: Optional[Callable[[], float]] = None) -> list[dict]:
    """Every concurrency level, with CPU microseconds per output token (client and server side)
    and, in-process, the share of the level's wall time spent inside ONNX Runtime."""
    await run_level(stream, texts, 4, 8, 60)  # warm-up
    out = []
    for c in args.concurrency:
        before, ort0, t0 = cpu(), inside_ort() if inside_ort else 0.0, time.perf_counter()
        res = await run_level(stream, texts, c, max(args.requests, 2 * c), args.max_seconds)
        after, wall = cpu(), time.perf_counter() - t0
        out.append(res.summary())
        if inside_ort:
            out[-1]["ort_share"] = (inside_ort() - ort0) / wall
        tokens = max(out[-1]["tokens"], 1)
        if isinstance(before, tuple):
            out[-1]["cpu_us_per_token"] = {"client": 1e6 * (after[0] - before[0]) / tokens,
                                           "server": 1e6 * (after[1] - before[1]) / tokens}
        else:
            out[-1]["cpu_us_per_token"] = {"process": 1e6 * (after - before) / tokens}
        print(f"  c={c}: {out[-1]['tokens_per_s']:.0f} tok/s", file=sys.stderr, flush=True)
    return out


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    base = results["runs"][0]
    for mode, style in (("inprocess", "o-"), ("grpc", "s--")):
        levels = base[mode]["levels"]
        c = [lv["concurrency"] for lv in levels]
        axes[0].plot(c, [lv["tokens_per_s"] for lv in levels], style, label=mode)
        for q, alpha in ((50, 1.0), (90, 0.6), (99, 0.3)):
            axes[1].plot(c, [lv["ttft_ms"][f"p{q}"] for lv in levels], style, alpha=alpha, label=f"{mode} p{q}")
            axes[2].plot(c, [lv["itl_ms"][f"p{q}"] for lv in levels], style, alpha=alpha, label=f"{mode} p{q}")
    for run in results["runs"][1:]:
        for mode, style in (("inprocess", "o:"), ("grpc", "s:")):
            levels = run[mode]["levels"]
            axes[0].plot([lv["concurrency"] for lv in levels], [lv["tokens_per_s"] for lv in levels], style,
                         label=f"{mode}, stream interval {run['stream_interval']}")
    for ax, title in zip(axes, ("throughput (target tokens/s)", "time to first token (ms)",
                                "gap between stream messages (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def median_run(repeats: list[dict]) -> dict:
    """Per level, the repeat with the median throughput (its latencies too), plus the spread."""
    levels = []
    for i in range(len(repeats[0]["levels"])):
        cells = sorted((r["levels"][i] for r in repeats), key=lambda lv: lv["tokens_per_s"])
        levels.append({**cells[len(cells) // 2], "tokens_per_s_range": [cells[0]["tokens_per_s"],
                                                                         cells[-1]["tokens_per_s"]]})
    out = {"levels": levels, "repeats": repeats}
    if "components" in repeats[0]:
        out["components"] = {key: float(np.median([r["components"][key] for r in repeats]))
                             for key in repeats[0]["components"]}
    return out


def peak(levels: list[dict]) -> dict:
    return max(levels, key=lambda lv: lv["tokens_per_s"])


def ort_share(level: dict) -> str:
    return f"{100 * level['ort_share']:.0f}%" if "ort_share" in level else "-"


def table(run: dict) -> list[str]:
    lines = ["| streams | in-process tok/s | gRPC tok/s | gRPC / in-process | TTFT p50 / p90 (ms) | "
             "message gap p50 / p90 (ms) | e2e p50 / p90 (ms) | CPU us/token: in-process; gRPC server + client "
             "| in-process time inside ONNX Runtime | errors |", "|---|---|---|---|---|---|---|---|---|---|"]
    def tps(lv: dict) -> str:
        lo, hi = lv["tokens_per_s_range"]
        return f"{lv['tokens_per_s']:,.0f} ({lo:,.0f}–{hi:,.0f})" if hi > lo else f"{lv['tokens_per_s']:,.0f}"
    for a, b in zip(run["inprocess"]["levels"], run["grpc"]["levels"]):
        ca, cb = a["cpu_us_per_token"], b["cpu_us_per_token"]
        lines.append(f"| {a['concurrency']} | {tps(a)} | {tps(b)} | "
                     f"{b['tokens_per_s'] / a['tokens_per_s']:.2f} | "
                     f"{b['ttft_ms']['p50']:.1f} / {b['ttft_ms']['p90']:.1f} | "
                     f"{b['itl_ms']['p50']:.1f} / {b['itl_ms']['p90']:.1f} | "
                     f"{b['e2e_ms']['p50']:.0f} / {b['e2e_ms']['p90']:.0f} | "
                     f"{ca['process']:.0f}; {cb['server']:.0f} + {cb['client']:.0f} | "
                     f"{ort_share(a)} | {a['errors'] + b['errors']} |")
    return lines


def render(results: dict, args, argv) -> str:
    import onnxruntime
    runs = results["runs"]
    base = runs[0]
    comp = base["inprocess"]["components"]
    lines = ["# Serving throughput and latency", "",
             "What it measures: the same engine driven in-process and through the gRPC server at each number of "
             "concurrent streams, and ONNX Runtime alone on the same step shapes. `python -m "
             "benchmarks.serving_load` rewrites this page.", "",
             f"Greedy streams over test_2016_flickr.en, {args.requests}+ requests per level, "
             f"{results['repeats']} repeats alternating the modes (tokens/s: median, range in brackets), model "
             f"`{results['model']}`, decode slots {args.max_batch_size}, ONNX Runtime "
             f"{onnxruntime.__version__}, intra-op threads {args.threads or 'default'} (one pool per process).",
             "In-process = the same HostedModel driven from asyncio without gRPC.", "",
             f"Command: `python -m benchmarks.serving_load {' '.join(argv)}`", "",
             date_line(), "",
             machine_line(f"Python {platform.python_version()}; client and server share it"), ""]
    for run in runs:
        k, core = run["stream_interval"], run.get("engine_core", "thread")
        lines += [f"## Stream interval {k}" + (" (default: a message per token)" if k == 1 else
                                               f" (first token at once, then a message every {k} tokens)")
                  + f", engine core: {core}",
                  "", *table(run), ""]
    g = {lv["concurrency"]: lv for lv in base["grpc"]["levels"]}
    lines += ["## Targets (issues 4 and 9)", ""]
    if 1 in g and 32 in g:
        r = g[32]["tokens_per_s"] / g[1]["tokens_per_s"]
        lines.append(f"- 32 streams vs 1 (gRPC, default settings): {r:.1f}x (target >= 8x): "
                     f"{'met' if r >= 8 else 'missed'}. ONNX Runtime alone allows at most "
                     f"{comp['ceiling_32_vs_1']:.1f}x on this machine (below).")
    for run in runs:
        ip, gp = peak(run["inprocess"]["levels"]), peak(run["grpc"]["levels"])
        gap = 1 - gp["tokens_per_s"] / ip["tokens_per_s"]
        lines.append(f"- gRPC (engine core {run.get('engine_core', 'thread')}) vs in-process at saturation, "
                     f"stream interval {run['stream_interval']}: peak "
                     f"{gp['tokens_per_s']:,.0f} ({gp['concurrency']} streams) vs {ip['tokens_per_s']:,.0f} "
                     f"({ip['concurrency']} streams) = {100 * gap:.1f}% below (target <= 10%): "
                     f"{'met' if gap <= 0.10 else 'missed'}")
        if "ort_share" in ip:
            share = ip["ort_share"]
            lines.append(f"- In-process engine vs ONNX Runtime alone on the same step shapes, stream interval "
                         f"{run['stream_interval']}, at the in-process peak: {100 * share:.0f}% of the wall time is "
                         f"inside ONNX Runtime (target >= 85%): {'met' if share >= 0.85 else 'missed'}")
    if 1 in g:
        bound = comp["ttft_encode_ms"] + comp["ttft_step_ms"] + 3.0
        t = g[1]["ttft_ms"]["p50"]
        lines.append(f"- TTFT p50 at 1 stream (gRPC): {t:.1f} ms vs encoder {comp['ttft_encode_ms']:.2f} ms + first "
                     f"step {comp['ttft_step_ms']:.2f} ms + 3 ms = {bound:.1f} ms: {'met' if t <= bound else 'missed'} "
                     "(ONNX Runtime alone, medians over the test sentences one at a time)")
    lines += ["", "## ONNX Runtime alone (same run, no serving code)", "",
              f"Mean output {comp['output_tokens']:.1f} tokens per request; 32 test sentences; past = half "
              "the output.", "",
              "| | batch 1 | batch 32 (per sentence / row) |", "|---|---|---|",
              f"| encoder pass (ms) | {comp['encode_1_ms']:.2f} | {comp['encode_32_ms'] / 32:.3f} |",
              f"| decoder step (ms) | {comp['step_1_ms']:.2f} | {comp['step_32_ms'] / 32:.3f} |",
              f"| cost per output token (ms) | {comp['step_1_ms'] + comp['encode_1_ms'] / comp['output_tokens']:.3f}"
              f" | {(comp['step_32_ms'] + comp['encode_32_ms'] / comp['output_tokens']) / 32:.3f} |",
              "", f"Ceiling for 32 streams vs 1: {comp['ceiling_32_vs_1']:.1f}x.", "",
              f"![latency]({Path(args.out).with_suffix('.png').name})", ""]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repository", default=str(ROOT / "model_repository"))
    p.add_argument("--src-file", default=str(TEST_SOURCES))
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64])
    p.add_argument("--requests", type=int, default=1000, help="streams per level (steady state, not ramp-up)")
    p.add_argument("--max-seconds", type=float, default=90.0)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--provider", default="auto", choices=["auto", "cpu", "cuda"], help="server execution provider")
    p.add_argument("--variant", default="fp32", help="bundle variant the server runs (fp32, int8, fp16)")
    p.add_argument("--threads", type=int, default=0, help="ONNX Runtime intra-op threads (0 = default)")
    p.add_argument("--decoder", default="auto", choices=["auto", "inplace", "standard", "copy"],
                   help="server decoder graph (see python -m server --help)")
    p.add_argument("--stream-intervals", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4],
                   help="server --stream-interval values to compare; the first is the main table")
    p.add_argument("--server-flags", default="", help="more `python -m server` flags for every server, one string")
    p.add_argument("--frontends", type=int, default=1, help="server --frontends (with --engine-cores process)")
    p.add_argument("--connections", type=int, default=1, help="client TCP connections, requests spread over them")
    p.add_argument("--engine-cores", type=lambda s: s.split(","), default=["thread"],
                   help="server --engine-core values to compare through gRPC (thread, process), alternating")
    p.add_argument("--repeats", type=int, default=3, help="sweeps per mode; each cell reports the median")
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "serving_load.md"))
    p.add_argument("--mode", choices=["inprocess", "grpc"], help=argparse.SUPPRESS)
    p.add_argument("--stream-interval", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--engine-core", default="thread", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    texts = Path(args.src_file).read_text(encoding="utf-8").splitlines()
    if args.mode:
        fn = inprocess if args.mode == "inprocess" else through_grpc
        print(json.dumps(asyncio.run(fn(args, texts))))
        return 0
    from models.core.bundle import discover
    # Repeats alternate the modes, so slow drift of a shared machine hits both alike.
    modes = ["inprocess", *(f"grpc:{core}" for core in args.engine_cores)]
    raw: dict = {(k, mode): [] for k in args.stream_intervals for mode in modes}
    for rep in range(args.repeats):
        for k in args.stream_intervals:
            for mode in modes:
                print(f"repeat {rep + 1}/{args.repeats}, stream interval {k}, {mode}:", file=sys.stderr, flush=True)
                kind, _, core = mode.partition(":")
                proc = subprocess.run([sys.executable, "-m", "benchmarks.serving_load", *argv, "--mode", kind,
                                       "--stream-interval", str(k), "--engine-core", core or "thread"], cwd=ROOT,
                                      stdout=subprocess.PIPE, text=True, check=True)
                raw[k, mode].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    results = {"model": discover(args.repository)[0].name, "repeats": args.repeats,
               "runs": [{"stream_interval": k, "engine_core": core, "inprocess": median_run(raw[k, "inprocess"]),
                         "grpc": median_run(raw[k, f"grpc:{core}"])}
                        for k in args.stream_intervals for core in args.engine_cores]}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    plot(results, out.with_suffix(".png"))
    # Hand-written notes below "## Reading" survive a re-run; the rest is regenerated.
    notes = ""
    if out.exists() and "\n## Reading" in out.read_text():
        notes = out.read_text()[out.read_text().index("\n## Reading") + 1:]
    out.write_text(render(results, args, argv) + ("\n" + notes if notes else ""))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
