"""The engine loop: one thread per model runs schedule -> execute -> update forever.

The gRPC side only submits jobs and reads their sinks; this thread alone
touches the engine, the slot cache and the running state, so none of them
needs a lock.
"""
from __future__ import annotations

import logging
import threading
import time

from server.core import relay
from server.core.engine import Engine
from server.core.errors import Internal, Unavailable
from server.core.scheduler import Scheduler

log = logging.getLogger(__name__)
# A visit of several steps lasts about this long (steps_per_visit): a stream's tokens still go out at least
# this often, and a step as long as this (the shipped model on a CPU at a full batch) is a visit of its own,
# as before; where a step is short (a few rows, a device, a small model) the host's work per step is what
# decides, and several steps share it.
VISIT_S = 0.005


class EngineLoop(threading.Thread):
    def __init__(self, scheduler: Scheduler, engine: Engine, max_queue_delay: float = 0.002, visit_steps: int = 1):
        super().__init__(name=f"engine-{engine.name}", daemon=True)
        self.scheduler, self.engine = scheduler, engine
        self.max_queue_delay = max_queue_delay
        self.visit_steps = visit_steps  # most decode steps per visit (steps_per_visit)
        self.stopping = threading.Event()
        self.aborting = threading.Event()
        # Last time the loop went round (idle waits included): the watchdog's evidence of progress.
        self.heartbeat = time.monotonic()

    def run(self) -> None:
        relay.hold_wakeups()  # this thread's events reach the asyncio side once per step
        try:
            self._run()
        finally:
            relay.flush()

    def _run(self) -> None:
        sched = self.scheduler
        while not (self.stopping.is_set() and sched.idle):
            self.heartbeat = time.monotonic()
            if self.aborting.is_set():
                sched.abort_all(Unavailable("the server shut down before this request finished"))
                break
            if sched.idle:
                self.engine.give_back_idle(time.monotonic())  # an idle engine holds no burst's memory
                sched.wait_for_work(0.05)
                continue
            now = time.monotonic()
            # Dynamic batching: with nothing running, give a lone arrival a moment for company.
            if not sched.running and sched.oldest_wait(now) < self.max_queue_delay \
                    and len(sched.waiting) < sched.max_encode_batch:
                time.sleep(self.max_queue_delay / 4)
                continue
            try:
                if not self.iteration(now):  # work waits but none could start: sleep, never spin
                    sched.wait_for_work(0.05, stalled=True)
            except Exception as e:  # noqa: BLE001 (an engine bug must not kill the loop)
                log.exception("engine step failed; failing the running requests")
                sched.fail_running(Internal(f"internal engine error: {e}"))
            finally:
                relay.flush()
            self.engine.trim_heap(now)  # what a busy engine frees goes back every few seconds, not only when idle

    def iteration(self, now: float) -> bool:
        """One schedule -> execute -> update round; False if there was nothing to run."""
        sched, engine = self.scheduler, self.engine
        scheduled = sched.schedule(now)
        self.admit(scheduled)
        if not engine.cache.used:
            return bool(scheduled.encode or scheduled.embed)
        # A step that raises here (the decoder itself) fails the rows in it (the caller's except); token
        # choice and each request's update contain their own failures to the rows concerned.
        controls = sched.controls()
        steps = self.steps_per_visit(scheduled, controls)
        if steps == 1:
            sched.update(engine.decode_step(controls), time.monotonic())
        else:
            sched.update_visit(engine.decode_visit(steps, sched.remaining(), self.end_visit), time.monotonic())
        return True

    def steps_per_visit(self, scheduled, controls) -> int:
        """Decode steps this visit (issue 58): several only when every row is plain greedy (controls None) on
        the in-place step, as many as fit in VISIT_S at the recent step time, up to --visit-steps. One in the
        iteration that admitted rows (their first token goes out at its end, at once) and while waiting work
        could take a free slot now (it starts at the next iteration)."""
        if self.visit_steps == 1 or controls is not None or self.engine.inplace is None or scheduled.encode:
            return 1
        if self.scheduler.waiting and self.engine.cache.free:
            return 1
        step = self.engine.step_seconds
        return self.visit_steps if step <= 0 else max(1, min(self.visit_steps, int(VISIT_S / step)))

    def end_visit(self, row_ended: bool) -> bool:
        """After each step of a visit: end it at the step a row ends (its answer goes out then, and its slot
        is free for the next iteration, as one step at a time would have it; a caller waiting for that answer
        would otherwise wait up to k - 1 steps more), or when waiting work could take a free slot."""
        return row_ended or (bool(self.scheduler.waiting) and self.engine.cache.free > 0)

    def admit(self, scheduled) -> None:
        """Encode the admitted jobs into fresh slots, embed the embedding jobs. A failure costs only
        these jobs: the rows already running took no part in the pass and decode on."""
        sched, engine = self.scheduler, self.engine
        try:
            if scheduled.encode:
                for job, rows in zip(scheduled.encode, engine.encode(scheduled.encode)):
                    sched.start(job, rows)
            if scheduled.embed:
                vectors = engine.embed(scheduled.embed)
                for job, vec in zip(scheduled.embed, vectors):
                    job.timing.finished = time.monotonic()
                    job.sink(vec)
                relay.flush()  # embeddings are done: do not hold them for the decode step
        except Exception as e:  # noqa: BLE001
            # Admitted jobs are neither queued nor running until started: answer them here, or nobody will.
            ids = [job.id for job in scheduled.encode + scheduled.embed]
            log.exception("encoder pass failed; failing the %d jobs admitted with it (%s)", len(ids), ids[:16])
            sched.fail_unstarted(scheduled.encode + scheduled.embed, Internal(f"internal engine error: {e}"))

    def stop(self, grace: float) -> None:
        """Refuse new work, let running and queued work finish for `grace` seconds, then fail the rest."""
        self.scheduler.close()
        self.stopping.set()
        self.join(grace)
        if self.is_alive():
            self.aborting.set()  # the loop thread fails what is left; only it touches that state
            self.join(5.0)
