"""The engine core process: ONNX Runtime, the slot caches, the schedulers and the engine loops of
every model, behind one ZeroMQ ROUTER socket. No grpc, no protobuf, no HTTP.

Why a process of its own (issue 22): in one process the frontend's per-message gRPC work and the
engine's per-step Python share one interpreter lock, and a native crash in a kernel takes every
caller's connection with it. Here the frontends (server/coreprocess/link.py) keep the callers,
the protobuf, documents and detokenisation; the core keeps the model and the decode loop.

Threads: one engine loop per model (server/core/loop.py, unchanged), and this process's main thread,
which owns the socket (ZeroMQ sockets are single-threaded). Engine threads never touch the socket:
their sinks append to a per-frontend `Outbox` and wake the main thread once per step (through the
same hold/flush rule as the asyncio relay, server/relay.py). The main thread then sends each
frontend one `Events` message with everything since the last, unless the frontend has said it is
behind (`Hold`, until `Resume`); meanwhile it keeps collecting, and a stream's consecutive tokens
merge into one item: a frontend that falls behind gets fewer, fuller messages, an idle one each
token at once (coalescing by back-pressure), and a frontend that keeps up sends nothing back.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
import time
from typing import Optional

import numpy as np
import zmq
from prometheus_client import generate_latest

from models.core.bundle import discover
from server import relay
from server.config import ServerConfig
from server.coreprocess import protocol as wire
from server.core.errors import ServiceError
from server.hosted import HostedModel
from server.metrics import Metrics
from server.observability import logs
from server.core.request import EmbedJob, ErrorEvent, FinishEvent, Job, TokenEvent

log = logging.getLogger("server.coreprocess")
POLL_MS = 100  # parent and watchdog checks between messages
EXIT_STUCK = 3  # the watchdog's exit status: the supervisor restarts the core


def to_wire(job_id: int, event) -> wire.Event:
    """An engine event (server/core/request.py) as the frontend's wire item."""
    if isinstance(event, TokenEvent):
        return wire.Tokens(job_id, event.token_ids)
    if isinstance(event, FinishEvent):
        t = event.timing
        return wire.Finished(job_id, [(list(map(int, h.tokens)), float(h.score), bool(h.finished_by_eos))
                                      for h in event.hypotheses],
                             event.reason.value, event.input_tokens,
                             (t.scheduled, t.first_token, t.finished, t.last_token))
    if isinstance(event, np.ndarray):  # an embedding
        return wire.Embedded(job_id, np.ascontiguousarray(event, dtype=np.float32).tobytes())
    error = event.error if isinstance(event, ErrorEvent) else event
    code = error.code if isinstance(error, ServiceError) else "INTERNAL"
    return wire.Failed(job_id, code, str(error))


class Outbox:
    """One frontend's events, collected from the engine threads until the main thread sends them."""

    def __init__(self, identity: bytes, wake) -> None:
        self.identity, self._wake_fd = identity, wake
        self.lock = threading.Lock()
        self.items: list[wire.Event] = []
        self.tokens_at: dict[int, int] = {}  # job id -> index of its pending Tokens item (merged into)
        self.held = False  # the frontend said it is behind (Hold) and has not said Resume yet
        # A job's first tokens and its end go out at once, held or not: back-pressure merges the
        # tokens in between, never delays a stream's first token (TTFT) or a unary call's answer.
        self.urgent = False
        self.started: set[int] = set()  # jobs whose first tokens were sent
        self.jobs: dict[int, Job | EmbedJob] = {}  # its jobs in the core, until their terminal event

    def post(self, item: wire.Event) -> None:
        with self.lock:
            if isinstance(item, wire.Tokens):
                at = self.tokens_at.get(item.id)
                if at is not None:
                    self.items[at].token_ids.extend(item.token_ids)
                    return
                self.tokens_at[item.id] = len(self.items)
                if item.id not in self.started:
                    self.started.add(item.id)
                    self.urgent = True
            else:
                self.jobs.pop(item.id, None)
                self.tokens_at.pop(item.id, None)  # the job's tokens before this item stay before it
                self.started.discard(item.id)
                self.urgent = True
            self.items.append(item)
        if not relay.defer_wake(self):  # the engine thread wakes the main thread once per step
            self._wake()

    def _wake(self) -> None:
        os.write(self._wake_fd, b"x")

    def take(self) -> list[wire.Event]:
        with self.lock:
            items, self.items, self.tokens_at, self.urgent = self.items, [], {}, False
        return items


class Core:
    def __init__(self, models: dict[str, HostedModel], metrics: Metrics, address: str, parent: int,
                 watchdog_s: float):
        self.models, self.metrics, self.parent, self.watchdog_s = models, metrics, parent, watchdog_s
        self.ready = wire.Ready([wire.ModelFacts(m.name, m.provider, m.capacity, m.variant)
                                 for m in models.values()], os.getpid())
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted frontend with the same id takes over
        self.sock.bind(address)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self.outboxes: dict[bytes, Outbox] = {}
        self.stopping: Optional[threading.Thread] = None

    # -- requests from a frontend ---------------------------------------------------------
    def _outbox(self, identity: bytes) -> Outbox:
        box = self.outboxes.get(identity)
        if box is None:
            box = self.outboxes[identity] = Outbox(identity, self._wake_w)
        return box

    def handle(self, identity: bytes, msg) -> None:
        box = self._outbox(identity)
        if isinstance(msg, wire.Hello):
            box.held = False  # a frontend (re)connecting is not behind
            self._send(identity, self.ready)
        elif isinstance(msg, wire.Hold):
            box.held = True
        elif isinstance(msg, wire.Resume):
            box.held = False
            self._send_events(box)
        elif isinstance(msg, wire.Submit):
            self._submit(box, msg)
        elif isinstance(msg, wire.Cancel):
            for job_id in msg.ids:
                job = box.jobs.get(job_id)
                if job is not None:
                    job.cancel()
        elif isinstance(msg, wire.AskMetrics):
            self._send(identity, wire.MetricsText(msg.ticket, generate_latest(self.metrics.registry).decode()))
        elif isinstance(msg, wire.Forget):
            gone = self.outboxes.pop(msg.identity, None)
            for job in list(gone.jobs.values()) if gone is not None else ():
                job.cancel()  # dropped at the next step; its events go nowhere
        elif isinstance(msg, wire.Stop) and self.stopping is None:
            self.stopping = threading.Thread(target=self._stop, args=(msg.grace,), name="core-stop", daemon=True)
            self.stopping.start()

    def _submit(self, box: Outbox, msg: wire.Submit) -> None:
        model = self.models.get(msg.model)
        if model is None:
            self._send(box.identity, wire.Refused(msg.ticket, "NOT_FOUND", f"the core serves no model {msg.model}"))
            return
        jobs = [self._job(box, spec) for spec in msg.jobs]
        try:
            model.scheduler.submit(jobs)
        except ServiceError as e:
            for job in jobs:
                box.jobs.pop(job.id, None)
            self._send(box.identity, wire.Refused(msg.ticket, e.code, str(e)))
            return
        self._send(box.identity, wire.Accepted(msg.ticket))

    @staticmethod
    def _job(box: Outbox, spec: wire.JobSpec) -> Job | EmbedJob:
        job_id, post = spec.id, box.post

        def sink(event) -> None:
            post(to_wire(job_id, event))
        if spec.kind == "embed":
            job = EmbedJob(spec.model, spec.src_ids, sink, spec.deadline, id=job_id)
        else:
            job = Job(spec.model, spec.src_ids, wire.params_in(spec.params), spec.max_len, sink, spec.deadline,
                      id=job_id, scores=spec.scores, stream=spec.stream, forced=tuple(spec.forced),
                      prefix=tuple(spec.prefix), terms=spec.terms, background=spec.background)
        job.timing.arrival = spec.arrival
        box.jobs[job_id] = job
        return job

    # -- events to a frontend ---------------------------------------------------------------
    def _send(self, identity: bytes, msg) -> None:
        self.sock.send_multipart([identity, wire.encode(msg)], copy=False)

    def _send_events(self, box: Outbox, force: bool = False) -> None:
        if box.held and not (box.urgent or force):
            return  # the frontend is behind: keep collecting (its streams' tokens merge)
        items = box.take()
        if items:
            self._send(box.identity, wire.Events(items))

    # -- the main thread ----------------------------------------------------------------------
    def run(self) -> int:
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        while True:
            ready = dict(poller.poll(POLL_MS))
            if self.sock in ready:
                while True:
                    try:
                        identity, frame = self.sock.recv_multipart(zmq.NOBLOCK, copy=True)
                    except zmq.Again:
                        break
                    try:
                        self.handle(identity, wire.to_core(frame))
                    except Exception:  # noqa: BLE001 (a malformed frame must not stop the core)
                        log.exception("bad message from a frontend")
            if self._wake_r in ready:
                try:
                    os.read(self._wake_r, 65536)
                except BlockingIOError:
                    pass
            for box in list(self.outboxes.values()):
                self._send_events(box)
            if self.stopping is not None and not self.stopping.is_alive():
                for box in self.outboxes.values():
                    self._send_events(box, force=True)
                return 0
            status = self._check()
            if status is not None:
                return status

    def _check(self) -> Optional[int]:
        if os.getppid() != self.parent:  # the frontend is gone: nobody is left to answer
            log.error("engine core: the frontend process exited; stopping")
            return 1
        if self.stopping is not None:  # draining: loops end as their models go idle
            return None
        now = time.monotonic()
        for model in self.models.values():
            problem = model.engine_problem(now, self.watchdog_s)
            if problem:
                log.error("engine core watchdog: %s; exiting for a restart", problem,
                          extra={"event": "engine_core_stuck", "problem": problem})
                return EXIT_STUCK
        return None

    def _stop(self, grace: float) -> None:
        threads = [threading.Thread(target=m.stop, args=(grace,)) for m in self.models.values()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()


def main(cfg: ServerConfig, address: str, parent: int, pieces: Optional[dict[str, tuple[str, ...]]] = None) -> None:
    """The core process's entry point (multiprocessing, spawn): load, warm up, say Ready, serve. A model
    with `pieces` (its frontend's) loads no tokenizer here."""
    # The primary frontend decides when to stop (the Stop message, after its own drain has begun): a
    # signal to the whole process group (Ctrl-C, systemd's control-group kill) must not end the core
    # under its callers. A frontend that is gone ends it too (Core._check).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logs.configure(cfg.log_format, cfg.log_level)
    metrics = Metrics()
    models = {}
    for bundle in discover(cfg.model_repository):
        model = HostedModel(bundle, cfg, metrics, pieces=(pieces or {}).get(bundle.name))
        model.start()
        models[bundle.name] = model
    core = Core(models, metrics, address, parent, cfg.watchdog_s)
    log.info("engine core ready", extra={"event": "engine_core_ready", "pid": os.getpid(), "models": sorted(models),
                                             "intra_op_threads": cfg.engine_threads or "default"})
    try:
        status = core.run()
    except Exception:  # noqa: BLE001
        log.exception("engine core failed")
        status = 1
    core.sock.close(linger=2000)  # the last Events go out before the process does
    core.ctx.term()
    os._exit(status)  # engine threads are daemons; nothing else to wait for
