"""Scale-out for real, on loopback: three replicas (`python -m server` subprocesses), the shipped nginx
and HAProxy configurations (deploy/, with addresses, ports and paths filled in) running in the
foreground, and the client library's own round_robin over the three.

- calls spread evenly (within 1.5x) over the replicas through each of the three paths;
- SIGTERM of a replica under load fails no call (lame duck, then drain; retries on UNAVAILABLE);
- kill -9 of a replica fails only streams that were in flight on it (unary calls are retried);
- a replica started again on the killed one's address receives traffic through every path.

Counts come from each replica's own /metrics (nmt_requests_total), polled with deadlines.
Without nginx or haproxy the tests skip, or fail when NMT_REQUIRE_TOOLS=1 (CI installs both).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import grpc
import pytest
from google.protobuf import descriptor_pool
from google.protobuf.message_factory import GetMessageClass
from grpc_health.v1 import health_pb2, health_pb2_grpc
from benchmarks.harness import ServerProcess, free_port
from tests.serving import ROOT, flickr_sentences

from client import TranslatorClient
from client.balancing import Balancing, channel_args
from protos.nmt.v1 import translator_pb2 as pb
from server.frontend.server import SERVICE_NAME
from server.config import ServerConfig
from server.edge.lifecycle import LIVENESS, _v1_reflection_file

LAME_DUCK_S = 2.0
REPLICA_FLAGS = ["--warmup", "false", "--intra-op-threads", "1", "--workers", "2", "--max-batch-size", "8",
                 "--lame-duck-s", str(LAME_DUCK_S), "--grace-period-s", "10",
                 # connections are recycled during the test too: GOAWAY must cost no call either
                 "--max-connection-age-ms", "15000", "--max-connection-age-grace-ms", "10000",
                 "--keepalive-time-ms", "10000"]
PATHS = ("round_robin", "nginx", "haproxy")
SPREAD_CALLS = 60


def need(tool: str) -> str:
    path = shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/usr/local/sbin")
    if not path:
        reason = f"{tool} is not installed (apt-get install -y nginx haproxy)"
        if os.environ.get("NMT_REQUIRE_TOOLS") == "1":
            pytest.fail(reason + " and NMT_REQUIRE_TOOLS=1")
        pytest.skip(reason)
    return path


def until(what: str, check, timeout: float, every: float = 0.05):
    """Poll `check` until it returns something truthy; fail with `what` at the deadline."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(every)


class Replica:
    def __init__(self, workdir: Path, index: int, *extra: str):
        self.port, self.metrics_port = free_port(), free_port()
        self.extra = extra
        self.log = workdir / f"replica{index}.log"
        self.proc: Optional[subprocess.Popen] = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> "Replica":
        """Launch (again, after a stop: the same ports and log) through the harness."""
        self.server = ServerProcess(*REPLICA_FLAGS, *self.extra, port=self.port, metrics_port=self.metrics_port,
                                    log_path=self.log).launch()
        self.proc = self.server.proc
        return self

    def wait_serving(self, timeout: float = 90) -> None:
        with TranslatorClient(self.target, retries=0, balancing=Balancing(retries=0)) as c:
            def serving():
                assert self.proc.poll() is None, self.log.read_text()
                try:
                    return c.health() == "SERVING"
                except grpc.RpcError:
                    return False
            until(f"replica {self.target} to serve", serving, timeout, every=0.1)

    def served(self) -> Optional[float]:
        """Translate + TranslateStream calls this process has finished (any status); None when down."""
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        except OSError:
            return None
        return sum(float(v) for v in re.findall(
            r'^nmt_requests_total\{(?=[^}]*rpc="(?:Translate|TranslateStream)")[^}]*\} (\S+)$', text, re.M))

    def stop(self) -> None:
        if self.proc is not None:
            self.server.stop(drain=False)  # killed if still running; its log closed


def _replace(text: str, pattern: str, repl, flags=re.M) -> str:
    new, n = re.subn(pattern, repl, text, flags=flags)
    assert n, f"the shipped config no longer has {pattern!r}: update the test's template"
    return new


def nginx_config(listen: int, replicas: list[Replica], workdir: Path) -> str:
    text = (ROOT / "deploy/nginx/nginx.conf").read_text()
    text = _replace(text, r"^(\s*)listen \d+ ", rf"\g<1>listen 127.0.0.1:{listen} ")
    lines = re.findall(r"^(\s*)server nmt-\d+:\d+( [^;\n]*)?;$", text, re.M)
    assert len(lines) == 3, lines
    indent, params = lines[0]
    text = _replace(text, r"^\s*server nmt-1:\d+[^;\n]*;$",
                    "\n".join(f"{indent}server {r.target}{params};" for r in replicas))
    text = _replace(text, r"^\s*server nmt-[23]:\d+[^;\n]*;\n", "")
    text = _replace(text, r"(?<= )/tmp/", f"{workdir}/")
    return _replace(text, r"/dev/stderr", str(workdir / "nginx-error.log"))


def haproxy_config(listen: int, stats: int, replicas: list[Replica], workdir: Path) -> str:
    text = (ROOT / "deploy/haproxy/haproxy.cfg").read_text()
    text = _replace(text, r"^(\s*)bind :50090 ", rf"\g<1>bind 127.0.0.1:{listen} ")
    text = _replace(text, r"^(\s*)bind :8404$", rf"\g<1>bind 127.0.0.1:{stats}")
    for i, r in enumerate(replicas, 1):
        text = _replace(text, rf"^(\s*server nmt{i}) nmt-{i}:\d+", rf"\g<1> {r.target}")
    return _replace(text, r"(?<= )/tmp/", f"{workdir}/")


class Fleet:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        # Replica 0's lame duck lasts until a second SIGTERM ends it: the test, not the clock, decides
        # when it is over (the other two keep the short one and end it by themselves).
        self.replicas = [Replica(workdir, 0, "--lame-duck-s", "600"), Replica(workdir, 1), Replica(workdir, 2)]
        self.haproxy_socket = workdir / "haproxy.sock"
        self.balancers: list[subprocess.Popen] = []
        self.targets: dict[str, str] = {}

    def start(self) -> "Fleet":
        nginx, haproxy = need("nginx"), need("haproxy")
        for r in self.replicas:
            r.start()
        for r in self.replicas:
            r.wait_serving()
        self.targets["round_robin"] = ",".join(r.target for r in self.replicas)
        nginx_port, haproxy_port, stats_port = free_port(), free_port(), free_port()
        conf = self.workdir / "nginx.conf"
        conf.write_text(nginx_config(nginx_port, self.replicas, self.workdir))
        cfg = self.workdir / "haproxy.cfg"
        cfg.write_text(haproxy_config(haproxy_port, stats_port, self.replicas, self.workdir))
        for name, argv in (("nginx", [nginx, "-p", str(self.workdir), "-c", str(conf), "-e", "stderr",
                                      "-g", "daemon off;"]),
                           ("haproxy", [haproxy, "-db", "-f", str(cfg)])):
            with open(self.workdir / f"{name}.out", "w") as out:
                self.balancers.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT))
        self.targets["nginx"] = f"127.0.0.1:{nginx_port}"
        self.targets["haproxy"] = f"127.0.0.1:{haproxy_port}"
        for name in ("nginx", "haproxy"):  # up when a call through them is answered
            with TranslatorClient(self.targets[name], timeout=5, retries=0) as c:
                def answers():
                    for p in self.balancers:
                        assert p.poll() is None, self.logs()
                    try:
                        c.translate(["A dog."], max_output_tokens=4)
                        return True
                    except grpc.RpcError:
                        return False
                until(f"{name} to pass calls", answers, 30, every=0.2)
        return self

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.workdir.glob("*.out")))

    def haproxy_servers(self) -> dict[str, tuple[str, str]]:
        """HAProxy's view of the replicas from its stats socket: name -> (status, last check's status)."""
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(str(self.haproxy_socket))
            s.sendall(b"show stat\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        header, *rows = data.decode().lstrip("# ").splitlines()
        cols = header.split(",")
        out = {}
        for row in rows:
            stat = dict(zip(cols, row.split(",")))
            if stat.get("pxname") == "nmt" and stat.get("svname", "").startswith("nmt"):
                out[stat["svname"]] = (stat["status"], stat["check_status"].lstrip("* "))
        return out

    def counts(self) -> list[Optional[float]]:
        return [r.served() for r in self.replicas]

    def stop(self) -> None:
        for p in self.balancers:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
        for r in self.replicas:
            r.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    f = Fleet(tmp_path_factory.mktemp("scaleout"))
    try:
        yield f.start()
    finally:
        f.stop()


@pytest.fixture(scope="module")
def clients(fleet):
    """One long-lived client per path (as an application would hold one), shared by the tests."""
    made = {path: TranslatorClient(fleet.targets[path], timeout=30) for path in PATHS}
    yield made
    for c in made.values():
        c.close()


SENTENCES = flickr_sentences(40)


def settled(fleet: Fleet, before: list[float], expected: int) -> list[float]:
    """Per-replica deltas once they add up to `expected` (a replica counts a call just after answering it)."""
    def deltas():
        now = fleet.counts()
        if None in now:
            return None
        d = [a - b for a, b in zip(now, before)]
        return d if sum(d) >= expected else None
    return until(f"{expected} calls counted by the replicas", deltas, 20)


def check_spread(fleet: Fleet, client: TranslatorClient, path: str) -> list[float]:
    """Every replica reachable through `path` gets calls; then SPREAD_CALLS calls split within 1.5x."""
    base = fleet.counts()
    sent = 0

    def all_reached():  # a replica just (re)started is admitted after its health check / reconnect
        nonlocal sent
        client.translate([SENTENCES[sent % len(SENTENCES)]], max_output_tokens=8)
        sent += 1
        now = fleet.counts()
        return None not in now and all(a > b for a, b in zip(now, base))
    until(f"every replica to get a call through {path}", all_reached, 40, every=0)
    settled(fleet, base, sent)
    before = fleet.counts()
    for i in range(SPREAD_CALLS):
        client.translate([SENTENCES[i % len(SENTENCES)]], max_output_tokens=8)
    d = settled(fleet, before, SPREAD_CALLS)
    assert min(d) > 0 and max(d) <= 1.5 * min(d), f"{path}: calls per replica {d}"
    return d


def test_targets_choose_the_policy_and_carry_retries_and_keepalive():
    def config(target, **kw):
        t, opts = channel_args(target, Balancing(**kw))
        return t, dict(opts), json.loads(dict(opts)["grpc.service_config"])
    t, opts, sc = config("127.0.0.1:5001, localhost:5002")
    assert t == "ipv4:127.0.0.1:5001,127.0.0.1:5002"  # a name counts once, by its first IPv4 address
    assert sc["loadBalancingConfig"] == [{"round_robin": {}}]
    assert sc["healthCheckConfig"] == {"serviceName": SERVICE_NAME}
    (method,) = sc["methodConfig"]
    assert method["name"] == [{"service": SERVICE_NAME}]
    assert method["retryPolicy"]["retryableStatusCodes"] == ["UNAVAILABLE", "CANCELLED"] and method["retryPolicy"]["maxAttempts"] == 5
    assert opts["grpc.enable_retries"] == 1
    # The client's pings stay within what the server accepts by default.
    assert opts["grpc.keepalive_time_ms"] >= ServerConfig().keepalive_min_ping_interval_ms
    assert opts["grpc.keepalive_permit_without_calls"] == int(ServerConfig().keepalive_permit_without_calls)
    t, opts, sc = config("[::1]:5001,127.0.0.1:5002")
    assert t == "ipv6:[::1]:5001,[::ffff:7f00:1]:5002"  # IPv4 mapped into IPv6 when the families mix
    t, opts, sc = config("dns:///nmt-serve-headless.prod.svc.cluster.local:50051")
    assert t.startswith("dns:///") and sc["loadBalancingConfig"] == [{"round_robin": {}}]
    # One address (a server, or a balancer in front of several): pick_first, no health watch.
    t, opts, sc = config("localhost:50051")
    assert t == "localhost:50051" and sc["loadBalancingConfig"] == [{"pick_first": {}}] and "healthCheckConfig" not in sc
    t, opts, sc = config("localhost:50051", retries=0, lb="round_robin")
    assert "methodConfig" not in sc and opts["grpc.enable_retries"] == 0 and "healthCheckConfig" in sc
    with pytest.raises(ValueError):
        channel_args("localhost,127.0.0.1:5001", Balancing())  # a list entry without a port


@pytest.mark.parametrize("path", PATHS)
def test_calls_spread_evenly_over_replicas(fleet, clients, path):
    check_spread(fleet, clients[path], path)


def test_health_list_and_reflection_v1(fleet):
    r = fleet.replicas[2]
    with grpc.insecure_channel(r.target) as ch:
        statuses = health_pb2_grpc.HealthStub(ch).List(health_pb2.HealthListRequest(), timeout=5).statuses
        assert {name: s.status for name, s in statuses.items()} == {
            "": health_pb2.HealthCheckResponse.SERVING, "nmt.v1.Translator": health_pb2.HealthCheckResponse.SERVING,
            LIVENESS: health_pb2.HealthCheckResponse.SERVING}
        _v1_reflection_file()
        pool = descriptor_pool.Default()
        request = GetMessageClass(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionRequest"))
        response = GetMessageClass(pool.FindMessageTypeByName("grpc.reflection.v1.ServerReflectionResponse"))
        for package in ("v1", "v1alpha"):
            call = ch.stream_stream(f"/grpc.reflection.{package}.ServerReflection/ServerReflectionInfo",
                                    request_serializer=request.SerializeToString,
                                    response_deserializer=response.FromString)
            listed, described = call(iter([request(list_services=""),
                                           request(file_containing_symbol="nmt.v1.Translator")]), timeout=5)
            names = {s.name for s in listed.list_services_response.service}
            assert {"nmt.v1.Translator", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection",
                    "grpc.reflection.v1alpha.ServerReflection"} <= names
            assert described.file_descriptor_response.file_descriptor_proto


def test_cli_and_loadgen_balance_over_replicas(fleet, tmp_path):
    """The command-line client and the load generator take the same replica list (round_robin)."""
    base = fleet.counts()
    run = lambda *a: subprocess.run([sys.executable, "-m", *a], cwd=ROOT, capture_output=True, text=True,  # noqa: E731
                                    timeout=120)
    out = run("client", "--target", fleet.targets["round_robin"], "translate", "A man is riding a bike.")
    assert out.returncode == 0 and out.stdout.strip(), out.stderr
    src = tmp_path / "src.en"
    src.write_text("\n".join(SENTENCES) + "\n")
    res = run("client.loadgen", "--target", fleet.targets["round_robin"], "--lb", "round_robin", "--src-file",
              str(src), "--rpc", "unary", "--max-output-tokens", "8", "--concurrency", "3", "--requests", "30",
              "--warmup", "0", "--quiet", "--json", str(tmp_path / "run.json"))
    assert res.returncode == 0, res.stderr
    (level,) = json.loads((tmp_path / "run.json").read_text())["levels"]
    assert level["codes"] == {"OK": 30}
    d = settled(fleet, base, 31)
    assert min(d) > 0, d  # every replica got some of them


@dataclass
class Outcome:
    path: str
    kind: str  # unary | stream
    start: float
    end: float
    code: Optional[str]  # None = OK


class Load:
    """Unary and streaming callers on every path until stopped; every call's outcome is kept."""

    def __init__(self, clients: dict[str, TranslatorClient]):
        self.clients = clients
        self.outcomes: list[Outcome] = []
        self._stop = threading.Event()
        self._lock = threading.Lock()
        workers = [(p, "unary") for p in PATHS] + [(p, "stream") for p in PATHS] + [("round_robin", "unary")]
        self.threads = [threading.Thread(target=self._work, args=w, daemon=True) for w in workers]

    def _work(self, path: str, kind: str) -> None:
        c, i = self.clients[path], 0
        while not self._stop.is_set():
            text = SENTENCES[i % len(SENTENCES)]
            i += 1
            t0, code = time.monotonic(), None
            try:
                if kind == "unary":
                    c.translate([text], max_output_tokens=12)
                else:
                    *_, last = c.translate_stream(text, max_output_tokens=24)
                    # OK means finished as it would have been: a drain must not end a stream CANCELLED.
                    code = "NO_FINAL_MESSAGE" if not last.final else \
                        "FINISHED_CANCELLED" if last.finish_reason == pb.FINISH_REASON_CANCELLED else None
            except grpc.RpcError as e:
                code = e.code().name
            with self._lock:
                self.outcomes.append(Outcome(path, kind, t0, time.monotonic(), code))

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        for t in self.threads:
            t.join(60)

    def failures(self) -> list[Outcome]:
        with self._lock:
            return [o for o in self.outcomes if o.code]

    def oks_since(self, t: float) -> dict[str, int]:
        with self._lock:
            done = [o for o in self.outcomes if o.start > t and not o.code]
        return {p: sum(o.path == p for o in done) for p in PATHS}


def progressed(fleet: Fleet, load: Load, since: float, per_path: int = 3, replicas=(0, 1, 2), timeout: float = 60):
    """Until every path completed `per_path` calls started after `since`, and the given replicas served."""
    base = fleet.counts()

    def check():
        now = fleet.counts()
        return all(v >= per_path for v in load.oks_since(since).values()) and all(
            now[i] is not None and base[i] is not None and now[i] > base[i] for i in replicas)
    until("the load to make progress on every path", check, timeout)


def refused_after(replica: Replica, client: TranslatorClient) -> Optional[float]:
    """Call the replica directly until it refuses or exits; when it refused (monotonic).

    Refused is UNAVAILABLE (the service stopped accepting), or CANCELLED when the call reaches the
    server in the instant grpc's own server shuts down after the drain: grpc core cancels calls it
    holds then, before any handler runs (seen as CANCELLED within ~15 ms of the second SIGTERM for
    calls arriving at an idle replica). Either way nothing was done; the client library retries both
    before a first message."""
    while replica.proc.poll() is None:
        try:
            client.translate(["A dog."], max_output_tokens=4)
        except grpc.RpcError as e:
            if e.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                raise
            return time.monotonic()
        time.sleep(0.02)
    return None


def test_rotation_sigterm_kill_and_replacement(fleet, clients):
    a, b = fleet.replicas[0], fleet.replicas[1]
    direct = TranslatorClient(a.target, timeout=10, retries=0, balancing=Balancing(retries=0))
    with Load(clients) as load:
        progressed(fleet, load, time.monotonic())

        # SIGTERM: NOT_SERVING at once while calls are still answered (lame duck) ...
        a.proc.send_signal(signal.SIGTERM)
        until("NOT_SERVING", lambda: direct.health() == "NOT_SERVING", 10, every=0.01)
        assert direct.health(LIVENESS) == "SERVING"  # a draining replica is alive: liveness probes leave it be
        direct.translate(["A dog."], max_output_tokens=4)
        # ... and HAProxy's gRPC health check takes it out (a failed check, not a refused connection).
        until("HAProxy to mark the lame duck DOWN", lambda: fleet.haproxy_servers()["nmt1"] == ("DOWN", "L7TOUT"),
              20, every=0.2)
        direct.translate(["A dog."], max_output_tokens=4)
        # A second SIGTERM ends the lame duck: new work is refused, in-flight work drains, exit 0.
        a.proc.send_signal(signal.SIGTERM)
        assert refused_after(a, direct) is not None, "new work was never refused after the second SIGTERM"
        assert a.proc.wait(30) == 0
        progressed(fleet, load, time.monotonic(), replicas=(1, 2))
        assert not load.failures(), f"SIGTERM (lame duck + drain) failed calls: {load.failures()}"

        # The replacement, on the same address, gets traffic again through every path (checked below).
        a.start().wait_serving()
        progressed(fleet, load, time.monotonic())

        # kill -9: only streams in flight on that replica may fail; unary calls are retried.
        killed_at = time.monotonic()
        b.proc.kill()
        b.proc.wait(10)
        progressed(fleet, load, time.monotonic(), replicas=(0, 2))
    direct.close()
    failures = load.failures()
    assert all(f.kind == "stream" and f.start < killed_at < f.end for f in failures), \
        f"calls failed that were not streams in flight at the kill: {failures}\n{fleet.logs()}"
    assert len(failures) <= len(PATHS)  # one stream caller per path, one call each in flight
    assert sum(not o.code for o in load.outcomes) > 100

    b.start().wait_serving()
    for path in PATHS:  # the long-lived clients reach both restarted replicas again, evenly
        check_spread(fleet, clients[path], path)

    # A lame duck ends by itself after --lame-duck-s: nothing is refused before that.
    c = fleet.replicas[2]
    with TranslatorClient(c.target, timeout=10, retries=0, balancing=Balancing(retries=0)) as direct:
        sigterm_at = time.monotonic()
        c.proc.send_signal(signal.SIGTERM)
        refused_at = refused_after(c, direct)
        assert c.proc.wait(30) == 0
    assert refused_at is not None, "the lame duck ended without refusing new work"
    assert refused_at - sigterm_at >= LAME_DUCK_S, "refused during the lame duck"
