"""The soak's scheduled phases (benchmarks/soak/__main__.py runs them in order): the random mix from a
number of workers, the window of large requests, and the main load with its bursts, golden pass and
extreme settings beside it."""
from __future__ import annotations

import asyncio
import random
import time
from typing import Optional

from benchmarks.soak.extreme import ExtremeTraffic
from benchmarks.soak.fuzz import INVALID
from benchmarks.soak.probes import HealthProbe, HttpHealthProbe
from benchmarks.soak.record import GOOD
from benchmarks.soak.traffic import Traffic
from protos.nmt.v1 import translator_pb2 as pb


async def workers(traffic: Traffic, concurrency: int, seconds: float, max_rpcs: int, seed: int) -> None:
    """`concurrency` loops of random calls until `seconds` pass or `max_rpcs` calls have started."""
    end = time.monotonic() + seconds

    async def loop(i: int) -> None:
        rng = random.Random(seed * 1_000_003 + i)
        while time.monotonic() < end and traffic.rec.started < max_rpcs:
            await traffic.random_call(rng)
    await asyncio.gather(*(loop(i) for i in range(concurrency)))


async def large_window(traffic: Traffic, probe: HealthProbe) -> tuple[list[float], dict]:
    """Large requests at once, nothing else, and a health check every 10 ms while they run."""
    traffic.rec.enter("large")
    longest = sorted(traffic.sentences, key=len)[-traffic.max_texts:]
    c, stub, t = traffic.client, traffic.stub, traffic.timeout
    # One valid large request at a time (together they would overflow a small queue), the hostile
    # ones beside the first: each must be tokenised or refused without holding up the event loop.
    heavy = [
        (f"{len(longest)} longest texts, beam {min(5, traffic.max_beam)}", "Translate", GOOD,
         lambda: c.translate(longest, beam_size=min(5, traffic.max_beam), timeout=t)),
        (f"{len(longest)} longest texts, greedy", "Translate", GOOD, lambda: c.translate(longest, timeout=t)),
        (f"embed {len(longest)} longest texts", "Embed", GOOD, lambda: c.embed(longest, timeout=t)),
    ]
    hostile = [
        ("1000 texts", "Translate", INVALID,
         lambda: stub.Translate(pb.TranslateRequest(texts=longest[:1] * 1000), timeout=t)),
        ("a 100,000-character text", "Translate", INVALID,
         lambda: stub.Translate(pb.TranslateRequest(texts=["word " * 20_000]), timeout=t)),
        # 3.8 MB, just under a 4 MiB receive limit: refused on length, at best before it is tokenised
        # at all. A server that tokenises it on its event loop stops answering for seconds.
        ("38 texts of 100,000 characters", "Translate", INVALID,
         lambda: stub.Translate(pb.TranslateRequest(texts=["word " * 20_000] * 38), timeout=t)),
    ]
    stop = asyncio.Event()
    probing = asyncio.ensure_future(probe.run("health_large", 0.01, stop))
    await asyncio.sleep(0.05)  # a few checks at rest first, as a baseline

    async def one(name, rpc, allowed, fn):
        async def call():
            await fn()
        return name, await traffic.rec.call("large_request", rpc, t, call, allowed=allowed, detail=name)

    async def in_turn():
        return [await one(*job) for job in heavy]
    first, *rest = await asyncio.gather(in_turn(), *(one(*job) for job in hostile))
    done = first + rest
    stop.set()
    return await probing, {name: r.code for name, r in done}


async def main_load(args, traffic: Traffic, probe: HealthProbe, http_probe: Optional[HttpHealthProbe],
                    extreme: ExtremeTraffic, golden: list[str]) -> tuple[list, list[float], list[float]]:
    """The mixed load; at 40% of it, bursts past the queue limit while the golden sentences run again, and
    every extreme setting beside them."""
    rec = traffic.rec
    rec.enter("load")
    seconds = args.duration * 0.9
    stop_probe = asyncio.Event()
    probing = asyncio.ensure_future(probe.run("health_probe", 0.1, stop_probe))
    http_probing = asyncio.ensure_future(http_probe.run("http_health_probe", 0.1, stop_probe) if http_probe
                                         else asyncio.sleep(0, []))
    load = asyncio.ensure_future(workers(traffic, args.concurrency, seconds, args.max_rpcs, args.seed))
    await asyncio.wait([load], timeout=0.4 * seconds)
    rec.enter("heavy")
    golden_done = asyncio.Event()

    async def bursts():
        for wave in range(5):  # until the golden pass is done: the slots stay full while it runs
            await traffic.burst(args.burst_calls, args.seed + wave)
            if golden_done.is_set():
                return
    bursting = asyncio.ensure_future(bursts())
    beside = asyncio.ensure_future(extreme.alongside(golden_done))
    await asyncio.sleep(0.3)  # the first wave has filled the slots and the queue
    under_load = await traffic.golden("golden_load", golden, retry_for=60.0)
    golden_done.set()
    await asyncio.gather(bursting, beside)
    rec.enter("load")
    await load
    stop_probe.set()
    return under_load, await probing, await http_probing
