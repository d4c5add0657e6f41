"""Soak and fuzz the translation server: a bounded mixed workload with hostile input, then a SIGTERM drain.

    python -m benchmarks.soak [--duration 60] [--max-rpcs 100000] [--concurrency 16] [--seed 0]
        [--json PATH] [--out docs/soak.md] [--target 127.0.0.1:PORT [--metrics-url URL] [--http-url URL]]
        [--strict-timing] [--strict-memory]

Without --target it starts `python -m server` on free loopback ports (gRPC, metrics
and HTTP) with a small queue (--max-queue-size 64) and waits for health SERVING. Then:
  rest     30 test sentences, greedy, one per call (the reference outputs)
  warmup   one call of every category, of every fuzz case, of every extreme setting and of
           every hostile HTTP case, then the random mix at low concurrency
  large    large requests (64 long texts with beam search, 1000 texts, 100k-character
           texts, 3.8 MB in one request) with a health check every 10 ms: health must
           answer in < 50 ms
  load     the random mix (benchmarks/soak/traffic.py: unary, streams, embed, list,
           health, cancellations, short deadlines, slow readers, closed channels,
           fuzzed payloads and options; extreme.py: extreme but valid settings;
           http_traffic.py: the native, DeepL and LibreTranslate APIs over one
           keep-alive pool, SSE streams read or dropped, hostile HTTP on raw sockets)
           from --concurrency workers, gRPC and HTTP health checks every 100 ms; at 40%
           a burst far past the queue limit while the 30 sentences are translated again
           and every extreme setting runs beside them ("heavy"): outputs must equal those at rest
  settle   the running / waiting / KV gauges must return to 0; nmt_requests_total
           must agree with the codes the client saw
  drain    SIGTERM with streams in flight: they finish or get UNAVAILABLE, new calls
           get UNAVAILABLE, the process exits 0 within the grace period
The server's memory (RSS and PSS, summed over its processes) is sampled every second throughout.
The growth after warm-up compares two quiet moments, QUIET_S after the warm-up's traffic and after
the load settled: the slot caches follow the rows running at the instant of a sample (and go back
to the kernel after 2 s idle, models/core/kv_cache.py), so two samples under load compare how busy
the engine happened to be, not what it kept; the peak covers the load. The run stops by itself
(--duration, --max-rpcs; every call has a deadline and counts as hung 10 s past it)
and talks to 127.0.0.1 only. Writes a Markdown report (--out), a PNG beside it
and, with --json, a JSON summary.

Exit code 0 only if: no INTERNAL or UNKNOWN, no HTTP 5xx, no connection resets, no
hangs, every call got a code its category allows, greedy outputs equal at rest and
under load, every category ran, the gauges settle to 0, nmt_requests_total agrees
with the client, no ERROR line or traceback in the server log, the drain is clean,
and no health check during large requests took 1 s (--stall-ms: a blocked event
loop). The 50 ms health targets gate only with --strict-timing; the memory targets
(growth after warm-up < 5%, peak <= 600 MB) only with --strict-memory.
Exit code 2: the harness could not run (the server did not start).
"""
from __future__ import annotations

import argparse
import asyncio
import platform
import random
import shlex
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

from benchmarks.soak.checks import (allowed_table, case_table, client_counts, code_table, evaluate, golden_compare,
                                    latency_stats, log_findings, metrics_consistency, verdict)
from benchmarks.soak.extreme import ExtremeTraffic, greedy_equivalence
from benchmarks.soak.http_traffic import MIX as HTTP_MIX, HttpTraffic, send
from benchmarks.soak.phases import large_window, main_load, workers
from benchmarks.soak.probes import HealthProbe, HttpHealthProbe
from benchmarks.soak.record import Recorder
from benchmarks.soak.report import timeline, write
from benchmarks.soak.server import RssSampler, ServerProcess, drain, settle
from benchmarks.soak.traffic import Traffic
from client.client import AsyncTranslatorClient
from protos.nmt.v1 import translator_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data" / "multi30k"
FIXTURE = ROOT / "tests" / "data" / "test_2016_flickr.head200.en"
LOOPBACK = ("127.0.0.1", "localhost", "[::1]")


def flickr_sentences() -> list[str]:
    """test_2016_flickr.en: the checksum-verified copy beside the checkout, else the committed first 200
    lines (the same choice as tests/serving.py)."""
    if SHARED.exists():
        from models.data import multi30k_file
        return multi30k_file("test_2016_flickr.en", data_dir=SHARED).splitlines()
    return FIXTURE.read_text(encoding="utf-8").splitlines()


QUIET_S = 3.0  # past the engine's idle give-back (models/core/kv_cache.py IDLE_S = 2 s)


async def progress(rec: Recorder, rss: Optional[RssSampler], stop: asyncio.Event, every: float = 5.0) -> None:
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every)
            return
        except TimeoutError:
            pass
        codes = Counter(r.code for r in rec.records)
        mem = f" rss {rss.samples[-1]['rss_mb']:.0f} MB" if rss and rss.samples else ""
        print(f"[{rec.elapsed():6.1f} s] {rec.phase:<6} {len(rec.records):6d} calls (+{rec.in_flight} in flight)"
              f"{mem} | " + " ".join(f"{c}={n}" for c, n in codes.most_common())
              + f" | unexpected {sum(r.unexpected for r in rec.records)}", flush=True)


async def run(args, argv: list[str]) -> dict:
    flags = ["--max-queue-size", str(args.max_queue_size), "--grace-period-s", str(args.grace_period),
             "--max-sentences-per-request", str(args.max_queue_size),
             *shlex.split(args.server_args)]
    server = None
    if args.target is None:
        server = ServerProcess(flags, Path(tempfile.mkstemp(prefix="soak-server-", suffix=".log")[1]), http=True)
        print(f"starting python -m server {' '.join(flags)} on {server.target} (log {server.log_path})", flush=True)
    try:
        return await soak(args, argv, server, flags if server else [])
    finally:
        if server:
            server.stop(drain=False)  # only the soak's own failures find it running: the drain phase SIGTERMs it


async def soak(args, argv: list[str], server: Optional[ServerProcess], flags: list[str]) -> dict:
    target = args.target or server.target
    metrics_url = args.metrics_url or (server.metrics_url if server else None)
    http_url = args.http_url or (server.http_url if server else None)
    if server:
        await server.wait_serving()
    rec = Recorder()
    rec.enter("rest")
    got: list[pb.ListModelsResponse] = []
    async with AsyncTranslatorClient(target, timeout=30, retries=0) as setup:
        async def list_models():
            got.append(await setup.list_models())
        first = await rec.call("list_models", "ListModels", 30.0, list_models)  # recorded: the server counts it
    if not got:
        raise RuntimeError(f"ListModels failed: {first.code} {first.note}")
    models = got[0]
    sentences = flickr_sentences()[:200]
    golden = sentences[:args.golden]
    traffic = Traffic(target, rec, sentences, models, args.call_timeout, args.seed)
    info = next(m for m in models.models if m.is_default)
    extreme = ExtremeTraffic(traffic, info, golden)
    traffic.extend({"extreme": 6}, extreme.runners)
    http, http_probe = None, None
    if http_url:
        http = HttpTraffic(http_url, rec, sentences, info.source_language or "en", info.target_language or "de",
                           traffic.max_texts, traffic.max_beam, args.call_timeout, extreme.cases)
        traffic.extend({name: weight * args.http_weight for name, weight in HTTP_MIX.items()}, http.runners)
        http_probe = HttpHealthProbe(http_url, rec, send)
    probe = HealthProbe(target, rec)
    stop = asyncio.Event()
    rss = RssSampler(server, rec) if server else None
    background = [asyncio.ensure_future(progress(rec, rss, stop))] + ([asyncio.ensure_future(rss.run(stop))]
                                                                      if rss else [])
    if rss:
        rss.sample("start")
    at_rest = await traffic.golden("golden_rest", golden)
    rec.enter("warmup")
    for category in traffic.mix:  # every category at least once, whatever the random mix draws later
        await traffic.runners[category](random.Random(args.seed))
    await traffic.every_fuzz_case()
    await extreme.every_case()
    if http:
        await http.every_hostile_case()
    await workers(traffic, max(2, args.concurrency // 4), args.duration * 0.1, args.max_rpcs, args.seed + 7)
    if rss:  # the growth compares two quiet moments (QUIET_S after traffic), not two random loads
        rss.sample("warm-up's end")
        await asyncio.sleep(QUIET_S)
        rss.sample("after_warmup")
    health_large, large = await large_window(traffic, probe)
    under_load, health_load, http_health_load = await main_load(args, traffic, probe, http_probe, extreme, golden)
    rec.enter("settle")
    if http:
        await http.close()
        await http_probe.close()
    metrics = None
    if metrics_url:
        metrics = await settle(metrics_url)
        before_drain = list(rec.records)
        metrics["client_counts"] = {rpc: dict(c) for rpc, c in sorted(client_counts(before_drain).items())}
        metrics["consistency"] = metrics_consistency(before_drain, metrics["server_counts"])
    if rss:
        rss.sample("load's end")
        await asyncio.sleep(QUIET_S)
        rss.sample("end")
    drained = await drain(server, traffic, args.grace_period) if server else None
    rec.enter("done")
    stop.set()
    await asyncio.gather(*background)
    await traffic.close()
    await probe.close()
    log = server.log_text() if server else ""
    records = rec.records
    summary = {
        "config": {"argv": argv, "target": target, "server_flags": flags, "duration": args.duration,
                   "concurrency": args.concurrency, "seed": args.seed, "max_rpcs": args.max_rpcs,
                   "call_timeout": args.call_timeout, "burst_calls": args.burst_calls,
                   "machine": f"Python {platform.python_version()}; the soak's clients share it"},
        "codes": code_table(records), "allowed": allowed_table(records), "cases": case_table(records),
        "golden": golden_compare(golden, at_rest, under_load),
        "health": {"under_load": latency_stats(health_load, args.health_slo_ms),
                   "large": latency_stats(health_large, args.health_slo_ms),
                   "http_under_load": latency_stats(http_health_load, args.health_slo_ms)},
        "http": {"url": http_url, "hostile_cases": len(http.hostile) if http else 0},
        "extreme": {"cases": len(extreme.cases), "greedy_equivalence": greedy_equivalence(
            extreme.greedy_outputs, dict(zip(golden, at_rest))), "beside_golden": {
            "calls": sum(r.category == "extreme" and r.phase == "heavy" for r in records),
            "served": sum(r.category == "extreme" and r.phase == "heavy" and r.code == "OK" for r in records)}},
        "large_requests": large, "metrics": metrics, "drain": drained, "rss": rss.summary() if rss else None,
        "timeline": timeline(records, rec.elapsed()), "phases": rec.phases, "wall_seconds": rec.elapsed(),
        "server_log": str(server.log_path) if server else None, "server_tracebacks": log.count("Traceback"),
        "server_log_findings": log_findings(log),
        "_records": records,
    }
    checks = evaluate(summary, args)
    summary["checks"] = [c.as_dict() for c in checks]
    summary["passed"] = verdict(checks)
    return summary


def loopback(value: str) -> str:
    host = value.rsplit(":", 1)[0].split("//")[-1]
    if host not in LOOPBACK:
        raise argparse.ArgumentTypeError(f"{value!r}: the harness only talks to {', '.join(LOOPBACK)}")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.soak", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=60.0,
                   help="seconds of load (warm-up 10%% + mixed load); start-up, the at-rest pass, the large-"
                   "request window, settling and the drain come on top (default: %(default)s)")
    p.add_argument("--max-rpcs", type=int, default=100_000,
                   help="start no more load calls once this many calls have started (default: %(default)s)")
    p.add_argument("--concurrency", type=int, default=16, help="workers in the mixed load (default: %(default)s)")
    p.add_argument("--http-weight", type=float, default=1.0,
                   help="multiplies the HTTP categories' weights in the mix (27 of 129 at 1): 4 makes about "
                        "half the calls HTTP (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seeds the mix, the fuzz corpus and sampling "
                   "(default: %(default)s)")
    p.add_argument("--json", type=Path, help="also write the summary and every unexpected call as JSON here")
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "soak.md",
                   help="Markdown report; the PNG goes beside it (default: docs/soak.md)")
    p.add_argument("--target", type=loopback, help="soak a running server at 127.0.0.1:PORT instead of starting "
                   "one (no RSS, no drain)")
    p.add_argument("--metrics-url", type=loopback, help="with --target: its /metrics URL (else no metric checks)")
    p.add_argument("--http-url", type=loopback, help="with --target: its HTTP base URL, http://127.0.0.1:PORT "
                   "(else no HTTP traffic)")
    p.add_argument("--max-queue-size", type=int, default=64,
                   help="the started server's queue limit, small so bursts overflow it (default: %(default)s)")
    p.add_argument("--grace-period", type=float, default=10.0,
                   help="the started server's --grace-period-s (default: %(default)s)")
    p.add_argument("--server-args", default="", help="more flags for `python -m server`, one string")
    p.add_argument("--call-timeout", type=float, default=30.0,
                   help="client deadline of calls that should finish, in seconds (default: %(default)s)")
    p.add_argument("--burst-calls", type=int, default=32, help="requests of max_texts_per_request / 8 texts at "
                   "once per burst wave: 256 texts against the default queue of 64 (default: %(default)s)")
    p.add_argument("--golden", type=int, default=30, help="sentences compared at rest and under load "
                   "(default: %(default)s)")
    p.add_argument("--health-slo-ms", type=float, default=50.0,
                   help="health-check latency target during large requests (default: %(default)s)")
    p.add_argument("--stall-ms", type=float, default=1000.0,
                   help="a health check slower than this during large requests is a blocked event loop; "
                   "gates the exit code (default: %(default)s)")
    p.add_argument("--strict-timing", action="store_true", help="let the --health-slo-ms check gate the exit code")
    p.add_argument("--max-rss-growth", type=float, help="RSS growth target after warm-up in %%; given, it gates "
                   "the exit code (default: 5, gating only with --strict-memory)")
    p.add_argument("--max-rss-mb", type=float, default=600.0, help="peak RSS target in MB (default: %(default)s, "
                   "gating only with --strict-memory)")
    p.add_argument("--strict-memory", action="store_true", help="let the RSS targets gate the exit code (RSS on a "
                   "short run mostly measures the step from the warm-up's concurrency to full load)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser().parse_args(argv)
    try:
        summary = asyncio.run(run(args, argv))
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write(summary, args.out, args.json)
    for c in summary["checks"]:
        mark = {True: "pass", False: "FAIL", None: "skip"}[c["ok"]]
        print(f"  {mark:4}  {c['name']}{'' if c['gating'] else ' (does not gate)'}: {c['detail']}")
    print(f"{'PASS' if summary['passed'] else 'FAIL'}: report {args.out}" + (f", JSON {args.json}" if args.json else ""))
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
