"""The engine core process: ONNX Runtime, the slot caches, the schedulers and the engine loops of
every model, behind one listening Unix socket (server/coreprocess/channel.py). No grpc, no protobuf,
no HTTP.

Why a process of its own (issue 22): in one process the frontend's per-message gRPC work and the
engine's per-step Python share one interpreter lock, and a native crash in a kernel takes every
caller's connection with it. Here the frontends (server/frontend/cores/link.py) keep the callers,
the protobuf, documents and detokenisation; the core keeps the model and the decode loop.

Threads: one engine loop per model (server/core/loop.py, unchanged), and this process's main thread,
which accepts the frontends' connections, reads their requests and answers them. Events go out from
the engine threads themselves: each (frontend, model) pair has an `Outbox` that the model's engine
thread fills during a step and sends once at its end, on that frontend's connection.

Measured problem (issue 35, py-spy over a core serving one stream): when the main thread sent the
events, every step cost a wake-up write on the engine thread, a poll return and a send on the main
thread and the interpreter lock passing between the two, about a third of the core's CPU at one
stream. Sending from the engine thread costs the send alone. The rule that decides what goes is the
same: one `Events` message per step with everything since the last, unless the frontend has said it
is behind (`Hold`, until `Resume`); meanwhile the outbox keeps collecting, and a stream's consecutive
tokens merge into one item: a frontend that falls behind gets fewer, fuller messages, an idle one each
token at once (coalescing by back-pressure), and a frontend that keeps up sends nothing back. A
job's events all come from its model's engine thread through one connection, so they arrive in order;
events posted off the engine thread (a job failed while the engine sleeps) are sent by the main thread,
under the same outbox lock, so they keep their order too.
"""
from __future__ import annotations

import logging
import os
import selectors
import signal
import threading
import time
from typing import Callable, Optional

import numpy as np
from prometheus_client import generate_latest

from models.core.bundle import discover
from server.core import relay
from server.config import ServerConfig
from server.coreprocess import protocol
from server.coreprocess.channel import Peer, listen
from server.frontend.cores.placement import measure_row_cost
from server.core.errors import ServiceError
from server.coreprocess.model_engine import ModelEngine
from server.observability.metrics import Metrics
from server.observability import logs
from server.core.request import EmbedJob, ErrorEvent, FinishEvent, Job, TokenEvent

log = logging.getLogger("server.coreprocess")
POLL_S = 0.1  # parent and watchdog checks between messages
EXIT_STUCK = 3  # the watchdog's exit status: the supervisor restarts the core
EXIT_WRITE_S = 2.0  # at exit, how long the last Events may take to go out to a frontend


def to_wire(job_id: int, event) -> protocol.Event:
    """An engine event (server/core/request.py) as the frontend's wire item."""
    if isinstance(event, TokenEvent):
        return protocol.Tokens(job_id, event.token_ids)
    if isinstance(event, FinishEvent):
        t = event.timing
        return protocol.Finished(job_id, [(list(map(int, h.tokens)), float(h.score), bool(h.finished_by_eos))
                                      for h in event.hypotheses],
                             event.reason.value, event.input_tokens,
                             (t.scheduled, t.first_token, t.finished, t.last_token))
    if isinstance(event, np.ndarray):  # an embedding
        return protocol.Embedded(job_id, np.ascontiguousarray(event, dtype=np.float32).tobytes())
    error = event.error if isinstance(event, ErrorEvent) else event
    code = error.code if isinstance(error, ServiceError) else "INTERNAL"
    return protocol.Failed(job_id, code, str(error))


class Outbox:
    """One frontend's events from one model's engine thread, collected during a step and sent at its end."""

    def __init__(self, peer: Peer, wake_main: Callable[[], None]) -> None:
        self.peer, self._wake_main = peer, wake_main  # wake_main: Core._wake, as the peer's
        self.lock = threading.Lock()
        self.items: list[protocol.Event] = []
        self.tokens_at: dict[int, int] = {}  # job id -> index of its pending Tokens item (merged into)
        self.held = False  # the frontend said it is behind (Hold) and has not said Resume yet
        self.gone = False  # the frontend died (its connection ended, or Forget): drop what comes
        self.main_due = False  # posted off the engine thread: the main thread sends it
        # A job's first tokens and its end go out at once, held or not: back-pressure merges the
        # tokens in between, never delays a stream's first token (TTFT) or a unary call's answer.
        self.urgent = False
        self.started: set[int] = set()  # jobs whose first tokens were sent
        self.jobs: dict[int, Job | EmbedJob] = {}  # its jobs in the core, until their terminal event

    def post(self, item: protocol.Event) -> None:
        with self.lock:
            if isinstance(item, protocol.Tokens):
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
        # main thread does.
        if not relay.defer_wake(self):
            self.main_due = True
            self._wake_main()

    def _wake(self) -> None:
        """The engine step's end (relay.flush, on the engine thread): send what the step collected."""
        self.flush()

    def flush(self, force: bool = False) -> None:
        """Send what was collected as one Events message, unless the frontend is behind (then only a
        first token or an end goes, or everything when `force`d); under the lock, so the engine thread
        and the main thread never send one outbox's events out of order."""
        with self.lock:
            if self.gone:
                self.items, self.tokens_at, self.urgent = [], {}, False
                return
            if not self.items or (self.held and not (self.urgent or force)):
                return  # nothing, or the frontend is behind: keep collecting (its streams' tokens merge)
            items = self._take()
            self.peer.send(protocol.encode(protocol.Events(items)))

    def take(self) -> list[protocol.Event]:
        with self.lock:
            return self._take()

    def _take(self) -> list[protocol.Event]:
        items, self.items, self.tokens_at, self.urgent = self.items, [], {}, False
        return items


class Core:
    def __init__(self, models: dict[str, ModelEngine], metrics: Metrics, address: str, parent: int,
                 watchdog_s: float, row_costs: Optional[dict[str, float]] = None):
        """`row_costs`: each model's measured cost per row and decode step (placement.py), said in Ready."""
        self.models, self.metrics, self.parent, self.watchdog_s = models, metrics, parent, watchdog_s
        costs = row_costs or {}
        self.ready = protocol.Ready([protocol.ModelFacts(m.name, m.provider, m.capacity, m.variant, costs.get(m.name, 0.0))
                                 for m in models.values()], os.getpid())
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self.listener = listen(address)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self._wake_r, selectors.EVENT_READ)
        self.peers: set[Peer] = set()
        self.writing: set[Peer] = set()  # peers whose socket the selector watches for room
        self.outboxes: dict[tuple[Peer, str], Outbox] = {}  # (frontend, model) -> its outbox
        self.stopping: Optional[threading.Thread] = None

    # -- requests from a frontend ---------------------------------------------------------
    def _outbox(self, peer: Peer, model: str) -> Outbox:
        box = self.outboxes.get((peer, model))
        if box is None:
            box = self.outboxes[(peer, model)] = Outbox(peer, self._wake)
        return box

    def _boxes(self, peer: Peer) -> list[Outbox]:
        return [box for (who, _), box in self.outboxes.items() if who is peer]

    def handle(self, peer: Peer, msg) -> None:
        if isinstance(msg, protocol.Hello):
            for other in [p for p in self.peers if p is not peer and msg.identity and p.identity == msg.identity]:
                self._drop(other)  # a frontend of that name connected again: the old connection is dead
            peer.identity = msg.identity
            self._send(peer, self.ready)
        elif isinstance(msg, (protocol.Hold, protocol.Resume)):
            # After Resume the engine thread sends at its step's end: every event still held belongs to
            # a running job (a job's end is urgent), so its next step comes.
            for box in self._boxes(peer):
                box.held = isinstance(msg, protocol.Hold)
        elif isinstance(msg, protocol.Submit):
            self._submit(peer, msg)
        elif isinstance(msg, protocol.Cancel):
            for box in self._boxes(peer):
                for job_id in msg.ids:
                    job = box.jobs.get(job_id)
                    if job is not None:
                        job.cancel()
        elif isinstance(msg, protocol.AskMetrics):
            self._send(peer, protocol.MetricsText(msg.ticket, generate_latest(self.metrics.registry).decode()))
        elif isinstance(msg, protocol.Forget):
            for other in [p for p in self.peers if p.identity == msg.identity]:
                self._drop(other)
        elif isinstance(msg, protocol.Stop) and self.stopping is None:
            self.stopping = threading.Thread(target=self._stop, args=(msg.grace,), name="core-stop", daemon=True)
            self.stopping.start()

    def _submit(self, peer: Peer, msg: protocol.Submit) -> None:
        model = self.models.get(msg.model)
        if model is None:
            self._send(peer, protocol.Refused(msg.ticket, "NOT_FOUND", f"the core serves no model {msg.model}"))
            return
        box = self._outbox(peer, msg.model)
        jobs = [self._job(box, spec) for spec in msg.jobs]
        try:
            model.scheduler.submit(jobs)
        except ServiceError as e:
            for job in jobs:
                box.jobs.pop(job.id, None)
            self._send(peer, protocol.Refused(msg.ticket, e.code, str(e)))
            return
        self._send(peer, protocol.Accepted(msg.ticket))

    @staticmethod
    def _job(box: Outbox, spec: protocol.JobSpec) -> Job | EmbedJob:
        job_id, post = spec.id, box.post

        def sink(event) -> None:
            post(to_wire(job_id, event))
        if spec.kind == "embed":
            job = EmbedJob(spec.model, spec.src_ids, sink, spec.deadline, id=job_id)
        else:
            job = Job(spec.model, spec.src_ids, protocol.params_in(spec.params), spec.max_len, sink, spec.deadline,
                      id=job_id, scores=spec.scores, stream=spec.stream, forced=tuple(spec.forced),
                      prefix=tuple(spec.prefix), terms=spec.terms, background=spec.background)
        job.timing.arrival = spec.arrival
        box.jobs[job_id] = job
        return job

    @staticmethod
    def _send(peer: Peer, msg) -> None:
        peer.send(protocol.encode(msg))

    # -- connections ------------------------------------------------------------------------
    def _wake(self) -> None:
        os.write(self._wake_w, b"x")

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except BlockingIOError:
                return
            peer = Peer(sock, self._wake)
            self.peers.add(peer)
            self.selector.register(sock, selectors.EVENT_READ, peer)

    def _read(self, peer: Peer) -> None:
        payloads = peer.receive()
        if payloads is None:  # the frontend closed its end (exited, or was killed)
            self._drop(peer)
            return
        for payload in payloads:
            try:
                self.handle(peer, protocol.to_core(payload))
            except Exception:  # noqa: BLE001 (a malformed frame must not stop the core)
                log.exception("bad message from a frontend")

    def _drop(self, peer: Peer) -> None:
        """A frontend is gone: its jobs are cancelled (dropped at the next step), their events go nowhere."""
        if peer not in self.peers:
            return
        self.peers.discard(peer)
        self.writing.discard(peer)
        self.selector.unregister(peer.sock)
        peer.close()
        for key in [key for key in self.outboxes if key[0] is peer]:
            box = self.outboxes.pop(key)
            box.gone = True
            for job in list(box.jobs.values()):
                job.cancel()

    def _watch_room(self) -> None:
        """Watch for room on the sockets where a send left bytes waiting; stop once they have gone."""
        for peer in self.peers:
            if peer.pending and peer not in self.writing:
                self.writing.add(peer)
                self.selector.modify(peer.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, peer)

    # -- the main thread ----------------------------------------------------------------------
    def run(self) -> int:
        while True:
            for key, mask in self.selector.select(POLL_S):
                peer = key.data
                if peer is None:
                    if key.fileobj is self.listener:
                        self._accept()
                    else:
                        try:
                            os.read(self._wake_r, 65536)
                        except BlockingIOError:
                            pass
                    continue
                if mask & selectors.EVENT_WRITE and peer in self.writing and peer.write_pending():
                    self.writing.discard(peer)
                    self.selector.modify(peer.sock, selectors.EVENT_READ, peer)
                if mask & selectors.EVENT_READ:
                    self._read(peer)
            for box in list(self.outboxes.values()):
                if box.main_due:  # posted off the engine thread (the others are the engine threads' to send)
                    box.main_due = False
                    box.flush()
            self._watch_room()
            if self.stopping is not None and not self.stopping.is_alive():
                for box in self.outboxes.values():
                    box.flush(force=True)
                return 0
            status = self._check()
            if status is not None:
                return status

    def close(self) -> None:
        """Write out what waits for each frontend (the last Events, up to EXIT_WRITE_S) and close."""
        for peer in list(self.peers):
            peer.close(wait=EXIT_WRITE_S)
        self.listener.close()

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


def pieces_here(bundle) -> tuple[str, ...]:
    """A model's vocabulary pieces from its own tokenizer, for a core started without its frontend's."""
    from models.core.bundle_tokenizer import load_tokenizer
    from server.core.terms import pieces_of
    return pieces_of(load_tokenizer(bundle.tokenizer_entry, bundle.path), bundle.spec.out_vocab_size)


def main(cfg: ServerConfig, address: str, parent: int, pieces: Optional[dict[str, tuple[str, ...]]] = None,
         measure: bool = True) -> None:
    """The core process's entry point (multiprocessing, spawn): load, warm up, measure each model's row cost
    (unless `measure` is off: the background replica, which placement never chooses by it), say Ready, serve.
    A model with `pieces` (its frontend's) loads no tokenizer here (ModelEngine: server/coreprocess/model_engine.py)."""
    # The primary frontend decides when to stop (the Stop message, after its own drain has begun): a
    # signal to the whole process group (Ctrl-C, systemd's control-group kill) must not end the core
    # under its callers. A frontend that is gone ends it too (Core._check).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    logs.configure(cfg.log_format, cfg.log_level)
    metrics = Metrics()
    models, row_costs = {}, {}
    for bundle in discover(cfg.model_repository):
        model = ModelEngine(bundle, cfg, metrics, (pieces or {}).get(bundle.name) or pieces_here(bundle))
        model.start()
        models[bundle.name] = model
        if cfg.warmup and measure:  # measured warm only: unmeasured, a model counts as 0 and is packed
            row_costs[bundle.name] = measure_row_cost(model)
    core = Core(models, metrics, address, parent, cfg.watchdog_s, row_costs)
    log.info("engine core ready", extra={"event": "engine_core_ready", "pid": os.getpid(), "models": sorted(models),
                                             "intra_op_threads": cfg.engine_threads or "default",
                                             "row_cost_ms": {k: round(v * 1000, 3) for k, v in row_costs.items()}})
    try:
        status = core.run()
    except Exception:  # noqa: BLE001
        log.exception("engine core failed")
        status = 1
    core.close()  # the last Events go out before the process does
    os._exit(status)  # engine threads are daemons; nothing else to wait for
