"""HTTP/JSON vs gRPC on the same server: unary batches, several clients, alternating rounds.

    python -m benchmarks.studies.http_throughput [--clients 4] [--batch 32] [--calls 20] [--rounds 5]

One server process serves both ports (the HTTP edge runs the gRPC servicer in process,
server/edge/gateway.py). Each round runs, one after the other, `--clients` threads sending
`--calls` Translate calls of `--batch` test sentences each through: gRPC (the project's client
library), the native HTTP API (`POST /v1/translate`, httpx with keep-alive), and DeepL's
`POST /v2/translate` (the deepl library's request shape, through httpx). The order rotates from
round to round, and the median over rounds of each path's throughput is reported, with the
HTTP paths as a ratio of the gRPC figure in the same round. Output tokens come from the
responses (DeepL's carries none: its texts/s is reported and its tokens counted as gRPC's for
the same texts, which are identical: tests/system/test_http.py checks it).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import httpx

from benchmarks.harness import ServerProcess, machine, rotations
from client.client import TranslatorClient
from models.data import multi30k_file

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data" / "multi30k"


def via_grpc(target: str) -> Callable[[list[str]], int]:
    client = TranslatorClient(target, timeout=300, retries=0)

    def call(texts: list[str]) -> int:
        response = client.translate(texts, target_language="de")
        return sum(t.output_tokens for t in response.translations)
    return call


def via_native(base: str) -> Callable[[list[str]], int]:
    http = httpx.Client(timeout=300)

    def call(texts: list[str]) -> int:
        r = http.post(f"{base}/v1/translate", json={"texts": texts, "targetLanguage": "de"})
        r.raise_for_status()
        return sum(int(t.get("outputTokens", 0)) for t in r.json()["translations"])
    return call


def via_deepl(base: str, tokens_of: dict[tuple, int]) -> Callable[[list[str]], int]:
    http = httpx.Client(timeout=300)

    def call(texts: list[str]) -> int:
        r = http.post(f"{base}/v2/translate", json={"text": texts, "source_lang": "EN", "target_lang": "DE"},
                      headers={"Authorization": "DeepL-Auth-Key bench"})
        r.raise_for_status()
        assert len(r.json()["translations"]) == len(texts)
        return tokens_of[tuple(texts)]
    return call


def run(make_call: Callable[[], Callable[[list[str]], int]], batches: list[list[str]], clients: int,
        calls: int) -> dict:
    """`clients` threads, each with its own connection, `calls` calls each; tokens and texts per second."""
    callers = [make_call() for _ in range(clients)]
    totals = [0] * clients
    start = threading.Barrier(clients + 1)

    def worker(i: int) -> None:
        start.wait()
        for j in range(calls):
            totals[i] += callers[i](batches[(i * calls + j) % len(batches)])
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    texts = clients * calls * len(batches[0])
    return {"tokens_per_s": sum(totals) / wall, "texts_per_s": texts / wall, "wall_s": wall}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--calls", type=int, default=20, help="calls per client per path per round")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default="docs/benchmarks/http_throughput.md")
    args = p.parse_args(argv)
    lines = multi30k_file("test_2016_flickr.en", data_dir=SHARED).splitlines()
    batches = [lines[i:i + args.batch] for i in range(0, len(lines) - args.batch + 1, args.batch)]
    server = ServerProcess("--log-level", "warning", metrics=False, http_port=0).start()
    target, base = server.target, server.http_url
    try:
        counter = via_grpc(target)
        tokens_of = {tuple(b): counter(b) for b in batches}  # also warms every batch shape once
        paths = {"grpc": lambda: via_grpc(target), "http_native": lambda: via_native(base),
                 "http_deepl": lambda: via_deepl(base, tokens_of)}
        names = list(paths)
        results: dict[str, list[dict]] = {n: [] for n in names}
        for r, order in enumerate(rotations(names, args.rounds)):
            for name in order:
                results[name].append(run(paths[name], batches, args.clients, args.calls))
                print(f"round {r + 1}/{args.rounds} {name}: {results[name][-1]['tokens_per_s']:.0f} tokens/s",
                      file=sys.stderr)
    finally:
        server.stop()
    report = render(results, args, argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(report)
    Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=1))
    print(report)
    return 0


def render(results: dict[str, list[dict]], args, argv) -> str:
    rounds = len(results["grpc"])
    ratio = {n: statistics.median(results[n][i]["tokens_per_s"] / results["grpc"][i]["tokens_per_s"]
                                  for i in range(rounds)) for n in results}
    m = machine()
    out = ["# HTTP/JSON vs gRPC, unary batches", "",
           f"`python -m benchmarks.studies.http_throughput {' '.join(argv or sys.argv[1:])}` — "
           f"{m['date']}, {m['cpu']}, {m['cores']} cores shared by server and clients; {args.clients} clients x "
           f"{args.calls} calls of {args.batch} "
           f"test sentences (en->de, shipped model), {rounds} alternating rounds.", "",
           "| path | tokens/s (median) | texts/s (median) | ratio to gRPC in the same round (median) |",
           "|---|---|---|---|"]
    for name, runs in results.items():
        out.append(f"| {name} | {statistics.median(r['tokens_per_s'] for r in runs):,.0f} | "
                   f"{statistics.median(r['texts_per_s'] for r in runs):,.1f} | {ratio[name]:.3f} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
