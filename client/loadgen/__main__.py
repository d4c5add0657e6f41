"""Command line: `python -m client.loadgen [run] ...`, `... compare A.json B.json`, `... report RUN.json DIR`.

    python -m client.loadgen --target localhost:50051 --src-file test.en --concurrency 1,8,32 --requests 200
    python -m client.loadgen --target 10.0.0.5:50051,10.0.0.6:50051 --src-file test.en \\
        --rate 2,4,8,16 --duration 60 --arrival gamma --burstiness 0.5 --warmup 10s \\
        --mix mix.yaml --slo-ttft-ms 300 --slo-e2e-ms 2000 --metrics-url 10.0.0.5:9090,10.0.0.6:9090 \\
        --json run.json --report run/
    python -m client.loadgen compare before.json after.json --fail-above 10

Every level ends by itself: at --requests, or --duration (else --max-seconds) seconds of
sending, then in-flight requests finish within their --timeout deadline.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from client.loadgen.calls import Security
from client.loadgen.measure import Slo
from client.loadgen.report import table, write_json
from client.loadgen.session import RunConfig, run
from client.loadgen.workload import ARRIVALS, load_mix


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def parse_warmup(text: str) -> tuple[int, float]:
    """'20' = 20 requests, '5s' = 5 seconds, '0' = none -> (requests, seconds)."""
    text = text.strip().lower()
    if text.endswith("s"):
        return 0, float(text[:-1])
    return int(text), 0.0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m client.loadgen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("where")
    g.add_argument("--target", default="localhost:50051", help="HOST:PORT; several, comma-separated, are "
                   "used round-robin (one channel each)")
    g.add_argument("--connections", type=int, default=1,
                   help="TCP connections per target, requests spread over them (a server with --frontends N > 1 "
                        "gets them spread over its frontend processes; one connection reaches one)")
    g.add_argument("--lb", choices=["split", "round_robin"], default="split",
                   help="several targets: split = one channel each, request i to target i mod n (exact "
                        "shares, reported per target); round_robin = one channel balanced by gRPC over the "
                        "targets' healthy replicas, as applications use the client library")
    g.add_argument("--tls", action="store_true", help="TLS with the system's root certificates")
    # --ca-file/--cert-file/--key-file: the same names as python -m client (docs/security.md)
    g.add_argument("--tls-ca", "--ca-file", dest="tls_ca", help="PEM root certificate(s) to trust (implies TLS)")
    g.add_argument("--tls-cert", "--cert-file", dest="tls_cert",
                   help="client certificate chain, PEM (mutual TLS; with --tls-key)")
    g.add_argument("--tls-key", "--key-file", dest="tls_key", help="client private key, PEM")
    g.add_argument("--tls-server-name", help="name to expect in the server's certificate")
    g.add_argument("--api-key", default=os.environ.get("NMT_API_KEY"),
                   help="sent as metadata 'authorization: Bearer KEY' (env NMT_API_KEY)")
    g.add_argument("--metrics-url", help="the server's Prometheus endpoint (HOST:PORT or URL; several, "
                   "comma-separated), sampled every second")
    g = p.add_argument_group("what")
    g.add_argument("--src-file", required=True, help="source sentences, one per line")
    g.add_argument("--mix", help="weighted request mix: a JSON/YAML file, inline JSON/YAML, or "
                   "'rpc=stream weight=3; rpc=unary texts=2-8 beam_size=4' (see docs/loadgen.md)")
    g.add_argument("--rpc", choices=["stream", "unary"], default="stream", help="without --mix: the RPC to call")
    g.add_argument("--texts-per-call", default="1", help="without --mix: texts per unary call, N or MIN-MAX")
    g.add_argument("--model", default="", help="without --mix: model name (empty = the server's default)")
    g.add_argument("--beam-size", type=int, default=0)
    g.add_argument("--temperature", type=float, default=0.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=0.0)
    g.add_argument("--max-output-tokens", type=int, default=0, help="applies to every mix entry that does "
                   "not set its own")
    g.add_argument("--timeout", type=float, default=120.0, help="deadline per request, seconds")
    g = p.add_argument_group("how much")
    g.add_argument("--concurrency", type=_ints, help="closed loop: requests in flight per level, e.g. 1,8,32 "
                   "(default 1,8,32,64 when no --rate)")
    g.add_argument("--rate", type=_floats, help="open loop: offered requests/s per level, e.g. 2,4,8")
    g.add_argument("--arrival", choices=ARRIVALS, default="poisson", help="open loop inter-arrival times")
    g.add_argument("--burstiness", type=float, default=1.0, help="gamma shape: 1 = Poisson, <1 burstier")
    g.add_argument("--requests", type=int, help="requests per level (default 64 when no --duration)")
    g.add_argument("--duration", type=float, help="seconds of sending per level")
    g.add_argument("--max-seconds", type=float, help="cap on the sending phase per level (default 120 "
                   "without --duration)")
    g.add_argument("--warmup", default="2", help="per level, before measuring: N requests or Ns seconds "
                   "at the level's load, drained and excluded (default 2; 0 = none)")
    g.add_argument("--seed", type=int, default=0, help="seed of the request plan and arrival schedule")
    g = p.add_argument_group("judging and output")
    g.add_argument("--slo-ttft-ms", type=float, help="goodput: TTFT objective, ms")
    g.add_argument("--slo-tpot-ms", type=float, help="goodput: time-per-output-token objective, ms")
    g.add_argument("--slo-e2e-ms", type=float, help="goodput: end-to-end objective, ms")
    g.add_argument("--window", type=float, default=0.0, help="seconds per stability window (0 = a tenth "
                   "of the level, at least 1)")
    g.add_argument("--json", help="write the results here")
    g.add_argument("--report", help="write PNG plots and index.html into this directory")
    g.add_argument("--quiet", action="store_true", help="no progress output")
    return p


def config(args: argparse.Namespace) -> RunConfig:
    if args.concurrency and args.rate:
        raise SystemExit("error: --concurrency (closed loop) and --rate (open loop) exclude each other")
    sources = [t for t in Path(args.src_file).read_text(encoding="utf-8").splitlines() if t.strip()]
    if not sources:
        raise SystemExit(f"error: no sentences in {args.src_file}")
    lo, _, hi = args.texts_per_call.partition("-")
    base = {"rpc": args.rpc, "texts": [int(lo), int(hi or lo)], "model": args.model}
    defaults = {"beam_size": args.beam_size, "temperature": args.temperature, "top_k": args.top_k,
                "top_p": args.top_p, "max_output_tokens": args.max_output_tokens}
    try:
        mix = load_mix(args.mix, defaults, base)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    warm_n, warm_s = parse_warmup(args.warmup)
    mode = "open" if args.rate else "closed"
    return RunConfig(
        targets=[t.strip() for t in args.target.split(",") if t.strip()], sources=sources, mix=mix,
        levels=args.rate if mode == "open" else (args.concurrency or [1, 8, 32, 64]), mode=mode,
        requests=args.requests, duration=args.duration, max_seconds=args.max_seconds, warmup_requests=warm_n,
        warmup_seconds=warm_s, seed=args.seed, arrival=args.arrival, burstiness=args.burstiness,
        timeout=args.timeout,
        security=Security(args.tls, args.tls_ca, args.tls_cert, args.tls_key, args.tls_server_name, args.api_key),
        slo=Slo(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2e_ms),
        metrics_urls=[u.strip() for u in (args.metrics_url or "").split(",") if u.strip()], lb=args.lb,
        connections=args.connections,
        window_s=args.window, progress=not args.quiet, src_file=args.src_file)


def report_main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m client.loadgen report",
                                description="Redraw the plots and index.html of a result JSON.")
    p.add_argument("result")
    p.add_argument("directory")
    args = p.parse_args(argv)
    from client.loadgen.compare import load
    from client.loadgen.plots import write_report
    for path in write_report(load(args.result), args.directory):
        print(path)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "compare":
        from client.loadgen.compare import main as compare_main
        return compare_main(argv[1:])
    if argv and argv[0] == "report":
        return report_main(argv[1:])
    if argv and argv[0] == "run":
        argv = argv[1:]
    args = parser().parse_args(argv)
    cfg = config(args)
    try:
        result = asyncio.run(run(cfg))
    except ConnectionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if args.json:
        write_json(args.json, result)
    print(table(result["levels"]))
    if args.report:
        from client.loadgen.plots import write_report  # matplotlib only when a report is asked for
        write_report(result, args.report)
        print(f"report: {Path(args.report) / 'index.html'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
