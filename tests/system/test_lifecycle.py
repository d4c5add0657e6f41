"""`python -m server` as a user runs it: flags, health, SIGTERM drain; and the client CLI against it."""
import asyncio
import signal
import subprocess
import sys
import time

import grpc
import pytest

from client import TranslatorClient
from benchmarks.harness import free_port, run_server
from tests.serving import ROOT, EngineGate, ServerThread, start_subprocess, wait_for, wait_process_serving

from protos.nmt.v1 import translator_pb2 as pb
from server.config import ServerConfig


@pytest.fixture
def served():
    port, mport = free_port(), free_port()
    # The guard off: a 200-token stream really decodes 200 tokens (on, it ends by itself in ~90).
    proc = start_subprocess(port, mport, "--grace-period-s", "20", "--runaway-guard", "false")
    client = TranslatorClient(f"127.0.0.1:{port}", timeout=60, retries=0)
    try:
        wait_process_serving(client, proc)
        yield proc, client, port
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


# Sampled (seed 3) for 200 tokens; EOS is banned before that (min_output_tokens), so the stream surely runs.
LONG_TEXT = "A man in a blue shirt and a woman in a red dress are walking down a busy street in the city."


def test_sigterm_drains_in_flight_work_and_refuses_new(served):
    proc, client, _ = served
    assert client.health() == "SERVING" and client.health("nmt.v1.Translator") == "SERVING"
    # Near-uniform sampling rarely ends early: the stream is surely still running at SIGTERM.
    stream = client.translate_stream(LONG_TEXT, max_output_tokens=200, min_output_tokens=200,
                                     temperature=5.0, seed=3)
    first = next(stream)  # in flight
    proc.send_signal(signal.SIGTERM)
    statuses, refused = [], None
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            statuses.append(client.health())
        except grpc.RpcError:
            break
        try:
            client.translate(["A dog."], timeout=5)
        except grpc.RpcError as e:
            refused = e.code()
        if "NOT_SERVING" in statuses and refused:
            break
        time.sleep(0.02)
    assert "NOT_SERVING" in statuses
    assert refused == grpc.StatusCode.UNAVAILABLE
    rest = list(stream)  # the in-flight stream finishes as it would have: all 200 tokens
    assert rest[-1].final and rest[-1].finish_reason == pb.FINISH_REASON_LENGTH, rest[-1]
    assert rest[-1].output_tokens == 200 == len(first.token_ids) + sum(len(m.token_ids) for m in rest)
    assert proc.wait(30) == 0


def test_drain_finishes_a_stream_held_mid_decode():
    """The same promise with no race: the engine is held (EngineGate) with the stream 3 tokens in
    when the drain begins, so the stream surely has most of its decode ahead of it; new work is
    refused meanwhile; released, it finishes whole (LENGTH, 200 tokens), not CANCELLED."""
    srv = ServerThread(runaway_guard=False, grace_period_s=60, metrics_port=0).start()
    model = srv.app.models["multi30k-en-de-small"]
    try:
        with TranslatorClient(srv.target, timeout=60, retries=0) as client, \
                EngineGate(model, let_through=3) as gate:
            stream = client.translate_stream(LONG_TEXT, max_output_tokens=200, min_output_tokens=200,
                                             temperature=5.0, seed=3)
            first = next(stream)
            stopping = asyncio.run_coroutine_threadsafe(srv.app.stop(), srv.loop)
            assert wait_for(lambda: client.health() == "NOT_SERVING" and not srv.app.service.accepting)
            with pytest.raises(grpc.RpcError) as refused:
                client.translate(["A dog."], timeout=5)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert srv.metric("nmt_running_requests") == 1 and not stopping.done()  # held mid-decode
            gate.open()
            rest = list(stream)
        assert rest[-1].final and rest[-1].finish_reason == pb.FINISH_REASON_LENGTH, rest[-1]
        assert 200 == rest[-1].output_tokens == len(first.token_ids) + sum(len(m.token_ids) for m in rest)
        stopping.result(60)
    finally:
        srv.stop()


def test_client_cli(served):
    _, _, port = served
    run = lambda *a: subprocess.run([sys.executable, "-m", "client", "--target", f"127.0.0.1:{port}", *a],  # noqa: E731
                                    cwd=ROOT, capture_output=True, text=True, timeout=60)
    out = run("translate", "A man is riding a bike.")
    assert out.returncode == 0 and out.stdout.strip()
    streamed = run("translate", "--stream", "A man is riding a bike.")
    assert streamed.returncode == 0 and streamed.stdout == out.stdout
    assert run("health").stdout.strip() == "SERVING"
    assert '"defaultModel": "multi30k-en-de-small"' in run("models").stdout
    bad = run("translate", "--beam", "99", "x")
    assert bad.returncode == 1 and "INVALID_ARGUMENT" in bad.stderr
    alts = run("translate", "--prefix", "Ein", "--alternatives", "3", "--repetition-penalty", "1.2",
               "A man is riding a bike.")
    lines = alts.stdout.splitlines()
    assert alts.returncode == 0 and len(lines) == 3 and len(set(lines)) == 3, alts.stdout + alts.stderr
    assert all(line.startswith("Ein") for line in lines)


def test_every_setting_has_a_flag_and_an_env_fallback(monkeypatch):
    monkeypatch.setenv("NMT_PORT", "6000")
    monkeypatch.setenv("NMT_WARMUP", "false")
    cfg = ServerConfig.from_args(["--max-batch-size", "8"])
    assert (cfg.port, cfg.warmup, cfg.max_batch_size) == (6000, False, 8)
    assert ServerConfig.from_args(["--port", "7000"]).port == 7000  # a flag beats the environment
    help_text = ServerConfig.parser().format_help()
    for name in ServerConfig.__dataclass_fields__:
        assert "--" + name.replace("_", "-") in help_text and "NMT_" + name.upper() in help_text


def test_bad_model_repository_fails_fast(tmp_path):
    proc = run_server("--model-repository", str(tmp_path), "--port", "0", timeout=60)
    assert proc.returncode != 0 and "no bundles under" in proc.stderr


def test_health_says_serving_only_once_every_port_listens():
    """The overall health ("") turns SERVING last: grpcio-health-checking's servicer starts with it SERVING,
    and the gRPC port opened ~0.3 s before the HTTP port (the language identifier warms in between), so a
    readiness probe could pass while HTTP still refused connections. Polled every 10 ms from launch, each
    time on a new channel (one channel would wait out grpc's reconnect backoff and miss that window): at the
    first SERVING, the HTTP port takes a connection at once."""
    import socket

    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from benchmarks.harness import ServerProcess
    server = ServerProcess(http_port=0)
    server.launch()
    try:
        end, status = time.monotonic() + 180, None
        while time.monotonic() < end and status != health_pb2.HealthCheckResponse.SERVING:
            with grpc.insecure_channel(server.target) as channel:
                try:
                    status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0).status
                except grpc.RpcError:
                    status = None  # not listening yet
            time.sleep(0.01)
        assert status == health_pb2.HealthCheckResponse.SERVING
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=5):
            pass  # refused before the fix: SERVING came while the HTTP port was not yet listening
    finally:
        server.stop()
