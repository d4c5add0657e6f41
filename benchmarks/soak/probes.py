"""Health checks at a fixed period while the soak's load runs: gRPC (grpc.health.v1) and HTTP (GET /healthz),
each on a connection of its own, so a check never queues behind the load's calls on the client side."""
from __future__ import annotations

import asyncio
from typing import Awaitable, Callable

import grpc
import httpx
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks.soak.record import BadResponse, Outcome, Record, Recorder

KEEPALIVE_S = 2.0  # below the server's keep-alive timeout (http_traffic.KEEPALIVE_S)


class _Periodic:
    """A check started every `period` s whether or not the last one answered, so a stalled server shows as
    many slow answers rather than one; the latencies of those that got their expected answer."""

    rec: Recorder
    ok_code = "OK"

    async def check(self, category: str) -> Record:
        raise NotImplementedError

    async def run(self, category: str, period: float, stop: asyncio.Event) -> list[float]:
        tasks = []
        while not stop.is_set():
            tasks.append(asyncio.ensure_future(self.check(category)))
            try:
                await asyncio.wait_for(stop.wait(), period)
            except TimeoutError:
                pass
        return [r.latency for r in await asyncio.gather(*tasks) if r.code == self.ok_code]


class HealthProbe(_Periodic):
    """grpc.health.v1 Check on a channel of its own."""

    def __init__(self, target: str, recorder: Recorder):
        self.channel = grpc.aio.insecure_channel(target)
        self.stub = health_pb2_grpc.HealthStub(self.channel)
        self.rec = recorder

    async def check(self, category: str) -> Record:
        async def fn():
            resp = await self.stub.Check(health_pb2.HealthCheckRequest(), timeout=5.0)
            if resp.status != health_pb2.HealthCheckResponse.SERVING:
                raise BadResponse(f"health status {resp.status}")
        return await self.rec.call(category, "Check", 5.0, fn)

    async def close(self) -> None:
        await self.channel.close()


class HttpHealthProbe(_Periodic):
    """GET /healthz through a keep-alive pool of its own (a reset shows as RESET, like the load's)."""

    ok_code = "HTTP 200"

    def __init__(self, base_url: str, recorder: Recorder, call: Callable[..., Awaitable[httpx.Response]]):
        self.client = httpx.AsyncClient(base_url=base_url, timeout=5.0, trust_env=False,
                                        limits=httpx.Limits(max_connections=4, max_keepalive_connections=4,
                                                            keepalive_expiry=KEEPALIVE_S))
        self.rec, self.call = recorder, call

    async def check(self, category: str) -> Record:
        async def fn():
            resp = await self.call(self.client, "GET", "/healthz")
            if resp.status_code != 200:
                raise Outcome(f"HTTP {resp.status_code}", resp.text[:300])
            if resp.json().get("status") != "SERVING":
                raise Outcome("BAD_RESPONSE", f"/healthz 200 with {resp.text[:100]!r}")
            return "HTTP 200"
        return await self.rec.call(category, "HTTP GET /healthz", 5.0, fn)

    async def close(self) -> None:
        await self.client.aclose()
