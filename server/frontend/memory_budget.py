"""The memory budget an operator states (`--memory-limit`): new work is refused while the server is near it.

A sidecar's memory is the budget set first (a Kubernetes `limits.memory`, a container's cgroup); past it
the kernel kills the whole server, every call in flight with it. Envoy's overload manager answers the same
way: stop taking new work before the limit instead of growing into it. Here every process's resident
memory (server/observability/memory.py) is summed every SAMPLE_S on the frontend's event loop (a few /proc
reads, ~0.1 ms: never per call); while the sum is at REFUSE_AT of the limit or above, admission refuses
new Translate and Embed calls with MemoryFull (RESOURCE_EXHAUSTED with a retry delay: gRPC's RetryInfo,
HTTP 429 with Retry-After in every API's own shape). Calls already admitted and health are never refused
for it; a document job's next texts wait it out as they wait out a full queue (server/files/jobs.py retries
RESOURCE_EXHAUSTED after the wait it names), so no document is lost to it.

After a burst the frontend hands back what it took: a burst of large HTTP bodies (parsed whole, spread
over glibc's heaps) grew a frontend from 155 to 330 MB, and nothing returned it (measured: 64 bodies of
3.4 MB; glibc's malloc_trim(0) gave back 45-70 MB of it at once). So every SAMPLE_S this process's own
resident memory is read too, and when it has grown by TRIM_GROWTH since the last trim and held still for
a sample (the burst is over), the garbage collector runs a full collection and then malloc_trim(0) runs off
the event loop (nmt_memory_trims_total and nmt_memory_trimmed_bytes_total count them). The collection first,
because what a burst leaves is mostly not free heap but garbage in reference cycles: a refused call's
exception holds its traceback, whose frames hold the call's task, request message and texts, and the task
holds the exception. Such cycles outlive the call until a full collection, which CPython runs only once
the long-lived objects have grown by a quarter: after 64 refused 3.4 MB bodies, one collection found 1,340
objects of eight calls' cycles (tasks, frames, tracebacks; measured with gc.DEBUG_SAVEALL). The same
collection runs before the budget first refuses work: garbage is not a reason to say no.

`--memory-limit auto` (the default) takes the cgroup's limit when the server runs under one (cgroup v2
memory.max, or v1 memory.limit_in_bytes), and is off otherwise; `0` turns it off; `500M`, `2G`, or bytes.
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
from pathlib import Path
from typing import Optional

from models.core.heap import release_free_heap
from server.core.errors import MemoryFull
from server.observability.memory import ServerProcesses, resident_bytes

log = logging.getLogger(__name__)
SAMPLE_S = 0.5
REFUSE_AT = 0.9  # of the limit: in-flight work still grows after the last admitted call
# A body being parsed and called holds about this many times its size (64 bodies of 3.2 MB, 8 at a time,
# took the frontend from 160 to 360 MB: ~25 MB each, docs/benchmarks/memory_burst.md).
BODY_FACTOR = 8
TRIM_GROWTH = 32 << 20  # this process grown by this much since its last trim: hand the free pages back
STILL = 1 << 20  # ... once two samples differ by less than this (the burst is over)
CGROUP_FILES = (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def cgroup_limit() -> Optional[int]:
    """The memory limit of the cgroup this process runs in, in bytes; None without one ("max", or v1's
    near-2^63 'no limit')."""
    for path in CGROUP_FILES:
        try:
            text = path.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
    return None


def parse_limit(text: str) -> Optional[int]:
    """`--memory-limit` -> bytes, or None (off). ValueError for anything else."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text == "AUTO":
        return cgroup_limit()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)", text)
    if match is None:
        raise ValueError(f"--memory-limit {text!r}: expected auto, 0, or a size such as 500M or 2G")
    value = int(float(match.group(1)) * _UNITS[match.group(2)])
    return value or None


class MemoryBudget:
    def __init__(self, limit_bytes: Optional[int], processes: ServerProcesses, metrics=None):
        self.limit, self.processes, self.metrics = limit_bytes, processes, metrics
        self.used = 0  # bytes, all the server's processes, at the last sample (with a limit)
        self._task: Optional[asyncio.Task] = None
        self._own: Optional[int] = None  # this process's resident bytes at the last sample
        self._baseline: Optional[int] = None  # ... after the last trim (or at start)
        self.reserved = 0  # bytes promised to bodies being read and parsed (reserve / release)

    def start(self) -> None:
        if self._task is None:
            if self.limit is not None:
                self.used = self.processes.total_bytes()
            self._own = self._baseline = resident_bytes(os.getpid())
            self._task = asyncio.create_task(self._sample(), name="memory-budget")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _sample(self) -> None:
        full = False
        while True:
            await asyncio.sleep(SAMPLE_S)
            await self._trim_after_burst()
            if self.limit is None:
                continue
            self.used = self.processes.total_bytes()
            if self.full and not full:  # about to refuse: first give back what garbage holds, and look again
                await self._give_back()
                self.used = self.processes.total_bytes()
            if self.full != full:
                full = self.full
                log.warning("memory %s: %d of %d MB", "full, refusing new work" if full else "below the budget again",
                            self.used >> 20, self.limit >> 20,
                            extra={"event": "memory_full" if full else "memory_ok", "used_bytes": self.used,
                                   "limit_bytes": self.limit})

    async def _trim_after_burst(self) -> None:
        own, before = resident_bytes(os.getpid()), self._own
        self._own = own
        if own is None or before is None or self._baseline is None:
            return
        if own - self._baseline >= TRIM_GROWTH and abs(own - before) < STILL:
            await self._give_back()
            after = resident_bytes(os.getpid()) or own
            self._own = self._baseline = after
            if self.metrics is not None:
                self.metrics.memory_trims.inc()
                self.metrics.memory_trimmed.inc(max(0, own - after))
            log.info("handed %d MB back to the system after a burst (%d -> %d MB)", (own - after) >> 20,
                     own >> 20, after >> 20, extra={"event": "memory_trimmed", "before_bytes": own,
                                                    "after_bytes": after})

    @staticmethod
    async def _give_back() -> None:
        """Free the garbage cycles (a full collection, on the loop: it holds the interpreter lock wherever it
        runs; ~10-30 ms), then hand the heaps' free pages to the kernel (off the loop)."""
        gc.collect()
        await asyncio.get_running_loop().run_in_executor(None, release_free_heap)

    @property
    def line(self) -> Optional[int]:
        """Bytes at which new work is refused (REFUSE_AT of the limit); None without a limit."""
        return None if self.limit is None else int(REFUSE_AT * self.limit)

    @property
    def full(self) -> bool:
        return self.line is not None and self.used >= self.line

    def reserve(self, body_bytes: int) -> bool:
        """Admit a request body of `body_bytes` before it is read: its parse and call are counted at BODY_FACTOR
        times its size until `release`; False (nothing reserved) when that would pass the refusal line.
        Always True without a limit."""
        if self.limit is None:
            return True
        cost = BODY_FACTOR * body_bytes
        if not self.room_for(self.reserved + cost):
            return False
        self.reserved += cost
        return True

    def release(self, body_bytes: int) -> None:
        if self.limit is not None:
            self.reserved = max(0, self.reserved - BODY_FACTOR * body_bytes)

    def room_for(self, more_bytes: int) -> bool:
        """Whether the server can grow by `more_bytes` (a process about to start) and stay under the point where
        it refuses work; always, without a limit."""
        return self.line is None or self.used + more_bytes < self.line

    def check(self) -> None:
        """Raise MemoryFull while the server is at its budget."""
        if self.full:
            raise MemoryFull(f"the server is at its memory limit ({self.used >> 20} MB of {self.limit >> 20} MB, "
                             f"--memory-limit); retry in a moment")
