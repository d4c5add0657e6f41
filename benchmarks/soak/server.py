"""The server under soak: start `python -m server` on loopback, sample its memory, read its metrics,
and drain it with SIGTERM while calls are in flight."""
from __future__ import annotations

import asyncio
import re
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Optional

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from benchmarks import harness
from benchmarks.soak.record import BadResponse, Recorder
from benchmarks.soak.traffic import Traffic
from protos.nmt.v1 import translator_pb2 as pb

ROOT = Path(__file__).resolve().parents[2]
GAUGES = ("nmt_running_requests", "nmt_waiting_requests", "nmt_kv_cache_usage_ratio")


class ServerProcess(harness.ServerProcess):
    """The harness's server process (benchmarks/harness.py) with what the soak reads besides: its
    resident memory, and an awaitable wait for SERVING (the soak runs on an event loop)."""

    def __init__(self, flags: list[str], log_path: Path, http: bool = False):
        super().__init__(*flags, log_path=log_path, http_port=0 if http else -1)
        self.launch()

    async def wait_serving(self, timeout: float = 180.0) -> None:
        await asyncio.to_thread(super().wait_serving, timeout)

    def memory(self) -> Optional[dict]:
        """The server's resident memory with its live descendants' (harness.tree_memory: RSS summed,
        PSS summed, each process's RSS): with engine cores in processes they hold most of it."""
        return harness.tree_memory(self.proc.pid)


class RssSampler:
    """The server's memory every `period` seconds, tagged with the harness's phase. The targets read
    the RSS sum (an upper bound: shared libraries count once per process); PSS and each process's
    RSS are kept beside it to say where the memory is."""

    def __init__(self, server: ServerProcess, recorder: Recorder, period: float = 1.0):
        self.server, self.rec, self.period = server, recorder, period
        self.samples: list[dict] = []
        self.marks: dict[str, dict] = {}

    def sample(self, mark: Optional[str] = None) -> Optional[float]:
        mem = self.server.memory()
        if mem is None:
            return None
        self.samples.append({"t": round(self.rec.elapsed(), 2), "rss_mb": round(mem["rss"], 1),
                             "pss_mb": round(mem["pss"], 1), "phase": self.rec.phase,
                             "processes": mem["processes"]})
        if mark:
            self.marks[mark] = mem
        return mem["rss"]

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.sample()
            try:
                await asyncio.wait_for(stop.wait(), self.period)
            except TimeoutError:
                pass

    def summary(self) -> dict:
        m = {k: v["rss"] for k, v in self.marks.items()}
        pss = {k: v["pss"] for k, v in self.marks.items()}
        base, pss_base = m.get("after_warmup"), pss.get("after_warmup")
        growth = 100.0 * (m["end"] - base) / base if base and "end" in m else None
        pss_growth = 100.0 * (pss["end"] - pss_base) / pss_base if pss_base and "end" in pss else None
        return {"start_mb": m.get("start"), "after_warmup_mb": base,
                "peak_mb": max((s["rss_mb"] for s in self.samples), default=None),
                "end_mb": m.get("end"), "growth_pct_after_warmup": growth,
                "pss": {"start_mb": pss.get("start"), "after_warmup_mb": pss_base, "end_mb": pss.get("end"),
                        "peak_mb": max((s["pss_mb"] for s in self.samples), default=None),
                        "growth_pct_after_warmup": pss_growth},
                "processes": {k: v["processes"] for k, v in self.marks.items()}, "samples": self.samples}


# -- /metrics ----------------------------------------------------------------------------------------------
def scrape(url: str) -> list[tuple[str, dict, float]]:
    """Every sample of a Prometheus text page as (name, labels, value)."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    out = []
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        if m:
            out.append((m.group(1), dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or "")), float(m.group(3))))
    return out


def gauges(samples: list[tuple[str, dict, float]]) -> dict[str, float]:
    return {g: sum(v for name, _, v in samples if name == g) for g in GAUGES}


def request_counts(samples: list[tuple[str, dict, float]]) -> dict[str, dict[str, int]]:
    """nmt_requests_total as {rpc: {code: n}}."""
    out: dict[str, dict[str, int]] = {}
    for name, labels, value in samples:
        if name == "nmt_requests_total" and value:
            out.setdefault(labels.get("rpc", "?"), {})[labels.get("code", "?")] = int(value)
    return out


def http_counts(samples: list[tuple[str, dict, float]]) -> dict[str, dict[str, int]]:
    """nmt_http_requests_total as {"api operation": {status: n}} (requests that reached an endpoint)."""
    out: dict[str, dict[str, int]] = {}
    for name, labels, value in samples:
        if name == "nmt_http_requests_total" and value:
            key = f"{labels.get('api', '?')} {labels.get('operation', '?')}"
            out.setdefault(key, {})[labels.get("status", "?")] = int(value)
    return out


async def settle(url: str, timeout: float = 15.0) -> dict:
    """Poll until the running / waiting / KV gauges read 0 (or the timeout); the last scrape's counts."""
    t0 = time.monotonic()
    while True:
        samples = await asyncio.to_thread(scrape, url)
        now = gauges(samples)
        settled = all(v == 0 for v in now.values())
        if settled or time.monotonic() - t0 >= timeout:
            return {"settled": settled, "gauges": now, "settle_seconds": round(time.monotonic() - t0, 2),
                    "server_counts": request_counts(samples), "http_counts": http_counts(samples)}
        await asyncio.sleep(0.1)


# -- drain ---------------------------------------------------------------------------------------------------
async def drain(server: ServerProcess, traffic: Traffic, grace: float, streams: int = 6, unary: int = 4) -> dict:
    """SIGTERM under load. Long streams are surely in flight (each has sent a message), unary calls have
    just been sent; after SIGTERM, new calls must be refused (UNAVAILABLE) once health says NOT_SERVING,
    the in-flight ones must finish or be refused, and the process must exit 0 within the grace period."""
    rec = traffic.rec
    rec.enter("drain")
    timeout = grace + 30.0
    first = [asyncio.Event() for _ in range(streams)]

    async def long_stream(i: int):
        # Near-uniform sampling rarely stops early: still decoding when SIGTERM lands. A drain lets it
        # finish as it would have: a final message whose reason is not CANCELLED (nor UNAVAILABLE).
        call = traffic.stub.TranslateStream(pb.TranslateStreamRequest(
            text=traffic.sentences[i], options=pb.DecodingOptions(temperature=5.0, seed=i, max_output_tokens=200)),
            timeout=timeout)
        last = None
        async for last in call:
            first[i].set()
        if last is None or not last.final or last.finish_reason == pb.FINISH_REASON_CANCELLED:
            raise BadResponse(f"a stream in flight at SIGTERM ended without finishing: {last}")

    async def unary_call(i: int):
        await traffic.client.translate(traffic.sentences[i:i + 8], timeout=timeout)

    inflight = [asyncio.ensure_future(rec.call("drain_stream", "TranslateStream", timeout,
                                               lambda i=i: long_stream(i), detail="long stream"))
                for i in range(streams)]
    try:
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in first)), 30.0)
        started = True
    except TimeoutError:
        started = False
    inflight += [asyncio.ensure_future(rec.call("drain_inflight", "Translate", timeout, lambda i=i: unary_call(i),
                                                detail="8 texts")) for i in range(unary)]
    await asyncio.sleep(0.05)  # let the unary requests leave the client
    t_term = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    not_serving = await _wait_not_serving(server.target)
    await asyncio.sleep(0.05)
    # All at once, early in the drain (one after another on a loaded machine, the last ones reached the
    # server as the drain ended more often; see traffic.EXPECTED for what may still come back).
    refused = list(await asyncio.gather(*(rec.call("drain_new", "Translate", 5.0,
                                                   lambda: traffic.client.translate(["A dog."], timeout=5.0))
                                          for _ in range(5))))
    done = await asyncio.gather(*inflight)
    try:
        rc = await asyncio.to_thread(server.proc.wait, grace + 15.0)
    except subprocess.TimeoutExpired:
        rc = None
    exit_s = time.monotonic() - t_term
    records = list(done) + refused
    codes: dict[str, int] = {}
    for r in records:
        codes[f"{r.category}:{r.code}"] = codes.get(f"{r.category}:{r.code}", 0) + 1
    ok = started and rc == 0 and exit_s <= grace + 15.0 and not any(r.unexpected for r in records)
    return {"ok": ok, "streams_in_flight_at_sigterm": started, "health_after_sigterm": not_serving,
            "exit_code": rc, "exit_seconds_after_sigterm": round(exit_s, 2), "grace_period_s": grace,
            "codes": codes}


async def _wait_not_serving(target: str, timeout: float = 5.0) -> str:
    """What health says after SIGTERM: NOT_SERVING, or the error once the port is closed."""
    async with grpc.aio.insecure_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        end = time.monotonic() + timeout
        status = "SERVING"
        while time.monotonic() < end:
            try:
                resp = await stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                status = health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status)
            except grpc.aio.AioRpcError as e:
                return e.code().name
            if status != "SERVING":
                return status
            await asyncio.sleep(0.02)
        return status
