"""Extra frontend processes (`--frontends N`, N > 1): more Python processes serving the same gRPC and
HTTP ports over the one engine core, each with its own event loop and interpreter lock.

Why: a gRPC message costs ~100 us of CPU on the frontend's event loop (docs/benchmarks/
frontend_profile.md), so one Python frontend caps a fast engine (a GPU's) at ~10k messages/s. The
kernel spreads new connections over the processes listening with SO_REUSEPORT (gRPC sets it on
Linux; the HTTP port here sets it when N > 1), so N frontends take N cores' worth of per-message
work. Each frontend is a whole TranslationServer attached to the core (server/coreprocess/
frontend.py): admission, tokenisers, documents, auth, protobuf, its own link to the core.

This module is the primary's side: it starts the N - 1 others, restarts one that dies (its calls are
lost with it, no one else's; the core cancels its jobs: `Forget`), asks each for its metrics at a
scrape (one view: server/observability/metrics.py MergedRegistry) and tells each to drain on shutdown. The
control channel is a ZeroMQ ROUTER here and a DEALER in each extra frontend.
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import subprocess
import sys
import zmq
import zmq.asyncio

from server.coreprocess import protocol
from server.frontend.cores.link import identity
from server.frontend.cores.supervisor import exited
from server.observability.metrics import Metrics

log = logging.getLogger("server.coreprocess")
START_TIMEOUT_S = 120.0
SCRAPE_TIMEOUT_S = 2.0


class FrontendPool:
    def __init__(self, count: int, config_file: str, directory: str, core_address: str, port: int, http_port: int,
                 metrics: Metrics, forget):
        self.count, self.metrics, self.forget = count, metrics, forget
        self.address = f"ipc://{os.path.join(directory, 'control.sock')}"
        self.ctx = zmq.asyncio.Context()
        self.sock = self.ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(self.address)
        self.base = [sys.executable, "-m", "server.frontend.extra", "--config", config_file,
                     "--core", core_address, "--control", self.address, "--port", str(port),
                     "--http-port", str(http_port), "--parent", str(os.getpid())]
        self.procs: dict[int, subprocess.Popen] = {}  # index (1..N-1) -> process
        self.hello: dict[bytes, asyncio.Future] = {}  # routing id -> resolved when that frontend serves
        self.answers: dict[int, asyncio.Future] = {}
        self._tickets = itertools.count(1)
        self.stopping = False
        self._tasks: list[asyncio.Task] = []

    async def start(self) -> None:
        self._tasks.append(asyncio.create_task(self._receive(), name="frontends-control"))
        await asyncio.gather(*(self._spawn(i) for i in range(1, self.count)))
        self._tasks += [asyncio.create_task(self._watch(i), name=f"frontend-{i}-watch") for i in range(1, self.count)]

    async def _spawn(self, index: int) -> None:
        proc = subprocess.Popen([*self.base, "--index", str(index)], stdin=subprocess.DEVNULL)
        self.procs[index] = proc
        serving = self.hello.setdefault(identity(proc.pid), asyncio.get_running_loop().create_future())
        exited = asyncio.ensure_future(self._exit(proc))
        done, _ = await asyncio.wait({serving, exited}, timeout=START_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED)
        exited.cancel()
        if serving not in done:
            proc.kill()
            raise RuntimeError(f"frontend {index} did not start (exit status {proc.poll()})")
        log.info("frontend %d serving (pid %d)", index, proc.pid,
                 extra={"event": "frontend_up", "index": index, "pid": proc.pid})

    @staticmethod
    async def _exit(proc: subprocess.Popen) -> int:
        await exited(proc.pid)
        return proc.wait()

    async def _watch(self, index: int) -> None:
        while True:
            proc = self.procs[index]
            status = await self._exit(proc)
            if self.stopping:
                return
            await self.forget(identity(proc.pid))  # the core cancels its jobs: nobody would read them
            self.hello.pop(identity(proc.pid), None)
            self.metrics.frontend_restarts.inc()
            log.error("frontend %d (pid %d) exited with status %d; its calls are lost, restarting it", index,
                      proc.pid, status, extra={"event": "frontend_lost", "index": index, "status": status})
            while not self.stopping:
                try:
                    await self._spawn(index)
                    break
                except RuntimeError as e:
                    log.error("%s", e, extra={"event": "frontend_start_failed", "index": index})
                    await asyncio.sleep(1.0)

    async def _receive(self) -> None:
        while True:
            peer, frame = await self.sock.recv_multipart()
            msg = protocol.to_frontend(frame)
            if isinstance(msg, protocol.MetricsText):
                future = self.answers.pop(msg.ticket, None)
                if future is not None and not future.done():
                    future.set_result(msg.text)
            elif isinstance(msg, protocol.Ready):  # an extra frontend says it serves
                future = self.hello.setdefault(peer, asyncio.get_running_loop().create_future())
                if not future.done():
                    future.set_result(None)

    async def metrics_texts(self) -> list[str]:
        """Each serving extra frontend's exposition (one that does not answer in time is left out)."""
        peers = [peer for peer, f in self.hello.items() if f.done()]
        futures = []
        for peer in peers:
            ticket = next(self._tickets)
            future = self.answers[ticket] = asyncio.get_running_loop().create_future()
            await self.sock.send_multipart([peer, protocol.encode(protocol.AskMetrics(ticket))])
            futures.append(future)
        done, pending = await asyncio.wait(futures, timeout=SCRAPE_TIMEOUT_S) if futures else (set(), set())
        for f in pending:
            f.cancel()
        return [f.result() for f in futures if f in done]

    async def begin_stop(self) -> None:
        """Tell every extra frontend to begin its lame duck and drain (before the core hears of it)."""
        self.stopping = True
        for task in self._tasks:
            task.cancel()
        await self.send_stop()

    async def send_stop(self) -> None:
        """Stop, to every live extra frontend: the first begins its shutdown, a second cuts its lame duck
        short (as a second SIGTERM does to the primary)."""
        for proc in self.procs.values():
            if proc.poll() is not None:
                continue
            serving = self.hello.get(identity(proc.pid))
            if serving is not None and serving.done():
                await self.sock.send_multipart([identity(proc.pid), protocol.encode(protocol.Stop(0.0))])
            else:  # still starting: not on the control channel yet, and no calls of its own to drain
                proc.terminate()

    async def stop(self, grace: float) -> None:
        """Wait (up to `grace` + 10 s) for every extra frontend to drain its own calls and exit."""
        if not self.stopping:
            await self.begin_stop()
        for proc in self.procs.values():
            try:
                await asyncio.wait_for(self._exit(proc), grace + 10.0)
            except (asyncio.TimeoutError, ProcessLookupError):
                proc.kill()
        self.sock.close(0)
        self.ctx.term()

    def signal_reload(self) -> None:
        """Pass a SIGHUP (reload the API keys) on to every extra frontend."""
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGHUP)
            except ProcessLookupError:
                pass

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values() if p.poll() is None]
