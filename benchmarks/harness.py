"""The one way a benchmark or a system test starts `python -m server` as a process, and free ports.

Why one harness: sixteen places used to launch the server by hand, each with its own port picking,
waiting and stopping, and there were seven copies of `free_port`. A flag added to the server (the
HTTP port, which then bound 8080 in every one of them) had to be added to each, and a server that
failed to start showed up as a timeout with its output thrown away. Here:

- `free_port()`: a free loopback TCP port outside the kernel's ephemeral range (the only copy in the
  repository).
- `ServerProcess(*flags)`: the server on loopback (127.0.0.1), started from the repository root;
  gRPC and metrics ports free unless given (`metrics=False`: no metrics endpoint), no HTTP port
  unless asked (`http_port=0`: a free one). Its output goes to a log file (a pipe nobody reads fills
  up and blocks the server), or, with `pipe=True`, to a pipe the caller reads (tests that parse the
  JSON log lines). `launch()` starts it; `start()` also waits until grpc.health says SERVING, and if
  the process exits or the wait times out, kills it and raises with the log's tail. `stop()` is
  SIGTERM, the server's drain, and a kill after the timeout (`drain=False`: kill at once). A log file
  the harness named itself is removed after a clean exit and kept (for the post-mortem) otherwise.
  Ports may be given, so a replica can be restarted on its own ports (the scale-out rotation).
- `PeerProcess(*flags)`: the CTranslate2 peer (benchmarks/ct2_server.py) under the same lifecycle: a
  free port, a log kept when it fails, SERVING awaited by the same health check, the same stop.
- `run_server(*flags)`: the server command run to its exit (start-up failures under test).
- `cpu_seconds(pid)`, `wait_serving(async_client)`: a process's CPU time; SERVING seen by a client.
- `serve_level(target, level, seconds)`: one load level served by `python -m client.loadgen` in its own
  process: closed loops of streams or 32-text calls, or streams arriving at a fixed rate (`level_command`).
- `rotations(names, rounds)`: each round's order, rotated, as every comparison here runs them.
- `machine()`: what a report records about where it ran (CPU model, its vector extensions, cores,
  commit, date); `date_line()` and `machine_line()`: the `Date:` and `Machine:` lines every results
  page under docs/benchmarks/ carries (tests/unit/test_readme_figures.py reads them).
"""
from __future__ import annotations

import functools
import json
import os
import platform
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]


_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_handed_out: set[int] = set()
_pick = random.Random(os.getpid() ^ time.time_ns())


@functools.lru_cache(maxsize=1)
def _outside_ephemeral() -> Optional[range]:
    """The ports below the kernel's ephemeral range (or above it), where no outgoing connection takes one."""
    try:
        low, high = (int(x) for x in _EPHEMERAL.read_text().split())
    except (OSError, ValueError):
        return None  # not Linux: the OS's own pick below
    if low - 20000 >= 2000:
        return range(20000, low)
    if 65535 - high >= 2000:
        return range(high + 1, 65536)
    return None


def free_port() -> int:
    """A loopback TCP port nobody listens on now, and none this process has handed out before.

    Taken outside the kernel's ephemeral range: a port the OS picks from inside it (bind to port 0) is
    free only until a process opens an outgoing connection, and the servers a test starts open many
    (one of three scale-out replicas once failed to bind its gRPC port, taken in the moment between
    the pick and its bind). Outside the range only another explicit bind can take it."""
    ports = _outside_ephemeral()
    for _ in range(200 if ports else 0):
        port = _pick.choice(ports)
        if port not in _handed_out and bindable(port):  # not in use, nor lingering from an earlier test
            _handed_out.add(port)
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    _handed_out.add(port)
    return port


def bindable(port: int) -> bool:
    """Whether a loopback TCP socket can bind `port` now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class ServerProcess:
    def __init__(self, *flags: str, port: int = 0, metrics_port: int = 0, http_port: int = -1,
                 metrics: bool = True, log_path: Optional[Path] = None, pipe: bool = False,
                 env: Optional[dict] = None, root: Optional[Path] = None):
        """`http_port`: -1 = no HTTP port, 0 = a free one; `metrics=False`: no metrics endpoint;
        `env`: the process's whole environment (None: this one's); `root`: the checkout whose server
        runs (None: this one; another, e.g. a `git worktree` of an earlier commit, for an A/B)."""
        self.root = Path(root) if root is not None else ROOT
        self.flags = list(flags)
        self.port = port or free_port()
        self.metrics_port = (metrics_port or free_port()) if metrics else -1
        self.http_port = free_port() if http_port == 0 else http_port
        self.log_path: Optional[Path] = Path(log_path) if log_path is not None else None
        self._own_log = False  # the harness named the log file (and removes it after a clean exit)
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

    def served_variants(self) -> dict[str, str]:
        """model -> the graph variant its engine loaded (nmt_model_info: `int8` may be served as int8-static,
        int8-vnni or int8, models/core/runtime.py served_variant). Needs the metrics endpoint."""
        import re
        import urllib.request

        text = urllib.request.urlopen(self.metrics_url, timeout=10).read().decode()
        found = {}
        for line in text.splitlines():
            if line.startswith("nmt_model_info{"):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
                found[labels["model"]] = labels["variant"]
        return found

    # -- lifecycle ------------------------------------------------------------------------------
    def launch(self) -> "ServerProcess":
        """Start the process and return at once (start() also waits for SERVING)."""
        if self.pipe:
            self.proc = subprocess.Popen(self.command, cwd=self.root, env=self.env, stdout=subprocess.PIPE,
                                         stderr=subprocess.STDOUT, text=True)
            return self
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="nmt-server-", suffix=".log")
            os.close(fd)
            self.log_path, self._own_log = Path(name), True
        self._log = open(self.log_path, "a")  # a restart on the same log appends to it
        self.proc = subprocess.Popen(self.command, cwd=self.root, env=self.env, stdout=self._log,
                                     stderr=subprocess.STDOUT)
        return self

    def start(self, timeout: float = 180.0) -> "ServerProcess":
        """Launch and wait for SERVING; on failure the process is killed and the error has its log."""
        self.launch()
        try:
            self.wait_serving(timeout)
        except BaseException:
            self.kill()
            raise
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
                    pass  # not listening yet, or still warming up
                time.sleep(0.1)
        raise TimeoutError(f"the server did not report SERVING within {timeout:g} s:\n{self.log_tail()}")

    def log_text(self) -> str:
        """The log file so far ("" with pipe=True: the caller reads the pipe)."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def signal(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def stop(self, drain: bool = True, timeout: float = 60.0) -> Optional[int]:
        """SIGTERM (the server drains) and a kill after `timeout`; `drain=False`: kill at once.
        Returns the exit status (None if never launched)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            if drain:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    pass
            self.kill()
        self._close_log()
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._own_log and self.proc.returncode == 0:
            self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> "ServerProcess":
        return self.start() if self.proc is None else self

    def __exit__(self, *exc) -> None:
        self.stop()


class PeerProcess(ServerProcess):
    """benchmarks/ct2_server.py with `flags` (its model, tokenizer, replicas, ...) on a free loopback port.
    It has no metrics or HTTP endpoint; `env` carries its GEMM setting (ct2_server.backend_env)."""

    def __init__(self, *flags: str, env: Optional[dict] = None, log_path: Optional[Path] = None):
        super().__init__(*flags, metrics=False, env=env, log_path=log_path)

    @property
    def command(self) -> list[str]:
        return [sys.executable, "-m", "benchmarks.ct2_server", "--host", "127.0.0.1", "--port", str(self.port),
                *self.flags]


def run_server(*flags: str, timeout: float = 120.0, env: Optional[dict] = None) -> subprocess.CompletedProcess:
    """`python -m server FLAGS` run to its exit (for start-up failures), its output captured as text."""
    return subprocess.run([sys.executable, "-m", "server", *flags], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def cpu_seconds(pid: Optional[int] = None) -> float:
    """CPU time (user + system) of this process, or of process `pid` and its live descendants (a
    server's engine core process: --engine-core process), from Linux /proc."""
    if pid is None:
        t = os.times()
        return t.user + t.system
    return sum(filter(None, (process_cpu_seconds(p) for p in [pid, *descendants(pid)])))


def process_cpu_seconds(pid: int) -> Optional[float]:
    """CPU time (user + system) of process `pid` alone, from /proc/PID/stat; None once it has exited."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS, VmHWM (peak RSS), RssAnon, RssFile of a process, in bytes (/proc/PID/status)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


def tree_rss_mb(pid: int) -> Optional[float]:
    """VmRSS of process `pid` plus its live descendants' (/proc), in MB; None once `pid` has exited.
    Pages the processes share count once per process, so this is an upper bound on what they use."""
    total = 0
    for p in [pid, *descendants(pid)]:
        try:
            total += proc_status(p)["VmRSS"]
        except (OSError, KeyError):  # exited (a zombie has no VmRSS)
            if p == pid:
                return None
    return total / (1 << 20)


def tree_memory(pid: int) -> Optional[dict]:
    """Memory of process `pid` and its live descendants, in MB; None once `pid` has exited:
    rss (VmRSS summed: pages the processes share count once per process, an upper bound),
    pss (proportional set size summed, /proc/PID/smaps_rollup: a shared page is split among the
    processes mapping it, so the sum is what the tree holds) and each process's own VmRSS by pid."""
    out = {"rss": 0.0, "pss": 0.0, "processes": {}}
    for p in [pid, *descendants(pid)]:
        try:
            rss = proc_status(p)["VmRSS"] / (1 << 20)
            pss = next(int(line.split()[1]) for line in Path(f"/proc/{p}/smaps_rollup").read_text().splitlines()
                       if line.startswith("Pss:")) / 1024
        except (OSError, KeyError, StopIteration):  # exited (a zombie has no VmRSS)
            if p == pid:
                return None
            continue
        out["rss"] += rss
        out["pss"] += pss
        out["processes"][p] = round(rss, 1)
    return out


def descendants(pid: int) -> list[int]:
    """Live child processes of `pid`, their children, and so on (/proc/PID/task/*/children)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for children in Path(f"/proc/{p}/task").glob("*/children"):
            try:
                kids = [int(c) for c in children.read_text().split()]
            except FileNotFoundError:
                continue
            out += kids
            todo += kids
    return out


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


TEST_SOURCES = ROOT.parent / "shared" / "data" / "multi30k" / "test_2016_flickr.en"


LEVEL_KINDS = ("stream", "unary", "rate")
ARRIVAL_SEED = 1  # rate levels: every server of a comparison gets the same arrival times


def parse_levels(parser, text: str, seconds: float) -> list[str]:
    """--levels' comma-separated load levels, each checked by level_command; a bad one is the parser's usage
    error."""
    levels = text.split(",")
    for level in levels:
        try:
            level_command("", level, seconds)
        except ValueError as e:
            parser.error(str(e))
    return levels


def level_command(target: str, level: str, seconds: float) -> list[str]:
    """The `python -m client.loadgen` command of one load level, over test_2016_flickr.en for `seconds`:
    "stream:N" = N concurrent TranslateStream clients and "unary:N" = N clients of 32-text Translate calls
    (closed loops: each client sends its next call when the last ends, so a faster server is also offered
    more); "rate:R" = TranslateStream calls arriving at R per second (an open loop: Poisson arrivals with a
    fixed seed, the same for every server, so latencies compare at one offered load). ValueError on any
    other level."""
    kind, _, count = level.partition(":")
    try:
        number = float(count) if kind == "rate" else int(count)
    except ValueError:
        number = 0
    if kind not in LEVEL_KINDS or not 0 < number < float("inf"):
        raise ValueError(f"load level {level!r}: expected stream:N, unary:N (N clients) or rate:R (calls per "
                         "second), each above 0")
    cmd = [sys.executable, "-m", "client.loadgen", "--target", target, "--src-file", str(TEST_SOURCES),
           "--duration", str(seconds), "--warmup", "0", "--quiet"]
    if kind == "rate":
        return cmd + ["--rpc", "stream", "--rate", count, "--arrival", "poisson", "--seed", str(ARRIVAL_SEED)]
    cmd += ["--rpc", kind, "--concurrency", count]
    return cmd + (["--texts-per-call", "32"] if kind == "unary" else [])


def serve_level(target: str, level: str, seconds: float, extra: Sequence[str] = ()) -> dict:
    """Serve one load level (level_command) with the load generator in its own process, as a caller would
    run it; `extra`: more loadgen flags (a later one wins). Returns the loadgen's figures for the level (its
    --json `levels[0]`: tokens_per_s, output_tokens, ttft_ms, ...)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "level.json"
        subprocess.run([*level_command(target, level, seconds), "--json", str(out), *extra], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())["levels"][0]


def rotations(names: Sequence[str], rounds: int) -> list[list[str]]:
    """Each round's order: the names rotated by one per round, so none always runs first (warm caches,
    a shared machine that slows down for a while)."""
    names = list(names)
    return [names[r % len(names):] + names[:r % len(names)] for r in range(rounds)]


def cpu_features(flags: set[str]) -> str:
    """The vector extensions that decide how CTranslate2's and ONNX Runtime's kernels rank against
    each other (and whether 8-bit int8 weights saturate: docs/export.md), in words."""
    if "avx512f" in flags:
        extras = [name for flag, name in (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16")) if flag in flags]
        words = ["AVX-512" + (f" with {' and '.join(extras)}" if extras else " without VNNI")]
    elif "avx2" in flags:
        words = ["AVX2" + (" with AVX-VNNI" if "avx_vnni" in flags else ", no AVX-512, no VNNI")]
    else:
        words = ["no AVX2"]
    words.append("AMX" if "amx_tile" in flags else "no AMX")
    return ", ".join(words)


def commit_of(root: Path) -> str:
    """The short commit a checkout is at (its working tree may differ: the page's Date line says which)."""
    out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def machine() -> dict:
    """CPU model and extensions, cores this process may run on, commit and date: what a report states
    about its run."""
    info: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:  # the first processor's lines are enough
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    cpu = info.get("model name") or platform.processor() or platform.machine() or "?"
    flags = set(info.get("flags", "").split())
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {"cpu": cpu, "features": cpu_features(flags) if flags else "extensions unknown", "cores": cores,
            "commit": commit.stdout.strip() or "?", "date": f"{datetime.now(timezone.utc):%Y-%m-%d}"}


def date_line(m: Optional[dict] = None) -> str:
    """`Date: YYYY-MM-DD (commit abc1234)`: the day of the run and the tree it measured."""
    m = m or machine()
    return f"Date: {m['date']} (commit {m['commit']})"


def machine_line(extra: str = "", m: Optional[dict] = None) -> str:
    """`Machine: <CPU model> (<extensions>), N cores[; extra]`: enough to tell a reader whether the
    figures speak for their kind of machine."""
    m = m or machine()
    return f"Machine: {m['cpu']} ({m['features']}), {m['cores']} cores" + (f"; {extra}" if extra else "")
