"""The CPU image, built and run for real where a Docker daemon answers: it serves, answers health
through its own HEALTHCHECK, runs as uid 10001 on a read-only /app, and drains on docker stop.

Without a daemon (CI's machine, most laptops in a sandbox) the test skips and says so; the
Dockerfiles are then only checked statically (tests/system/test_deploy.py). The base image is
NMT_IMAGE_BASE when set; else python:3.11-slim when local or pullable; else the image that
deploy/offline-base.sh builds for hosts without Docker Hub (nmt-offline-base:3.11), when built.
"""
import os
import shutil
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from benchmarks.harness import free_port
from tests.serving import ServerThread, wait_for

from client import TranslatorClient

ROOT = Path(__file__).resolve().parents[2]
OFFICIAL_BASE, OFFLINE_BASE = "python:3.11-slim", "nmt-offline-base:3.11"
SENTENCES = ["A man rides a bicycle down the street.", "Two dogs play in the snow."]


def docker(*args: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=timeout, check=check)


@pytest.fixture(scope="module")
def image():
    if shutil.which("docker") is None or docker("info", check=False, timeout=20).returncode != 0:
        pytest.skip("no Docker daemon answers here (`docker info` fails); the image is checked statically only")
    base = os.environ.get("NMT_IMAGE_BASE") or next(
        (b for b in (OFFICIAL_BASE, OFFLINE_BASE) if docker("image", "inspect", b, check=False).returncode == 0),
        None)
    if base is None and docker("pull", OFFICIAL_BASE, check=False, timeout=300).returncode == 0:
        base = OFFICIAL_BASE
    if base is None:
        pytest.skip(f"no base image: {OFFICIAL_BASE} is neither local nor pullable, and {OFFLINE_BASE} is not "
                    "built (sudo sh deploy/offline-base.sh)")
    tag = f"nmt-serve:test-{uuid.uuid4().hex[:8]}"
    build = docker("build", "--build-arg", f"BASE_IMAGE={base}", "-t", tag, str(ROOT), check=False, timeout=900)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    yield tag
    docker("rmi", "-f", tag, check=False)


def test_image_serves_reports_healthy_and_drains_on_stop(image):
    grpc_port, metrics_port = free_port(), free_port()
    name = f"nmt-test-{uuid.uuid4().hex[:8]}"
    docker("run", "-d", "--name", name, "-p", f"127.0.0.1:{grpc_port}:50051",
           "-p", f"127.0.0.1:{metrics_port}:9090", image)
    try:
        target = f"127.0.0.1:{grpc_port}"
        with TranslatorClient(target, timeout=30, retries=0) as client:
            def serving() -> bool:
                try:
                    return client.health(timeout=2) == "SERVING"
                except Exception:  # noqa: BLE001 (still starting: connection refused or reset)
                    return False
            assert wait_for(serving, 120, every=0.5), docker("logs", name).stderr[-3000:]
            out = client.translate(SENTENCES)
        # The same model repository, served from this checkout: the same words, exactly.
        local = ServerThread(warmup=False).start()
        try:
            with TranslatorClient(local.target, timeout=30, retries=0) as client:
                expected = client.translate(SENTENCES)
        finally:
            local.stop()
        assert out.model == expected.model
        assert [t.hypotheses[0].text for t in out.translations] == [t.hypotheses[0].text for t in expected.translations]
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
        assert 'nmt_requests_total{code="OK",rpc="Translate"} 1.0' in metrics  # the container's own count

        # The image's own HEALTHCHECK (python -m client ... health on $NMT_PORT) turns healthy.
        def health_status() -> str:
            return docker("inspect", "--format", "{{.State.Health.Status}}", name).stdout.strip()
        assert wait_for(lambda: health_status() == "healthy", 90, every=0.5), health_status()

        assert docker("exec", name, "id", "-u").stdout.strip() == "10001"
        assert docker("exec", name, "touch", "/app/x", check=False).returncode != 0  # the code is not writable

        # docker stop: SIGTERM -> lame duck (NMT_LAME_DUCK_S=5) -> drain -> exit 0, well inside -t 30.
        t0 = time.monotonic()
        docker("stop", "-t", "30", name, timeout=60)
        assert time.monotonic() - t0 < 25
        assert docker("inspect", "--format", "{{.State.ExitCode}}", name).stdout.strip() == "0"
        logs = docker("logs", name).stderr
        assert "lame_duck" in logs and "stopped" in logs, logs[-2000:]
    finally:
        docker("rm", "-f", "-v", name, check=False)
