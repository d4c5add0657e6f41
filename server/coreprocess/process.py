"""The engine core process: ONNX Runtime, the slot caches, the schedulers and the engine loops of
every model, behind one ZeroMQ ROUTER socket. No grpc, no protobuf, no HTTP.

Why a process of its own (issue 22): in one process the frontend's per-message gRPC work and the
engine's per-step Python share one interpreter lock, and a native crash in a kernel takes every
caller's connection with it. Here the frontends (server/coreprocess/link.py) keep the callers,
the protobuf, documents and detokenisation; the core keeps the model and the decode loop.

Threads: one engine loop per model (server/core/loop.py, unchanged), and this process's main thread,
which owns the ROUTER socket (ZeroMQ sockets are single-threaded): it takes the frontends' requests
and answers them. Events go out from the engine threads themselves: each (frontend, model) pair has
an `Outbox` that the model's engine thread fills during a step and sends once at its end, on a PUSH
socket of its own connected to the frontend's PULL socket (the address in its Hello).

Measured problem (issue 35, py-spy over a core serving one stream): when the main thread sent the
events, every step cost a wake-up write on the engine thread, a poll return and a send on the main
thread and the interpreter lock passing between the two, about a third of the core's CPU at one
stream. Sending from the engine thread costs the send alone. The rule that decides what goes is the
same: one `Events` message per step with everything since the last, unless the frontend has said it
is behind (`Hold`, until `Resume`); meanwhile the outbox keeps collecting, and a stream's consecutive
tokens merge into one item: a frontend that falls behind gets fewer, fuller messages, an idle one each
token at once (coalescing by back-pressure), and a frontend that keeps up sends nothing back. A
job's events all come from its model's engine thread through one socket, so they arrive in order.
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
    """One frontend's events from one model's engine thread, collected during a step and sent at its end."""

    def __init__(self, identity: bytes, ctx: zmq.Context, address: str, wake_fd: int) -> None:
        self.identity, self.ctx, self._wake_fd = identity, ctx, wake_fd
        self.address = address  # the frontend's PULL socket ("": the main thread sends, on the ROUTER)
        self.sock: Optional[zmq.Socket] = None  # the engine thread's PUSH socket, made on its first send
        self.sock_address = ""
        self.lock = threading.Lock()
        self.items: list[wire.Event] = []
        self.tokens_at: dict[int, int] = {}  # job id -> index of its pending Tokens item (merged into)
        self.held = False  # the frontend said it is behind (Hold) and has not said Resume yet
        self.gone = False  # the frontend died (Forget): drop what comes, close the socket
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
        # On the engine thread (wake-ups held) the step's end sends (_wake); on any other thread the
        # main thread does, and only for an outbox without a PULL address (see _wake_main).
        if not relay.defer_wake(self):
            self._wake_main()

    def _wake_main(self) -> None:
        os.write(self._wake_fd, b"x")

    def _wake(self) -> None:
        """The engine step's end (relay.flush, on the engine thread): send what the step collected."""
        if not self.address:
            self._wake_main()
            return
        if self.gone:
            self.take()
            self.close(0)
            return
        if self.held and not self.urgent:
            return  # the frontend is behind: keep collecting (its streams' tokens merge)
        items = self.take()
        if not items:
            return
        if self.sock is None or self.sock_address != self.address:  # first send, or the frontend reconnected
            self.close(0)
            self.sock = self.ctx.socket(zmq.PUSH)
            self.sock.setsockopt(zmq.SNDHWM, 0)  # never drop or block: Hold/Resume bounds what is queued
            self.sock.setsockopt(zmq.LINGER, 2000)
            self.sock.connect(self.address)
            self.sock_address = self.address
        self.sock.send(wire.encode(wire.Events(items)))  # copied: small, and no zero-copy bookkeeping thread

    def close(self, linger: int = 2000) -> None:
        """Close the engine thread's socket: from that thread, or once it has ended."""
        if self.sock is not None:
            self.sock.close(linger)
            self.sock = None

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
        # The engine threads' PUSH sockets get a context (an I/O thread) of their own. Sharing the ROUTER's,
        # a reply from the main thread (Accepted) waited for the engine's next send in a quarter of the calls:
        # p90 3.4 ms from Submit to Accepted at the frontend against 0.54 ms apart (one stream, 2026-11-27).
        self.events_ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 1000)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a restarted frontend with the same id takes over
        self.sock.bind(address)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self.outboxes: dict[tuple[bytes, str], Outbox] = {}  # (frontend, model) -> its outbox
        self.events_at: dict[bytes, str] = {}  # frontend -> its PULL socket's address (from its Hello)
        self.every_box: list[Outbox] = []  # forgotten ones too: their sockets are closed at exit
        self.stopping: Optional[threading.Thread] = None

    # -- requests from a frontend ---------------------------------------------------------
    def _outbox(self, identity: bytes, model: str) -> Outbox:
        box = self.outboxes.get((identity, model))
        if box is None:
            box = self.outboxes[(identity, model)] = Outbox(identity, self.events_ctx, self.events_at.get(identity, ""),
                                                            self._wake_w)
            self.every_box.append(box)
        return box

    def _boxes(self, identity: bytes) -> list[Outbox]:
        return [box for (who, _), box in self.outboxes.items() if who == identity]

    def handle(self, identity: bytes, msg) -> None:
        if isinstance(msg, wire.Hello):
            self.events_at[identity] = msg.events
            for box in self._boxes(identity):
                box.held = False  # a frontend (re)connecting is not behind
                box.address = msg.events  # the engine thread reconnects on its next send
            self._send(identity, self.ready)
        elif isinstance(msg, (wire.Hold, wire.Resume)):
            # After Resume the engine thread sends at its step's end: every event still held belongs to
            # a running job (a job's end is urgent), so its next step comes.
            for box in self._boxes(identity):
                box.held = isinstance(msg, wire.Hold)
                if not box.held and not box.address:
                    self._send_events(box)
        elif isinstance(msg, wire.Submit):
            self._submit(identity, msg)
        elif isinstance(msg, wire.Cancel):
            for box in self._boxes(identity):
                for job_id in msg.ids:
                    job = box.jobs.get(job_id)
                    if job is not None:
                        job.cancel()
        elif isinstance(msg, wire.AskMetrics):
            self._send(identity, wire.MetricsText(msg.ticket, generate_latest(self.metrics.registry).decode()))
        elif isinstance(msg, wire.Forget):
            self.events_at.pop(msg.identity, None)
            for key in [key for key in self.outboxes if key[0] == msg.identity]:
                box = self.outboxes.pop(key)
                box.gone = True  # its engine thread drops what comes and closes the socket
                for job in list(box.jobs.values()):
                    job.cancel()  # dropped at the next step; its events go nowhere
        elif isinstance(msg, wire.Stop) and self.stopping is None:
            self.stopping = threading.Thread(target=self._stop, args=(msg.grace,), name="core-stop", daemon=True)
            self.stopping.start()

    def _submit(self, identity: bytes, msg: wire.Submit) -> None:
        model = self.models.get(msg.model)
        if model is None:
            self._send(identity, wire.Refused(msg.ticket, "NOT_FOUND", f"the core serves no model {msg.model}"))
            return
        box = self._outbox(identity, msg.model)
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
                if not box.address:  # the others are their engine threads' to send
                    self._send_events(box)
            if self.stopping is not None and not self.stopping.is_alive():
                for box in self.outboxes.values():
                    if not box.address:
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
    # The engine threads' sockets may be closed here once those threads have ended (a clean stop);
    # otherwise the process ends without waiting on them (the frontends fail what was in flight).
    if not any(model.loop.is_alive() for model in models.values()):
        for box in core.every_box:
            box.close()
        core.events_ctx.term()
        core.ctx.term()
    os._exit(status)  # engine threads are daemons; nothing else to wait for
