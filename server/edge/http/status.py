"""GET /v1/status: what the status page plots, from the server's own metrics, without Prometheus.

    {"time": 1733100000.1, "health": {"live": "SERVING", "ready": "SERVING"},
     "engine": "process", "replicas": [{"name": "0", "up": true, "pid": 4242}, ...],
     "memory": [{"role": "frontend", "name": "0", "pid": 4240, "rssBytes": 170000000}, ...],
     "memoryTotalBytes": 650000000,
     "models": [{"name", "version", "variant", "provider", "pairs": ["en-de"], "running", "waiting",
                 "outputTokens", "texts", "latency": HISTOGRAM, "firstToken": HISTOGRAM}]}

    HISTOGRAM = {"bounds": [0.005, ...], "counts": [cumulative, ...], "count", "sum"}

The counters are cumulative since the engine started, as a scrape's are: the page samples every
few seconds and plots the differences (tokens/s, latency percentiles of the texts finished in each
interval), so the server keeps no history and does no work while nobody looks. The numbers are the
engine's series from the metrics port's view (every replica's, summed per model); the models and
the key check are ListModels' through the gateway: a caller the API refuses gets the same 401/403
here, and a key limited to some models sees only those.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from prometheus_client.parser import text_string_to_metric_families
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from protos.nmt.v1 import translator_pb2 as pb
from server.edge.gateway import CallFailed
from server.edge.http.context import Edge
from server.edge.http.native import failed

API = "native"
GAUGES = {"nmt_running_requests": "running", "nmt_waiting_requests": "waiting"}
COUNTERS = {"nmt_output_tokens": "outputTokens"}
HISTOGRAMS = {"nmt_sequence_duration_seconds": "latency", "nmt_time_to_first_token_seconds": "firstToken"}


@dataclass
class EngineView:
    """What the frontend can tell about its engine: built by the server (server/frontend/server.py)."""
    kind: str  # "process" (engine core processes) or "thread" (the engine in this process)
    exposition: Callable[[], Awaitable[str]]  # the engine's series in the text format, every replica's
    replicas: Callable[[], list[dict]]  # [{"name", "up", "pid"}]
    memory: Callable[[], list[dict]]  # [{"role", "name", "pid", "rssBytes"}]: every process of the server


class StatusApi:
    def __init__(self, edge: Edge, engine: EngineView, health: Callable[[], dict]):
        """`health()`: {"live": "SERVING" | "NOT_SERVING", "ready": ...}, as /healthz and /readyz answer."""
        self.edge, self.engine, self.health = edge, engine, health

    def routes(self) -> list[Route]:
        return [Route("/v1/status", self.status, methods=["GET"])]

    async def status(self, request: Request) -> Response:
        caller = self.edge.caller(request)
        try:
            listed = await self.edge.gateway.unary("ListModels", pb.ListModelsRequest(), caller)
        except CallFailed as e:
            return self.edge.count(API, "Status", failed(e, caller.request_id))
        series = per_model(await self.engine.exposition())
        models = []
        for m in listed.models:
            pairs = [f"{p.source_language}-{p.target_language}" for p in m.language_pairs] or \
                [f"{m.source_language}-{m.target_language}"]
            models.append({"name": m.name, "version": m.version, "variant": m.variant, "provider": m.provider,
                           "pairs": pairs, **series.get(m.name, empty())})
        memory = self.engine.memory()
        body = {"time": time.time(), "health": self.health(), "engine": self.engine.kind,
                "replicas": self.engine.replicas(), "models": models, "memory": memory,
                "memoryTotalBytes": sum(p["rssBytes"] for p in memory)}
        return self.edge.count(API, "Status", JSONResponse(body, headers={"Cache-Control": "no-store"}))


def empty() -> dict:
    out: dict = {name: 0 for name in (*GAUGES.values(), *COUNTERS.values())}
    out["texts"] = 0
    for name in HISTOGRAMS.values():
        out[name] = {"bounds": [], "counts": [], "count": 0, "sum": 0.0}
    return out


def per_model(text: str) -> dict[str, dict]:
    """The engine's exposition -> per model: gauges and counters summed over replicas, histograms summed
    bucket by bucket (the replicas share the buckets: one declaration, server/observability/metrics.py)."""
    models: dict[str, dict] = {}
    buckets: dict[tuple[str, str], dict[float, float]] = {}
    for family in text_string_to_metric_families(text) if text else ():
        for sample in family.samples:
            model = sample.labels.get("model")
            if model is None:
                continue
            out = models.setdefault(model, empty())
            if family.name in GAUGES and sample.name == family.name:
                out[GAUGES[family.name]] += sample.value
            elif family.name in COUNTERS and sample.name == family.name + "_total":
                out[COUNTERS[family.name]] += sample.value
            elif family.name in HISTOGRAMS:
                field = HISTOGRAMS[family.name]
                if sample.name.endswith("_bucket"):
                    le = float(sample.labels["le"])
                    per = buckets.setdefault((model, field), {})
                    per[le] = per.get(le, 0.0) + sample.value
                elif sample.name.endswith("_count"):
                    out[field]["count"] += sample.value
                elif sample.name.endswith("_sum"):
                    out[field]["sum"] += sample.value
    for (model, field), per in buckets.items():
        bounds = sorted(b for b in per if b != float("inf"))  # +Inf is the count
        models[model][field]["bounds"] = bounds
        models[model][field]["counts"] = [per[b] for b in bounds]
    for out in models.values():
        for name in (*GAUGES.values(), *COUNTERS.values()):
            out[name] = int(out[name])  # counts of texts and tokens: whole numbers in the text format's floats
        for name in HISTOGRAMS.values():
            out[name]["counts"] = [int(c) for c in out[name]["counts"]]
            out[name]["count"] = int(out[name]["count"])
        out["texts"] = out["latency"]["count"]
    return models
