"""The load generator (client/loadgen/) against a real server and against fakes.

Only counts, schedules and schemas are asserted, never a latency or a rate: the machine is
shared and timing varies, but what was sent and what the server counted must agree exactly.
"""
import asyncio
import json
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent import futures

import grpc
import numpy as np
import pytest

import client.loadgen as loadgen
from client.client import AsyncTranslatorClient
from client.loadgen.__main__ import main
from client.loadgen.compare import compare, load
from client.loadgen.workload import Plan, arrival_times, load_mix
from protos.nmt.v1 import translator_pb2 as pb
from protos.nmt.v1 import translator_pb2_grpc as pb_grpc
from tests.serving import FIXTURE, ROOT, ServerThread

MIX = "rpc=stream weight=3; rpc=unary weight=1 texts=2"
PNGS = ("latency_cdf.png", "saturation.png", "windows.png")


def documented(section: str) -> list[str]:
    """Field names listed in client/loadgen/__init__.py under `section` (4-space indented `name:` lines)."""
    text = loadgen.__doc__.split(section, 1)[1]
    names = []
    for line in text.splitlines()[1:]:
        if not line.strip():
            break
        m = re.match(r"^    (\w[\w, ]*):", line)
        if m:
            names += [n.strip() for n in m.group(1).split(",")]
    return names


@pytest.fixture(scope="module")
def server():
    srv = ServerThread(metrics_port=0).start()
    yield srv
    srv.stop()


def server_counts(srv) -> dict:
    """(rpc, code) -> nmt_requests_total, read with the test helper (not the load generator's parser)."""
    out = {}
    for line in srv.metrics_text().splitlines():
        if line.startswith("nmt_requests_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            out[labels["rpc"], labels["code"]] = float(line.rsplit(" ", 1)[1])
    return out


def delta(before: dict, after: dict) -> dict:
    d = {k: int(after[k] - before.get(k, 0.0)) for k in after}
    return {k: v for k, v in d.items() if v}


def flat(calls: dict) -> dict:
    return {(rpc, code): n for rpc, codes in calls.items() for code, n in codes.items()}


def run_json(tmp_path, name: str, *args: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert main([*args, "--src-file", str(FIXTURE), "--json", str(out), "--quiet"]) == 0
    return json.loads(out.read_text())


def check_schema(level: dict, with_server: bool) -> None:
    for name in documented("Level fields:"):
        assert name in level, name
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "client_loop_lag_ms"):
        assert set(level[key]) == {"n", "mean", "std", "p50", "p90", "p99"}
    assert set(level["quantiles_ms"]) == {"ttft", "tpot", "e2e"}
    assert all(set(w) >= {"start_s", "end_s", "rps", "output_tokens_per_s", "ttft_p90_ms", "e2e_p90_ms"}
               for w in level["windows"])
    if with_server:
        for name in documented("Server fields:"):
            if name != "note":  # only present when scraping failed
                assert name in level["server"], name


def test_closed_loop_counts_match_the_server(server, tmp_path):
    before, tokens_before = server_counts(server), server.metric("nmt_output_tokens_total", missing_ok=True)
    res = run_json(tmp_path, "closed", "--target", server.target, "--concurrency", "2", "--requests", "20",
                   "--mix", MIX, "--max-output-tokens", "12", "--warmup", "0", "--seed", "3",
                   "--metrics-url", f"127.0.0.1:{server.app.metrics_port}", "--slo-e2e-ms", "60000",
                   "--report", str(tmp_path / "report"))
    (lv,) = res["levels"]
    assert (lv["mode"], lv["concurrency"], lv["offered_rps"]) == ("closed", 2, None)
    check_schema(lv, with_server=True)
    # What was sent is fixed by the seed: the same mix draw as an independent Plan.
    plan = Plan(load_mix(MIX), ["x"], 3)
    by_rpc = Counter(plan[i].entry.method for i in range(20))
    assert lv["sent"] == sum(lv["codes"].values()) == 20 and lv["warmup_requests"] == 0
    assert {rpc: sum(c.values()) for rpc, c in lv["calls"].items()} == by_rpc
    assert lv["targets"] == {server.target: 20}
    # The server's own counters moved by exactly what the client counted, by rpc and code.
    assert delta(before, server_counts(server)) == flat(lv["calls"])
    assert lv["server"]["requests"] == lv["calls"] and lv["server"]["matches_client"] is True
    tokens = server.metric("nmt_output_tokens_total") - tokens_before
    assert lv["output_tokens"] == lv["server"]["output_tokens"] == tokens == lv["tokens"]
    assert lv["slo"]["met"] == lv["requests"]  # a 60 s objective: every OK request meets it
    for png in PNGS:
        assert (tmp_path / "report" / png).stat().st_size > 1000
    assert "c=2" in (tmp_path / "report" / "index.html").read_text()


def test_open_loop_sends_the_seeded_schedule(server, tmp_path):
    before = server_counts(server)
    res = run_json(tmp_path, "open", "--target", server.target, "--rate", "20", "--duration", "1.2",
                   "--mix", MIX, "--max-output-tokens", "12", "--warmup", "3", "--seed", "11",
                   "--metrics-url", f"http://127.0.0.1:{server.app.metrics_port}/metrics")
    (lv,) = res["levels"]
    check_schema(lv, with_server=True)
    assert (lv["mode"], lv["offered_rps"], lv["arrival"]) == ("open", 20.0, "poisson")
    times = arrival_times(20, seed=11, duration=1.2)
    assert lv["sent"] == len(times) == sum(lv["codes"].values()) and lv["unsent"] == 0
    assert lv["schedule_digest"] == Plan(load_mix(MIX), [t for t in FIXTURE.read_text().splitlines() if t.strip()],
                                         11).digest(len(times), times)
    assert isinstance(lv["late_sends"], int) and lv["warmup_requests"] == 3
    # The /metrics section covers the measured phase only; the whole run adds the warm-up.
    assert lv["server"]["requests"] == lv["calls"]
    assert lv["server"]["output_tokens"] == lv["output_tokens"]
    assert sum(delta(before, server_counts(server)).values()) == lv["sent"] + 3


def test_a_busy_client_loop_is_measured_and_reported():
    """client_loop_lag_ms: a request that holds the load generator's event loop for 0.3 s makes its 50 ms
    timer run at least 0.25 s late, and the report says the latencies include the client's own wait."""

    from client.loadgen.measure import Sample
    from client.loadgen.report import table
    from client.loadgen.runner import closed_loop

    async def send(i: int) -> Sample:
        await asyncio.sleep(0.12)  # the timer is armed and waiting ...
        time.sleep(0.3)  # ... while the loop is held, as a CPU-starved client's would be
        return Sample(None, [], 0.42, 1)

    lv = asyncio.run(closed_loop(send, 1, requests=2)).summary()
    lag = lv["client_loop_lag_ms"]
    assert lag["n"] >= 2 and lag["p99"] >= 250 and lag["p50"] >= 0, lag
    assert "this client's event loop ran up to" in table([lv])


def test_schedules_and_plans_are_reproducible():
    a = arrival_times(10, seed=5, requests=200)
    assert np.array_equal(a, arrival_times(10, seed=5, requests=200)) and a[0] == 0.0 and len(a) == 200
    assert not np.array_equal(a, arrival_times(10, seed=6, requests=200))
    assert np.allclose(arrival_times(20, seed=5, requests=200) * 2, a)  # one pattern, stretched per rate
    g = arrival_times(10, arrival="gamma", burstiness=0.5, seed=5, duration=30)
    assert np.array_equal(g, arrival_times(10, arrival="gamma", burstiness=0.5, seed=5, duration=30))
    assert g.max() < 30 and np.all(np.diff(g) >= 0)
    assert np.allclose(np.diff(arrival_times(4, arrival="constant", requests=5)), 0.25)
    assert len(arrival_times(1000, seed=1, duration=10, requests=7)) == 7
    mix = load_mix("rpc=stream weight=2; rpc=unary texts=1-3; rpc=stream temperature=0.7")
    p1, p2 = Plan(mix, ["a", "b", "c"], 9), Plan(mix, ["a", "b", "c"], 9)
    seq = [(r.entry.name, r.texts, r.options.get("seed")) for r in (p1[i] for i in range(50))]
    assert seq == [(r.entry.name, r.texts, r.options.get("seed")) for r in (p2[i] for i in range(50))]
    assert p1.digest(50) == p2.digest(50) != Plan(mix, ["a", "b", "c"], 10).digest(50)
    assert all(s is not None for name, _, s in seq if name == "stream2")  # sampling gets a per-request seed


def test_mix_specs(tmp_path):
    yaml_file = tmp_path / "mix.yaml"
    yaml_file.write_text("- {name: chat, rpc: stream, weight: 3, max_output_tokens: 32}\n"
                         "- {name: batch, rpc: unary, texts: [2, 8], options: {beam_size: 4}}\n")
    mix = load_mix(str(yaml_file), {"max_output_tokens": 64})
    assert [(e.name, e.method, e.weight, e.texts) for e in mix] == \
        [("chat", "TranslateStream", 3.0, (1, 1)), ("batch", "Translate", 1.0, (2, 8))]
    assert mix[0].options == {"max_output_tokens": 32} and mix[1].options == {"max_output_tokens": 64, "beam_size": 4}
    assert load_mix('[{"rpc": "unary", "texts": 3}]')[0].texts == (3, 3)
    assert load_mix(None, base={"rpc": "unary", "texts": [2, 2]})[0].method == "Translate"
    for bad in ("rpc=stream texts=2", "rpc=fax", "rpc=stream colour=red", "rpc=unary weight=0", "rpc=stream n=2"):
        with pytest.raises(ValueError):
            load_mix(bad)


def test_legacy_api_for_serving_load(server):
    import benchmarks.serving_load  # noqa: F401 (imports Sample, grpc_stream, run_level from here)

    async def go():
        async with AsyncTranslatorClient(server.target, timeout=60, retries=0) as c:
            return await loadgen.run_level(loadgen.grpc_stream(c, max_output_tokens=8), ["A dog runs.", "Hi."],
                                           2, 4, 30)
    s = asyncio.run(go()).summary()
    assert (s["concurrency"], s["requests"], s["errors"]) == (2, 4, 0)
    assert s["tokens"] > 0 and {"tokens_per_s", "seconds"} <= set(s)
    assert all(set(s[k]) >= {"p50", "p90", "p99"} for k in ("ttft_ms", "itl_ms", "e2e_ms"))
    assert loadgen.Sample(0.1, [0.01], 0.3, 3).tpot == pytest.approx(0.1)


def result(levels: list[dict]) -> dict:
    return {"levels": [{"mode": "closed", "requests": 10, "errors": 0, "late_sends": 0,
                        "achieved_rps": rps, "output_tokens_per_s": 10 * rps, "goodput_rps": rps,
                        "e2e_ms": {"p50": p, "p90": 2 * p, "p99": 3 * p}, **extra} for rps, p, extra in levels]}


def test_compare(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(result([(10.0, 100.0, {"concurrency": 1}), (20.0, 150.0, {"concurrency": 8})])))
    b.write_text(json.dumps(result([(10.0, 100.0, {"concurrency": 1}), (15.0, 300.0, {"concurrency": 8}),
                                    (30.0, 400.0, {"concurrency": 32})])))
    cmp = compare(load(a), load(b), 0.05)
    assert [lv["level"] for lv in cmp["levels"]] == ["c=1", "c=8"] and cmp["only_b"] == ["('closed', 32)"]
    worse = {r["metric"] for lv in cmp["levels"] for r in lv["rows"] if r["worse"]}
    assert worse == {"OK req/s", "goodput req/s", "output tok/s", "e2e p50 ms", "e2e p90 ms", "e2e p99 ms"}
    assert main(["compare", str(a), str(b)]) == 0
    assert main(["compare", str(a), str(b), "--fail-above", "10"]) == 1
    assert main(["compare", str(a), str(a), "--fail-above", "10"]) == 0
    legacy = tmp_path / "old.json"  # the pre-package tool wrote a bare list of levels
    legacy.write_text(json.dumps([{"concurrency": 1, "requests": 8, "errors": 0, "tokens": 80, "seconds": 2.0,
                                   "tokens_per_s": 40.0, "ttft_ms": {"p50": 5.0}, "e2e_ms": {"p50": 50.0}}]))
    assert compare(load(legacy), load(a))["levels"][0]["level"] == "c=1"


class FakeTranslator(pb_grpc.TranslatorServicer):
    """Answers instantly (model "slow": after 2 s) and records the authorization metadata."""

    def __init__(self):
        self.auth, self.lock = [], threading.Lock()

    def _seen(self, context):
        with self.lock:
            self.auth.append(dict(context.invocation_metadata()).get("authorization"))

    def TranslateStream(self, request, context):
        self._seen(context)
        for i in range(3):
            yield pb.TranslateStreamResponse(delta="x ", token_ids=[i])
        yield pb.TranslateStreamResponse(final=True, output_tokens=3)

    def Translate(self, request, context):
        self._seen(context)
        if request.model == "slow":
            time.sleep(2)
        return pb.TranslateResponse(translations=[pb.Translation(output_tokens=2) for _ in request.texts])


def test_tls_api_key_targets_and_deadlines(tmp_path):
    if not shutil.which("openssl"):
        pytest.skip("no openssl to make a test certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost"],
                   check=True, capture_output=True)
    creds = grpc.ssl_server_credentials([(key.read_bytes(), cert.read_bytes())])
    fakes, servers, targets = [], [], []
    for _ in range(2):
        fake, srv = FakeTranslator(), grpc.server(futures.ThreadPoolExecutor(8))
        pb_grpc.add_TranslatorServicer_to_server(fake, srv)
        targets.append(f"127.0.0.1:{srv.add_secure_port('127.0.0.1:0', creds)}")
        srv.start()
        fakes.append(fake)
        servers.append(srv)
    try:
        mix = "name=s rpc=stream; name=u rpc=unary texts=2; name=late rpc=unary model=slow timeout=0.2"
        res = run_json(tmp_path, "fake", "--target", ",".join(targets), "--tls-ca", str(cert),
                       "--tls-server-name", "localhost", "--api-key", "sekrit", "--concurrency", "3",
                       "--requests", "12", "--warmup", "0", "--mix", mix, "--seed", "1")
    finally:
        for srv in servers:
            srv.stop(0)
    (lv,) = res["levels"]
    plan = Plan(load_mix(mix), ["x"], 1)
    kinds = Counter(plan[i].entry.name for i in range(12))
    assert lv["targets"] == {targets[0]: 6, targets[1]: 6}
    assert all(a == "Bearer sekrit" for f in fakes for a in f.auth) and sum(len(f.auth) for f in fakes) == 12
    assert lv["codes"] == {k: v for k, v in {"OK": kinds["s"] + kinds["u"],
                                              "DEADLINE_EXCEEDED": kinds["late"]}.items() if v}
    assert lv["output_tokens"] == 3 * kinds["s"] + 2 * 2 * kinds["u"]
    assert lv["ttft_ms"]["n"] == lv["tpot_ms"]["n"] == kinds["s"] and lv["itl_ms"]["n"] == 2 * kinds["s"]
    assert res["config"]["tls"] is True and res["config"]["api_key"] is True
    assert "sekrit" not in json.dumps(res)


def test_module_entry_point():
    out = subprocess.run([sys.executable, "-m", "client.loadgen", "--help"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and "--rate" in out.stdout and "--slo-ttft-ms" in out.stdout


def test_benchmark_load_levels_run_as_the_load_generator(server):
    """benchmarks/harness.py's levels (what checkout_ab and the studies serve) are commands the load generator
    runs: closed loops of streams and of 32-text calls, and streams arriving at a seeded rate."""
    from benchmarks.harness import ARRIVAL_SEED, level_command, serve_level
    for level, mode in (("stream:2", "closed"), ("unary:1", "closed"), ("rate:8", "open")):
        before = server_counts(server)
        lv = serve_level(server.target, level, 1.0, ("--max-output-tokens", "6"))
        assert lv["mode"] == mode and lv["errors"] == 0 and lv["requests"] > 0 and lv["output_tokens"] > 0
        assert sum(delta(before, server_counts(server)).values()) == lv["sent"]
        if level.startswith("unary"):
            assert set(lv["calls"]) == {"Translate"} and lv["texts"] == 32 * lv["requests"]
        else:
            assert set(lv["calls"]) == {"TranslateStream"} and lv["ttft_ms"]["n"] == lv["requests"]
    # A rate level's arrivals are the seeded schedule, the same for every server an A/B starts.
    assert lv["offered_rps"] == 8.0 and lv["sent"] == len(arrival_times(8, seed=ARRIVAL_SEED, duration=1.0))
    for bad in ("stream:0", "unary:x", "rate:-2", "rate:nan", "rate:inf", "burst:4", "stream"):
        with pytest.raises(ValueError, match="load level"):
            level_command(server.target, bad, 1.0)
