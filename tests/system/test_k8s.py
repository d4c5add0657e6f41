"""No cluster here: check deploy/k8s/ against the Kubernetes JSON schemas (kubernetes-validate bundles
them; strict: an unknown or misspelt field fails) and against the server itself: every container
argument is a real flag, every NMT_* variable a real setting, the ports, probes, health service
names, shutdown timings and the autoscaler's metric agree with what the server does."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from tests.serving import ROOT

from server.frontend.server import SERVICE_NAME
from server.config import ServerConfig
from server.edge.lifecycle import LIVENESS
from server.observability.metrics import Metrics

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (dev extra)")

K8S = ROOT / "deploy" / "k8s"
# The oldest release these manifests are meant for (native gRPC probes are GA since 1.27) and the
# newest whose schemas the package bundles.
VERSIONS = ("1.29", kubernetes_validate.utils.latest_version())


def load(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@pytest.fixture(scope="module")
def kustomization() -> dict:
    return yaml.safe_load((K8S / "kustomization.yaml").read_text())


@pytest.fixture(scope="module")
def resources(kustomization) -> dict[str, dict]:
    """kind/name -> manifest, for everything the kustomization applies."""
    out = {}
    for name in kustomization["resources"]:
        for doc in load(K8S / name):
            out[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return out


@pytest.fixture(scope="module")
def pod(resources) -> dict:
    return resources["Deployment/nmt-serve"]["spec"]["template"]


@pytest.fixture(scope="module")
def server(pod) -> dict:
    (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "server"]
    return container


@pytest.fixture(scope="module")
def cfg(server, monkeypatch_module) -> ServerConfig:
    """The settings the container runs with: its NMT_* variables (literal ones as given, resource
    references as a number) under its arguments, through the server's own parser."""
    for var in server.get("env", []):
        monkeypatch_module.setenv(var["name"], var.get("value", "2"))
    return ServerConfig(**vars(ServerConfig.parser().parse_args(server["args"])))


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_kustomization_lists_every_manifest(kustomization):
    listed = set(kustomization["resources"])
    assert all((K8S / name).is_file() for name in listed)
    assert {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"} == listed
    assert kustomization["kind"] == "Kustomization"
    assert {i["name"] for i in kustomization["images"]} == {c["image"].split(":")[0] for c in _all_containers(
        load(K8S / "deployment.yaml")[0])}


def _all_containers(deployment: dict) -> list[dict]:
    spec = deployment["spec"]["template"]["spec"]
    return spec.get("initContainers", []) + spec["containers"]


@pytest.mark.parametrize("version", VERSIONS)
def test_manifests_match_the_kubernetes_schemas(resources, version):
    for key, doc in resources.items():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            raise AssertionError(f"{key} against Kubernetes {version}: {e.message} at {list(e.path)}") from None


def test_container_args_and_env_are_real_server_settings(server, cfg):
    # parse_args above exits on an unknown flag; the settings must also agree with each other.
    assert cfg.problems() == []
    flags = {o for a in ServerConfig.parser()._actions for o in a.option_strings}
    for arg in server["args"]:  # spelt out in full (argparse would also take an abbreviation)
        assert not arg.startswith("--") or arg.split("=")[0] in flags, arg
    for var in server.get("env", []):
        assert var["name"].startswith("NMT_") and var["name"][4:].lower() in ServerConfig.__dataclass_fields__, var
    replicas = next(v for v in server["env"] if v["name"] == "NMT_ENGINE_REPLICAS")["valueFrom"]["resourceFieldRef"]
    assert replicas["resource"] == "limits.cpu" and replicas["containerName"] == server["name"]
    assert next(v for v in server["env"] if v["name"] == "NMT_INTRA_OP_THREADS")["value"] == "1"


def test_ports_and_probes_agree_with_the_server(pod, server, cfg, resources):
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {"grpc": cfg.port, "metrics": cfg.metrics_port, "http": cfg.http_port}
    probes = {k: server[k] for k in ("startupProbe", "readinessProbe", "livenessProbe")}
    for kind, probe in probes.items():
        assert probe["grpc"]["port"] == cfg.port, kind  # native gRPC probes take a number, not a port name
    # Readiness follows the Translator's health (NOT_SERVING from the first moment of the lame duck);
    # liveness the entry that stays SERVING while draining (a draining pod must not be restarted).
    assert probes["readinessProbe"]["grpc"]["service"] == SERVICE_NAME
    assert probes["startupProbe"]["grpc"]["service"] == SERVICE_NAME
    assert probes["livenessProbe"]["grpc"]["service"] == LIVENESS
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(cfg.metrics_port) and annotations["prometheus.io/path"] == "/metrics"
    for name in ("Service/nmt-serve", "Service/nmt-serve-headless"):
        spec = resources[name]["spec"]
        assert spec["selector"].items() <= pod["metadata"]["labels"].items(), name
        for port in spec["ports"]:
            assert port["targetPort"] in ports, (name, port)
    assert resources["Service/nmt-serve-headless"]["spec"]["clusterIP"] == "None"


def test_shutdown_timings_cover_lame_duck_and_drain(pod, server, cfg):
    """preStop sleeps while endpoints are updated; then SIGTERM: lame duck, drain, close (1 s).
    Kubernetes kills whatever is still running at terminationGracePeriodSeconds, counted from the
    start of preStop."""
    (sleep,) = [int(a) for a in server["lifecycle"]["preStop"]["exec"]["command"][1:]]
    assert server["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    assert cfg.lame_duck_s > 0 and sleep >= cfg.lame_duck_s
    assert pod["spec"]["terminationGracePeriodSeconds"] > sleep + cfg.lame_duck_s + cfg.grace_period_s + 1
    readiness = server["readinessProbe"]
    assert readiness["periodSeconds"] * readiness["failureThreshold"] < cfg.lame_duck_s  # out while still serving
    assert cfg.max_connection_age_ms > 0  # clients reconnect (and re-resolve) to reach new replicas


def test_pod_runs_unprivileged_with_the_model_repository_as_a_volume(pod, server, cfg):
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    (uid,) = re.findall(r"^USER (\d+)", (ROOT / "Dockerfile").read_text(), re.M)
    assert spec["securityContext"]["runAsUser"] == int(uid)
    assert spec["enableServiceLinks"] is False  # a Service's <NAME>_PORT variable must not reach NMT_* parsing
    for c in _all_containers({"spec": {"template": pod}}):
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, c["name"]
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert {"cpu", "memory"} <= c["resources"]["requests"].keys() and c["resources"]["limits"]["memory"]
    mounts = {m["mountPath"]: m for m in server["volumeMounts"]}
    assert mounts[cfg.model_repository]["readOnly"] is True
    volumes = {v["name"] for v in spec["volumes"]}
    assert mounts[cfg.model_repository]["name"] in volumes and mounts["/tmp"]["name"] in volumes


def test_service_names_cannot_shadow_server_settings(resources):
    """Kubernetes injects <SERVICE>_PORT, <SERVICE>_SERVICE_HOST, ... for every Service (unless
    enableServiceLinks is off): none of them may be an NMT_* setting (a Service named "nmt" would
    set NMT_PORT=tcp://...)."""
    fields = {"NMT_" + f.upper() for f in ServerConfig.__dataclass_fields__}
    for key in resources:
        if key.startswith("Service/"):
            prefix = key.split("/")[1].upper().replace("-", "_")
            assert not any(f.startswith(prefix + "_") for f in fields), key


def test_disruption_budget_and_autoscaler_target_the_deployment(resources, pod):
    pdb = resources["PodDisruptionBudget/nmt-serve"]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    hpa = resources["HorizontalPodAutoscaler/nmt-serve"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "nmt-serve"}
    assert hpa["minReplicas"] > pdb["maxUnavailable"]
    assert hpa["minReplicas"] <= resources["Deployment/nmt-serve"]["spec"]["replicas"] <= hpa["maxReplicas"]


def test_autoscaling_metric_is_exported_by_the_server_and_served_by_the_adapter(resources):
    """The HPA's pods metric is a gauge the server exports, under the name the prometheus-adapter
    rule serves it as, and that rule's query selects the server's series."""
    gauges = {m.name for m in Metrics().registry.collect() if m.type == "gauge"}
    pods = [m["pods"]["metric"]["name"] for m in resources["HorizontalPodAutoscaler/nmt-serve"]["spec"]["metrics"]
            if m["type"] == "Pods"]
    assert pods
    rules = yaml.safe_load((K8S / "prometheus-adapter" / "config.yaml").read_text())["rules"]
    served = {}
    for rule in rules:
        series = re.match(r"^(\w+)\{", rule["seriesQuery"]).group(1)
        assert series in gauges, f"the server exports no gauge {series}"
        assert re.fullmatch(rule["name"]["matches"], series)
        assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
        assert "<<.Series>>{<<.LabelMatchers>>}" in rule["metricsQuery"] and "by (<<.GroupBy>>)" in rule["metricsQuery"]
        served[rule["name"]["as"]] = series
    for name in pods:
        assert name in served, f"no prometheus-adapter rule serves {name}"
