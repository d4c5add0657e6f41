"""The engine core in its own process (--engine-core process, server/coreprocess/): the same tokens as
the in-process engine on every path, cancellation and deadlines reaching the core, metrics read
from it, a core killed under load (every call answered UNAVAILABLE, the core restarted, the same
outputs after), SIGTERM's drain across the split, and no core left behind by a dead frontend.

Where a test needs work to be in flight at a given moment it stops the core with SIGSTOP (the
process is frozen, nothing it holds can finish) rather than hoping a decode is still running."""
from __future__ import annotations

import concurrent.futures as cf
import os
import signal
import time

import grpc
import pytest

from benchmarks.harness import descendants, free_port, proc_status, tree_memory, tree_rss_mb
from client.client import TranslatorClient
from tests.serving import (ServerThread, flickr_sentences, read_to_end, start_subprocess, wait_for,
                           wait_process_serving)

MODEL = "multi30k-en-de-small"
# ~uniform sampling, and EOS banned until the budget: the request surely runs 250 steps
LONG = dict(max_output_tokens=250, min_output_tokens=250, temperature=5.0, seed=1)


@pytest.fixture(scope="module")
def core_server():
    srv = ServerThread(engine_core="process", engine_replicas=1, runaway_guard=False).start()
    with TranslatorClient(srv.target, timeout=120, retries=0) as client:
        yield srv, client
    srv.stop()


@pytest.fixture(scope="module")
def thread_server():
    srv = ServerThread(runaway_guard=False).start()
    with TranslatorClient(srv.target, timeout=120, retries=0) as client:
        yield srv, client
    srv.stop()


def core_pid(srv: ServerThread) -> int:
    return srv.app.core.members[0].pid


def status_of(call) -> grpc.StatusCode:
    try:
        call()
    except grpc.RpcError as e:
        return e.code()
    return grpc.StatusCode.OK


@pytest.mark.parametrize("decoding", [{}, {"beam_size": 4}, {"temperature": 0.8, "seed": 7, "top_k": 20}],
                         ids=["greedy", "beam4", "sampling"])
def test_same_tokens_as_the_engine_in_process(core_server, thread_server, decoding):
    texts = flickr_sentences(128)

    def run(client) -> list:
        return [t for i in range(0, len(texts), 64) for t in
                client.translate(texts[i:i + 64], return_tokens=True, return_scores=True, **decoding).translations]
    got, want = run(core_server[1]), run(thread_server[1])
    assert [list(t.hypotheses[0].token_ids) for t in got] == [list(t.hypotheses[0].token_ids) for t in want]
    assert [t.hypotheses[0].score for t in got] == pytest.approx([t.hypotheses[0].score for t in want], abs=1e-6)
    assert [(t.finish_reason, t.input_tokens, t.output_tokens) for t in got] == \
        [(t.finish_reason, t.input_tokens, t.output_tokens) for t in want]


def test_streams_equal_unary_and_embeddings_match(core_server, thread_server):
    _, client = core_server
    texts = flickr_sentences(24)
    unary = [t.hypotheses[0].text for t in client.translate(texts).translations]
    with cf.ThreadPoolExecutor(8) as pool:  # concurrent streams share the core's steps
        streams = list(pool.map(lambda t: list(client.translate_stream(t)), texts))
    assert ["".join(m.delta for m in s) for s in streams] == unary
    assert all(s[-1].final and s[-1].output_tokens == sum(len(m.token_ids) for m in s) for s in streams)
    got = client.embed(texts[:4], normalize=True).embeddings
    want = thread_server[1].embed(texts[:4], normalize=True).embeddings
    for a, b in zip(got, want):
        assert list(a.values) == pytest.approx(list(b.values), abs=1e-6)


def test_bad_requests_are_refused_by_the_frontend_as_before(core_server):
    _, client = core_server
    assert status_of(lambda: client.translate(["a"], beam_size=99)) == grpc.StatusCode.INVALID_ARGUMENT
    assert status_of(lambda: client.translate(["a"], model="nope")) == grpc.StatusCode.NOT_FOUND
    assert client.translate(["A dog."]).translations[0].hypotheses[0].text


def test_core_metrics_are_exported_by_the_frontend(core_server):
    srv, client = core_server
    before = srv.metric("nmt_output_tokens_total", missing_ok=True, model=MODEL)
    out = client.translate(["A man rides a bike."], model=MODEL)
    produced = out.translations[0].output_tokens
    # The engine's series come from the core process at each scrape; the frontend's own from here.
    assert srv.settled_metric("nmt_output_tokens_total", before + produced, model=MODEL) == before + produced
    assert srv.metric("nmt_decode_step_duration_seconds_count", model=MODEL) > 0
    assert srv.metric("nmt_requests_total", rpc="Translate", code="OK") >= 1
    assert srv.metric("nmt_engine_core_restarts_total") == 0  # exported (metric() raises if not), nothing restarted
    text = srv.metrics_text()
    for family in ("nmt_running_requests", "nmt_kv_cache_usage_ratio", "nmt_inter_token_seconds"):
        assert text.count(f"# TYPE {family} ") == 1, family  # the core's, once (not also a zero copy here)


def test_cancel_reaches_the_core(core_server):
    srv, client = core_server
    srv.wait_idle()
    before = srv.metric("nmt_output_tokens_total", missing_ok=True, model=MODEL)
    stream = client.translate_stream("A dog runs on the beach.", **LONG)
    next(iter(stream))  # decoding in the core
    os.kill(core_pid(srv), signal.SIGSTOP)  # frozen: it cannot finish the 250 tokens meanwhile
    try:
        stream.cancel()
        assert read_to_end(stream)[0] == grpc.StatusCode.CANCELLED
    finally:
        os.kill(core_pid(srv), signal.SIGCONT)
    srv.wait_idle()  # the core dropped the job: slot free, nothing counted as produced
    assert srv.metric("nmt_kv_cache_usage_ratio") == 0
    assert srv.metric("nmt_output_tokens_total", missing_ok=True, model=MODEL) == before


def test_deadline_reaches_the_core(core_server):
    srv, client = core_server
    srv.wait_idle()
    before = srv.metric("nmt_output_tokens_total", missing_ok=True, model=MODEL)
    stream = client.translate_stream("A dog runs on the beach.", timeout=1.5, **LONG)
    next(iter(stream))
    os.kill(core_pid(srv), signal.SIGSTOP)
    try:
        assert read_to_end(stream)[0] == grpc.StatusCode.DEADLINE_EXCEEDED  # the frozen core cannot finish
    finally:
        os.kill(core_pid(srv), signal.SIGCONT)
    srv.wait_idle()
    assert srv.metric("nmt_output_tokens_total", missing_ok=True, model=MODEL) == before


def test_a_killed_core_fails_calls_unavailable_and_comes_back(start_server):
    srv = start_server(engine_core="process", engine_replicas=1, runaway_guard=False)
    texts = flickr_sentences(16)
    with TranslatorClient(srv.target, timeout=120, retries=0) as client:
        before = [t.hypotheses[0].text for t in client.translate(texts).translations]
        old = core_pid(srv)
        # 48 more rows make each step several times longer: no stream can decode its 250 tokens in the moments
        # between its first message and the freeze below (with 8 rows alone, a test thread held up for a
        # tenth of a second on a busy machine saw the first streams finish before it).
        background = [client.translate_stream(t, **LONG) for t in texts * 3]
        streams = [client.translate_stream(t, **LONG) for t in texts[:8]]
        for s in streams:
            next(iter(s))  # each is decoding in the core
        os.kill(old, signal.SIGSTOP)  # nothing finishes from here on
        with cf.ThreadPoolExecutor(12) as pool:
            ends = [pool.submit(read_to_end, s) for s in streams]
            # Calls sent to the frozen core wait for its answer to their submission.
            unary = [pool.submit(status_of, lambda: client.translate(texts[:2])) for _ in range(2)]
            assert wait_for(lambda: len(srv.app.core.members[0].link.waiting) == 2)
            os.kill(old, signal.SIGKILL)
            codes = [f.result(60)[0] for f in ends] + [f.result(60) for f in unary]
        codes += [read_to_end(s)[0] for s in background]
        assert codes == [grpc.StatusCode.UNAVAILABLE] * 58, codes  # every call answered, retryable
        assert client.health("liveness") == "SERVING"  # the frontend never went down
        t0 = time.monotonic()
        assert wait_for(lambda: client.health() == "SERVING" and core_pid(srv) != old, timeout=90)
        print(f"SERVING again {time.monotonic() - t0:.2f} s after the kill was noticed")
        assert srv.metric("nmt_engine_core_restarts_total") == 1
        after = [t.hypotheses[0].text for t in client.translate(texts).translations]
        assert after == before


def test_sigterm_drains_through_the_core_and_leaves_no_process():
    port, metrics_port = free_port(), free_port()
    proc = start_subprocess(port, metrics_port, "--engine-core", "process", "--engine-replicas", "1",
                            "--runaway-guard", "false", "--grace-period-s", "60")
    try:
        with TranslatorClient(f"127.0.0.1:{port}", timeout=120, retries=0) as client:
            wait_process_serving(client, proc)
            (core,) = descendants(proc.pid)
            stream = client.translate_stream("A dog runs on the beach.", **LONG)
            first = next(iter(stream))
            proc.send_signal(signal.SIGTERM)
            code, rest = read_to_end(stream)
            assert code == grpc.StatusCode.OK
            messages = [first, *rest]
            assert messages[-1].final and messages[-1].output_tokens == 250
        assert proc.wait(60) == 0
        assert not os.path.exists(f"/proc/{core}") or "zombie" in open(f"/proc/{core}/status").read().lower()
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_dead_frontend_takes_its_core_with_it():
    port, metrics_port = free_port(), free_port()
    proc = start_subprocess(port, metrics_port, "--engine-core", "process", "--engine-replicas", "1")
    try:
        with TranslatorClient(f"127.0.0.1:{port}", timeout=60, retries=0) as client:
            wait_process_serving(client, proc)
        (core,) = descendants(proc.pid)
        # What the soak and the benchmarks read as the server's memory includes the core's (it holds the
        # models): the sum is exactly the two processes' VmRSS, read once each.
        both, alone = tree_rss_mb(proc.pid), [proc_status(p)["VmRSS"] / 2**20 for p in (proc.pid, core)]
        assert alone[1] > 20 and abs(both - sum(alone)) < 0.05 * sum(alone), (both, alone)
        # PSS splits the pages the two share (libraries, Python): less than the RSS sum, more than either.
        mem = tree_memory(proc.pid)
        assert set(mem["processes"]) == {proc.pid, core} and max(alone) < mem["pss"] < mem["rss"], mem
        proc.kill()
        proc.wait(10)

        def gone() -> bool:
            try:
                with open(f"/proc/{core}/status") as f:
                    return "zombie" in f.read().lower()
            except FileNotFoundError:
                return True
        assert wait_for(gone, timeout=30)  # the core notices its parent is gone within its poll period
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_core_loads_no_tokenizer(core_server):
    """The core decodes ids its frontend tokenised; it gets the vocabulary's pieces from the frontend
    (server/frontend/hosted.py) rather than loading the tokenizers library and each model's tokenizer (~11 MB
    resident per replica, measured), and its output is the frontend's, as every test here checks."""
    srv, client = core_server
    with open(f"/proc/{core_pid(srv)}/maps", encoding="utf-8") as f:
        libraries = {line.split()[-1].rsplit("/", 1)[-1] for line in f if "/" in line}
    assert not any(name.startswith("tokenizers") for name in libraries), sorted(libraries)
    assert any(name.startswith("onnxruntime") for name in libraries)  # the probe reads the right process
    assert client.translate(["A man is riding a bike."], model=MODEL).translations[0].hypotheses[0].text


def test_extreme_settings_beside_ordinary_calls_fail_nothing_in_the_core_process(core_server):
    """Issue 33 in the engine-core layout: every extreme-but-accepted setting (tests/system/test_isolation.py's,
    where the batch is gated to be shared) sent at once with ordinary calls: all succeed, and the
    ordinary outputs equal their outputs at rest."""
    from tests.system.test_isolation import EXTREME, MODEL
    srv, client = core_server
    ordinary = flickr_sentences(8)
    at_rest = [t.hypotheses[0].text for t in client.translate(ordinary, model=MODEL).translations]
    with cf.ThreadPoolExecutor(len(EXTREME) + 1) as pool:
        extreme = [pool.submit(client.translate, ["A little girl climbs into a wooden playhouse."], model=MODEL,
                               **kw) for kw in EXTREME]
        loaded = pool.submit(client.translate, ordinary, model=MODEL)
        assert [t.hypotheses[0].text for t in loaded.result().translations] == at_rest
        assert all(f.result().translations[0].hypotheses for f in extreme)
