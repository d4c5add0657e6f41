"""Server memory (RSS) at start, with every decode slot busy, and over a soak of mixed requests.

    python -m benchmarks.memory [--streams 80] [--busy-seconds 20] [--soak-requests 3000]
        [--preload /usr/lib/x86_64-linux-gnu/libjemalloc.so.2] [--json out.json] [-- server flags...]

Starts `python -m server` (default settings unless flags follow `--`) as a
subprocess and reads its VmRSS / VmHWM from /proc:

1. ready: health is SERVING (bundle loaded, built-in warm-up done);
   then `--warmup-requests` mixed requests (the soak's mix, below), so that every
   kind of request has run once before the reference reading;
2. busy: `--streams` concurrent sampled streams (temperature 10, top_k 0,
   max_output_tokens 200: near-uniform sampling, so rows run to the budget;
   at temperature 1.0 the shipped model ends after ~15 tokens) keep all decode
   slots running for `--busy-seconds`;
   RSS is sampled throughout (peak) and read again once the server is idle
   ("after warm-up");
3. soak: `--soak-requests` mixed requests (greedy streams, unary batches, beam
   search, sampling with several hypotheses, long sampled streams, embeddings),
   RSS after every `--soak-report` of them; growth = end vs after warm-up.

Then a breakdown: the slot cache's arrays (allocated bytes; RSS only counts
pages that were written), the per-step gathered inputs at full occupancy, the
server's mappings by kind (/proc/PID/smaps) and its largest anonymous mappings
(in --json), and, in a fresh process each, ONNX Runtime alone decoding 64 rows
for 200 steps twice, with memory patterns and the CPU arena on and off.
Results and their reading: docs/memory.md.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Sequence

from benchmarks.harness import TEST_SOURCES, ServerProcess, proc_status

ROOT = Path(__file__).resolve().parents[1]
MB = 1 << 20


def smaps(pid: int) -> list[tuple[str, int, int]]:
    """(name, size, resident bytes) of every mapping of a process."""
    out, name, size = [], "", 0
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split()
        if "-" in head[0] and len(head) >= 5 and ":" in head[3]:  # a mapping's header line
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            name, size = (head[5] if len(head) > 5 else ""), hi - lo
        elif head[0] == "Rss:":
            out.append((name, size, int(head[1]) * 1024))
    return out


def smaps_by_kind(pid: int) -> dict[str, int]:
    """Resident bytes grouped as main heap, large / small anonymous mappings and files.

    Large anonymous mappings (>= 32 MB) are the slot cache's and the step buffers' arrays, ONNX
    Runtime arena chunks and glibc's per-thread heaps (64 MB reservations); the small ones are
    further malloc'ed blocks above the mmap threshold and thread stacks.
    """
    kinds: dict[str, int] = {}
    for name, size, rss in smaps(pid):
        if name == "[heap]":
            kind = "main heap (brk)"
        elif name.startswith("["):
            kind = "other ([stack] etc.)"
        elif name:
            kind = "files (libraries, models)"
        elif size >= 32 * MB:
            kind = "anonymous mappings >= 32 MB"
        else:
            kind = "anonymous mappings < 32 MB"
        kinds[kind] = kinds.get(kind, 0) + rss
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def largest_anonymous(pid: int, n: int = 16) -> list[tuple[int, int]]:
    """(size, resident) of the n most resident anonymous mappings, in MB (for attributing them)."""
    anon = sorted(((size, rss) for name, size, rss in smaps(pid) if not name), key=lambda t: -t[1])[:n]
    return [(round(size / MB, 1), round(rss / MB, 1)) for size, rss in anon]


def metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


# -- the load -------------------------------------------------------------------------------
# Near-uniform sampling: EOS is one token in 8000, so rows run to max_output_tokens.
LONG = dict(temperature=10.0, top_k=0, max_output_tokens=200)


async def one_request(client, kind: str, texts: list[str], rng: random.Random) -> int:
    """One request of `kind`; returns the number of texts it carried."""
    pick = lambda n: [texts[rng.randrange(len(texts))] for _ in range(n)]  # noqa: E731
    if kind == "greedy_stream":
        async for _ in client.translate_stream(pick(1)[0]):
            pass
    elif kind == "long_stream":
        async for _ in client.translate_stream(pick(1)[0], **LONG):
            pass
    elif kind == "unary_batch":
        await client.translate(pick(rng.randint(2, 8)))
    elif kind == "beam":
        await client.translate(pick(1), beam_size=4)
    elif kind == "sampling":
        await client.translate(pick(2), temperature=0.8, top_p=0.9, num_hypotheses=3)
    elif kind == "embed":
        await client.embed(pick(rng.randint(1, 16)))
    return 1


SOAK_MIX = [("greedy_stream", 40), ("unary_batch", 20), ("beam", 10), ("sampling", 10), ("long_stream", 10),
            ("embed", 10)]


async def busy_phase(client, pid: int, metrics_port: int, texts: list[str], streams: int, seconds: float) -> dict:
    """`streams` workers send long sampled streams back to back for `seconds`; RSS sampled meanwhile."""
    stop = time.monotonic() + seconds
    rng = random.Random(0)
    done = 0

    async def worker():
        nonlocal done
        while time.monotonic() < stop:
            await one_request(client, "long_stream", texts, rng)
            done += 1

    tasks = [asyncio.create_task(worker()) for _ in range(streams)]
    peak, full_samples, running_max = 0, 0, 0.0
    while not all(t.done() for t in tasks):
        await asyncio.sleep(0.25)
        peak = max(peak, proc_status(pid)["VmRSS"])
        if metrics_port > 0:
            running = metric(metrics_port, "nmt_kv_cache_usage_ratio")
            running_max = max(running_max, running)
            full_samples += running >= 0.999
    await asyncio.gather(*tasks)
    return {"peak_rss": peak, "requests": done, "slots_full_samples": full_samples, "max_kv_usage": running_max}


async def soak_phase(client, pid: int, texts: list[str], requests: int, concurrency: int, report: int,
                     seed: int = 1) -> list:
    rng = random.Random(seed)
    kinds = [k for k, w in SOAK_MIX for _ in range(w)]
    plan = iter([rng.choice(kinds) for _ in range(requests)])
    samples, done = [], 0

    async def worker():
        nonlocal done
        for kind in plan:
            await one_request(client, kind, texts, rng)
            done += 1
            if done % report == 0:
                samples.append((done, proc_status(pid)["VmRSS"]))
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


async def drive(args, proc, port: int, metrics_port: int, texts: list[str]) -> dict:
    from client.client import AsyncTranslatorClient
    out: dict = {}
    async with AsyncTranslatorClient(f"127.0.0.1:{port}", timeout=600, retries=0) as client:
        t0 = time.monotonic()
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode}")
            try:
                if await client.health() == "SERVING":
                    break
            except Exception:  # noqa: BLE001 (not up yet)
                pass
            await asyncio.sleep(0.2)
        out["ready_s"] = time.monotonic() - t0
        await asyncio.sleep(0.5)
        out["ready"] = proc_status(proc.pid)
        print(f"ready: {out['ready']['VmRSS'] / MB:.0f} MB", file=sys.stderr, flush=True)
        if args.warmup_requests:
            await soak_phase(client, proc.pid, texts, args.warmup_requests, args.soak_concurrency,
                             args.warmup_requests, seed=2)
            out["mixed_warmup"] = proc_status(proc.pid)
        out["busy"] = await busy_phase(client, proc.pid, metrics_port, texts, args.streams, args.busy_seconds)
        await asyncio.sleep(1.0)
        out["after_warmup"] = proc_status(proc.pid)
        out["smaps_after_warmup"] = smaps_by_kind(proc.pid)
        out["largest_after_warmup"] = largest_anonymous(proc.pid)
        print(f"busy peak {out['busy']['peak_rss'] / MB:.0f} MB, after warm-up "
              f"{out['after_warmup']['VmRSS'] / MB:.0f} MB", file=sys.stderr, flush=True)
        t = time.monotonic()
        out["soak"] = await soak_phase(client, proc.pid, texts, args.soak_requests, args.soak_concurrency,
                                       args.soak_report)
        out["soak_s"] = time.monotonic() - t
        await asyncio.sleep(1.0)
        out["end"] = proc_status(proc.pid)
        out["smaps"] = smaps_by_kind(proc.pid)
        out["largest_end"] = largest_anonymous(proc.pid)
        print(f"end of soak: {out['end']['VmRSS'] / MB:.0f} MB", file=sys.stderr, flush=True)
    return out


# -- breakdown ------------------------------------------------------------------------------
def cache_sizes(repository: str, server_flags: list[str]) -> dict:
    """Allocated bytes of the slot cache's arrays and of one step's gathered inputs at full occupancy."""
    import numpy as np

    from models.core.bundle import discover
    from models.core.kv_cache import SlotCache
    from server.config import ServerConfig
    cfg = ServerConfig.from_args(["--model-repository", repository, *server_flags])
    spec = discover(repository)[0].spec
    max_source = min(cfg.max_source_tokens, spec.max_positions)
    max_target = min(cfg.max_output_tokens, spec.max_positions - 1) + 1
    cache = SlotCache(spec, cfg.max_batch_size, max_source, max_target)
    arrays = {name: value.nbytes for name, value in vars(cache).items() if isinstance(value, np.ndarray)}
    arrays.update({f"step buffer {name}": value.nbytes
                   for name, value in getattr(cache, "_step", {}).items()})  # reused step inputs, if any
    row = spec.n_dec_layers * spec.n_heads * spec.head_dim * 4  # fp32 bytes per row and position
    b = cfg.max_batch_size
    return {"model": f"L={spec.n_dec_layers} H={spec.n_heads} Dh={spec.head_dim}", "slots": b,
            "max_source": max_source, "max_target": max_target, "arrays": arrays,
            "step_past_kv_200": 2 * b * 200 * row, "step_cross_kv_40": 2 * b * 40 * row}


def ort_probe(repository: str, arena: bool, pattern: bool, slots: int, steps: int = 200) -> dict:
    """In this (fresh) process, ONNX Runtime alone: `slots` rows decoded for `steps` steps, the past
    growing by one position per step as in serving (a new input shape every step), twice."""
    import numpy as np

    from models.core.bundle import discover
    from models.core.heap import keep_freed_memory
    from models.core.runtime import OnnxModel, RuntimeOptions
    pid = os.getpid()
    keep_freed_memory()  # as the server does
    model = OnnxModel(discover(repository)[0], RuntimeOptions(provider="cpu", cpu_mem_arena=arena,
                                                              mem_pattern=pattern))
    s = model.spec
    rng = np.random.default_rng(0)
    ids = rng.integers(4, s.vocab_size, (slots, 30))
    mask = np.ones_like(ids, dtype=bool)
    _, ck, cv = model.encode(ids, mask)
    full = rng.standard_normal((s.n_dec_layers * slots * s.n_heads * steps * s.head_dim,), dtype=np.float32)
    loaded = proc_status(pid)["VmRSS"]
    out = {"loaded_and_encoded": loaded}
    for sweep in (1, 2):  # in serving, shapes recur: the second sweep meets each one again
        times = []
        for p in range(1, steps + 1):
            past = full[:s.n_dec_layers * slots * s.n_heads * p * s.head_dim].reshape(
                s.n_dec_layers, slots, s.n_heads, p, s.head_dim)
            t = time.perf_counter()
            model.decode_step(np.full((slots, 1), 5), np.full((slots, 1), p), past, past,
                              np.ones((slots, p), bool), ck, cv, mask)
            times.append(time.perf_counter() - t)
        out[f"after_sweep_{sweep}"] = proc_status(pid)["VmRSS"]
        out[f"step_ms_{sweep}"] = 1e3 * float(np.mean(times))
    return out


ORT_VARIANTS = {"arena on, patterns on (ONNX Runtime defaults)": (True, True),
                "arena on, patterns off (the server)": (True, False),
                "arena off, patterns off": (False, False)}


# -- report ---------------------------------------------------------------------------------
def render(res: dict, args, argv) -> str:
    mb = lambda b: f"{b / MB:,.0f}"  # noqa: E731
    ready, after, end = res["ready"]["VmRSS"], res["after_warmup"]["VmRSS"], res["end"]["VmRSS"]
    lines = [f"Command: `python -m benchmarks.memory {' '.join(argv)}`", "",
             "| phase | VmRSS (MB) |", "|---|---|",
             f"| ready (loaded, built-in warm-up) | {mb(ready)} |",
             *([f"| after {args.warmup_requests} mixed warm-up requests | {mb(res['mixed_warmup']['VmRSS'])} |"]
               if "mixed_warmup" in res else []),
             f"| all slots busy: peak ({res['busy']['requests']} long streams, {args.streams} at once, "
             f"kv usage max {res['busy']['max_kv_usage']:.2f}) | {mb(res['busy']['peak_rss'])} |",
             f"| after warm-up (idle after the busy phase) | {mb(after)} |"]
    for n, rss in res["soak"]:
        lines.append(f"| soak: {n} mixed requests | {mb(rss)} |")
    lines += [f"| end of soak (idle) | {mb(end)} |",
              f"| peak over the run (VmHWM) | {mb(res['end']['VmHWM'])} |", "",
              f"Growth over the soak (end vs after warm-up): {100 * (end / after - 1):+.1f}%"
              + (f"; end vs after the first {res['soak'][0][0]} soak requests: "
                 f"{100 * (end / res['soak'][0][1] - 1):+.1f}%" if res["soak"] else "")
              + f"; soak took {res['soak_s']:.0f} s.", "", "Resident memory by mapping kind:", "",
              "| kind | after warm-up (MB) | end of soak (MB) |", "|---|---|---|"]
    lines += [f"| {k} | {mb(res['smaps_after_warmup'].get(k, 0))} | {mb(v)} |" for k, v in res["smaps"].items()]
    c = res["cache"]
    lines += ["", f"Slot cache ({c['model']}, {c['slots']} slots, {c['max_source']} source / {c['max_target']} "
              "target positions, fp32; allocated, resident only where written):", "",
              "| array | MB |", "|---|---|"]
    lines += [f"| {k} | {mb(v)} |" for k, v in c["arrays"].items() if v >= MB]
    lines += [f"| total | {mb(sum(c['arrays'].values()))} |", "",
              f"One step's gathered inputs with every slot running: past K+V at 200 positions "
              f"{mb(c['step_past_kv_200'])} MB, cross K+V at 40 source tokens {mb(c['step_cross_kv_40'])} MB.", ""]
    if "ort" in res:
        lines += ["ONNX Runtime alone, a fresh process each: 64 rows decoded for 200 steps, the past growing "
                  "by one position a step, then the same 200 shapes again (random data; the inputs are reused "
                  "buffers, so the growth is ONNX Runtime's):", "",
                  "| session options | RSS loaded + encoded (MB) | after 1st sweep | after 2nd sweep | "
                  "ms / step, 1st; 2nd sweep |", "|---|---|---|---|---|"]
        for name, r in res["ort"].items():
            lines.append(f"| {name} | {mb(r['loaded_and_encoded'])} | {mb(r['after_sweep_1'])} | "
                         f"{mb(r['after_sweep_2'])} | {r['step_ms_1']:.1f}; {r['step_ms_2']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, server_flags = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repository", default=str(ROOT / "model_repository"))
    p.add_argument("--src-file", default=str(TEST_SOURCES))
    p.add_argument("--streams", type=int, default=80, help="concurrent long streams in the busy phase")
    p.add_argument("--warmup-requests", type=int, default=300, help="mixed requests before the busy phase")
    p.add_argument("--busy-seconds", type=float, default=20.0)
    p.add_argument("--soak-requests", type=int, default=3000)
    p.add_argument("--soak-concurrency", type=int, default=32)
    p.add_argument("--soak-report", type=int, default=500, help="RSS after every this many soak requests")
    p.add_argument("--preload", default="", help="LD_PRELOAD for the server (e.g. jemalloc or tcmalloc)")
    p.add_argument("--no-ort-probe", action="store_true", help="skip the arena on/off probe")
    p.add_argument("--json", default="", help="also write the raw results here")
    p.add_argument("--ort-probe", choices=list(ORT_VARIANTS), help=argparse.SUPPRESS)
    args = p.parse_args(own)
    if args.ort_probe:
        print(json.dumps(ort_probe(args.repository, *ORT_VARIANTS[args.ort_probe], 64)))
        return 0
    from tests.serving import flickr_sentences
    texts = Path(args.src_file).read_text(encoding="utf-8").splitlines() if Path(args.src_file).exists() \
        else flickr_sentences(200)
    env = dict(os.environ, **({"LD_PRELOAD": args.preload} if args.preload else {}))
    server = ServerProcess("--model-repository", args.repository, *server_flags, env=env).launch()
    try:
        res = asyncio.run(drive(args, server.proc, server.port, server.metrics_port, texts))
    finally:
        server.stop()
    res["cache"] = cache_sizes(args.repository, server_flags)
    if not args.no_ort_probe:
        res["ort"] = {}
        for name in ORT_VARIANTS:
            run = subprocess.run([sys.executable, "-m", "benchmarks.memory", "--repository", args.repository,
                                  "--ort-probe", name], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True,
                                 check=True)
            res["ort"][name] = json.loads(run.stdout.strip().splitlines()[-1])
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    print(render(res, args, argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
