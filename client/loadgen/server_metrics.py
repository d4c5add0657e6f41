"""The server's side of a level, from its Prometheus /metrics endpoint(s), scraped every second.

Counters and histograms are read as deltas between the scrape at the level's start and the
one at its end, so a server that has been up for days reports only this level's work;
gauges (KV cache usage, queue depth) are averaged over the one-second samples in between.
The parser reads the text exposition format only as far as these metrics need, so the
client needs no prometheus_client.
"""
from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from typing import Optional, Sequence

Key = tuple[str, tuple[tuple[str, str], ...]]
Snapshot = dict[Key, float]

LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def metrics_url(spec: str) -> str:
    """Accept HOST:PORT, a URL without a path, or the full /metrics URL."""
    url = spec if "://" in spec else f"http://{spec}"
    return url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"


def parse(text: str) -> Snapshot:
    out: Snapshot = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = LINE.match(line)
        if not m:
            continue
        labels = tuple(sorted(LABEL.findall(m.group(2) or "")))
        try:
            out[m.group(1), labels] = float(m.group(3))
        except ValueError:
            continue
    return out


def total(snap: Snapshot, name: str) -> float:
    return sum(v for (n, _), v in snap.items() if n == name)


def series(snap: Snapshot, name: str) -> list[float]:
    return [v for (n, _), v in snap.items() if n == name]


def by_labels(snap: Snapshot, name: str, keys: Sequence[str]) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for (n, labels), v in snap.items():
        if n == name:
            d = dict(labels)
            k = tuple(d.get(key, "") for key in keys)
            out[k] = out.get(k, 0.0) + v
    return out


def fetch(url: str, timeout: float = 2.0) -> Snapshot:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return parse(resp.read().decode("utf-8", "replace"))


class MetricsSampler:
    """Scrapes every URL once a second during a level (several URLs: one per server, summed)."""

    def __init__(self, urls: Sequence[str], interval: float = 1.0):
        self.urls, self.interval = [metrics_url(u) for u in urls], interval
        self.scrapes: list[tuple[float, list[Snapshot]]] = []
        self.errors = 0
        self._task: Optional[asyncio.Task] = None
        self._t0 = 0.0

    async def scrape(self) -> Optional[list[Snapshot]]:
        try:
            return list(await asyncio.gather(*(asyncio.to_thread(fetch, u) for u in self.urls)))
        except Exception:  # noqa: BLE001 (an unreachable endpoint is counted, the run goes on)
            self.errors += 1
            return None

    async def begin(self, t0: float) -> None:
        """The baseline scrape, then a background scrape every `interval` seconds."""
        self.scrapes, self.errors, self._t0 = [], 0, t0
        await self._record()
        self._task = asyncio.create_task(self._loop())

    async def _record(self) -> Optional[list[Snapshot]]:
        snaps = await self.scrape()
        if snaps is not None:
            self.scrapes.append((time.perf_counter() - self._t0, snaps))
        return snaps

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            await self._record()

    async def end(self, client_calls: dict[str, dict[str, int]], settle: float = 1.0) -> dict:
        """The closing scrape. The server counts an RPC as it finishes it, which for a failed call
        can be just after the client saw the status; so re-scrape (briefly) until the request
        counts match the client's, then summarise."""
        if self._task:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        stop = time.perf_counter() + settle
        while True:
            await self._record()
            s = self.summary(client_calls)
            if s.get("matches_client") or time.perf_counter() >= stop:
                return s
            await asyncio.sleep(0.05)

    def _delta(self, name: str) -> float:
        first, last = self.scrapes[0][1], self.scrapes[-1][1]
        return sum(total(b, name) - total(a, name) for a, b in zip(first, last))

    def _mean_of(self, hist: str) -> Optional[float]:
        count = self._delta(hist + "_count")
        return self._delta(hist + "_sum") / count if count > 0 else None

    def summary(self, client_calls: dict[str, dict[str, int]]) -> dict:
        if len(self.scrapes) < 2:
            return {"urls": self.urls, "scrapes": len(self.scrapes), "scrape_errors": self.errors,
                    "note": "fewer than two successful scrapes: no server figures"}
        first, last = self.scrapes[0][1], self.scrapes[-1][1]
        requests: dict[str, dict[str, int]] = {}
        for a, b in zip(first, last):
            before = by_labels(a, "nmt_requests_total", ("rpc", "code"))
            for (rpc, code), v in by_labels(b, "nmt_requests_total", ("rpc", "code")).items():
                d = int(round(v - before.get((rpc, code), 0.0)))
                if d:
                    requests.setdefault(rpc, {})[code] = requests.get(rpc, {}).get(code, 0) + d
        requests = {rpc: dict(sorted(c.items())) for rpc, c in sorted(requests.items())}
        kv, waiting, points = [], [], []
        for t, snaps in self.scrapes:
            k = [v for s in snaps for v in series(s, "nmt_kv_cache_usage_ratio")]
            w = sum(total(s, "nmt_waiting_requests") for s in snaps)
            r = sum(total(s, "nmt_running_requests") for s in snaps)
            kv_now = sum(k) / len(k) if k else None
            if kv_now is not None:
                kv.append(kv_now)
            waiting.append(w)
            points.append({"t_s": round(t, 3), "kv_usage": None if kv_now is None else round(kv_now, 4),
                           "waiting": w, "running": r})
        queue = self._mean_of("nmt_queue_duration_seconds")
        batch = self._mean_of("nmt_decode_batch_size")
        return {
            "urls": self.urls, "scrapes": len(self.scrapes), "scrape_errors": self.errors,
            "requests": requests, "matches_client": requests == client_calls,
            "output_tokens": int(round(self._delta("nmt_output_tokens_total"))),
            "queue_ms_mean": None if queue is None else round(queue * 1e3, 3),
            "decode_batch_mean": None if batch is None else round(batch, 3),
            "kv_cache_usage": {"mean": round(sum(kv) / len(kv), 4) if kv else None,
                               "max": round(max(kv), 4) if kv else None},
            "waiting_max": max(waiting, default=0.0),
            "series": points,
        }
