"""Observability (docs/observability.md): the JSON access log and lifecycle events of a real `python -m
server`, request ids in metadata and in log lines, process and build metrics, the Grafana dashboard
against the metrics a real server exports, the Prometheus rules (promtool), and OpenTelemetry spans.

One server subprocess serves the module (its stderr goes to a file: a pipe nobody reads would fill up
and block it); the tracing tests run an in-process server with an in-memory span exporter.
"""
import asyncio
import contextlib
import contextvars
import hashlib
import io
import json
import logging
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
import urllib.request
from functools import partial

import grpc
import pytest
import yaml
from tests.serving import ROOT, EngineGate, ServerThread

from models.core.bundle import discover
from protos.nmt.v1 import translator_pb2 as pb
from protos.nmt.v1 import translator_pb2_grpc as pb_grpc
from benchmarks.harness import ServerProcess
from server.config import ServerConfig
from server.observability import calls, logs

MODEL = "multi30k-en-de-small"  # the default one
SHIPPED = sorted(b.name for b in discover(ROOT / "model_repository"))  # every shipped model is served
ACCESS_FIELDS = {"time", "level", "logger", "message", "event", "service", "method", "code", "model", "texts",
                 "sentences", "input_tokens", "output_tokens", "queue_s", "first_token_s", "total_s", "key_id",
                 "request_id", "peer"}
HEX_ID = re.compile(r"[0-9a-f]{32}")
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "nmt.json"
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RULES_TEST = ROOT / "deploy" / "prometheus" / "rules_test.yml"
PROMETHEUS_SYNTHETIC = {"up"}  # series Prometheus itself writes for each target


class Served:
    def __init__(self, proc, log_path, port, metrics_port):
        self.proc, self.log_path, self.port, self.metrics_port = proc, log_path, port, metrics_port
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.stub = pb_grpc.TranslatorStub(self.channel)

    def records(self) -> list[dict]:
        """Every line the server wrote, each parsed as JSON (a line that is not fails the test)."""
        return [json.loads(line) for line in self.log_path.read_text(encoding="utf-8").splitlines() if line]

    def access(self, request_id: str, timeout: float = 15.0) -> dict:
        """The access-log record of the call with this request id (written by a thread: wait for it)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = [r for r in self.records() if r.get("event") == "rpc" and r.get("request_id") == request_id]
            if found:
                assert len(found) == 1, found
                return found[0]
            time.sleep(0.05)
        raise AssertionError(f"no access-log line for request id {request_id}")

    def event(self, name: str, timeout: float = 15.0) -> dict:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = [r for r in self.records() if r.get("event") == name]
            if found:
                return found[-1]
            time.sleep(0.05)
        raise AssertionError(f"no {name!r} event in the log")

    def metrics_text(self) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    log_path = tmp_path_factory.mktemp("observability") / "server.log"
    server = ServerProcess("--log-format", "json", "--log-level", "info", "--grace-period-s", "5",
                           log_path=log_path).start(timeout=120)
    s = Served(server.proc, log_path, server.port, server.metrics_port)
    try:
        yield s
    finally:
        s.channel.close()
        server.stop(drain=False)


def request_id_of(metadata) -> str:
    ids = [v for k, v in (metadata or ()) if k == calls.REQUEST_ID]
    assert len(ids) == 1, metadata
    return ids[0]


def check_access_record(r: dict, method: str, code: str) -> None:
    assert ACCESS_FIELDS <= set(r), ACCESS_FIELDS - set(r)
    assert (r["logger"], r["level"], r["service"], r["method"], r["code"]) == \
        ("nmt.access", "INFO", "nmt.v1.Translator", method, code)
    assert r["key_id"] == ""  # no API keys configured
    assert r["peer"].startswith(("ipv4:127.0.0.1:", "ipv6:")), r["peer"]
    assert isinstance(r["total_s"], float) and 0 < r["total_s"] < 60
    for name in ("texts", "sentences", "input_tokens", "output_tokens"):
        assert isinstance(r[name], int) and r[name] >= 0, (name, r[name])


# -- the access log and request ids --------------------------------------------------------------
def test_translate_access_log_and_request_id_echoed(served):
    texts = ["A man is riding a bike.", "Two dogs play in the snow. They are happy."]
    response, call = served.stub.Translate.with_call(pb.TranslateRequest(texts=texts), timeout=60,
                                                     metadata=[("x-request-id", "test-translate-1")])
    assert request_id_of(call.trailing_metadata()) == "test-translate-1"
    r = served.access("test-translate-1")
    check_access_record(r, "Translate", "OK")
    assert r["model"] == MODEL and r["texts"] == 2 and r["sentences"] == 3
    assert r["input_tokens"] == sum(t.input_tokens for t in response.translations)
    assert r["output_tokens"] == sum(t.output_tokens for t in response.translations) > 0
    assert 0 <= r["queue_s"] <= r["first_token_s"] <= r["total_s"]
    assert r["message"].startswith("Translate OK")


def test_stream_access_log_and_request_id_generated(served):
    call = served.stub.TranslateStream(pb.TranslateStreamRequest(text="A dog runs on the beach."), timeout=60)
    generated = request_id_of(call.initial_metadata())  # sent before the first message
    assert HEX_ID.fullmatch(generated)
    messages = list(call)
    assert request_id_of(call.trailing_metadata()) == generated
    r = served.access(generated)
    check_access_record(r, "TranslateStream", "OK")
    final = messages[-1]
    assert final.final and (r["model"], r["texts"], r["sentences"]) == (MODEL, 1, 1)
    assert (r["input_tokens"], r["output_tokens"]) == (final.input_tokens, final.output_tokens)
    assert 0 <= r["queue_s"] <= r["first_token_s"] <= r["total_s"]


def test_invalid_argument_is_logged_with_its_request_id(served):
    with pytest.raises(grpc.RpcError) as err:
        served.stub.Translate(pb.TranslateRequest(texts=["A dog."], options=pb.DecodingOptions(beam_size=99)),
                              timeout=30, metadata=[("x-request-id", "test-invalid-1")])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert request_id_of(err.value.trailing_metadata()) == "test-invalid-1"  # errors carry it too
    r = served.access("test-invalid-1")
    check_access_record(r, "Translate", "INVALID_ARGUMENT")
    assert (r["model"], r["texts"], r["output_tokens"]) == (MODEL, 1, 0)
    assert r["queue_s"] is None and r["first_token_s"] is None  # it never reached the engine


@contextlib.contextmanager
def json_lines(logger_name: str):
    """Records of one logger, formatted as the server formats them (JSON, call context stamped),
    into a StringIO for the duration; the logger's level and handlers are restored after."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(logs.json_formatter())
    handler.addFilter(logs.CallContext())
    logger = logging.getLogger(logger_name)
    previous = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)


def test_cancelled_stream_is_logged():
    """In process, with the engine held after a few tokens, so the stream is surely still running
    when it is cancelled (a subprocess server cannot be held: the stream might finish first)."""
    srv = ServerThread(metrics_port=-1, warmup=False).start()
    try:
        with json_lines("nmt.access") as lines, grpc.insecure_channel(srv.target) as channel, \
                EngineGate(srv.app.models[MODEL], let_through=3) as gate:
            request = pb.TranslateStreamRequest(text="A man in a blue shirt walks down a busy street.",
                                                options=pb.DecodingOptions(temperature=5.0, seed=3,
                                                                           max_output_tokens=200))
            call = pb_grpc.TranslatorStub(channel).TranslateStream(
                request, timeout=60, metadata=[("x-request-id", "test-cancel-1")])
            first = next(call)
            assert not first.final and not gate.released.is_set()
            call.cancel()
            end = time.monotonic() + 30  # bounds a failure only: the record is written when the handler ends
            while "test-cancel-1" not in lines.getvalue() and time.monotonic() < end:
                time.sleep(0.02)
            gate.open()
        (r,) = [json.loads(x) for x in lines.getvalue().splitlines() if "test-cancel-1" in x]
        check_access_record(r, "TranslateStream", "CANCELLED")
        assert r["model"] == MODEL and r["output_tokens"] >= len(first.token_ids) >= 1
        assert r["first_token_s"] is not None
    finally:
        srv.stop()


def test_an_unusable_request_id_is_replaced(served):
    for sent in ("has spaces in it", "x" * 200):
        _, call = served.stub.Translate.with_call(pb.TranslateRequest(texts=["A dog."]), timeout=60,
                                                  metadata=[("x-request-id", sent)])
        echoed = request_id_of(call.trailing_metadata())
        assert HEX_ID.fullmatch(echoed)
        assert served.access(echoed)["code"] == "OK"


def test_list_models_and_embed_are_logged_too(served):
    _, call = served.stub.ListModels.with_call(pb.ListModelsRequest(), timeout=30,
                                               metadata=[("x-request-id", "test-list-1")])
    check_access_record(served.access("test-list-1"), "ListModels", "OK")
    served.stub.Embed(pb.EmbedRequest(texts=["A dog.", "A cat."]), timeout=30, metadata=[("x-request-id", "test-e-1")])
    r = served.access("test-e-1")
    check_access_record(r, "Embed", "OK")
    assert (r["model"], r["texts"], r["output_tokens"]) == (MODEL, 2, 0) and r["input_tokens"] > 0


def test_every_line_is_json_and_startup_is_logged(served):
    records = served.records()  # parses every line
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)
    serving = served.event("serving")
    records = served.records()
    loaded = [r for r in records if r.get("event") == "model_loaded"]
    assert sorted((r["model"], r["version"], r["provider"]) for r in loaded) == \
        [(b.name, b.version, "CPUExecutionProvider") for b in sorted(discover(ROOT / "model_repository"),
                                                                      key=lambda b: b.name)]
    assert serving["grpc_port"] == served.port and serving["metrics_port"] == served.metrics_port
    assert serving["models"] == SHIPPED and serving["config"]["log_format"] == "json"
    assert serving["build"]["python"] == platform.python_version()
    assert [r["event"] for r in records if r.get("event") in ("starting", "model_loaded", "serving")] == \
        ["starting"] + ["model_loaded"] * len(SHIPPED) + ["serving"]


# -- metrics -----------------------------------------------------------------------------------
def samples(text: str) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        if m:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out.setdefault(m.group(1), []).append({**labels, "__value__": float(m.group(3))})
    return out


def test_process_and_build_info_metrics(served):
    import onnxruntime

    exported = samples(served.metrics_text())
    for name in ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_start_time_seconds",
                 "process_open_fds", "python_info", "python_gc_collections_total"):
        assert name in exported, name
    (build,) = exported["nmt_build_info"]
    # The version as the project declares it (pyproject.toml), read independently of the server's code.
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert build == {"version": declared, "python": platform.python_version(),
                     "onnxruntime": onnxruntime.__version__, "grpc": grpc.__version__, "__value__": 1.0}
    assert sorted(exported["nmt_model_info"], key=lambda m: m["model"]) == [
        {"model": b.name, "version": str(b.version), "variant": "fp32", "provider": "CPUExecutionProvider",
         "__value__": 1.0} for b in sorted(discover(ROOT / "model_repository"), key=lambda b: b.name)]
    assert sorted(exported["nmt_queue_capacity"], key=lambda m: m["model"]) == [
        {"model": name, "__value__": 1024.0} for name in SHIPPED]


@pytest.mark.parametrize("activations, weights", [("auto", "auto"), ("row", "auto"), ("row", "7")])
def test_model_info_names_the_int8_graphs_served(activations, weights):
    """--variant int8 runs the bundle's int8-static graphs (activation ranges calibrated at export) by default;
    with --int8-activations row its row-wise graphs: 8-bit weights (int8-vnni) on a CPU with VNNI, 7-bit ones
    elsewhere or when told (--int8-weights 7). nmt_model_info says which, from the engine core that loaded them."""
    from models.core.runtime import cpu_has_vnni
    want = "int8-static" if activations == "auto" else \
        "int8-vnni" if weights == "auto" and cpu_has_vnni() else "int8"
    with ServerProcess("--variant", "int8", "--int8-activations", activations, "--int8-weights", weights) as server:
        with urllib.request.urlopen(server.metrics_url, timeout=10) as r:
            exported = samples(r.read().decode())
    assert {m["variant"] for m in exported["nmt_model_info"]} == {want}


def test_a_blocked_event_loop_shows_in_the_loop_lag_histogram():
    """nmt_event_loop_lag_seconds: while the loop is blocked for 0.4 s, its 0.1 s timer comes due and
    runs at least 0.3 s late, so one more observation lands above 0.256 s (the engine's own latency
    histograms start at admission and cannot show a saturated frontend)."""
    srv = ServerThread(http_port=-1, warmup=False).start()

    def slow_and_all() -> tuple[float, float]:
        total = srv.metric("nmt_event_loop_lag_seconds_count")
        return total - srv.metric("nmt_event_loop_lag_seconds_bucket", le="0.256"), total

    async def block() -> None:
        time.sleep(0.4)  # what a long synchronous step in a handler would do to every other call

    try:
        slow_before, _ = slow_and_all()
        asyncio.run_coroutine_threadsafe(block(), srv.loop).result(10)
        end = time.monotonic() + 10
        while (now := slow_and_all())[0] == slow_before and time.monotonic() < end:
            time.sleep(0.05)
        assert now[0] >= slow_before + 1, now
        assert srv.metric("nmt_event_loop_lag_seconds_sum") >= 0.3
    finally:
        srv.stop()


_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
                 "offset", "inf", "nan"}


def promql_metrics(expr: str) -> set[str]:
    """Metric names an expression reads (not functions, keywords, label names, strings or variables)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = re.sub(r"\$\w+", "", e)
    names = set()
    for m in re.finditer(r"(?<![\w.])[A-Za-z_:][A-Za-z0-9_:]*", e):
        if not e[m.end():].lstrip().startswith("(") and m.group(0).lower() not in _PROMQL_WORDS:
            names.add(m.group(0))
    return names


def dashboard_queries(dashboard: dict) -> list[str]:
    found = []

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("expr"), str):
                found.append(node["expr"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(dashboard["panels"])
    return found


def test_promql_metric_extraction():
    assert promql_metrics('histogram_quantile(0.9, sum by (le, model) (rate(nmt_x_bucket{job=~"$job", '
                          'le="0.5"}[$__rate_interval]))) / on (job) group_left nmt:y:ratio') == \
        {"nmt_x_bucket", "nmt:y:ratio"}
    assert promql_metrics("sum(up{job=~\"$job\"}) > bool 0.5 and absent(foo)") == {"up", "foo"}


def test_dashboard_uses_only_metrics_the_server_exports(served):
    # Every RPC kind once, so that the per-method series exist too.
    served.stub.Translate(pb.TranslateRequest(texts=["A dog."]), timeout=60)
    list(served.stub.TranslateStream(pb.TranslateStreamRequest(text="A cat."), timeout=60))
    exported = set(samples(served.metrics_text()))
    dashboard = json.loads(DASHBOARD.read_text())
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 20
    used = set().union(*(promql_metrics(q) for q in queries))
    for var in dashboard["templating"]["list"]:
        if var["type"] == "query":
            used |= set(re.findall(r"label_values\(\s*([A-Za-z_:][\w:]*)", var["definition"]))
    assert {"nmt_output_tokens_total", "nmt_requests_total", "nmt_time_to_first_token_seconds_bucket",
            "nmt_inter_token_seconds_bucket", "nmt_request_duration_seconds_bucket", "nmt_waiting_requests",
            "nmt_decode_batch_size_bucket", "nmt_kv_cache_usage_ratio", "nmt_runaway_stopped_total"} <= used
    assert used - exported <= PROMETHEUS_SYNTHETIC, sorted(used - exported - PROMETHEUS_SYNTHETIC)
    # The rules read exported metrics, their own recordings, or Prometheus's `up`.
    rules = yaml.safe_load(RULES.read_text())
    recorded = {r["record"] for g in rules["groups"] for r in g["rules"] if "record" in r}
    read = set().union(*(promql_metrics(r["expr"]) for g in rules["groups"] for r in g["rules"]))
    assert read - exported - recorded <= PROMETHEUS_SYNTHETIC, sorted(read - exported - recorded)


def test_grafana_is_provisioned_by_compose():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    grafana, prometheus = compose["services"]["grafana"], compose["services"]["prometheus"]
    mounts = {v.split(":")[1]: ROOT / v.split(":")[0] for v in grafana["volumes"] if v.startswith("./")}
    provisioning, dashboards = mounts["/etc/grafana/provisioning"], mounts["/etc/grafana/dashboards"]
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    assert "9090" in [p.split(":")[-1] for p in prometheus["ports"]]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "nmt.yml").read_text())["providers"]
    assert provider["options"]["path"] == "/etc/grafana/dashboards" and (dashboards / "nmt.json").exists()
    dashboard = json.loads((dashboards / "nmt.json").read_text())
    (ds_var,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert ds_var["current"]["value"] == datasource["uid"]
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
    # Data survives a restart, and the services come back by themselves.
    for name, service in (("grafana", grafana), ("prometheus", prometheus)):
        assert service["restart"] == "unless-stopped", name
        named = [v.split(":")[0] for v in service["volumes"] if not v.startswith("./")]
        assert named and set(named) <= set(compose["volumes"]), name
    # Prometheus gets its rules at the path deploy/prometheus.yml names, relative to itself.
    config = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    assert config["rule_files"] == ["prometheus/rules.yml"]
    assert "./deploy/prometheus:/etc/prometheus/prometheus:ro" in prometheus["volumes"]


# -- Prometheus rules ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("NMT_REQUIRE_TOOLS") == "1":
            pytest.fail("promtool is not installed but NMT_REQUIRE_TOOLS=1: apt-get install prometheus")
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus); NMT_REQUIRE_TOOLS=1 makes "
                    "this a failure")
    return path


def test_prometheus_rules_and_their_unit_tests(promtool):
    for args in (["check", "rules", str(RULES)], ["test", "rules", str(RULES_TEST)],
                 ["check", "config", str(ROOT / "deploy" / "prometheus.yml")]):
        out = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, f"promtool {' '.join(args)}:\n{out.stdout}\n{out.stderr}"


# -- log plumbing (in-process) ---------------------------------------------------------------------
class FakeContext:
    def __init__(self, metadata=()):
        self.metadata, self.trailers = tuple(metadata), ()

    def invocation_metadata(self):
        return self.metadata

    def peer(self):
        return "ipv4:127.0.0.1:1"

    def trailing_metadata(self):
        return self.trailers

    def set_trailing_metadata(self, md):
        self.trailers = tuple(md)


def test_log_lines_written_during_a_call_carry_its_request_id():
    logger = logging.getLogger("tests.observability")
    ctx = FakeContext([("x-request-id", "abc-1"), ("x-forwarded-for", "10.1.2.3")])

    async def handle():
        call = calls.begin("Translate", ctx)
        logger.info("in the handler")
        run = partial(contextvars.copy_context().run, logger.info, "in a worker thread")  # as service._off_loop
        await asyncio.get_running_loop().run_in_executor(None, run)
        call.end(grpc.StatusCode.OK)
        logger.info("after the call")
    with json_lines("tests.observability") as out:
        asyncio.run(handle())
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["message"], r.get("request_id")) for r in lines] == \
        [("in the handler", "abc-1"), ("in a worker thread", "abc-1"), ("after the call", None)]
    assert ctx.trailers == (("x-request-id", "abc-1"),)


def test_text_format_puts_the_fields_after_the_message():
    record = logging.LogRecord("nmt.access", logging.INFO, __file__, 1, "Translate %s", ("OK",), None)
    record.__dict__.update({"event": "rpc", "model": "m", "queue_s": None, "peer": "a b"})
    line = logs.TextFormatter().format(record)
    assert re.fullmatch(r"\S+ INFO nmt.access: Translate OK event=rpc model=m queue_s=- peer=\"a b\"", line), line


def test_start_up_summary_hides_secrets_and_bad_settings_are_refused():
    cfg = ServerConfig(api_keys_file="/etc/nmt/keys", tls_key_file="/etc/nmt/tls.key",
                       otlp_endpoint="http://user:hunter2@collector:4317")
    summary = logs.config_summary(cfg)
    assert summary["api_keys_file"] == summary["tls_key_file"] == "<redacted>"
    assert "hunter2" not in json.dumps(summary) and summary["otlp_endpoint"].endswith("@collector:4317")
    assert summary["max_source_tokens"] == cfg.max_source_tokens and summary["host"] == cfg.host
    assert ServerConfig(log_format="xml").problems() and ServerConfig(log_level="loud").problems()
    assert not ServerConfig(log_format="text", log_level="DEBUG").problems()


def test_access_log_names_the_callers_api_key(tmp_path, caplog):
    key = "nmt_observability-test-key"
    (tmp_path / "keys").write_text(f"alice {hashlib.sha256(key.encode()).hexdigest()}\n")
    srv = ServerThread(metrics_port=-1, api_keys_file=str(tmp_path / "keys")).start()
    try:
        with grpc.insecure_channel(srv.target) as channel, caplog.at_level(logging.INFO, logger="nmt.access"):
            pb_grpc.TranslatorStub(channel).Translate(
                pb.TranslateRequest(texts=["A dog."]), timeout=60,
                metadata=[("authorization", f"Bearer {key}"), ("x-request-id", "keyed-1")])
            end = time.monotonic() + 10
            while not (found := [r for r in caplog.records if getattr(r, "request_id", "") == "keyed-1"]):
                assert time.monotonic() < end, "no access-log record"
                time.sleep(0.02)
    finally:
        srv.stop()
    assert found[0].key_id == "alice" and found[0].code == "OK"


# -- tracing ---------------------------------------------------------------------------------------
def test_no_tracing_means_no_opentelemetry_import():
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = ("import sys, server.frontend.server, server.edge.servicer, server.__main__; from server.observability import tracing; "
            "assert tracing.from_config('') is None; print(sorted(m for m in sys.modules if 'opentelemetry' in m))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


@pytest.fixture(scope="module")
def traced():
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    srv = ServerThread(metrics_port=-1)
    srv.app.span_exporter = exporter = InMemorySpanExporter()
    srv.start()
    channel = grpc.insecure_channel(srv.target)
    try:
        yield pb_grpc.TranslatorStub(channel), exporter
    finally:
        channel.close()
        srv.stop()


def spans_of(exporter, trace_id: int, n: int, timeout: float = 10.0) -> list:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        spans = [s for s in exporter.get_finished_spans() if s.context.trace_id == trace_id]
        if len(spans) >= n:
            return spans
        time.sleep(0.02)
    raise AssertionError(f"{n} spans of trace {trace_id:032x} never arrived")


def test_a_span_per_rpc_with_phases_under_the_callers_trace(traced, caplog):
    from opentelemetry.trace import SpanKind, StatusCode

    stub, exporter = traced
    trace_id, parent_id = 0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331
    with caplog.at_level(logging.INFO, logger="nmt.access"):
        response, call = stub.Translate.with_call(
            pb.TranslateRequest(texts=["A man is riding a bike."]), timeout=60,
            metadata=[("traceparent", f"00-{trace_id:032x}-{parent_id:016x}-01"), ("x-request-id", "traced-1")])
        spans = spans_of(exporter, trace_id, 4)
    (rpc,) = [s for s in spans if s.name == "nmt.v1.Translator/Translate"]
    assert rpc.kind == SpanKind.SERVER and rpc.parent.span_id == parent_id
    assert rpc.status.status_code == StatusCode.UNSET
    a = rpc.attributes
    assert (a["rpc.system"], a["rpc.service"], a["rpc.method"], a["rpc.grpc.status_code"]) == \
        ("grpc", "nmt.v1.Translator", "Translate", 0)
    assert (a["nmt.model"], a["nmt.request_id"], a["nmt.texts"]) == (MODEL, "traced-1", 1)
    assert a["nmt.output_tokens"] == response.translations[0].output_tokens > 0
    phases = {s.name: s for s in spans if s.parent is not None and s.parent.span_id == rpc.context.span_id}
    assert set(phases) == {"queue", "encode", "decode"}
    q, e, d = phases["queue"], phases["encode"], phases["decode"]
    assert rpc.start_time <= q.start_time <= q.end_time == e.start_time <= e.end_time == d.start_time
    assert d.end_time <= rpc.end_time
    (record,) = [r for r in caplog.records if getattr(r, "request_id", "") == "traced-1"]
    assert record.trace_id == f"{trace_id:032x}"


def test_a_failed_rpc_span_records_its_code(traced):
    stub, exporter = traced
    trace_id = 0x1234567890ABCDEF1234567890ABCDEF
    with pytest.raises(grpc.RpcError) as err:
        stub.Translate(pb.TranslateRequest(texts=[]), timeout=30,
                       metadata=[("traceparent", f"00-{trace_id:032x}-{1:016x}-01")])
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    (rpc,) = spans_of(exporter, trace_id, 1)
    assert rpc.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert not [s for s in exporter.get_finished_spans() if s.parent and s.parent.span_id == rpc.context.span_id]


# -- last: the module's server drains and exits ------------------------------------------------------
def test_drain_and_exit_are_logged(served):
    served.proc.send_signal(signal.SIGTERM)
    assert served.proc.wait(60) == 0
    events = [r.get("event") for r in served.records()]
    assert events[-4:] == ["signal", "draining", "stopped", "exit"], events[-6:]
    assert served.event("exit")["status"] == 0 and served.event("signal")["signal"] == "SIGTERM"


def test_auto_log_format_is_text_on_a_terminal_and_json_in_a_pipe():
    """The default: a person starting the server in a terminal reads text lines, a log collector reading
    a pipe or a file gets one JSON object per line."""
    lines = {}
    master, slave = os.openpty()
    read_end, write_end = os.pipe()
    try:
        for name, fd, reader in (("tty", slave, master), ("pipe", write_end, read_end)):
            stream = os.fdopen(os.dup(fd), "w", buffering=1)
            logs.configure("auto", "info", stream=stream)
            logging.getLogger("server").info("hello from %s", name, extra={"event": "probe"})
            logs.shutdown()  # flushes the log writer
            stream.flush()
            lines[name] = os.read(reader, 65536).decode().strip()
            stream.close()
    finally:
        for fd in (master, slave, read_end, write_end):
            os.close(fd)
        logs.configure("json", "info")
    assert "hello from tty" in lines["tty"] and not lines["tty"].startswith("{")
    assert json.loads(lines["pipe"])["message"] == "hello from pipe"
