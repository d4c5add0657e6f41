"""The server's memory, process by process: what a sidecar's operator budgets first.

A server is several processes (docs/architecture.md): the primary frontend, extra frontends
(`--frontends N`), the engine replicas and, while it runs, the background replica. Each one's resident
set is read from /proc/PID/status (VmRSS; pages two processes share count in both, so the sum is an upper
bound) at the moment someone asks: a scrape of the metrics port (nmt_process_resident_memory_bytes, one
series per process, server/observability/metrics.py) or GET /v1/status (the status page's memory table).
Only the primary reads them: it started every other process and knows their pids; nothing is sampled
while nobody asks.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional


@dataclass(frozen=True)
class ProcessMemory:
    role: str  # frontend | replica | background
    name: str  # "0" for the primary frontend, "1".. for extra ones; a replica's index; "background"
    pid: int
    rss_bytes: int


def resident_bytes(pid: int) -> Optional[int]:
    """VmRSS of process `pid` in bytes; None when it has exited (a zombie has no VmRSS) or cannot be read."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def children(pid: int) -> list[tuple[int, list[str]]]:
    """(pid, command line) of every live child of process `pid` (/proc: each process's parent is in its
    stat line, after the command's closing parenthesis)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
                out.append((int(entry.name), (entry / "cmdline").read_text().split("\0")))
        except (OSError, ValueError, IndexError):
            continue  # exited meanwhile
    return out


def siblings(primary: int, replica_pids: set[int]) -> list[tuple[str, str, int]]:
    """An extra frontend's view of the primary's other processes, which it did not start: (role, name,
    pid) of the extra frontends (`--index N` on their command line) and of a background replica (an engine
    core that is none of `replica_pids`)."""
    out = []
    for pid, command in children(primary):
        if "server.frontend.extra" in command and "--index" in command:
            out.append(("frontend", command[command.index("--index") + 1], pid))
        elif "server.coreprocess" in command and pid not in replica_pids:
            out.append(("background", "background", pid))
    return out


class ServerProcesses:
    """Every live process of this server with its resident memory. `members()` lists (role, name, pid) as
    the server knows them at the time of asking (a restarted replica has a new pid)."""

    def __init__(self, members: Callable[[], list[tuple[str, str, int]]]):
        self.members = members

    def snapshot(self) -> list[ProcessMemory]:
        out = []
        for role, name, pid in self.members():
            rss = resident_bytes(pid) if pid else None
            if rss is not None:
                out.append(ProcessMemory(role, name, pid, rss))
        return out

    def total_bytes(self) -> int:
        return sum(p.rss_bytes for p in self.snapshot())
