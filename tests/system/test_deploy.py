"""Docker cannot run here: check that the compose file, the Dockerfiles and the Prometheus
configuration agree with the server's real flags, ports and paths."""
import re
import shutil
import subprocess
import sys

import pytest
import yaml
from tests.serving import ROOT

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
    volume = compose["services"]["prometheus"]["volumes"][0]
    host_path, container_path = volume.split(":")[:2]
    assert container_path == "/etc/prometheus/prometheus.yml"
    prom = yaml.safe_load((ROOT / host_path).read_text())
    (job,) = prom["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    # Whichever server service runs, CPU or GPU, by compose's DNS (docs/observability.md).
    (sd,) = job["dns_sd_configs"]
    assert set(sd["names"]) == {"nmt", "nmt-gpu"}
    for name in sd["names"]:
        assert sd["port"] == ServerConfig.parser().parse_args(compose["services"][name]["command"]).metrics_port
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
    assert {int(env["NMT_PORT"]), int(env["NMT_HTTP_PORT"]), int(env["NMT_METRICS_PORT"])} == exposed
    assert env["NMT_MODEL_REPOSITORY"] == "/app/model_repository"
    for name in env:
        assert name[4:].lower() in ServerConfig.__dataclass_fields__, name
    # The health check follows the configured port; the server runs unprivileged; models are a volume.
    assert 'python -m client --target "localhost:${NMT_PORT}" health' in text
    (user,) = re.findall(r"^USER (\S+)$", text, re.M)
    assert user.split(":")[0] not in ("0", "root")
    assert f'VOLUME ["{env["NMT_MODEL_REPOSITORY"]}"]' in text
    # The serving image installs only the serve (or gpu) extra: no torch in it.
    assert '".[serve]"' in text or '".[gpu]"' in text


# A model loaded as the engine core process loads it (server/coreprocess/process.py main), or as a frontend over
# engine cores builds its models (engine=False).
LOAD_MODEL = ("from models.core.bundle import discover\n"
              "from server.config import ServerConfig\n"
              "from server.frontend.hosted import HostedModel\n"
              "from server.observability.metrics import Metrics\n"
              "cfg = ServerConfig(model_repository='model_repository')\n")


def loaded_packages(code: str, packages: tuple[str, ...]) -> list[str]:
    """The modules of `packages` that a fresh interpreter has loaded after running `code`."""
    probe = f"{code}\nimport sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] in {packages!r}))"
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    return eval(out.stdout.strip())  # a printed list of module names


def test_engine_core_imports_no_grpc_or_protobuf():
    """The engine core (request, scheduler, loop, engine, token choice, hosted model) is plain Python
    and numpy: errors are plain kinds that the service edge maps to status codes."""
    assert loaded_packages("import server.core.scheduler, server.core.row_controls, server.core.loop, server.core.engine, "
                           "server.core.chooser, server.core.request, server.frontend.hosted, server.core.errors",
                           ("grpc", "google")) == []
    # The engine core process each replica runs: its wire is msgspec over zmq, so grpc (~10 MB resident
    # with its TLS library, in every replica) has no business there either.
    assert loaded_packages("import server.coreprocess.__main__\n" + LOAD_MODEL +
                           "HostedModel(next(iter(discover(cfg.model_repository))), cfg, Metrics()).here.start()",
                           ("grpc", "google", "starlette")) == []


def test_a_frontend_over_engine_cores_loads_no_onnx_runtime():
    """With --engine-core process the frontend builds requests and never runs a model: ONNX Runtime (~20 MB
    resident) stays out of it, through its start (metrics, the replica count's CUDA check, the models'
    tokenizers and checks)."""
    assert loaded_packages("import server.__main__, server.frontend.server\n" + LOAD_MODEL +
                           "metrics = Metrics()\n"
                           "assert cfg.replicas >= 1 and cfg.background_core in (True, False)\n"
                           "[HostedModel(b, cfg, metrics, engine=False) for b in discover(cfg.model_repository)]",
                           ("onnxruntime",)) == []


def test_serving_runtime_imports_no_torch():
    code = ("import sys, server.__main__, server.frontend.server, server.core.engine, client.__main__, "
            "models.core.sentencepiece_tokenizer, "
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


def _seconds(text: str) -> float:
    return float(text[:-1]) * {"s": 1, "m": 60}[text[-1]]


def _compose_services():
    for path in ("docker-compose.yml", "deploy/docker-compose.scaleout.yml"):
        for name, service in yaml.safe_load((ROOT / path).read_text())["services"].items():
            yield path, name, service


SERVERS = [s for s in _compose_services() if str(s[2].get("image", "")).startswith("nmt-serve")]


@pytest.mark.parametrize("path,name,service", SERVERS, ids=[f"{path}:{name}" for path, name, _ in SERVERS])
def test_compose_servers_rotate_gracefully(path, name, service):
    """Every server in a compose file: real flags, a restart policy, and docker stop waiting longer than
    the server's lame duck plus its drain (else SIGKILL cuts the in-flight work)."""
    cfg = ServerConfig.parser().parse_args(service["command"])
    assert ServerConfig(**vars(cfg)).problems() == []
    flags = {o for a in ServerConfig.parser()._actions for o in a.option_strings}
    assert all(arg in flags for arg in service["command"] if arg.startswith("--"))  # no abbreviations
    assert service.get("restart") in ("unless-stopped", "always", "on-failure")
    assert _seconds(service["stop_grace_period"]) > cfg.lame_duck_s + cfg.grace_period_s + 1
    assert cfg.lame_duck_s > 0
    health = service["healthcheck"]["test"]
    assert health[health.index("--target") + 1] == f"localhost:{cfg.port}"


def test_compose_host_ports_do_not_clash():
    """Every profile can run at once (docker compose --profile gpu up): no host port published twice."""
    for path in ("docker-compose.yml", "deploy/docker-compose.scaleout.yml"):
        published = [str(p).rsplit(":", 1)[0] for s in yaml.safe_load((ROOT / path).read_text())["services"].values()
                     for p in s.get("ports", [])]
        assert len(published) == len(set(published)), (path, published)


def test_scaleout_compose_balancers_point_at_the_replicas():
    compose = yaml.safe_load((ROOT / "deploy/docker-compose.scaleout.yml").read_text())
    replicas = {name: ServerConfig.parser().parse_args(s["command"]).port
                for name, s in compose["services"].items() if name.startswith("nmt-")}
    wanted = {f"{name}:{port}" for name, port in replicas.items()}
    nginx = (ROOT / "deploy/nginx/nginx.conf").read_text()
    haproxy = (ROOT / "deploy/haproxy/haproxy.cfg").read_text()
    assert set(re.findall(r"^\s*server (\S+:\d+)", nginx, re.M)) == wanted
    assert set(re.findall(r"^\s*server \S+ (\S+:\d+)", haproxy, re.M)) == wanted
    for balancer, conf, listen in (("nginx", nginx, r"listen (\d+)"), ("haproxy", haproxy, r"bind :(\d+) proto h2")):
        service = compose["services"][balancer]
        (mount,) = service["volumes"]
        assert (ROOT / "deploy" / mount.split(":")[0]).resolve() in {(ROOT / "deploy/nginx/nginx.conf").resolve(),
                                                                       (ROOT / "deploy/haproxy/haproxy.cfg").resolve()}
        port = re.search(listen, conf).group(1)
        assert f"{port}:{port}" in service["ports"]


def test_dockerignore_lets_every_copy_through():
    """.dockerignore excludes everything but what the Dockerfiles copy (a small build context)."""
    kept = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    for dockerfile in ("Dockerfile", "Dockerfile.gpu"):
        for line in re.findall(r"^COPY (.+)$", (ROOT / dockerfile).read_text(), re.M):
            for src in line.split()[:-1]:
                assert src.rstrip("/") in kept, f"{dockerfile}: COPY {src} is excluded by .dockerignore"
    assert (ROOT / ".dockerignore").read_text().splitlines()[3] == "*"  # everything else stays out


def test_gpu_image_pins_onnxruntime_gpu_and_a_released_python():
    text = (ROOT / "Dockerfile.gpu").read_text()
    base = re.search(r"^FROM nvidia/cuda:(\d+)\.\d+\.\d+-cudnn-runtime-ubuntu(\d+)\.04$", text, re.M)
    assert base and int(base.group(2)) >= 24  # Ubuntu 24.04's system Python is 3.12
    assert re.search(r"^ARG ONNXRUNTIME_GPU=\d+\.\d+\.\d+$", text, re.M)
    assert '"onnxruntime-gpu==${ONNXRUNTIME_GPU}"' in text


def test_default_model_repository_is_found_outside_the_checkout(tmp_path, monkeypatch):
    """`pip install .` then `nmt-serve` anywhere: the checkout's repository, else ./model_repository,
    else the bundle installed under <prefix>/share/nmt-serve (pyproject's data-files)."""
    import tomllib

    import server.config as config
    monkeypatch.setattr(config, "CHECKOUT_REPOSITORY", tmp_path / "site-packages" / "model_repository")
    monkeypatch.setattr(config, "INSTALLED_REPOSITORY", tmp_path / "share" / "nmt-serve" / "model_repository")
    monkeypatch.chdir(tmp_path)
    assert config.default_repository() == config.CHECKOUT_REPOSITORY  # none: the path the error names
    config.INSTALLED_REPOSITORY.mkdir(parents=True)
    assert config.default_repository() == config.INSTALLED_REPOSITORY
    (tmp_path / "model_repository").mkdir()
    assert config.default_repository() == tmp_path / "model_repository"
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    shipped = ROOT / "model_repository"
    for bundle in {p.parent for p in shipped.glob("*/*/config.json")}:
        dest = "share/nmt-serve/model_repository/" + bundle.relative_to(shipped).as_posix()
        (pattern,) = data[dest]
        assert {p.name for p in ROOT.glob(pattern)} == {p.name for p in bundle.iterdir()}, dest

