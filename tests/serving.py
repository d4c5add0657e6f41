"""Helpers for tests that run a real server: in a background thread, or as a subprocess."""
from __future__ import annotations

import asyncio
import os
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from benchmarks.harness import ServerProcess
from models.data import multi30k_file
from server.frontend.server import TranslationServer
from server.config import ServerConfig

ROOT = Path(__file__).resolve().parents[1]
REPOSITORY = ROOT / "model_repository"
SHARED = ROOT.parent / "shared" / "data" / "multi30k"
FIXTURE = ROOT / "tests" / "data" / "test_2016_flickr.head200.en"  # the first 200 lines (tests/data/README.md)


class ServerThread:
    """A TranslationServer on its own event loop in a daemon thread, on free loopback ports."""

    def __init__(self, **overrides):
        # The engine in this process (--engine-core thread) unless a test asks for core processes: tests read
        # and gate the in-process engine loop (EngineGate, schedulers); the default layout is tested through
        # `python -m server` subprocesses and with engine_core="process".
        # No memory budget by default (--memory-limit 0): this process is the test runner too, whose memory
        # (torch, other servers) is no server's; tests/system/test_memory_budget.py sets one.
        defaults = dict(host="127.0.0.1", port=0, metrics_port=0, http_port=0, model_repository=str(REPOSITORY),
                        engine_core="thread", intra_op_threads=int(os.environ.get("NMT_TEST_THREADS", "0")),
                        memory_limit="0")
        self.cfg = ServerConfig(**{**defaults, **overrides})
        self.app = TranslationServer(self.cfg)
        self._ready = threading.Event()
        self._error: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        async def main():
            self.loop = asyncio.get_running_loop()
            try:
                await self.app.start()
            except BaseException as e:  # noqa: BLE001 (surface start-up failures in the test)
                self._error.append(e)
                self._ready.set()
                return
            self._ready.set()
            self._done = asyncio.Event()
            await self.app.wait()
            await self._done.wait()  # the stop coroutine outlives the gRPC server; let it finish
        asyncio.run(main())

    def start(self) -> "ServerThread":
        self._thread.start()
        self._ready.wait(120)
        if self._error:
            raise self._error[0]
        return self

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.app.port}"

    @property
    def http(self) -> str:
        """The HTTP port's base URL."""
        return f"http://127.0.0.1:{self.app.http_port}"

    def stop(self, grace: float = 5.0) -> None:
        async def shutdown():
            try:
                await self.app.stop(grace)
            finally:
                self._done.set()
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result(60)
            self._thread.join(30)

    def begin_stop(self, grace: float = 5.0):
        """Start the shutdown (lame duck, then the drain) without waiting for it: a concurrent future
        for finish_stop."""
        return asyncio.run_coroutine_threadsafe(self.app.stop(grace), self.loop)

    def finish_stop(self, stopping=None) -> None:
        """After begin_stop: a second stop cuts the lame duck short, then wait for the shutdown and the
        thread (the thread's done event is set on its loop: set from here it would wake nothing).
        Without a shutdown begun, an ordinary stop."""
        if stopping is None:
            self.stop()
            return
        asyncio.run_coroutine_threadsafe(self.app.stop(), self.loop).result(30)
        stopping.result(90)
        self.loop.call_soon_threadsafe(self._done.set)
        self._thread.join(30)

    def metrics_text(self) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.app.metrics_port}/metrics", timeout=5).read().decode()

    def settled_metric(self, name: str, expected: float, timeout: float = 20.0, **labels) -> float:
        """The metric once it equals `expected` (or its value after `timeout`).

        For counters that the handler updates after the status went out (nmt_requests_total):
        a client may read its answer a moment before the server has counted it.
        """
        end = time.monotonic() + timeout
        while (value := self.metric(name, missing_ok=True, **labels)) != expected and time.monotonic() < end:
            time.sleep(0.02)
        return value

    def metric(self, name: str, missing_ok: bool = False, **labels) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0 if missing_ok and none yet)."""
        total, found = 0.0, False
        for line in self.metrics_text().splitlines():
            m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? (\S+)$", line)
            if not m or m.group(1) != name:
                continue
            got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            if all(got.get(k) == v for k, v in labels.items()):
                total += float(m.group(3))
                found = True
        if not found and not missing_ok:
            raise KeyError(f"{name}{labels} not exported")
        return total

    def wait_idle(self, timeout: float = 10.0) -> None:
        """Until the running and waiting gauges are 0 (the engine frees slots between steps)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.metric("nmt_running_requests") == 0 and self.metric("nmt_waiting_requests") == 0:
                return
            time.sleep(0.05)
        raise AssertionError(f"server not idle: running={self.metric('nmt_running_requests')}, "
                             f"waiting={self.metric('nmt_waiting_requests')}")


def key_file(directory: Path, *lines: str) -> str:
    """A --api-keys-file in `directory` holding `lines` (server/security/keys.py file_line: a key id, its key,
    and its limits): the one way the tests turn API keys on."""
    path = Path(directory) / "keys.txt"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def wait_for(predicate, timeout: float = 20.0, every: float = 0.02) -> bool:
    """Poll until true; the timeout only bounds a failure (each use waits for a settled state)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(every)
    return predicate()


def flickr_sentences(n: int) -> list[str]:
    """The first n test_2016_flickr English sentences: from the local copy beside the checkout
    (checksum-verified by the project's loader) or, without one, from the committed head of the file."""
    text = multi30k_file("test_2016_flickr.en", data_dir=SHARED) if SHARED.exists() \
        else FIXTURE.read_text(encoding="utf-8")
    lines = text.splitlines()
    if n > len(lines):
        raise ValueError(f"asked for {n} sentences; the fixture has {len(lines)}")
    return lines[:n]


def start_subprocess(port: int, metrics_port: int, *extra: str) -> subprocess.Popen:
    """`python -m server` as a process through the harness (benchmarks/harness.py), its output in a pipe
    the test reads."""
    return ServerProcess(*extra, port=port, metrics_port=metrics_port, pipe=True).launch().proc


def wait_process_serving(client, proc: subprocess.Popen, timeout: float = 90) -> None:
    """Until `client` sees SERVING from a server process started with start_subprocess (its output
    is in the failure when the process exits first)."""
    import grpc
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stdout.read()
        try:
            if client.health() == "SERVING":
                return
        except grpc.RpcError:
            pass
        time.sleep(0.2)
    raise AssertionError("server never became SERVING")


class EngineGate:
    """Holds a model's engine loop before its next iteration until released: lets a test line
    up queue and stream states exactly, instead of racing the engine.

        with EngineGate(model, let_through=1) as gate:   # one iteration runs, the next one waits
            ...
            gate.step()   # exactly one more iteration, returns once it is done
            gate.open()
    """

    def __init__(self, model, let_through: int = 0, timeout: float = 30.0, after=None):
        self.loop, self.let_through, self.timeout = model.here.loop, let_through, timeout
        self.after = after  # called on the engine thread after each iteration (e.g. to record who ran)
        self.released = threading.Event()
        self.held = threading.Event()  # the engine is waiting at the gate now
        self.timed_out = False
        self.calls = 0
        self.done = 0  # iterations completed since the gate was put in
        self._passes = 0  # iterations step() has let through and the engine has not yet taken
        self._cond = threading.Condition()

    def __enter__(self) -> "EngineGate":
        inner = type(self.loop).iteration.__get__(self.loop)

        def gated(now):
            with self._cond:
                self.calls += 1
                if self.calls > self.let_through and not self.released.is_set():
                    self.held.set()
                    self._cond.notify_all()
                    if not self._cond.wait_for(lambda: self.released.is_set() or self._passes, self.timeout):
                        self.timed_out = True
                    self._passes = max(0, self._passes - 1)
                    self.held.clear()
            try:
                return inner(time.monotonic())
            finally:
                if self.after:
                    self.after()
                with self._cond:
                    self.done += 1
                    self._cond.notify_all()
        self.loop.iteration = gated
        return self

    def step(self, n: int = 1) -> None:
        """Let exactly `n` more iterations run and return once they have (the engine waits at the
        gate again afterwards). Fails the test if the engine does not come round in time."""
        with self._cond:
            target = self.done + n
            self._passes += n
            self._cond.notify_all()
            if not self._cond.wait_for(lambda: self.done >= target, self.timeout):
                raise AssertionError(f"the engine ran {self.done - target + n} of {n} iterations")

    def open(self) -> None:
        with self._cond:
            self.released.set()
            self._cond.notify_all()

    def __exit__(self, *exc) -> None:
        self.open()
        del self.loop.iteration  # back to the class's method


def read_to_end(stream) -> tuple:
    """(status code, messages) of a server stream read to its end: OK, or the code it failed with."""
    import grpc
    messages = []
    try:
        for message in stream:
            messages.append(message)
    except grpc.RpcError as e:
        return e.code(), messages
    return grpc.StatusCode.OK, messages


def tcp_connections(pid: int) -> set[tuple[int, int]]:
    """(local port, remote port) of every established TCP connection process `pid` holds (from /proc:
    its socket inodes matched against the namespace's TCP tables). Tests use it to see which server
    process (--frontends) accepted which client connection."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "01" and f[9] in inodes:  # ESTABLISHED
                out.add((int(f[1].rsplit(":", 1)[1], 16), int(f[2].rsplit(":", 1)[1], 16)))
    return out
