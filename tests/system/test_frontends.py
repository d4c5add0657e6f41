"""Several frontend processes over one engine core (--engine-core process --frontends N): the kernel
spreads connections over them, each answers as the primary does, the metrics port shows them as
one server, a killed frontend loses only its own calls (the core cancels its jobs and it comes
back), and SIGTERM drains every frontend.

Which process holds a connection is read from /proc (tests/serving.py tcp_connections), so the
tests pick connections by where they landed instead of hoping the kernel's hash spreads them."""
from __future__ import annotations

import json
import re
import os
import signal
import urllib.request
from pathlib import Path

import grpc
import pytest

from benchmarks.harness import descendants, free_port
from client.client import TranslatorClient, options
from protos.nmt.v1 import translator_pb2 as pb
from protos.nmt.v1 import translator_pb2_grpc as pb_grpc
from tests.serving import read_to_end, start_subprocess, tcp_connections, wait_for, wait_process_serving

LONG = dict(max_output_tokens=250, min_output_tokens=250, temperature=5.0, seed=1)


def channel_to(target: str) -> grpc.Channel:
    # A subchannel pool of its own: otherwise channels to one target share one TCP connection.
    return grpc.insecure_channel(target, options=[("grpc.use_local_subchannel_pool", 1)])


def holder(stub_channel_port: int, server_port: int, pids: list[int]) -> int:
    """The process (of `pids`) that accepted the connection whose client side is `stub_channel_port`."""
    for pid in pids:
        if (server_port, stub_channel_port) in tcp_connections(pid):
            return pid
    raise AssertionError(f"no server process holds the connection from port {stub_channel_port}")


def connections_by_holder(target: str, port: int, pids: list[int], wanted: set[int], limit: int = 300) -> dict:
    """Open connections (one Translate each, so they are established) until every process in `wanted`
    holds one; returns pid -> [(channel, stub)] for every connection opened."""
    me = os.getpid()
    held: dict[int, list] = {pid: [] for pid in pids}
    for _ in range(limit):
        before = {c for c in tcp_connections(me) if c[1] == port}
        channel = channel_to(target)
        stub = pb_grpc.TranslatorStub(channel)
        stub.Translate(pb.TranslateRequest(texts=["A dog."]), timeout=60)
        (local, _), = {c for c in tcp_connections(me) if c[1] == port} - before
        held[holder(local, port, pids)].append((channel, stub))
        if all(held[pid] for pid in wanted):
            return held
    raise AssertionError(f"{limit} connections never reached every frontend: {[len(v) for v in held.values()]}")


def http_by_holder(port: int, pids: list[int], wanted: set[int], limit: int = 300) -> dict:
    """HTTP keep-alive clients (httpx), one per process in `wanted`, found as connections_by_holder finds
    gRPC ones: pid -> client (the others opened on the way are closed)."""
    import httpx
    me, found = os.getpid(), {}
    for _ in range(limit):
        before = {c for c in tcp_connections(me) if c[1] == port}
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        assert client.get("/healthz").status_code == 200
        (local, _), = {c for c in tcp_connections(me) if c[1] == port} - before
        pid = holder(local, port, pids)
        if pid in wanted and pid not in found:
            found[pid] = client
            if set(found) == wanted:
                return found
        else:
            client.close()
    raise AssertionError(f"{limit} HTTP connections never reached every frontend: {sorted(found)}")


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_connections_spread_over_frontends_and_metrics_are_one_view(start_server):
    srv = start_server(engine_core="process", engine_replicas=1, frontends=3, runaway_guard=False)
    extra = srv.app.frontends.pids
    assert len(extra) == 2
    pids = [os.getpid(), *extra]  # the primary frontend runs in this test process (ServerThread)
    before = srv.metric("nmt_requests_total", missing_ok=True, rpc="Translate", code="OK")
    held = connections_by_holder(srv.target, srv.app.port, pids, set(pids))
    calls = sum(map(len, held.values()))
    # Every frontend answered calls; the metrics port counts all of them, once.
    assert srv.settled_metric("nmt_requests_total", before + calls, rpc="Translate", code="OK") == before + calls
    text = srv.metrics_text()
    assert text.count("# TYPE nmt_requests_total counter") == 1
    assert "nmt_running_requests" in text  # the core's series, through the primary
    # Every process's resident memory, one series each, read by the primary: the same pids /v1/status lists
    replica = srv.app.core.members[0].pid
    series = {(role, name): float(value) for name, role, value in re.findall(
        r'^nmt_process_resident_memory_bytes\{name="(\w+)",role="(\w+)"\} (\S+)$', text, re.M)}
    for key in (("frontend", "0"), ("frontend", "1"), ("frontend", "2"), ("replica", "0")):
        assert series[key] > 10 << 20, (key, series)
    for _ in range(9):  # a connection each: whichever frontend answers (an extra one reads /proc), the same list
        status = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{srv.app.http_port}/v1/status",
                                                   timeout=60).read())
        listed = {(p["role"], p["name"]): p["pid"] for p in status["memory"]}
        assert {k: v for k, v in listed.items() if k[0] != "background"} == {
            ("frontend", "0"): os.getpid(), ("frontend", "1"): srv.app.frontends.procs[1].pid,
            ("frontend", "2"): srv.app.frontends.procs[2].pid, ("replica", "0"): replica}
        assert status["memoryTotalBytes"] == sum(p["rssBytes"] for p in status["memory"])
    http_before = srv.metric("nmt_http_requests_total", missing_ok=True)
    body = json.dumps({"texts": ["A dog runs."]}).encode()
    for _ in range(9):  # a connection each (urllib closes it): spread over the HTTP listeners too
        request = urllib.request.Request(f"http://127.0.0.1:{srv.app.http_port}/v1/translate", data=body,
                                         headers={"Content-Type": "application/json"})
        assert json.loads(urllib.request.urlopen(request, timeout=60).read())["translations"]
    assert srv.settled_metric("nmt_http_requests_total", http_before + 9) == http_before + 9
    for channels in held.values():
        for channel, _ in channels:
            channel.close()


def test_a_killed_frontend_loses_only_its_own_calls(start_server):
    srv = start_server(engine_core="process", engine_replicas=1, frontends=2, runaway_guard=False)
    (extra,) = srv.app.frontends.pids
    me, port = os.getpid(), srv.app.port
    held = connections_by_holder(srv.target, port, [me, extra], {me, extra})
    (_, on_extra), (_, on_primary) = held[extra][0], held[me][0]
    produced = srv.metric("nmt_output_tokens_total", missing_ok=True)
    request = pb.TranslateStreamRequest(text="A dog runs on the beach.", options=options(**LONG))
    # 24 more rows, through the primary, make each step several times longer: none of the four can decode its
    # 250 tokens in the moments between its first message and the freeze below on a busy machine.
    background = [on_primary.TranslateStream(request, timeout=120) for _ in range(24)]
    streams = [stub.TranslateStream(request, timeout=120) for stub in (on_extra, on_extra, on_primary, on_primary)]
    for s in streams:
        next(s)  # all four decoding in the core
    core = srv.app.core.members[0].pid
    os.kill(core, signal.SIGSTOP)  # nothing finishes while the frontend dies
    try:
        os.kill(extra, signal.SIGKILL)
        assert wait_for(lambda: srv.metric("nmt_frontend_restarts_total") == 1)  # the core was told to forget it
    finally:
        os.kill(core, signal.SIGCONT)
    ends = [read_to_end(s) for s in streams + background]
    assert [code for code, _ in ends] == [grpc.StatusCode.UNAVAILABLE] * 2 + [grpc.StatusCode.OK] * 26
    assert all(got[-1].output_tokens == 250 for _, got in ends[2:])
    srv.wait_idle()
    # Only the primary's streams were decoded to the end: the dead frontend's jobs were cancelled.
    assert srv.metric("nmt_output_tokens_total") == produced + 26 * 250
    assert wait_for(lambda: len(srv.app.frontends.pids) == 1 and srv.app.frontends.pids[0] != extra, timeout=60)
    with TranslatorClient(srv.target, timeout=60, retries=0) as client:
        assert client.translate(["A dog."]).translations[0].hypotheses[0].text


def test_sigterm_drains_every_frontend():
    port, metrics_port = free_port(), free_port()
    proc = start_subprocess(port, metrics_port, "--engine-core", "process", "--frontends", "2",
                            "--runaway-guard", "false", "--grace-period-s", "60")
    try:
        with TranslatorClient(f"127.0.0.1:{port}", timeout=60, retries=0) as client:
            wait_process_serving(client, proc)
        children = descendants(proc.pid)
        (extra,) = [p for p in children if "server.frontend.extra" in cmdline(p)]
        target = f"127.0.0.1:{port}"
        held = connections_by_holder(target, port, [proc.pid, extra], {proc.pid, extra})
        request = pb.TranslateStreamRequest(text="A dog runs on the beach.", options=options(**LONG))
        streams = [held[pid][0][1].TranslateStream(request, timeout=120) for pid in (proc.pid, extra)]
        firsts = [next(s) for s in streams]
        proc.send_signal(signal.SIGTERM)
        for first, stream in zip(firsts, streams):
            code, rest = read_to_end(stream)
            assert code == grpc.StatusCode.OK
            assert rest[-1].final and rest[-1].output_tokens == 250
        assert proc.wait(60) == 0
        assert wait_for(lambda: not any(os.path.exists(f"/proc/{p}") and "zombie" not in
                                        Path(f"/proc/{p}/status").read_text().lower() for p in children))
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.parametrize("flags,named", [({"frontends": 2, "engine_core": "thread"}, "--frontends"),
                                         ({"frontends": -1, "engine_core": "process"}, "--frontends"),
                                         ({"engine_replicas": 2, "engine_core": "thread"}, "--engine-replicas"),
                                         ({"engine_replicas": -1}, "--engine-replicas")])
def test_frontends_and_replicas_need_the_core_process(flags, named):
    from server.config import ServerConfig
    problems = ServerConfig(**flags).problems()
    assert any(named in p for p in problems), problems


def test_lame_duck_reaches_every_frontend_and_the_core_keeps_serving():
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from tests.serving import ServerThread
    srv = ServerThread(engine_core="process", frontends=2, lame_duck_s=60).start()
    stopping = None
    try:
        (extra,) = srv.app.frontends.pids
        me, port = os.getpid(), srv.app.port
        held = connections_by_holder(srv.target, port, [me, extra], {me, extra})
        channels = {pid: held[pid][0][0] for pid in (me, extra)}

        def health(pid: int) -> str:
            reply = health_pb2_grpc.HealthStub(channels[pid]).Check(health_pb2.HealthCheckRequest(), timeout=10)
            return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        assert health(me) == health(extra) == "SERVING"
        stopping = srv.begin_stop(5.0)
        assert wait_for(lambda: health(me) == health(extra) == "NOT_SERVING")  # both out of rotation
        for pid in (me, extra):  # ... and both still serve new work through the core: lame duck
            reply = pb_grpc.TranslatorStub(channels[pid]).Translate(pb.TranslateRequest(texts=["A dog."]), timeout=60)
            assert reply.translations[0].hypotheses[0].text
    finally:
        srv.finish_stop(stopping)  # a second stop ends the lame duck here; the others follow
    assert wait_for(lambda: not os.path.exists(f"/proc/{extra}") or
                    "zombie" in Path(f"/proc/{extra}/status").read_text().lower(), timeout=90)


def test_a_document_uploaded_to_one_frontend_is_answered_by_every_one(start_server):
    """Document jobs are translated by the process that took the upload, and their status, result and
    deletion are answered by any frontend (server/files/spool.py): a DeepL client polls on whichever
    connection it has, and the port is shared."""
    srv = start_server(engine_core="process", engine_replicas=1, frontends=2, runaway_guard=False)
    (extra,) = srv.app.frontends.pids
    me = os.getpid()
    by = http_by_holder(srv.app.http_port, [me, extra], {me, extra})
    try:
        text = "A man is riding a bike down the street.\n\nTwo dogs play in the snow.\n"
        upload = by[extra].post("/v1/files", data={"target_language": "de", "source_language": "en"},
                                files={"file": ("story.txt", text.encode())})
        assert upload.status_code == 200, upload.text
        ident = upload.json()["id"]
        assert wait_for(lambda: by[me].get(f"/v1/files/{ident}").json()["status"] == "done", timeout=60)
        status = by[me].get(f"/v1/files/{ident}").json()
        assert status["segmentsDone"] == status["segmentsTotal"] > 0
        got = by[me].get(f"/v1/files/{ident}/content")  # the primary serves the extra frontend's result
        assert got.status_code == 200 and got.text.count("\n") == text.count("\n")
        assert got.text != text and got.headers["content-disposition"].startswith("attachment")
        assert by[extra].get(f"/v1/files/{ident}/content").status_code == 404  # downloaded once
        assert by[extra].get(f"/v1/files/{ident}").status_code == 404

        # DeepL's API, the other way round: uploaded at the primary, polled and fetched at the extra one.
        deepl_upload = by[me].post("/v2/document", data={"target_lang": "DE", "source_lang": "EN"},
                                   files={"file": ("story.txt", text.encode())})
        handle = deepl_upload.json()
        form = {"document_key": handle["document_key"]}
        assert wait_for(lambda: by[extra].post(f"/v2/document/{handle['document_id']}", data=form).json()["status"]
                        == "done", timeout=60)
        assert by[extra].post(f"/v2/document/{handle['document_id']}/result", data=form).text == got.text

        # Deleted at one process, gone at the other.
        second = by[extra].post("/v1/files", data={"target_language": "de"}, files={"file": ("b.txt", b"A dog.")})
        ident = second.json()["id"]
        assert by[me].delete(f"/v1/files/{ident}").status_code == 200
        assert by[extra].get(f"/v1/files/{ident}").status_code == 404
        assert by[me].get(f"/v1/files/{ident}/content").status_code == 404
    finally:
        for client in by.values():
            client.close()
