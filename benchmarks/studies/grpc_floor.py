"""What grpc.aio itself costs per streamed message on this machine: the frontend's floor.

    python -m benchmarks.studies.grpc_floor [--streams 8,64] [--messages 13] [--step-ms 3] [--rounds 3]

A server with no model streams TranslateStreamResponse messages shaped like ours (a word of
text, one token id, the model name) on the real nmt.v1 method: every --step-ms one "engine
step" wakes every open stream, which writes one message, as our frontend does with one token
per message. Each stream sends --messages messages (13: the shipped model's mean output on
test_2016_flickr.en), so call set-up is amortised as in serving. The client is grpc.aio too,
on the same machine, reading every message. Reported: messages/s and the server process's
CPU per message (from /proc), to compare with our frontend's CPU per output token
(docs/serving_speed.md): the difference is our own Python per message, not grpc's.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

import grpc

from benchmarks.harness import cpu_seconds, free_port, machine
from protos.nmt.v1 import translator_pb2 as pb
from protos.nmt.v1 import translator_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[2]


class PacedServicer(pb_grpc.TranslatorServicer):
    """TranslateStream writes one message per engine step, like our frontend with one token per message."""

    def __init__(self, messages: int, step: asyncio.Event):
        self.messages, self.step = messages, step

    async def TranslateStream(self, request, context):
        for i in range(self.messages):
            await self.step.wait()
            await context.write(pb.TranslateStreamResponse(delta="Wort ", token_ids=[i], model="floor"))
        await context.write(pb.TranslateStreamResponse(final=True, output_tokens=self.messages, model="floor"))


async def serve(port: int, messages: int, step_ms: float) -> None:
    step = asyncio.Event()
    server = grpc.aio.server()
    pb_grpc.add_TranslatorServicer_to_server(PacedServicer(messages, step), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    while True:  # the engine's steps: wake every stream waiting for its next token
        await asyncio.sleep(step_ms / 1000)
        step.set()
        step.clear()


async def drive(target: str, streams: int, calls: int) -> tuple[int, float]:
    """`calls` streams, `streams` at a time; returns (messages read, seconds)."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        left, read = [calls], [0]

        async def worker() -> None:
            while left[0] > 0:
                left[0] -= 1
                async for _ in stub.TranslateStream(pb.TranslateStreamRequest(text="x")):
                    read[0] += 1
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        return read[0], time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")], default=[8, 64])
    p.add_argument("--messages", type=int, default=13, help="token messages per stream (plus its final one)")
    p.add_argument("--step-ms", type=float, default=3.0, help="time between engine steps")
    p.add_argument("--calls", type=int, default=640, help="streams per measurement")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)  # the server subprocess's port
    args = p.parse_args(argv)
    if args.serve:
        asyncio.run(serve(args.serve, args.messages, args.step_ms))
        return 0
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.studies.grpc_floor", "--serve", str(port), "--messages",
                             str(args.messages), "--step-ms", str(args.step_ms)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        m = machine()
        print(f"`python -m benchmarks.studies.grpc_floor {' '.join(argv or sys.argv[1:])}` — {m['cpu']}, {m['cores']} cores, "
              f"grpcio {grpc.__version__}\n\n| streams | messages/s | server CPU µs per message |\n|---|---|---|")
        asyncio.run(drive(f"127.0.0.1:{port}", 4, 16))  # warm-up
        for streams in args.streams:
            rates, costs = [], []
            for _ in range(args.rounds):
                c0 = cpu_seconds(proc.pid)
                n, dt = asyncio.run(drive(f"127.0.0.1:{port}", streams, args.calls))
                rates.append(n / dt)
                costs.append(1e6 * (cpu_seconds(proc.pid) - c0) / n)
            print(f"| {streams} | {statistics.median(rates):,.0f} | {statistics.median(costs):.0f} "
                  f"({min(costs):.0f}-{max(costs):.0f}) |", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
