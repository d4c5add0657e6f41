"""The CPU cost of one TranslateStream message in Python gRPC, with no model behind it.

    python -m benchmarks.grpc_overhead [--streams 1,32] [--messages 14] [--total 45000]

A stand-in servicer (its own process) answers every TranslateStream with
`--messages` small messages shaped like the real ones and a final message;
the asyncio client here reads them over loopback. CPU time of each process
divided by the messages sent is what every streamed message costs the two
ends, before any decoding: the floor under serving_load.md's per-token figures.
"""
from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import grpc

from benchmarks.serving_load import cpu_seconds
from protos.nmt.v1 import translator_pb2 as pb
from protos.nmt.v1 import translator_pb2_grpc as pb_grpc

ROOT = Path(__file__).resolve().parents[1]


class EchoTranslator(pb_grpc.TranslatorServicer):
    async def TranslateStream(self, request: pb.TranslateStreamRequest, context) -> None:
        n = int(request.text)
        for i in range(n):
            await context.write(pb.TranslateStreamResponse(delta=" Wort", token_ids=[i], model="bench"))
        await context.write(pb.TranslateStreamResponse(final=True, output_tokens=n, model="bench"))


async def serve(port: int) -> None:
    server = grpc.aio.server()
    pb_grpc.add_TranslatorServicer_to_server(EchoTranslator(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


async def level(port: int, server_pid: int, streams: int, per_call: int, total: int) -> dict:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.TranslatorStub(channel)
        calls = max(1, total // ((per_call + 1) * streams))
        received = 0

        async def worker() -> None:
            nonlocal received
            for _ in range(calls):
                async for _msg in stub.TranslateStream(pb.TranslateStreamRequest(text=str(per_call))):
                    received += 1
        await worker()  # warm-up
        received = 0
        c0, s0, t0 = cpu_seconds(), cpu_seconds(server_pid), time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        c1, s1, t1 = cpu_seconds(), cpu_seconds(server_pid), time.perf_counter()
    return {"streams": streams, "messages": received, "messages_per_s": received / (t1 - t0),
            "server_us": 1e6 * (s1 - s0) / received, "client_us": 1e6 * (c1 - c0) / received}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32])
    p.add_argument("--messages", type=int, default=14, help="token messages per call (+1 final)")
    p.add_argument("--total", type=int, default=45000, help="messages per level, roughly")
    p.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.serve:
        asyncio.run(serve(args.serve))
        return 0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.grpc_overhead", "--serve", str(port)], cwd=ROOT)
    try:
        time.sleep(2.0)
        print("| streams | messages/s | server CPU µs/message | client CPU µs/message |\n|---|---|---|---|")
        for n in args.streams:
            r = asyncio.run(level(port, proc.pid, n, args.messages, args.total))
            print(f"| {n} | {r['messages_per_s']:,.0f} | {r['server_us']:.0f} | {r['client_us']:.0f} |", flush=True)
    finally:
        proc.terminate()
        proc.wait(10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
