"""Load generator: N concurrent streams against a server, with latency percentiles.

    python -m client.loadgen --target localhost:50051 --concurrency 1,8,32 --requests 64 \\
        --src-file test.en [--json out.json]

Each of the N workers sends TranslateStream requests back to back (sentences
taken round-robin), recording time to first token, the gaps between tokens,
and end-to-end latency. The run is bounded by --requests per level and
--max-seconds, so it always stops by itself.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

import numpy as np

from client.client import AsyncTranslatorClient


@dataclass
class Sample:
    ttft: float
    gaps: list[float]
    total: float
    tokens: int


@dataclass
class LevelResult:
    concurrency: int
    seconds: float
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0

    def summary(self) -> dict:
        def pct(values, q):
            return float(np.percentile(values, q)) * 1e3 if len(values) else float("nan")
        ttft = [s.ttft for s in self.samples]
        gaps = [g for s in self.samples for g in s.gaps]
        total = [s.total for s in self.samples]
        tokens = sum(s.tokens for s in self.samples)
        return {"concurrency": self.concurrency, "requests": len(self.samples), "errors": self.errors,
                "tokens": tokens, "seconds": round(self.seconds, 3), "tokens_per_s": tokens / self.seconds,
                "ttft_ms": {f"p{q}": pct(ttft, q) for q in (50, 90, 99)},
                "itl_ms": {f"p{q}": pct(gaps, q) for q in (50, 90, 99)},
                "e2e_ms": {f"p{q}": pct(total, q) for q in (50, 90, 99)}}


StreamFn = Callable[[str], Awaitable[Sample]]


async def run_level(stream: StreamFn, texts: Sequence[str], concurrency: int, requests: int,
                    max_seconds: float) -> LevelResult:
    """`requests` streams in total over `concurrency` workers (bounded by max_seconds)."""
    result = LevelResult(concurrency, 0.0)
    counter = iter(range(requests))
    stop_at = time.monotonic() + max_seconds

    async def worker():
        for i in counter:
            if time.monotonic() > stop_at:
                return
            try:
                result.samples.append(await stream(texts[i % len(texts)]))
            except Exception:  # noqa: BLE001 (counted and reported, the run goes on)
                result.errors += 1
    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    result.seconds = time.monotonic() - t0
    return result


def grpc_stream(client: AsyncTranslatorClient, **decoding) -> StreamFn:
    async def stream(text: str) -> Sample:
        t0 = time.perf_counter()
        first, last, gaps, tokens = None, None, [], 0
        async for msg in client.translate_stream(text, **decoding):
            now = time.perf_counter()
            if msg.token_ids:
                if first is None:
                    first = now - t0
                else:
                    gaps.append(now - last)
                last = now
            tokens = msg.output_tokens if msg.final else tokens
        end = time.perf_counter()
        return Sample(first if first is not None else end - t0, gaps, end - t0, tokens)
    return stream


async def main_async(args: argparse.Namespace) -> list[dict]:
    texts = [t for t in open(args.src_file, encoding="utf-8").read().splitlines() if t.strip()]
    out = []
    async with AsyncTranslatorClient(args.target, timeout=args.timeout, retries=0) as client:
        stream = grpc_stream(client, max_output_tokens=args.max_output_tokens)
        await run_level(stream, texts, 1, 2, 30)  # warm-up
        for c in args.concurrency:
            res = await run_level(stream, texts, c, max(args.requests, c), args.max_seconds)
            summary = res.summary()
            out.append(summary)
            print(f"c={c:3d}: {summary['tokens_per_s']:8.0f} tok/s, ttft p50 {summary['ttft_ms']['p50']:.1f} ms, "
                  f"itl p50 {summary['itl_ms']['p50']:.1f} ms, e2e p50 {summary['e2e_ms']['p50']:.0f} ms, "
                  f"errors {summary['errors']}", file=sys.stderr)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m client.loadgen", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="localhost:50051")
    p.add_argument("--src-file", required=True, help="source sentences, one per line")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 64])
    p.add_argument("--requests", type=int, default=64, help="streams per concurrency level")
    p.add_argument("--max-seconds", type=float, default=120.0, help="time bound per level")
    p.add_argument("--max-output-tokens", type=int, default=0)
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument("--json", help="write the summaries here")
    args = p.parse_args(argv)
    out = asyncio.run(main_async(args))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
