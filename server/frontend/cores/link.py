"""A frontend's side of the engine core: queue jobs, cancel them, deliver their events.

Runs on the frontend's asyncio loop, over one connection to the core (server/coreprocess/channel.py:
every message wakes only the thread that reads it). A job submitted here keeps its sink and its
frontend-side `Job` object; the core gets a `JobSpec` and answers `Accepted` or `Refused` (queue
full, shutting down: the same ServiceError kinds as the in-process scheduler raises, so admission and
the status mapping do not know which side ran it). The core's engine threads write each step's
`Events` to the same connection, so a job's events arrive in order.

Each `Events` message is delivered in one go (every sink of a stream posts to the loop's relay,
one wake-up for the lot). If it finds this loop's streams still holding the previous message's events,
`Hold` tells the core to collect until `Resume`, sent once they have taken them (or after MAX_HOLD_S):
while this loop is busy the core merges what piles up, so a loaded frontend gets fewer, fuller
messages, and a frontend that keeps up sends nothing back. (Measured problem: acknowledging every
message, the scheme before this one, was 58 of the 255 µs of frontend CPU per token at one stream,
docs/serving_speed.md.)

If the core dies, `lost()` fails every job in flight with UNAVAILABLE (retryable: nothing is
silently dropped) and refuses new work until the supervisor has a new core Ready.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from typing import Optional

import numpy as np

from server.coreprocess import protocol
from server.coreprocess.channel import FrameProtocol
from server.core.errors import ServiceError, Unavailable
from server.core.relay import Outflow, outflow_for
from server.core.request import EmbedJob, FinishEvent, FinishReason, Hypothesis, Job, TokenEvent

log = logging.getLogger("server.coreprocess")
# The longest the core's next Events waits for this loop's stream backlog to clear (a loop that stays
# busy must not hold back every stream's tokens for long).
MAX_HOLD_S = 0.05
# How often connect() tries again while the core is not listening yet (it listens once its models are warm).
CONNECT_RETRY_S = 0.02


def error_of(code: str, message: str) -> ServiceError:
    """A core's error code back as the ServiceError kind that carries it (server/core/errors.py)."""
    kind = next((k for k in ServiceError.__subclasses__() if k.code == code), ServiceError)
    return kind(message)


class CoreLink:
    def __init__(self, address: str):
        self.address = address  # the core's listening socket (a path)
        self.outflow: Optional[Outflow] = None  # the loop's stream backlog (set by connect)
        self.holding = False  # the core was told Hold and not yet Resume
        self.row_costs: dict[str, float] = {}  # model -> its cost per row and decode step, from the core's Ready
        self.channel: Optional[FrameProtocol] = None  # the connection to the core, once made
        self.jobs: dict[int, Job | EmbedJob] = {}  # in the core, until their terminal event
        # Tallies of `jobs` kept as they change: the replicas read them for every call (replicas.py pick).
        self.source_tokens = 0
        self.background_jobs = 0
        self.waiting: dict[int, asyncio.Future] = {}  # submit / metrics tickets awaiting an answer
        self.submitting: dict[int, list] = {}  # ticket -> its jobs, until Accepted or Refused
        self._tickets = itertools.count(1)
        self._last_metrics = ""
        self.ready: Optional[asyncio.Future] = None
        self.up = False  # a core is Ready and has not been lost since

    # -- connection ------------------------------------------------------------------------
    async def connect(self) -> protocol.Ready:
        """(Re)connect to the core at `address` and wait for its Ready. The core listens once its models are
        warm (a restarted one at the same path): until then the connection is refused, and tried again."""
        self._close_channel()
        self._loop, self._loop_thread = asyncio.get_running_loop(), threading.get_ident()
        self.outflow = outflow_for(self._loop)
        self.holding = False  # a new core (or connection) starts sending at once
        self.ready = self._loop.create_future()
        while True:
            try:
                _, channel = await self._loop.create_unix_connection(
                    lambda: FrameProtocol(self._on_message, self._on_lost), self.address)
                break
            except (FileNotFoundError, ConnectionRefusedError):
                await asyncio.sleep(CONNECT_RETRY_S)
        self.channel = channel
        channel.send(protocol.encode(protocol.Hello(identity(os.getpid()))))
        ready = await self.ready
        self.row_costs = {facts.name: facts.row_cost_s for facts in ready.models}
        self.up = True
        return ready

    def _on_lost(self, exc: Optional[Exception]) -> None:
        """The connection ended: the core is exiting (its data came first, so every Events it wrote has been
        delivered). Nothing more can be sent, and the replicas choose another one from now on; the
        supervisor fails what was in it once the process has gone (`lost`)."""
        self.channel = None
        self.up = False

    def _send(self, msg) -> None:
        if self.channel is None:
            raise Unavailable("the engine core is restarting; retry")
        self.channel.send(protocol.encode(msg))

    def _close_channel(self) -> None:
        channel, self.channel = self.channel, None
        if channel is not None and channel.transport is not None:
            channel.on_message = channel.on_lost = _ignore  # a closed connection's last frames go nowhere
            channel.transport.abort()

    def lost(self, error: Exception) -> int:
        """The core is gone: fail every job and ticket in flight with `error`; returns the jobs failed."""
        self.up = False
        self._close_channel()
        for pending in self.submitting.values():  # their submit() raises `error`: no event for them too
            for job in pending:
                self._release(job.id)
        jobs, self.jobs = list(self.jobs.values()), {}
        self.source_tokens = self.background_jobs = 0
        for job in jobs:
            job.answered = True
            job.sink(job.failure(error))
        waiting, self.waiting = list(self.waiting.values()), {}
        for future in waiting:
            if not future.done():
                future.set_exception(error)
        if self.ready is not None and not self.ready.done():
            self.ready.set_exception(error)
        return len(jobs)

    def close(self) -> None:
        self._close_channel()

    # -- requests --------------------------------------------------------------------------
    async def submit(self, model: str, jobs: list[Job | EmbedJob]) -> None:
        """Queue `jobs` in the core, all or none; raises the core's ServiceError if it refuses them."""
        if not self.up:
            raise Unavailable("the engine core is restarting; retry")
        specs = [self._spec(job) for job in jobs]
        ticket = next(self._tickets)
        future = self.waiting[ticket] = asyncio.get_running_loop().create_future()
        # Registered before the answer: the core's first Events for them may be read before this
        # coroutine resumes after Accepted.
        for job in jobs:
            self._track(job)
            job.on_cancel = self._cancel
        self.submitting[ticket] = jobs
        try:
            self._send(protocol.Submit(ticket, model, specs))
            await future
        except BaseException:
            for job in jobs:
                self._release(job.id)
            raise
        finally:
            self.submitting.pop(ticket, None)

    def _track(self, job: Job | EmbedJob) -> None:
        self.jobs[job.id] = job
        self.source_tokens += len(job.src_ids)
        self.background_jobs += job.background

    def _release(self, job_id: int) -> Optional[Job | EmbedJob]:
        job = self.jobs.pop(job_id, None)
        if job is not None:
            self.source_tokens -= len(job.src_ids)
            self.background_jobs -= job.background
        return job

    @staticmethod
    def _spec(job: Job | EmbedJob) -> protocol.JobSpec:
        if isinstance(job, EmbedJob):
            return protocol.JobSpec(job.id, "embed", job.model, job.src_ids, job.timing.arrival, job.deadline)
        return protocol.JobSpec(job.id, "translate", job.model, job.src_ids, job.timing.arrival, job.deadline,
                            protocol.params_out(job.params), job.max_len, job.scores, job.stream, job.forced, job.prefix,
                            job.terms, job.background)

    def _cancel(self, job: Job | EmbedJob) -> None:
        if threading.get_ident() != self._loop_thread:  # the socket is the loop's alone
            self._loop.call_soon_threadsafe(self._cancel, job)
            return
        if self.up and job.id in self.jobs and self.channel is not None:
            self._send(protocol.Cancel([job.id]))

    async def metrics_text(self, timeout: float = 1.0) -> str:
        """The core registry's exposition. A core that does not answer within `timeout` (busy in a long
        step, stopped) gets its previous answer served again: a scrape must not hang on the core,
        and stale counters read better than vanished ones ('' before the first answer)."""
        if not self.up:
            return self._last_metrics
        ticket = next(self._tickets)
        future = self.waiting[ticket] = asyncio.get_running_loop().create_future()
        try:
            self._send(protocol.AskMetrics(ticket))
            self._last_metrics = await asyncio.wait_for(future, timeout)
        except (asyncio.TimeoutError, Unavailable):
            self.waiting.pop(ticket, None)
        return self._last_metrics

    async def forget(self, frontend: bytes) -> None:
        """Tell the core that the frontend with this identity died: its jobs are cancelled. (The core sees
        its connection end as well; this says it whichever the core hears first.)"""
        if self.up and self.channel is not None:
            self._send(protocol.Forget(frontend))

    async def stop(self, grace: float) -> None:
        """Ask the core to drain (refuse new work, finish within `grace`, fail the rest) and exit."""
        if self.up and self.channel is not None:
            self._send(protocol.Stop(grace))

    # -- answers -----------------------------------------------------------------------------
    def _on_message(self, payload: bytes) -> None:
        """One frame from the core (FrameProtocol calls this for every frame of a read, in order)."""
        msg = protocol.to_frontend(payload)
        if isinstance(msg, protocol.Events):
            if self.outflow.pending and not self.holding:  # the last message's events are still waiting
                self._hold()
            self._deliver(msg.items)
        elif isinstance(msg, protocol.Ready):
            if self.ready is not None and not self.ready.done():
                self.ready.set_result(msg)
        else:
            future = self.waiting.pop(msg.ticket, None)
            if future is None or future.done():
                return
            if isinstance(msg, protocol.Refused):
                future.set_exception(error_of(msg.code, msg.message))
            else:
                future.set_result(msg.text if isinstance(msg, protocol.MetricsText) else None)

    def _hold(self) -> None:
        """Tell the core to collect; Resume once this loop's streams have taken what they were given (the
        relay's drain and the streams run first), or after MAX_HOLD_S at the latest."""
        channel = self.channel  # the core's main thread reads Hold and Resume
        self.holding = True
        channel.send(protocol.encode(protocol.Hold()))
        resumed = []

        def resume() -> None:
            if not resumed and channel is self.channel:
                resumed.append(True)
                self.holding = False
                channel.send(protocol.encode(protocol.Resume()))
        loop = asyncio.get_running_loop()
        loop.call_later(MAX_HOLD_S, resume)
        loop.call_soon(self.outflow.when_empty, resume)

    def _deliver(self, items: list[protocol.Event]) -> None:
        jobs = self.jobs
        for item in items:
            if isinstance(item, protocol.Tokens):
                job = jobs.get(item.id)
                if job is not None:
                    job.sink(TokenEvent(item.token_ids))
                continue
            job = self._release(item.id)
            if job is None:  # failed here already (core lost) or unknown
                continue
            job.answered = True
            if isinstance(item, protocol.Finished):
                t = job.timing
                t.scheduled, t.first_token, t.finished, t.last_token = item.timing
                hyps = [Hypothesis(tokens, score, eos) for tokens, score, eos in item.hypotheses]
                job.sink(FinishEvent(hyps, FinishReason(item.reason), item.input_tokens, t))
            elif isinstance(item, protocol.Embedded):
                job.timing.finished = time.monotonic()
                job.sink(np.frombuffer(item.vector, dtype=np.float32))
            else:
                error = error_of(item.code, item.message)
                job.sink(job.failure(error))


def identity(pid: int) -> bytes:
    """A frontend's routing id at the core."""
    return f"frontend-{pid}".encode()


def socket_address(directory: str) -> str:
    """Where a core started for this server directory listens."""
    return os.path.join(directory, "core.sock")


def _ignore(*_) -> None:
    pass
