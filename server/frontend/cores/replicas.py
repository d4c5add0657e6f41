"""Engine replicas: N engine core processes, each with every model, and the frontend's choice among them.

The measured problem (issue 35, 2-core AMD EPYC): one engine whose ONNX Runtime intra-op threads meet
at a barrier after every kernel of a d_model-128 model, on cores it shares with the event loop, served
unary batches at half of its own static decoding speed, while CTranslate2 behind a thin gRPC server
runs independent single-thread replicas (its inter_threads) that never wait on a pool. Two of our
servers with one engine thread each, sharing one unary load, served 1.26x one default server.

The design: `--engine-replicas N` core processes (server/coreprocess/process.py, unchanged), each with
its own sessions, slot cache, scheduler and loop, each watched and restarted by its own
CoreSupervisor. A request's jobs go to one replica, all of them (a document's sentences stay
together: their order and the request's all-or-none admission are that replica's). Which one is
server/frontend/cores/placement.py's rule: a stream fills one replica's batch before the next opens,
unless its model's rows cost more than the rest of a token (then, like every other call, it goes to
the least outstanding work: the source tokens of the jobs a replica holds, a proxy for the decode
steps they still need; ties to the first, whose caches are warm). Cancels follow each job to its
replica (the link sets `job.on_cancel`).

Background work (PRIORITY_BACKGROUND: every document file's texts) has a replica of its own, at the
lowest CPU priority (nice 19, --background-replica). Measured on 2 cores (docs/benchmarks/
document_load.md): a 200-page DOCX decoding in a replica of normal priority made 8 interactive
streams' TTFT p50 1.46x and halved their tokens/s, because on a machine the interactive pipeline
(client, frontend, replica) already keeps busy, every hop of a call waited for a core the document
held; in a nice-19 replica the document used only the CPU time they left. That replica starts at the
first background request and stops after BACKGROUND_IDLE_S without any, so a server that never sees
one never pays its memory, and it does not start while the memory budget (--memory-limit) could not hold
one more replica as large as the largest running one: the budget is for calls, not for a process that
would then make the server refuse them. Without it (off, starting, over the budget, or an extra frontend, which cannot start it)
background work goes to the replica with the least interactive work, and interactive calls prefer
replicas holding no background work. A replica that dies fails only its own calls (UNAVAILABLE)
and restarts while the others serve; readiness is NOT_SERVING only while no replica is up. Each
replica's series carry a `replica` label (sum over it for the server's total).
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import os
from typing import Awaitable, Callable, Optional

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from server.config import ServerConfig
from server.frontend.cores.placement import choose
from server.frontend.cores.supervisor import CoreFailed, CoreSupervisor
from server.core.errors import Unavailable
from server.core.request import Job
from server.observability.memory import resident_bytes
from server.observability.metrics import Metrics

log = logging.getLogger("server.coreprocess")
BACKGROUND_NICE = 19  # the lowest CPU priority: the background replica runs on what the others leave
BACKGROUND_IDLE_S = 60.0  # the background replica stops after this long without work
# Under a memory budget, as many replicas as it holds when each is busy: a replica at work held 1.35x its
# resident size at start (140 -> 190 MB in the soak, its slot cache's pages), and the frontend at rest held
# 2.2x what it holds when the replicas start (79 MB then, before its HTTP port, language identifier and first
# calls; 172 MB at rest after the soak's warm-up).
BUSY_REPLICA = 1.35
RESTING_FRONTEND = 2.2


def replicas_that_fit(line: int, frontend: int, replica: int, wanted: int) -> int:
    """How many of `wanted` replicas of `replica` bytes (at start) a server whose frontend holds `frontend`
    bytes (at start) can run busy under `line` bytes (where the budget refuses calls); at least one."""
    room = line - RESTING_FRONTEND * frontend
    return max(1, min(wanted, int(room // (BUSY_REPLICA * replica)) if replica > 0 else wanted))


async def _nothing() -> None:
    """The background replica's down/up hooks: it never changes the server's readiness."""


class Replicas:
    def __init__(self, cfg: ServerConfig, metrics: Metrics, on_down: Callable[[], Awaitable[None]],
                 on_up: Callable[[], Awaitable[None]], attach: str = "",
                 pieces: Optional[dict[str, tuple[str, ...]]] = None, memory_line: Optional[int] = None,
                 room_for: Optional[Callable[[int], bool]] = None):
        """`attach`: the comma-separated core addresses of another process's replicas (an extra frontend).
        `pieces`: each model's vocabulary pieces, handed to the cores (CoreSupervisor). `memory_line`: where
        the memory budget refuses calls (bytes), when the replica count is the server's to choose: then
        only as many start as fit it (replicas_that_fit). `room_for(bytes)`: whether the budget holds that much
        more (MemoryBudget.room_for): the background replica starts only then."""
        self.memory_line = memory_line
        self.on_down, self.on_up, self.pieces = on_down, on_up, pieces
        addresses = attach.split(",") if attach else [""] * cfg.replicas
        # On CUDA each replica drives one device of --device (ServerConfig.devices), in turn when
        # --engine-replicas asks for more replicas than devices: its own config says which.
        devices = cfg.devices if cfg.on_cuda and not attach else []
        configs = [dataclasses.replace(cfg, device=f"cuda:{devices[i % len(devices)]}") if devices else cfg
                   for i in range(len(addresses))]
        self.members = [CoreSupervisor(c, metrics, functools.partial(self._down, i), self._up, attach=a,
                                       pieces=pieces) for i, (a, c) in enumerate(zip(addresses, configs))]
        # Streams fill one replica's batch before opening the next (placement.py says when, and why not
        # other calls).
        self.pack_rows = cfg.max_batch_size
        self.cfg, self.metrics = cfg, metrics
        self.background_allowed = cfg.background_core and not attach  # the primary starts it, alone
        self.background: CoreSupervisor | None = None  # running now
        self._background_lock = asyncio.Lock()
        self._background_watch: asyncio.Task | None = None
        self.room_for = room_for
        self._no_room_logged = False

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
        """Start every replica at once; their Ready (the same models in each): the first one's. Under a memory
        line, the first alone, and then as many more as fit beside it."""
        if self.memory_line is not None and len(self.members) > 1:
            first = await self.members[0].start()
            frontend, replica = resident_bytes(os.getpid()) or 0, resident_bytes(first.pid) or 0
            fit = replicas_that_fit(self.memory_line, frontend, replica, len(self.members))
            log.log(logging.WARNING if fit < len(self.members) else logging.INFO,
                    "the memory budget holds %d engine replica(s) at work (%d wanted): starting %d", fit,
                    len(self.members), fit, extra={"event": "engine_replicas_fit", "replicas": fit,
                                                   "wanted": len(self.members), "frontend_bytes": frontend,
                                                   "replica_bytes": replica, "line_bytes": self.memory_line})
            del self.members[fit:]  # never started
            readies = [first, *await asyncio.gather(*(m.start() for m in self.members[1:]))]
        else:
            readies = await asyncio.gather(*(m.start() for m in self.members))
        log.info("%d engine replica(s) ready: pids %s", len(readies), [r.pid for r in readies],
                 extra={"event": "engine_replicas_up", "pids": [r.pid for r in readies]})
        return readies[0]

    async def stop(self, grace: float) -> None:
        self.background_allowed = False
        if self._background_watch is not None:
            self._background_watch.cancel()
        background = [self.background] if self.background is not None else []
        await asyncio.gather(*(m.stop(grace) for m in self.members + background))

    # -- the background replica -----------------------------------------------------------------
    async def _background_link(self):
        """The background replica's link, started first if need be; None when there is none to use."""
        if not self.background_allowed:
            return None
        async with self._background_lock:
            if self.background is None and not self._room_for_background():
                return None
            if self.background is None:
                core = CoreSupervisor(self.cfg, self.metrics, _nothing, _nothing, nice=BACKGROUND_NICE,
                                     pieces=self.pieces)
                try:
                    ready = await core.start()
                except CoreFailed as e:  # background work goes to the replicas meanwhile
                    log.error("background replica did not start: %s", e, extra={"event": "background_replica_failed"})
                    await core.stop(0.0)
                    return None
                log.info("background replica %d ready (nice %d)", ready.pid, BACKGROUND_NICE,
                         extra={"event": "background_replica_up", "pid": ready.pid})
                self.background = core
                self._background_watch = asyncio.create_task(self._retire_when_idle(core), name="background-idle")
            return self.background.link if self.background.link.up else None

    def _room_for_background(self) -> bool:
        """Whether the memory budget holds one more replica (the size of the largest running one)."""
        size = max((resident_bytes(pid) or 0 for pid in self.pids if pid), default=0)
        if self.room_for is None or self.room_for(size):
            self._no_room_logged = False
            return True
        if not self._no_room_logged:  # once per spell: background work goes to the replicas meanwhile
            self._no_room_logged = True
            log.warning("background replica not started: the memory budget cannot hold another %d MB replica; "
                        "background work runs in the replicas", size >> 20,
                        extra={"event": "background_replica_no_room", "replica_bytes": size})
        return False

    async def _retire_when_idle(self, core: CoreSupervisor) -> None:
        """Stop the background replica once it has held no work for BACKGROUND_IDLE_S."""
        loop = asyncio.get_running_loop()
        busy = loop.time()
        while True:
            await asyncio.sleep(BACKGROUND_IDLE_S / 6)
            async with self._background_lock:
                if core.link.jobs:
                    busy = loop.time()
                elif loop.time() - busy >= BACKGROUND_IDLE_S:
                    self.background = None  # new background work starts a fresh one
                    log.info("background replica idle for %.0f s: stopping it", BACKGROUND_IDLE_S,
                             extra={"event": "background_replica_idle"})
                    await core.stop(1.0)
                    return

    async def _down(self, index: int) -> None:
        """Replica `index` died (its link still counts as up until its calls are failed, just after)."""
        if not any(m.link.up for i, m in enumerate(self.members) if i != index):
            await self.on_down()  # the last live replica went: nothing can serve until one is back

    async def _up(self) -> None:
        await self.on_up()

    # -- requests -------------------------------------------------------------------------------
    def pick(self, rows: int = 1, background: bool = False, model: str = "", stream: bool = True):
        """The replica for a request of `rows` decode rows of `model` (placement.py `choose`: streams pack
        one replica's batch unless the model's rows cost more than --spread-row-cost-ms, other calls go to
        the least outstanding work); live ones holding background work come last. None when none is live.
        Background work: the live one with the fewest interactive jobs, then the least outstanding work."""
        live = [m.link for m in self.members if m.link.up]
        if not live:
            return None
        if background:  # from the back (ties: the last), where interactive calls, packed from the front, are not
            return min(reversed(live), key=lambda link: (len(link.jobs) - link.background_jobs, link.source_tokens))
        if len(live) > 1:
            live.sort(key=lambda link: link.background_jobs > 0)  # stable
        row_cost = max(link.row_costs.get(model, 0.0) for link in live)
        return choose(live, rows, stream, row_cost, self.cfg.spread_row_cost_ms, self.pack_rows)

    async def submit(self, model: str, jobs: list) -> None:
        """Queue a request's jobs in one replica, all or none. A replica lost between the choice and its
        answer (UNAVAILABLE with the link down) passes them to another live one, once per replica."""
        rows = sum(job.params.rows if isinstance(job, Job) else 1 for job in jobs)  # an embedding counts one
        background = any(job.background for job in jobs)
        stream = any(getattr(job, "stream", False) for job in jobs)  # an embedding has no stream
        if background:
            link = await self._background_link()
            if link is not None:
                try:
                    await link.submit(model, jobs)
                    return
                except Unavailable:
                    if link.up:  # draining: its answer stands
                        raise  # (lost between the choice and the answer: the replicas take it below)
        for _ in self.members:
            link = self.pick(rows, background, model, stream)
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
        background = [self.background] if self.background is not None else []
        await asyncio.gather(*(m.link.forget(frontend) for m in self.members + background))

    async def metrics_text(self) -> str:
        """Every replica's exposition in one, each sample labelled with its replica's index ("background"
        for the background replica while it runs)."""
        members = list(self.members)
        labels = [str(i) for i in range(len(members))]
        if self.background is not None and self.background.link.up:
            members.append(self.background)
            labels.append("background")
        texts = await asyncio.gather(*(m.link.metrics_text() for m in members))
        if len(texts) == 1:
            return texts[0]
        return merged(texts, labels)


def merged(texts: list[str], labels: list[str] | None = None) -> str:
    """Expositions of the same registry from several replicas -> one, each family once, every sample
    with a `replica` label (its text's label, by default its index)."""
    families: dict[str, list] = {}
    heads: dict[str, tuple[str, str]] = {}
    for replica, text in zip(labels or [str(i) for i in range(len(texts))], texts):
        for family in text_string_to_metric_families(text) if text else ():
            heads.setdefault(family.name, (family.documentation, family.type))
            families.setdefault(family.name, []).extend(
                Sample(s.name, {**s.labels, "replica": replica}, s.value) for s in family.samples
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
