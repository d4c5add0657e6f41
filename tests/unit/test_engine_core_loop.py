"""The engine loop as a thread, its failure and shutdown paths, and the relay into asyncio, against the
scripted runtime of tests/unit/test_engine_core_scripted.py.

No sleeps race the loop: a test waits for an event the loop thread sets (a job's terminal event, a
scripted failure), or joins the thread (`EngineLoop.stop`), and then reads the final state. The
abort path is made deterministic by a decode step that holds until the loop's own `aborting` flag is
raised, which `stop()` raises exactly when the grace period is over.

The encoder-failure, fail_everything and drain tests found bugs in the engine core (fixed with them,
2026-11-25): jobs admitted in an iteration whose encoder pass failed were never answered and the rows
of earlier length groups leaked (each later step then decoded an orphan row until the cache overflowed
and every request failed INTERNAL); a job fail_everything answered was answered again when the loop
dropped it; a closed queue made a draining loop with unadmittable work spin.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from server.core.errors import Cancelled, DeadlineExceeded, Internal, Unavailable
from server.core.relay import EventRelay, relay_for
from server.core.request import EmbedJob, ErrorEvent, FinishEvent, FinishReason, TokenEvent
from tests.unit.test_engine_core_scripted import Bench, ScriptedRuntime

pytestmark = pytest.mark.unit
WAIT = 10.0  # generous: a healthy wait takes milliseconds


def settled(bench: Bench, job) -> threading.Event:
    """An Event set when `job` gets its terminal event (its sink still records every event)."""
    done = threading.Event()
    box = bench.events[job.id]

    def sink(event):
        box.append(event)
        if isinstance(event, (FinishEvent, ErrorEvent)):
            done.set()
    job.sink = sink
    return done


def counting_schedule(bench: Bench) -> list[int]:
    calls = [0]
    real = bench.sched.schedule

    def schedule(now):
        calls[0] += 1
        return real(now)
    bench.sched.schedule = schedule
    return calls


# -- failures ----------------------------------------------------------------------------------------
def test_a_decoder_failure_fails_the_running_texts_and_the_loop_serves_on():
    bench = Bench()
    bench.rt.fail_decode = {3}
    first, second = bench.job(range(10, 20)), bench.job((30, 31, 32, 33), beam_size=2)
    waits = [settled(bench, first), settled(bench, second)]
    bench.submit(first, second)
    bench.loop.start()
    try:
        assert all(w.wait(WAIT) for w in waits)
        assert isinstance(bench.end(first), Internal) and isinstance(bench.end(second), Internal)
        assert "scripted decoder failure" in str(bench.end(first))
        later = bench.job((40, 41))
        done = settled(bench, later)
        bench.submit(later)
        assert done.wait(WAIT) and bench.tokens(later) == [40, 41]
    finally:
        bench.loop.stop(WAIT)
    assert bench.cache.used == 0 and not bench.loop.is_alive()


@pytest.mark.parametrize("kind", ["translate", "embed"])
def test_an_encoder_failure_answers_every_admitted_text_and_frees_its_slots(kind):
    bench = Bench()
    if kind == "translate":  # two length groups: the first is encoded and allocated, the second fails
        bench.rt.fail_encode = {2}
        jobs = [bench.job((10, 11)), bench.job(range(10, 30))]
    else:
        bench.rt.fail_encode = {1}
        jobs = [EmbedJob("m", [10, 11], None)]
        bench.events[jobs[0].id] = box = []
        jobs[0].sink = box.append
    bench.submit(*jobs)
    bench.loop.start()
    assert bench.rt.raised.wait(WAIT)
    bench.loop.stop(WAIT)  # drains: returns once the loop has handled the failure and gone idle
    got = [bench.events[j.id] for j in jobs]
    assert bench.cache.used == 0, f"{bench.cache.used} slot(s) held by rows of no request"
    assert all(len(events) == 1 and isinstance(getattr(events[0], "error", events[0]), Internal)
               for events in got), got


def test_after_an_encoder_failure_later_requests_still_succeed():
    bench = Bench(max_target=40, max_encode_batch=2)
    bench.rt.fail_encode = {2}
    witness = bench.job((60,))  # queued behind the failing admission: answered once the failure is handled
    handled = settled(bench, witness)
    bench.submit(bench.job((10, 11)), bench.job(range(10, 30)), witness)
    bench.loop.start()
    try:
        assert handled.wait(WAIT)
        for n in range(4):  # 4 x 16 steps: past the 40 positions a leaked row has
            job = bench.job(range(40 + n, 55 + n))
            done = settled(bench, job)
            bench.submit(job)
            assert done.wait(WAIT)
            assert isinstance(bench.end(job), FinishEvent), f"request {n}: {bench.end(job)!r}"
    finally:
        bench.loop.stop(WAIT)


def test_fail_everything_answers_each_job_once_and_the_loop_then_frees_its_slot():
    bench = Bench()
    job = bench.submit(bench.job(range(10, 30)))
    bench.step()
    assert bench.sched.fail_everything(Unavailable("engine stuck")) == 1
    bench.step()  # the stuck loop wakes up
    assert bench.cache.used == 0 and bench.sched.idle
    assert isinstance(bench.end(job), Unavailable)


# -- waiting, stalling, draining, aborting -----------------------------------------------------------
def test_a_lone_arrival_waits_the_queue_delay_and_a_full_batch_does_not():
    bench = Bench(max_queue_delay=0.05, max_encode_batch=2)
    lone = bench.job((10, 11))
    done = settled(bench, lone)
    bench.loop.start()
    try:
        bench.submit(lone)
        assert done.wait(WAIT) and bench.tokens(lone) == [10, 11]
        t = bench.end(lone).timing
        assert t.scheduled - t.arrival >= 0.05  # held back for company, never less
        pair = bench.job((20,)), bench.job((21,))
        waits = [settled(bench, j) for j in pair]
        bench.submit(*pair)  # the batch is full at once: encoded together
        assert all(w.wait(WAIT) for w in waits)
        assert bench.rt.encoded[-1] == [(20,), (21,)]
    finally:
        bench.loop.stop(WAIT)


def test_work_that_cannot_be_admitted_waits_without_spinning_until_its_deadline():
    bench = Bench(slots=2)
    calls = counting_schedule(bench)
    job = bench.job((10, 11), beam_size=4, deadline=time.monotonic() + 0.15)  # 4 rows, 2 slots: never fits
    done = settled(bench, job)
    bench.submit(job)
    bench.loop.start()
    try:
        assert done.wait(WAIT) and isinstance(bench.end(job), DeadlineExceeded)
        assert calls[0] < 20  # ~50 ms per stalled wait; a spinning loop goes round thousands of times
    finally:
        bench.loop.stop(WAIT)


def test_a_drain_with_unadmittable_work_does_not_spin():
    bench = Bench(slots=2)
    calls = counting_schedule(bench)
    job = bench.job((10, 11), beam_size=4)
    done = settled(bench, job)
    bench.submit(job)
    bench.loop.start()
    bench.loop.stop(0.15)
    assert done.wait(WAIT) and isinstance(bench.end(job), Unavailable)
    assert calls[0] < 20, f"{calls[0]} schedule() calls"


def test_stop_drains_running_and_queued_work_then_refuses_new_work():
    bench = Bench(slots=1)
    jobs = bench.submit(bench.job((10, 11, 12)), bench.job((20, 21)), bench.job((30,), beam_size=1))
    bench.loop.start()
    bench.loop.stop(WAIT)
    assert not bench.loop.is_alive()
    assert [bench.tokens(j) for j in jobs] == [[10, 11, 12], [20, 21], [30]]
    with pytest.raises(Unavailable):
        bench.submit(bench.job((40,)))


class HeldRuntime(ScriptedRuntime):
    """Its decode step holds (once `hold` is set) until `release` is set."""

    def __init__(self):
        super().__init__()
        self.hold, self.entered, self.release = threading.Event(), threading.Event(), threading.Event()

    def decode_step(self, *args, **kwargs):
        if self.hold.is_set():
            self.entered.set()
            assert self.release.wait(WAIT)
        return super().decode_step(*args, **kwargs)


def test_stop_after_the_grace_period_fails_what_is_left_unavailable():
    bench = Bench(HeldRuntime(), slots=1)
    bench.rt.release = bench.loop.aborting  # the held step ends exactly when stop() gives up waiting
    running, queued = bench.job(range(10, 30)), bench.job((40,))
    waits = [settled(bench, running), settled(bench, queued)]
    bench.rt.hold.set()
    bench.submit(running, queued)
    bench.loop.start()
    assert bench.rt.entered.wait(WAIT)
    bench.loop.stop(0.0)
    assert not bench.loop.is_alive() and all(w.is_set() for w in waits)
    assert isinstance(bench.end(running), Unavailable) and isinstance(bench.end(queued), Unavailable)
    assert bench.cache.used == 0 and bench.sched.idle and bench.rt.rows == [1]


def test_a_cancel_from_another_thread_frees_the_slot_at_the_next_step():
    bench = Bench(HeldRuntime(), slots=1)
    job, after = bench.job(range(10, 30)), bench.job((50, 51))
    waits = [settled(bench, job), settled(bench, after)]
    bench.rt.hold.set()
    bench.submit(job, after)
    bench.loop.start()
    try:
        assert bench.rt.entered.wait(WAIT)  # the loop is inside step 1
        job.cancel()
        bench.rt.hold.clear()
        bench.rt.release.set()
        assert all(w.wait(WAIT) for w in waits)
        assert isinstance(bench.end(job), Cancelled) and bench.tokens(after) == [50, 51]
        # The held step, then the waiting text's three (50, 51, EOS): the cancelled row took no other.
        assert bench.rt.rows == [1, 1, 1, 1] and bench.rt.encoded == [[tuple(range(10, 30))], [(50, 51)]]
    finally:
        bench.loop.stop(WAIT)


# -- the relay ---------------------------------------------------------------------------------------
def test_a_stream_reaches_the_event_loop_in_order_with_at_most_one_wakeup_per_step():
    bench = Bench()
    src = list(range(10, 22))

    async def main():
        relay = relay_for(asyncio.get_running_loop())
        queue: asyncio.Queue = asyncio.Queue()
        job = bench.job(src, stream=True)
        job.sink = relay.sink(queue.put_nowait)
        bench.submit(job)
        bench.loop.start()
        events = []
        while not events or isinstance(events[-1], TokenEvent):
            events.append(await asyncio.wait_for(queue.get(), WAIT))
        return events, relay.wakeups
    try:
        events, wakeups = asyncio.run(main())
    finally:
        bench.loop.stop(WAIT)
    assert sum((e.token_ids for e in events[:-1]), []) == src
    assert isinstance(events[-1], FinishEvent) and events[-1].reason == FinishReason.EOS
    assert 1 <= wakeups <= len(bench.rt.rows)  # one decode step: one wake-up at most


def test_one_failing_consumer_does_not_starve_the_others(caplog):
    async def main():
        relay = EventRelay(asyncio.get_running_loop())
        got, arrived = [], asyncio.Event()

        def broken(value):
            raise ValueError("consumer bug")

        def fine(value):
            got.append(value)
            arrived.set()
        poster = threading.Thread(target=lambda: (relay.post(broken, 1), relay.post(fine, 2)))
        poster.start()
        poster.join()
        await asyncio.wait_for(arrived.wait(), WAIT)
        return got
    with caplog.at_level(logging.ERROR, logger="server.core.relay"):
        assert asyncio.run(main()) == [2]
    assert "event delivery failed" in caplog.text


def test_posting_to_a_closed_loop_drops_the_events_and_a_later_post_tries_again():
    loop = asyncio.new_event_loop()
    relay = EventRelay(loop)
    loop.close()
    delivered = []
    poster = threading.Thread(target=lambda: (relay.post(delivered.append, 1), relay.post(delivered.append, 2)))
    poster.start()
    poster.join()
    assert relay.wakeups == 2 and delivered == []  # the first failed wake-up did not leave it "scheduled"


def test_relay_for_gives_one_relay_per_loop_and_forgets_closed_loops():
    first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        relay = relay_for(first)
        assert relay_for(first) is relay and relay.loop is first
        first.close()
        other = relay_for(second)  # a new relay: the relays of closed loops are dropped here
        assert other is not relay and other.loop is second and relay_for(second) is other
        assert relay_for(first) is not relay  # forgotten with its loop
    finally:
        first.close()
        second.close()
