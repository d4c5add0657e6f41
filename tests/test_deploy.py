"""Docker cannot run here: check that the compose file, the Dockerfiles and the Prometheus
configuration agree with the server's real flags, ports and paths."""
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from serving import ROOT

from server.config import ServerConfig


@pytest.fixture(scope="module")
def compose():
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def container_ports(service) -> set[int]:
    return {int(str(p).split(":")[-1]) for p in service["ports"]}


@pytest.mark.parametrize("name", ["nmt", "nmt-gpu"])
def test_compose_command_is_valid_server_flags(compose, name):
    service = compose["services"][name]
    cfg = ServerConfig.parser().parse_args(service["command"])  # unknown flags would exit here
    assert {cfg.port, cfg.metrics_port} <= container_ports(service)


def test_prometheus_scrapes_the_metrics_port(compose):
    service = compose["services"]["nmt"]
    metrics_port = ServerConfig.parser().parse_args(service["command"]).metrics_port
    volume = compose["services"]["prometheus"]["volumes"][0]
    host_path, container_path = volume.split(":")[:2]
    assert container_path == "/etc/prometheus/prometheus.yml"
    prom = yaml.safe_load((ROOT / host_path).read_text())
    (job,) = prom["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"nmt:{metrics_port}"]
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "config", str(ROOT / host_path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.gpu"])
def test_dockerfiles_copy_real_paths_and_agree_with_the_server(dockerfile, compose):
    text = (ROOT / dockerfile).read_text()
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        for src in line.split()[:-1]:
            assert (ROOT / src).exists(), f"{dockerfile}: COPY {src} does not exist"
    assert 'ENTRYPOINT ["python", "-m", "server"]' in text
    exposed = {int(p) for p in re.findall(r"^EXPOSE (.+)$", text, re.M)[0].split()}
    env = dict(re.findall(r"(NMT_\w+)=(\S+)", text))
    assert {int(env["NMT_PORT"]), int(env["NMT_METRICS_PORT"])} == exposed
    assert env["NMT_MODEL_REPOSITORY"] == "/app/model_repository"
    for name in env:
        assert name[4:].lower() in ServerConfig.__dataclass_fields__, name
    assert "python -m client --target localhost:50051 health" in text
    # The serving image installs only the serve (or gpu) extra: no torch in it.
    assert '".[serve]"' in text or '".[gpu]"' in text


def test_serving_runtime_imports_no_torch():
    code = ("import sys, server.__main__, server.app, client.__main__, models.core.sentencepiece_tokenizer, "
            "models.core.tokenizer_json; "
            "print(sorted(m for m in sys.modules if m in ('torch', 'transformers') "
            "or m.startswith(('torch.', 'transformers.', 'models'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    loaded = eval(out.stdout.strip())  # a printed list of module names
    # Only the torch-free core (which the Dockerfiles copy whole); never torch, transformers or the
    # training package's other modules.
    assert loaded and all(m == "models" or m == "models.core" or m.startswith("models.core.") for m in loaded), loaded
    assert {"models.core.bundle", "models.core.runtime", "models.core.tokenizer"} <= set(loaded)
    for dockerfile in ("Dockerfile", "Dockerfile.gpu"):
        copied = (ROOT / dockerfile).read_text()
        assert "COPY models/core/ models/core/" in copied and "COPY models/__init__.py models/" in copied


def test_generated_grpc_code_is_current(tmp_path):
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I.", f"--python_out={tmp_path}",
                    f"--grpc_python_out={tmp_path}", f"--pyi_out={tmp_path}", "protos/nmt/v1/translator.proto"],
                   cwd=ROOT, check=True)
    for name in ("translator_pb2.py", "translator_pb2_grpc.py", "translator_pb2.pyi"):
        fresh = (tmp_path / "protos/nmt/v1" / name).read_text()
        assert fresh == (ROOT / "protos/nmt/v1" / name).read_text(), f"{name} is stale: run `make protos`"
