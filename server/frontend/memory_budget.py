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

`--memory-limit auto` (the default) takes the cgroup's limit when the server runs under one (cgroup v2
memory.max, or v1 memory.limit_in_bytes), and is off otherwise; `0` turns it off; `500M`, `2G`, or bytes.
"""
from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Optional

from server.core.errors import MemoryFull
from server.observability.memory import ServerProcesses

log = logging.getLogger(__name__)
SAMPLE_S = 0.5
REFUSE_AT = 0.9  # of the limit: in-flight work still grows after the last admitted call
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
    def __init__(self, limit_bytes: Optional[int], processes: ServerProcesses):
        self.limit, self.processes = limit_bytes, processes
        self.used = 0  # bytes, at the last sample
        self._task: Optional[asyncio.Task] = None

    def start(self) -> None:
        if self.limit is not None and self._task is None:
            self.used = self.processes.total_bytes()
            self._task = asyncio.create_task(self._sample(), name="memory-budget")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _sample(self) -> None:
        full = False
        while True:
            await asyncio.sleep(SAMPLE_S)
            self.used = self.processes.total_bytes()
            if self.full != full:
                full = self.full
                log.warning("memory %s: %d of %d MB", "full, refusing new work" if full else "below the budget again",
                            self.used >> 20, self.limit >> 20,
                            extra={"event": "memory_full" if full else "memory_ok", "used_bytes": self.used,
                                   "limit_bytes": self.limit})

    @property
    def full(self) -> bool:
        return self.limit is not None and self.used >= REFUSE_AT * self.limit

    def check(self) -> None:
        """Raise MemoryFull while the server is at its budget."""
        if self.full:
            raise MemoryFull(f"the server is at its memory limit ({self.used >> 20} MB of {self.limit >> 20} MB, "
                             f"--memory-limit); retry in a moment")
