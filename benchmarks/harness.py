"""The one way a benchmark or a system test starts `python -m server` as a process, and free ports.

Sixteen places used to launch the server by hand, each with its own port picking, waiting and
stopping, and seven copies of `free_port`; a flag added to the server (the HTTP port) then had to
be added to each. Here:

- `free_port()`: a free loopback TCP port.
- `ServerProcess(*flags)`: the server on free loopback ports (gRPC, metrics; HTTP only when asked),
  from the repository root, its output in a log file (a pipe nobody reads fills up and blocks the
  server) or, with `pipe=True`, in a pipe the caller reads (tests that parse the JSON log lines);
  `start()` waits until grpc.health says SERVING (or the process exits: the error has its log);
  `stop()` is SIGTERM, the server's drain, and a kill after the timeout. Ports may be given, so a
  replica can be restarted on its own ports (the scale-out rotation).
- `run_server(*flags)`: the server command run to its exit (start-up failures under test).
- `cpu_seconds(pid)`, `wait_serving(async_client)`: a process's CPU time; SERVING seen by a client.
- `median(values)`, `rotations(names, rounds)`: alternating rounds, as every comparison here runs them.
- `machine()`: what a report records about where it ran.
"""
from __future__ import annotations

import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A loopback TCP port nobody listens on now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    def __init__(self, *flags: str, port: int = 0, metrics_port: int = 0, http_port: int = -1,
                 metrics: bool = True, log_path: Optional[Path] = None, pipe: bool = False,
                 env: Optional[dict] = None):
        """`http_port`: -1 = no HTTP port, 0 = a free one; `metrics=False`: no metrics endpoint."""
        self.flags = list(flags)
        self.port = port or free_port()
        self.metrics_port = (metrics_port or free_port()) if metrics else -1
        self.http_port = free_port() if http_port == 0 else http_port
        self.log_path = log_path or Path(tempfile.mkstemp(prefix="nmt-server-", suffix=".log")[1])
        self.pipe, self.env = pipe, env
        self.proc: Optional[subprocess.Popen] = None
        self._log: Optional[IO] = None

    # -- where it listens ---------------------------------------------------------------------
    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "server", "--host", "127.0.0.1", "--port", str(self.port),
                "--metrics-port", str(self.metrics_port), "--http-port", str(self.http_port), *self.flags]

    # -- lifecycle ------------------------------------------------------------------------------
    def launch(self) -> "ServerProcess":
        """Start the process and return at once (start() also waits for SERVING)."""
        if self.pipe:
            self.proc = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True)
        else:
            self._log = open(self.log_path, "a")
            self.proc = subprocess.Popen(self.command, cwd=ROOT, env=self.env, stdout=self._log,
                                         stderr=subprocess.STDOUT)
        return self

    def start(self, timeout: float = 180.0) -> "ServerProcess":
        self.launch()
        self.wait_serving(timeout)
        return self

    def wait_serving(self, timeout: float = 180.0) -> None:
        """Until the gRPC health check says SERVING (models loaded and warmed up)."""
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc
        end = time.monotonic() + timeout
        with grpc.insecure_channel(self.target) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            while time.monotonic() < end:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the server exited with {self.proc.returncode}:\n{self.log_tail()}")
                try:
                    if stub.Check(health_pb2.HealthCheckRequest(), timeout=2.0).status == \
                            health_pb2.HealthCheckResponse.SERVING:
                        return
                except grpc.RpcError:
                    pass
                time.sleep(0.1)
        raise TimeoutError(f"the server did not report SERVING within {timeout:g} s:\n{self.log_tail()}")

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 40) -> str:
        return "" if self.pipe else "\n".join(self.log_text().splitlines()[-lines:])

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 60.0) -> Optional[int]:
        """SIGTERM (the server drains), then kill after `timeout`. Returns the exit status."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._log is not None:
            self._log.close()
            self._log = None
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def __enter__(self) -> "ServerProcess":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


def cpu_seconds(pid: Optional[int] = None) -> float:
    """CPU time (user + system) of this process, or of process `pid` (Linux /proc)."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_serving(client, tries: int = 600) -> None:
    """Until an async client's health check says SERVING (a server started elsewhere, or a peer's)."""
    import asyncio
    for _ in range(tries):
        try:
            if await client.health() == "SERVING":
                return
        except Exception:  # noqa: BLE001 (not up yet)
            pass
        await asyncio.sleep(0.2)  # not up, or up but still warming up (NOT_SERVING)


def run_server(*flags: str, timeout: float = 120.0, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """`python -m server FLAGS` run to its exit (for start-up failures), its output captured."""
    return subprocess.run([sys.executable, "-m", "server", *flags], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def rotations(names: Sequence[str], rounds: int) -> list[list[str]]:
    """Each round's order: the names rotated by one per round, so none always runs first (warm caches,
    a machine that slows down over the run)."""
    names = list(names)
    return [names[r % len(names):] + names[:r % len(names)] for r in range(rounds)]


def machine() -> dict:
    """CPU model, cores, commit and date: what a report states about its run."""
    cpu = platform.processor() or "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {"cpu": cpu, "cores": os.cpu_count(), "commit": commit.stdout.strip() or "?",
            "date": f"{datetime.now(timezone.utc):%Y-%m-%d}"}
