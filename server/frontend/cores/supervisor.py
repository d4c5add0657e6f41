"""Start the engine core process, watch it, restart it when it dies (the primary frontend); or, in
an extra frontend (`attach`), watch the core another process started and reconnect to its successor.

A core that exits while the server is not stopping (kill -9, a native crash in a kernel, its own
watchdog finding a stuck loop) costs the calls in flight an UNAVAILABLE each (retryable; none is
left hanging or silently dropped) and readiness turns NOT_SERVING at once; a new core loads the
same models, and readiness turns SERVING again when it says Ready. The frontend's port, its
connections and its liveness stay up throughout. `nmt_engine_core_restarts_total` counts them.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Awaitable, Callable, Optional

from server.config import ServerConfig
from server.coreprocess import protocol
from server.frontend.cores.link import CoreLink, socket_address
from server.core.errors import Unavailable
from server.observability.metrics import Metrics

log = logging.getLogger("server.coreprocess")
START_TIMEOUT_S = 600.0  # loading and warming every model (an imported NLLB takes a while on CPU)
RESTART_BACKOFF_S = (0.0, 1.0, 2.0, 5.0, 10.0)  # consecutive failed starts wait longer, up to the last


async def exited(pid: int) -> None:
    """Until process `pid` has exited (a zombie counts), without a thread: a pidfd on the event loop
    where the kernel offers one (Linux 5.3+), else /proc polled every 0.1 s."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        while os.path.exists(f"/proc/{pid}") and "zombie" not in _status(pid):
            await asyncio.sleep(0.1)
        return
    loop, gone = asyncio.get_running_loop(), asyncio.Event()
    loop.add_reader(fd, gone.set)
    try:
        await gone.wait()
    finally:
        loop.remove_reader(fd)
        os.close(fd)


def _status(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as f:
            return f.read().lower()
    except FileNotFoundError:
        return "zombie"


class CoreFailed(RuntimeError):
    """The core exited before it was Ready."""


class CoreSupervisor:
    def __init__(self, cfg: ServerConfig, metrics: Metrics, on_down: Callable[[], Awaitable[None]],
                 on_up: Callable[[], Awaitable[None]], attach: str = "", nice: int = 0,
                 pieces: Optional[dict[str, tuple[str, ...]]] = None):
        """`nice`: the core's CPU priority lowered by this much (the background replica, replicas.py).
        `pieces`: each model's vocabulary pieces from the frontend's tokenizers, so the core loads none
        (server/frontend/hosted.py HostedModel)."""
        self.cfg, self.metrics, self.on_down, self.on_up = cfg, metrics, on_down, on_up
        self.attached = bool(attach)  # the core is another process's child: watch and reconnect only
        self.dir = "" if attach else tempfile.mkdtemp(prefix="nmt-core-")
        self.link = CoreLink(attach or socket_address(self.dir))
        self.proc: Optional[subprocess.Popen] = None
        self.pid: Optional[int] = None  # the core's, from its Ready
        self.stopping = False
        self._watcher: Optional[asyncio.Task] = None
        if not attach:
            self.config_file = os.path.join(self.dir, "config.json")
            with open(self.config_file, "w", encoding="utf-8") as f:
                json.dump(dataclasses.asdict(cfg), f)
            extra = ["--nice", str(nice)] if nice else []
            if pieces:
                pieces_file = os.path.join(self.dir, "pieces.json")
                with open(pieces_file, "w", encoding="utf-8") as f:
                    json.dump(pieces, f)
                extra += ["--pieces", pieces_file]
            self.command = [sys.executable, "-m", "server.coreprocess", "--config", self.config_file,
                            "--address", self.link.address, "--parent", str(os.getpid()), *extra]

    async def start(self) -> protocol.Ready:
        """Start a core and wait for it to be Ready (raises CoreFailed if it exits first)."""
        ready = await self._launch()
        self._watcher = asyncio.create_task(self._watch(), name="core-watch")
        return ready

    async def _launch(self) -> protocol.Ready:
        if self.attached:  # Ready comes once the primary's (new) core has bound the address
            ready = await self.link.connect()
            self.pid = ready.pid
            return ready
        self.proc = subprocess.Popen(self.command, stdin=subprocess.DEVNULL)
        connect = asyncio.ensure_future(self.link.connect())
        exited = asyncio.ensure_future(self._exit_status())
        done, _ = await asyncio.wait({connect, exited}, timeout=START_TIMEOUT_S,
                                     return_when=asyncio.FIRST_COMPLETED)
        if connect in done:
            exited.cancel()
            ready = connect.result()
            self.pid = ready.pid
            log.info("engine core %d ready", ready.pid, extra={"event": "engine_core_up", "pid": ready.pid})
            return ready
        connect.cancel()
        if exited in done:
            raise CoreFailed(f"the engine core exited with status {exited.result()} before it was ready")
        exited.cancel()
        self.proc.kill()
        raise CoreFailed(f"the engine core was not ready within {START_TIMEOUT_S:.0f} s")

    async def _exit_status(self) -> int:
        """Wait for the core's exit (-1 when the core is not this process's child: its status is its
        parent's to read)."""
        if self.attached:
            await exited(self.pid)
            return -1
        await exited(self.proc.pid)
        return self.proc.wait()

    async def _watch(self) -> None:
        while True:
            status = await self._exit_status()
            if self.stopping:
                return
            if not self.attached:
                self.metrics.core_restarts.inc()
            log.error("engine core %d exited (status %d); failing the calls in flight and %s", self.pid, status,
                      "waiting for its successor" if self.attached else "restarting it",
                      extra={"event": "engine_core_lost", "status": status})
            await self.on_down()
            failed = self.link.lost(Unavailable(f"the engine core stopped (exit status {status}) while this "
                                                "request was in it; the server is restarting it: retry"))
            log.info("failed %d jobs of the lost core", failed, extra={"event": "engine_core_jobs_failed",
                                                                      "jobs": failed})
            for attempt in range(1_000_000):
                await asyncio.sleep(RESTART_BACKOFF_S[min(attempt, len(RESTART_BACKOFF_S) - 1)])
                if self.stopping:
                    return
                try:
                    await self._launch()
                    break
                except CoreFailed as e:
                    log.error("engine core restart failed: %s", e, extra={"event": "engine_core_start_failed"})
            if not self.stopping:
                await self.on_up()

    async def stop(self, grace: float) -> None:
        """Drain the core (new work refused, running work finished within `grace`), then end it. Attached:
        wait (up to `grace`) for this frontend's own jobs only; the primary stops the core."""
        self.stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
        if self.attached:
            for _ in range(int(grace / 0.025) + 1):
                if not self.link.jobs:
                    break
                await asyncio.sleep(0.025)
        elif self.proc is not None and self.proc.poll() is None:
            await self.link.stop(grace)
            try:
                await asyncio.wait_for(self._exit_status(), grace + 10.0)
            except asyncio.TimeoutError:
                log.error("engine core did not stop in time; killing it", extra={"event": "engine_core_killed"})
                self.proc.kill()
                await self._exit_status()
            for _ in range(40):  # the core's last Events may still be on their way to the receiver
                if not self.link.jobs:
                    break
                await asyncio.sleep(0.025)
        self.link.lost(Unavailable("the server shut down before this request finished"))
        self.link.close()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
