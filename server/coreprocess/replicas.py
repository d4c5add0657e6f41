"""Engine replicas: N engine core processes, each with every model, and the frontend's choice among them.

The measured problem (issue 35, 2-core AMD EPYC): one engine whose ONNX Runtime intra-op threads meet
at a barrier after every kernel of a d_model-128 model, on cores it shares with the event loop, served
unary batches at half of its own static decoding speed, while CTranslate2 behind a thin gRPC server
runs independent single-thread replicas (its inter_threads) that never wait on a pool. Two of our
servers with one engine thread each, sharing one unary load, served 1.26x one default server.

The design: `--engine-replicas N` core processes (server/coreprocess/process.py, unchanged), each with
its own sessions, slot cache, scheduler and loop, each watched and restarted by its own
CoreSupervisor. A request's jobs go to one replica, all of them (a document's sentences stay
together: their order and the request's all-or-none admission are that replica's), the replica with
the least outstanding work: the source tokens of the jobs it holds, a proxy for the decode steps they
still need. Ties rotate, so an idle server spreads its first calls. Cancels follow each job to its
replica (the link sets `job.on_cancel`). Background work (document files, PRIORITY_BACKGROUND) goes
to the replica with the least interactive work, and interactive calls prefer replicas holding no
background work, so on a server with two replicas a document decodes beside interactive calls
instead of in their batch. A replica that dies fails only its own calls (UNAVAILABLE)
and restarts while the others serve; readiness is NOT_SERVING only while no replica is up. Each
replica's series carry a `replica` label (sum over it for the server's total).
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from typing import Awaitable, Callable

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from server.config import ServerConfig
from server.coreprocess.supervisor import CoreSupervisor
from server.core.errors import Unavailable
from server.core.request import Job
from server.metrics import Metrics

log = logging.getLogger("server.coreprocess")


class Replicas:
    def __init__(self, cfg: ServerConfig, metrics: Metrics, on_down: Callable[[], Awaitable[None]],
                 on_up: Callable[[], Awaitable[None]], attach: str = ""):
        """`attach`: the comma-separated core addresses of another process's replicas (an extra frontend)."""
        self.on_down, self.on_up = on_down, on_up
        addresses = attach.split(",") if attach else [""] * cfg.replicas
        self.members = [CoreSupervisor(cfg, metrics, functools.partial(self._down, i), self._up, attach=a)
                        for i, a in enumerate(addresses)]
        self._turn = itertools.count()
        # Fill one replica's batch before opening the next: a step's fixed cost (Python, the hop to the
        # frontend) is spread over its rows, so two half-full replicas cost more per token than one full one
        # (measured: 64 streams 5,400 tok/s packed vs 4,000 spread; unary 32-text calls from 4 clients fill
        # both either way).
        self.pack_rows = cfg.max_batch_size

    # -- what the frontend and the pool read ---------------------------------------------------
    @property
    def addresses(self) -> str:
        return ",".join(m.link.address for m in self.members)

    @property
    def config_file(self) -> str:
        return self.members[0].config_file

    @property
    def dir(self) -> str:
        return self.members[0].dir

    @property
    def pids(self) -> list:
        return [m.pid for m in self.members]

    @property
    def up(self) -> int:
        return sum(m.link.up for m in self.members)

    # -- lifecycle ------------------------------------------------------------------------------
    async def start(self):
        """Start every replica at once; their Ready (the same models in each): the first one's."""
        readies = await asyncio.gather(*(m.start() for m in self.members))
        log.info("%d engine replica(s) ready: pids %s", len(readies), [r.pid for r in readies],
                 extra={"event": "engine_replicas_up", "pids": [r.pid for r in readies]})
        return readies[0]

    async def stop(self, grace: float) -> None:
        await asyncio.gather(*(m.stop(grace) for m in self.members))

    async def _down(self, index: int) -> None:
        """Replica `index` died (its link still counts as up until its calls are failed, just after)."""
        if not any(m.link.up for i, m in enumerate(self.members) if i != index):
            await self.on_down()  # the last live replica went: nothing can serve until one is back

    async def _up(self) -> None:
        await self.on_up()

    # -- requests -------------------------------------------------------------------------------
    def pick(self, rows: int = 1, background: bool = False):
        """The replica for a request of `rows` decode rows: the first live one (in order; those holding
        background work last) whose outstanding rows leave room for it within --max-batch-size, else the
        live one with the least outstanding work (source tokens; ties rotate); None when none is live.
        Background work: the live one with the fewest interactive jobs, then the least outstanding work."""
        live = [m.link for m in self.members if m.link.up]
        if not live:
            return None
        if background:
            return min(live, key=lambda link: (sum(not job.background for job in link.jobs.values()),
                                               sum(len(job.src_ids) for job in link.jobs.values())))
        if len(live) > 1:
            live.sort(key=lambda link: any(job.background for job in link.jobs.values()))  # stable
        for link in live:
            if len(link.jobs) + rows <= self.pack_rows:
                return link
        start = next(self._turn) % len(live)
        rotated = live[start:] + live[:start]
        return min(rotated, key=lambda link: sum(len(job.src_ids) for job in link.jobs.values()))

    async def submit(self, model: str, jobs: list) -> None:
        """Queue a request's jobs in one replica, all or none. A replica lost between the choice and its
        answer (UNAVAILABLE with the link down) passes them to another live one, once per replica."""
        rows = sum(job.params.rows if isinstance(job, Job) else 1 for job in jobs)  # an embedding counts one
        background = any(job.background for job in jobs)
        for _ in self.members:
            link = self.pick(rows, background)
            if link is None:
                break
            try:
                await link.submit(model, jobs)
                return
            except Unavailable:
                if link.up:  # the replica itself refused (draining): its answer stands
                    raise
        raise Unavailable("every engine replica is restarting; retry")

    async def forget(self, frontend: bytes) -> None:
        await asyncio.gather(*(m.link.forget(frontend) for m in self.members))

    async def metrics_text(self) -> str:
        """Every replica's exposition in one, each sample labelled with its replica's index."""
        texts = await asyncio.gather(*(m.link.metrics_text() for m in self.members))
        if len(texts) == 1:
            return texts[0]
        return merged(texts)


def merged(texts: list[str]) -> str:
    """Expositions of the same registry from several replicas -> one, each family once, every sample
    with a `replica` label (its text's index)."""
    families: dict[str, list] = {}
    heads: dict[str, tuple[str, str]] = {}
    for replica, text in enumerate(texts):
        for family in text_string_to_metric_families(text) if text else ():
            heads.setdefault(family.name, (family.documentation, family.type))
            families.setdefault(family.name, []).extend(
                Sample(s.name, {**s.labels, "replica": str(replica)}, s.value) for s in family.samples
                if not s.name.endswith("_created"))  # creation times say nothing summed over replicas
    lines = []
    for name, samples in families.items():
        documentation, kind = heads[name]
        name = f"{name}_total" if kind == "counter" else name  # the text format names a counter by its sample
        lines += [f"# HELP {name} {_escape_help(documentation)}", f"# TYPE {name} {kind}"]
        lines += [_line(sample) for sample in samples]
    return "\n".join(lines) + "\n" if lines else ""


def _line(sample: Sample) -> str:
    labels = ",".join(f'{k}="{_escape(v)}"' for k, v in sorted(sample.labels.items()))
    return f"{sample.name}{{{labels}}} {_value(sample.value)}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n")


def _value(v: float) -> str:
    return "+Inf" if v == float("inf") else "-Inf" if v == float("-inf") else repr(float(v))
