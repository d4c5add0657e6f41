"""Engine thread -> asyncio loop delivery with one wake-up per decode step.

Every decode step produces one event per running stream. Handing each to the
event loop with its own `call_soon_threadsafe` costs a self-pipe write per
token on the engine thread and a loop wake-up per token on the gRPC thread.
Worse, each self-pipe write releases the GIL, so the loop wakes between two
posts and drains one event at a time: waking "only when no drain is pending"
still gave ~19 wake-ups per step at 32 streams (8% of the engine thread).

So the engine loop holds wake-ups back while it runs a step (`hold_wakeups`)
and releases them all once at the end (`flush`): one wake-up per loop per step.
Any other thread that posts (tests, warm-up) wakes the loop at once.

Order is preserved per relay (FIFO), which is what the streams need: a job's
tokens, then its FinishEvent.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)
_thread = threading.local()  # .held: set of relays with wake-ups held back by this (engine) thread


class EventRelay:
    """Coalescing bridge from any thread into one asyncio event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._items: collections.deque[tuple[Callable[[Any], None], Any]] = collections.deque()
        self._scheduled = False
        self.wakeups = 0  # drains scheduled so far (tests and benchmarks read it)

    def post(self, callback: Callable[[Any], None], value: Any) -> None:
        """Run `callback(value)` on the loop soon; callable from any thread."""
        with self._lock:
            self._items.append((callback, value))
            if self._scheduled:
                return  # a drain is already on its way and will take this item too
            self._scheduled = True
        if not defer_wake(self):
            self._wake()

    def sink(self, callback: Callable[[Any], None]) -> Callable[[Any], None]:
        """A job sink that delivers through this relay."""
        return lambda value: self.post(callback, value)

    def _wake(self) -> None:
        self.wakeups += 1
        try:
            if asyncio._get_running_loop() is self.loop:  # posted on the loop itself (the engine core's link)
                self.loop.call_soon(self._drain)  # no self-pipe write, no extra turn of the selector
            else:
                self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed (shutdown): nobody is left to deliver to
            with self._lock:
                self._items.clear()
                self._scheduled = False

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, collections.deque()
            self._scheduled = False
        for callback, value in items:
            try:
                callback(value)
            except Exception:  # noqa: BLE001 (one broken consumer must not starve the others)
                log.exception("event delivery failed")


def defer_wake(target) -> bool:
    """On a thread that holds wake-ups (the engine loop), remember `target` for `flush()` and return True;
    elsewhere return False (wake it now). Anything with a `_wake()` method: this relay, or the engine
    core's per-frontend outbox (server/coreprocess/process.py)."""
    held = getattr(_thread, "held", None)
    if held is None:
        return False
    held.add(target)  # woken by flush() at the end of the engine step
    return True


def hold_wakeups() -> None:
    """From now on, this thread's posts wait for `flush()` (the engine loop calls this once)."""
    _thread.held = set()


def flush() -> None:
    """Wake every loop that this thread posted to since the last flush."""
    held = getattr(_thread, "held", None)
    if held:
        relays = list(held)
        held.clear()
        for relay in relays:
            relay._wake()


class Outflow:
    """This loop's backlog of stream work: how many streams have events they have not taken yet (a
    stream blocked in a write is not counted, server/edge/servicer.py `_StreamInbox`). The engine core's
    link waits for it to empty before asking the core for more (server/frontend/cores/link.py): while the
    frontend is busy, the core keeps merging tokens, so each stream's next message carries all of
    them (coalescing by back-pressure); an idle frontend empties it at once."""

    def __init__(self) -> None:
        self.pending = 0
        self._waiters: list[Callable[[], None]] = []

    def add(self) -> None:
        self.pending += 1

    def done(self) -> None:
        self.pending = max(0, self.pending - 1)
        if not self.pending and self._waiters:
            waiters, self._waiters = self._waiters, []
            for callback in waiters:
                callback()

    def when_empty(self, callback: Callable[[], None]) -> None:
        if self.pending:
            self._waiters.append(callback)
        else:
            callback()


_relays: dict[asyncio.AbstractEventLoop, EventRelay] = {}
_outflows: dict[asyncio.AbstractEventLoop, Outflow] = {}


def outflow_for(loop: asyncio.AbstractEventLoop) -> Outflow:
    """The Outflow of `loop` (one per loop, shared by its streams and its link to the engine core)."""
    flow = _outflows.get(loop)
    if flow is None:
        for dead in [lp for lp in _outflows if lp.is_closed()]:
            del _outflows[dead]
        flow = _outflows[loop] = Outflow()
    return flow


def relay_for(loop: asyncio.AbstractEventLoop) -> EventRelay:
    """The relay of `loop` (one per loop, so all of its requests share wake-ups)."""
    relay = _relays.get(loop)
    if relay is None or relay.loop is not loop:
        for dead in [lp for lp in _relays if lp.is_closed()]:
            del _relays[dead]
        relay = _relays[loop] = EventRelay(loop)
    return relay
