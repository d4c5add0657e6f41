"""Driving load: the closed loop (N workers back to back) and the open loop (sends on a schedule).

Both take `send(i) -> Sample` for request i and record, per request, when it was sent
relative to the level start. Both always end by themselves: a closed loop stops starting
requests at its request count or its duration; an open loop has a finite schedule; and a
hard stop cancels whatever is still in flight (recorded as CANCELLED, never dropped).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional, Sequence

import grpc

from client.loadgen.measure import LevelStats, Sample, Slo, stats_ms, summarize

SendFn = Callable[[int], Awaitable[Sample]]
# Called after each request with the finished sample and the number still in flight.
ProgressFn = Callable[[Sample, int], None]


@dataclass
class LevelResult:
    mode: str  # closed | open
    concurrency: Optional[int] = None
    offered_rps: Optional[float] = None
    seconds: float = 0.0  # first send to last completion
    sending_until: float = 0.0  # last send, from the level start
    samples: list[Sample] = field(default_factory=list)
    unsent: int = 0  # open loop: scheduled sends skipped at the hard stop
    loop_lags: list[float] = field(default_factory=list)  # how late this client's event loop ran its timer

    @property
    def errors(self) -> int:
        return sum(not s.ok for s in self.samples)

    def summary(self, slo: Optional[Slo] = None, window_s: float = 0.0) -> dict:
        """The level's JSON (fields documented in client/loadgen/__init__.py)."""
        stats = summarize(self.samples, LevelStats(self.seconds, self.sending_until, slo or Slo(), window_s))
        return {"mode": self.mode, "concurrency": self.concurrency, "offered_rps": self.offered_rps,
                **stats, "unsent": self.unsent, "client_loop_lag_ms": stats_ms(self.loop_lags)}


LOOP_TICK_S = 0.05


async def _watch_loop(lags: list[float]) -> None:
    """Record how late this event loop runs a timer due every LOOP_TICK_S: the time a response that
    has arrived waits before the client reads it. Large values mean the measured latencies include
    the load generator's own wait (it shares its CPU with what it measures, or needs more processes)."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + LOOP_TICK_S
        await asyncio.sleep(LOOP_TICK_S)
        lags.append(max(0.0, loop.time() - due))


class _LoopWatch:
    """`async with _LoopWatch(result):` runs _watch_loop for the level."""

    def __init__(self, result: LevelResult):
        self.result = result

    async def __aenter__(self) -> None:
        self.task = asyncio.create_task(_watch_loop(self.result.loop_lags))

    async def __aexit__(self, *exc) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def _attempt(send: SendFn, i: int) -> Sample:
    """A request that raises still counts: as its gRPC code if it is an RPC error (the old
    stream-function API raises), else as CLIENT_ERROR."""
    try:
        return await send(i)
    except asyncio.CancelledError:
        raise
    except grpc.RpcError as e:
        code = e.code().name if hasattr(e, "code") and e.code() else "UNKNOWN"
        return Sample(None, [], 0.0, 0, code=code)
    except Exception:  # noqa: BLE001 (recorded and reported; the run goes on)
        return Sample(None, [], 0.0, 0, code="CLIENT_ERROR")


class _Flight:
    """Requests in flight, so a hard stop can record them as cancelled instead of losing them."""

    def __init__(self, result: LevelResult, t0: float, progress: Optional[ProgressFn]):
        self.result, self.t0, self.progress = result, t0, progress
        self.open: dict[int, tuple[float, float]] = {}  # i -> (sent_at, lag)

    async def run(self, send: SendFn, i: int, lag: float = 0.0) -> None:
        sent_at = time.perf_counter() - self.t0
        self.open[i] = (sent_at, lag)
        self.result.sending_until = max(self.result.sending_until, sent_at)
        sample = await _attempt(send, i)
        del self.open[i]
        sample.sent_at, sample.lag = sent_at, lag
        if sample.total == 0.0:  # a raised error: its duration is what it took to fail
            sample.total = time.perf_counter() - self.t0 - sent_at
        self.result.samples.append(sample)
        if self.progress:
            self.progress(sample, len(self.open))

    def cancel_rest(self) -> None:
        now = time.perf_counter() - self.t0
        for sent_at, lag in self.open.values():
            self.result.samples.append(Sample(None, [], now - sent_at, 0, code="CANCELLED", sent_at=sent_at, lag=lag))
        self.open.clear()


async def closed_loop(send: SendFn, concurrency: int, *, requests: Optional[int] = None,
                      duration: Optional[float] = None, hard_stop: Optional[float] = None,
                      progress: Optional[ProgressFn] = None) -> LevelResult:
    """`concurrency` workers, each sending its next request as soon as its last one ends, until
    `requests` have been started or `duration` seconds have passed; in-flight requests then
    finish, unless `hard_stop` seconds (from the start) pass first."""
    if requests is None and duration is None:
        raise ValueError("a closed loop needs a request count or a duration")
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    result = LevelResult("closed", concurrency=concurrency)
    t0 = time.perf_counter()
    flight = _Flight(result, t0, progress)
    started = 0

    async def worker() -> None:
        nonlocal started
        while (requests is None or started < requests) and \
                (duration is None or time.perf_counter() - t0 < duration):
            i, started = started, started + 1  # one event loop: no await between the check and the claim
            await flight.run(send, i)
    async with _LoopWatch(result):
        workers = asyncio.gather(*(worker() for _ in range(concurrency)))
        try:
            await asyncio.wait_for(workers, hard_stop)
        except asyncio.TimeoutError:
            flight.cancel_rest()
    result.seconds = time.perf_counter() - t0
    return result


async def open_loop(send: SendFn, times: Sequence[float], *, hard_stop: Optional[float] = None,
                    progress: Optional[ProgressFn] = None, rate: Optional[float] = None) -> LevelResult:
    """Send request i at times[i] seconds from the start, whatever the responses are doing. A
    send the event loop could not make on time goes out late (its lag is recorded) rather
    than being dropped or bunched, so the offered count is exact."""
    result = LevelResult("open", offered_rps=rate)
    t0 = time.perf_counter()
    flight = _Flight(result, t0, progress)
    async with _LoopWatch(result):
        tasks: set[asyncio.Task] = set()
        for i, at in enumerate(float(t) for t in times):  # plain floats: numpy scalars would leak into the JSON
            if hard_stop is not None and at >= hard_stop:
                result.unsent = len(times) - i
                break
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            lag = max(0.0, time.perf_counter() - t0 - at)
            task = asyncio.create_task(flight.run(send, i, lag))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            left = None if hard_stop is None else max(0.0, hard_stop - (time.perf_counter() - t0))
            _, pending = await asyncio.wait(set(tasks), timeout=left)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            flight.cancel_rest()
    result.seconds = time.perf_counter() - t0
    return result


async def run_level(stream: Callable[[str], Awaitable[Sample]], texts: Sequence[str], concurrency: int,
                    requests: Optional[int], max_seconds: float) -> LevelResult:
    """`requests` streams in total over `concurrency` workers (none started after max_seconds; with
    `requests` None, as many as max_seconds allows).
    The pre-package API, kept for benchmarks/serving_load.py: texts are used round-robin and
    an exception from `stream` counts as an error."""
    return await closed_loop(lambda i: stream(texts[i % len(texts)]), concurrency, requests=requests,
                             duration=max_seconds)


def describe(value: Any) -> str:
    """How a level is named in progress lines and tables."""
    return f"c={value}" if isinstance(value, int) else f"{value:g} rps"
