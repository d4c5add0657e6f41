"""One run: for each level, a warm-up, then the measured load, with /metrics sampled alongside.

Warm-up is a separate phase at the level's own load (same concurrency or rate) that is
drained before measuring starts; that way no warm-up request can finish inside the
measured phase and pollute either the client's statistics or the server's counter deltas.
The ramp-up this leaves at the start of a level shows in the windows and the stability note.
"""
from __future__ import annotations

import datetime as dt
import sys
import time
from dataclasses import dataclass, field
from typing import Optional, Sequence

from client.loadgen.calls import Security, Targets
from client.loadgen.measure import Slo
from client.loadgen.report import Progress, level_line
from client.loadgen.runner import LevelResult, closed_loop, describe, open_loop
from client.loadgen.server_metrics import MetricsSampler
from client.loadgen.workload import MixEntry, Plan, arrival_times

DEFAULT_REQUESTS = 64  # per level, when neither --requests nor --duration is given
DEFAULT_MAX_SECONDS = 120.0  # per level sending phase, when no --duration is given
SCHEMA = 2  # 1 was the pre-package tool's bare list of levels


@dataclass
class RunConfig:
    targets: list[str]
    sources: list[str]
    mix: list[MixEntry]
    levels: list  # concurrencies (closed loop) or rates in requests/s (open loop)
    mode: str = "closed"
    requests: Optional[int] = None
    duration: Optional[float] = None
    max_seconds: Optional[float] = None
    warmup_requests: int = 0
    warmup_seconds: float = 0.0
    seed: int = 0
    arrival: str = "poisson"
    burstiness: float = 1.0
    timeout: Optional[float] = 120.0
    security: Security = field(default_factory=Security)
    slo: Slo = field(default_factory=Slo)
    metrics_urls: list[str] = field(default_factory=list)
    window_s: float = 0.0
    progress: bool = True
    src_file: str = ""
    lb: str = "split"  # split: one channel per target, exact shares; round_robin: one balanced channel
    connections: int = 1  # TCP connections per target (split): a server's frontend processes share them

    def bounds(self, level) -> tuple[Optional[int], float, float]:
        """(request count, sending-phase seconds, hard stop seconds) of a measured level."""
        requests = self.requests
        if requests is None and self.duration is None:
            requests = DEFAULT_REQUESTS
        if requests is not None and self.mode == "closed":
            requests = max(requests, level)  # every worker gets at least one request
        send_for = min(x for x in (self.duration, self.max_seconds) if x is not None) \
            if (self.duration or self.max_seconds) else DEFAULT_MAX_SECONDS
        # In-flight requests end by their own deadline; the hard stop is only a safety net.
        return requests, send_for, send_for + (self.timeout or 30.0) + 1.0

    def as_dict(self) -> dict:
        return {"targets": self.targets, "mode": self.mode, "levels": self.levels, "requests": self.requests,
                "lb": self.lb, "duration": self.duration, "max_seconds": self.max_seconds,
                "warmup": {"requests": self.warmup_requests, "seconds": self.warmup_seconds},
                "seed": self.seed, "arrival": self.arrival if self.mode == "open" else None,
                "burstiness": self.burstiness if self.mode == "open" else None, "timeout": self.timeout,
                "tls": self.security.uses_tls, "api_key": bool(self.security.api_key),
                "slo": self.slo.as_dict(), "metrics_urls": self.metrics_urls, "src_file": self.src_file,
                "sources": len(self.sources), "mix": [e.as_dict() for e in self.mix]}


async def _load(cfg: RunConfig, targets: Targets, plan: Plan, level, *, requests: Optional[int],
                duration: Optional[float], hard_stop: float, seed, progress: Optional[Progress]
                ) -> tuple[LevelResult, Optional[Sequence[float]]]:
    async def send(i: int):
        return await targets.execute(plan[i], cfg.timeout)
    report = progress.update if progress else None
    if cfg.mode == "open":
        times = arrival_times(level, arrival=cfg.arrival, burstiness=cfg.burstiness, seed=seed, requests=requests,
                              duration=duration)
        if progress:
            progress.set_total(len(times))
        return await open_loop(send, times, hard_stop=hard_stop, progress=report, rate=level), times
    if progress:
        progress.set_total(requests)
    return await closed_loop(send, level, requests=requests, duration=duration, hard_stop=hard_stop,
                             progress=report), None


async def _warm_up(cfg: RunConfig, targets: Targets, level) -> int:
    if cfg.warmup_requests <= 0 and cfg.warmup_seconds <= 0:
        return 0
    seed = f"warmup:{cfg.seed}"  # its own plan and schedule: the measured ones stay as they would be without it
    result, _ = await _load(cfg, targets, Plan(cfg.mix, cfg.sources, seed), level,
                            requests=cfg.warmup_requests or None, duration=cfg.warmup_seconds or None,
                            hard_stop=(cfg.warmup_seconds or 0) + (cfg.timeout or 30.0) + 1.0, seed=seed,
                            progress=None)
    return len(result.samples)


def saturation(levels: list[dict], mode: str) -> dict:
    """A rough knee. Open loop: the highest offered rate still served (>= 90% of it achieved, no
    errors). Closed loop: the last concurrency whose step up still added >= 10% throughput."""
    if not levels:
        return {"knee": None, "rule": None}
    if mode == "open":
        ok = [lv["offered_rps"] for lv in levels if lv["errors"] == 0 and lv["achieved_rps"] >= 0.9 * lv["offered_rps"]]
        return {"knee": max(ok) if ok else None, "rule": "highest offered rate with >= 90% achieved and no errors"}
    knee = levels[0]["concurrency"]
    for prev, cur in zip(levels, levels[1:]):
        if cur["output_tokens_per_s"] < 1.1 * prev["output_tokens_per_s"]:
            break
        knee = cur["concurrency"]
    return {"knee": knee, "rule": "last concurrency whose step up added >= 10% output tokens/s"}


async def run(cfg: RunConfig) -> dict:
    if cfg.mode not in ("closed", "open"):
        raise ValueError("mode is closed or open")
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    targets = Targets(cfg.targets, cfg.security, cfg.lb, cfg.connections)
    sampler = MetricsSampler(cfg.metrics_urls) if cfg.metrics_urls else None
    levels: list[dict] = []
    run_t0 = time.perf_counter()
    try:
        await targets.wait_ready(min(cfg.timeout or 30.0, 30.0))
        for level in cfg.levels:
            warm = await _warm_up(cfg, targets, level)
            requests, send_for, hard_stop = cfg.bounds(level)
            plan = Plan(cfg.mix, cfg.sources, cfg.seed)  # the same request sequence at every level
            progress = Progress(describe(level), enabled=cfg.progress)
            started_s = time.perf_counter() - run_t0
            if sampler:
                await sampler.begin(time.perf_counter())
            try:
                result, times = await _load(cfg, targets, plan, level, requests=requests, duration=send_for,
                                            hard_stop=hard_stop, seed=cfg.seed, progress=progress)
            finally:
                progress.close()
            summary = result.summary(cfg.slo, cfg.window_s)
            summary.update(arrival=cfg.arrival if cfg.mode == "open" else None,
                           burstiness=cfg.burstiness if cfg.mode == "open" else None, seed=cfg.seed,
                           schedule_digest=plan.digest(summary["sent"], times), warmup_requests=warm,
                           started_s=round(started_s, 3))
            summary["server"] = await sampler.end(summary["calls"]) if sampler else None
            levels.append(summary)
            if cfg.progress:
                print(level_line(summary), file=sys.stderr, flush=True)
    finally:
        await targets.close()
    return {"tool": "client.loadgen", "schema": SCHEMA, "started": started, "config": cfg.as_dict(),
            "levels": levels, "saturation": saturation(levels, cfg.mode)}
