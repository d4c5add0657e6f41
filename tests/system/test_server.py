"""The gRPC service end to end: a real server on a loopback port, the shipped bundle, the real client."""
import concurrent.futures as cf
import threading
import time

import grpc
import numpy as np
import pytest
from tests.serving import REPOSITORY, EngineGate, ServerThread, flickr_sentences, wait_for

from client import TranslatorClient
from models.core.bundle import discover
from models.core.runtime import OnnxModel, RuntimeOptions
from models.core.static_decode import pad_batch
from protos.nmt.v1 import translator_pb2 as pb
from protos.nmt.v1 import translator_pb2_grpc as pb_grpc
from server.core.request import DecodingParams, ErrorEvent, FinishEvent


@pytest.fixture(scope="module")
def server(shipped_server):
    return shipped_server


@pytest.fixture(scope="module")
def client(server):
    with TranslatorClient(server.target, timeout=120) as c:
        yield c


def code_of(call) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as err:
        call()
    return err.value.code(), err.value.details()


def default_bundle():
    """The served version of the default model (its dimensions are the API's, e.g. the embedding size)."""
    return next(b for b in discover(REPOSITORY) if b.name == "multi30k-en-de-small")


def test_list_models_and_translate(client):
    models = client.list_models()
    assert models.default_model == "multi30k-en-de-small"
    info = models.models[0]
    assert (info.source_language, info.target_language, info.is_default) == ("en", "de", True)
    assert info.max_source_tokens > 0 and info.embedding_dimension == default_bundle().spec.d_model
    resp = client.translate(["A man is riding a bike.", "Two dogs are playing in the snow."], return_scores=True,
                            return_tokens=True)
    assert resp.model == "multi30k-en-de-small" and len(resp.translations) == 2
    for tr in resp.translations:
        hyp = tr.hypotheses[0]
        assert hyp.text and hyp.score < 0 and len(hyp.token_ids) == tr.output_tokens == len(hyp.tokens)
        assert tr.finish_reason == pb.FINISH_REASON_EOS
        t = tr.timings
        assert 0 <= t.queue_seconds <= t.first_token_seconds <= t.total_seconds


def near_tie_at_divergence(onnx_model, src_ids, a, b) -> float:
    """Top-2 logit gap where two greedy outputs first differ (teacher-forced on the common prefix)."""
    i = next(k for k in range(min(len(a), len(b)) + 1) if k == min(len(a), len(b)) or a[k] != b[k])
    ids, mask = pad_batch([src_ids], 0)
    _, ck, cv = onnx_model.encode(ids, mask)
    prefix = [onnx_model.spec.bos_id] + a[:i]
    s = onnx_model.spec
    past = np.zeros((s.n_dec_layers, 1, s.n_heads, 0, s.head_dim), np.float32)
    logits, _, _ = onnx_model.decode_step(np.array([prefix]), np.arange(len(prefix))[None], past, past,
                                          np.zeros((1, 0), bool), ck, cv, mask)
    top2 = np.sort(logits[0, -1])[-2:]
    return float(top2[1] - top2[0])


@pytest.mark.parametrize("beam", [1, 4])
def test_batched_equals_one_at_a_time(server, client, beam):
    texts = flickr_sentences(200)
    assert len({len(t.split()) for t in texts}) > 10  # many different lengths
    single = [client.translate([t], beam_size=beam, return_tokens=True, return_scores=True).translations[0]
              for t in texts]
    # 8 requests of 25 texts, all queued before the engine runs (held at the gate), then decoded
    # together; each step records which requests had rows in it.
    model = server.app.models["multi30k-en-de-small"]
    request_of = {tuple(model.tok.encode(t)): i // 25 for i, t in enumerate(texts)}
    steps: list[set] = []
    record = lambda: steps.append({request_of[tuple(st.job.src_ids)] for st in model.here.scheduler.running})  # noqa: E731
    with EngineGate(model, after=record) as gate, cf.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(client.translate, texts[i:i + 25], beam_size=beam, return_tokens=True,
                               return_scores=True) for i in range(0, 200, 25)]
        assert wait_for(lambda: server.metric("nmt_waiting_requests") == 200)
        gate.open()
        batched = [tr for f in futures for tr in f.result().translations]
    shared = [s for s in steps if len(s) > 1]
    assert len(shared) > len(steps) / 2 and max(map(len, steps)) >= (3 if beam == 1 else 2), \
        f"{len(shared)} of {len(steps)} steps mixed requests"
    onnx_model = OnnxModel(discover(server.cfg.model_repository)[0], RuntimeOptions(provider="cpu"))
    tok = model.tok
    differing = 0
    for text, a, b in zip(texts, single, batched):
        ta, tb = list(a.hypotheses[0].token_ids), list(b.hypotheses[0].token_ids)
        if ta == tb:
            continue
        differing += 1
        if beam == 1:
            assert near_tie_at_divergence(onnx_model, tok.encode(text), ta, tb) < 1e-4, text
        else:  # beam: the two best hypotheses must score the same to within float noise
            assert abs(a.hypotheses[0].score - b.hypotheses[0].score) < 1e-4, text
    assert differing <= 2


def test_stream_concatenates_to_unary(server, client):
    model = server.app.models["multi30k-en-de-small"]
    for text in flickr_sentences(12)[4:]:
        unary = client.translate([text], return_tokens=True).translations[0]
        # Really incremental, and deterministic: the engine runs one iteration (encoder pass and
        # the first token), then waits at the gate until the client holds the first message. A
        # slow reader would otherwise find several tokens (or the whole text) coalesced in it.
        with EngineGate(model, let_through=1) as gate:
            stream = client.translate_stream(text)
            first = next(stream)
            assert not gate.released.is_set()
            gate.open()
            msgs = [first, *stream]
        assert not gate.timed_out
        assert first.token_ids == unary.hypotheses[0].token_ids[:1] and not first.final
        assert first.delta and first.delta != unary.hypotheses[0].text
        assert msgs[-1].final and not any(m.final for m in msgs[:-1])
        assert "".join(m.delta for m in msgs) == unary.hypotheses[0].text
        assert [t for m in msgs for t in m.token_ids] == list(unary.hypotheses[0].token_ids)
        assert msgs[-1].output_tokens == unary.output_tokens
        t = msgs[-1].timings
        assert t.first_token_seconds <= t.total_seconds


def test_stream_interval_sends_chunks_that_still_add_up(start_server):
    srv = start_server(stream_interval=4, metrics_port=-1)
    # Engine side, deterministic: the first token at once, then chunks of at least 4 (a visit of several
    # steps, --visit-steps, sends its tokens together), the tail before the end.
    model = srv.app.models["multi30k-en-de-small"]
    events, done = [], threading.Event()

    def sink(event):
        events.append(event)
        if isinstance(event, FinishEvent):
            done.set()
    text = flickr_sentences(8)[2]
    (job,) = model.jobs([text], DecodingParams(), sink, None, stream=True)
    model.here.scheduler.submit([job])
    assert done.wait(30)
    chunks = [len(e.token_ids) for e in events[:-1]]
    n = len(events[-1].hypotheses[0].tokens)
    assert sum(chunks) == n and chunks[0] == 1 and all(c >= 4 for c in chunks[1:-1]) and chunks[-1] >= 1
    # Through gRPC: the chunks still add up to the unary result, in about n/4 messages instead of n + 1
    # (fewer when a slow reader lets chunks pile up into one message).
    with TranslatorClient(srv.target, timeout=60) as c:
        for text in flickr_sentences(8)[:4]:
            unary = c.translate([text], return_tokens=True).translations[0]
            msgs = list(c.translate_stream(text))
            n = len(unary.hypotheses[0].token_ids)
            assert [t for m in msgs for t in m.token_ids] == list(unary.hypotheses[0].token_ids)
            assert "".join(m.delta for m in msgs) == unary.hypotheses[0].text
            assert msgs[-1].final and len(msgs) <= 2 + (n - 1 + 3) // 4, [len(m.token_ids) for m in msgs]


def test_target_prefix_starts_the_translation_in_documents_and_streams(client):
    """The shipped model: each text's first sentence starts with the prefix; the rest of a document
    is translated as without it; a stream sends the prefix first and adds up to the unary text."""
    doc = "A man is riding a bike. Two dogs play in the snow."
    free = client.translate([doc]).translations[0].hypotheses[0].text
    second = client.translate(["Two dogs play in the snow."]).translations[0].hypotheses[0].text
    for beam in (1, 4):
        got = client.translate([doc, "A cat sleeps."], target_prefix="Eine Frau", beam_size=beam).translations
        assert all(t.hypotheses[0].text.startswith("Eine Frau") for t in got), got
        assert got[0].hypotheses[0].text.endswith(" " + second) and got[0].hypotheses[0].text != free
        messages = list(client.translate_stream(doc, target_prefix="Eine Frau", beam_size=beam))
        assert "".join(m.delta for m in messages) == got[0].hypotheses[0].text
    first = next(client.translate_stream(doc, target_prefix="Eine Frau"))  # (a slow reader may get more at once)
    assert first.delta.startswith("Ein")


def test_beam_stream_equals_beam_unary(client):
    text = "A little girl climbs into a wooden playhouse."
    unary = client.translate([text], beam_size=4).translations[0].hypotheses[0].text
    assert "".join(m.delta for m in client.translate_stream(text, beam_size=4)) == unary


def test_seeded_sampling_repeats(client):
    texts = flickr_sentences(6)
    a = client.translate(texts, temperature=1.0, top_k=50, top_p=0.95, seed=7)
    b = client.translate(texts, temperature=1.0, top_k=50, top_p=0.95, seed=7)
    c = client.translate(texts, temperature=1.0, top_k=50, top_p=0.95, seed=8)
    text = lambda r: [t.hypotheses[0].text for t in r.translations]  # noqa: E731
    assert text(a) == text(b)
    assert text(a) != text(c)
    greedy = client.translate(texts)
    assert text(greedy) != text(a)  # sampling really samples
    n = client.translate(texts[:1], temperature=1.0, seed=3, num_hypotheses=3).translations[0]
    assert len(n.hypotheses) == 3


def test_controls_with_sampling_give_the_same_output_alone_and_in_a_batch(server, client):
    """Seeded sampling with a repetition penalty, no repeated 2-grams and a minimum length: each text
    alone = the same text among 23 others (greedy, beam and other settings) sharing the steps."""
    texts = flickr_sentences(24)
    opts = dict(temperature=0.9, top_k=40, seed=11, repetition_penalty=1.5, no_repeat_ngram_size=2,
                min_output_tokens=6)
    alone = [client.translate([t], return_tokens=True, **opts).translations[0].hypotheses[0].token_ids
             for t in texts[:6]]
    model = server.app.models["multi30k-en-de-small"]
    with EngineGate(model) as gate, cf.ThreadPoolExecutor(4) as pool:  # everything queued, then one batch
        mixed = pool.submit(client.translate, texts[:6], return_tokens=True, **opts)
        others = [pool.submit(client.translate, texts[6:], beam_size=b, repetition_penalty=p)
                  for b, p in ((1, 1.0), (3, 1.3), (1, 0.8))]
        assert wait_for(lambda: server.metric("nmt_waiting_requests") == 6 + 3 * 18)
        gate.open()
        together = [t.hypotheses[0].token_ids for t in mixed.result().translations]
        assert all(len(o.result().translations) == 18 for o in others)
    assert [list(a) for a in alone] == [list(t) for t in together]
    assert all(len(t) >= 6 for t in together)


def test_num_hypotheses_from_beam(client):
    tr = client.translate(["A dog runs on the beach."], beam_size=5, num_hypotheses=3, return_scores=True)
    hyps = tr.translations[0].hypotheses
    assert len(hyps) == 3 and hyps[0].score >= hyps[1].score >= hyps[2].score
    assert len({h.text for h in hyps}) == 3


def test_embed(client):
    texts = ["A dog runs on the beach.", "A man is riding a bike."]
    both = client.embed(texts)
    d_model = default_bundle().spec.d_model
    assert both.dimension == d_model and len(both.embeddings[0].values) == d_model
    alone = client.embed(texts[1:])
    assert np.allclose(both.embeddings[1].values, alone.embeddings[0].values, atol=1e-5)  # padding-masked
    unit = client.embed(texts, normalize=True)
    assert abs(np.linalg.norm(unit.embeddings[0].values) - 1.0) < 1e-5


def test_bad_input_gets_clear_errors_and_server_keeps_serving(server, client):
    INVALID = grpc.StatusCode.INVALID_ARGUMENT
    cases = [
        (lambda: client.translate([]), INVALID, "texts is empty"),
        (lambda: client.translate(["ok", ""]), INVALID, "texts[1] is empty"),  # "  " is layout: OK
        (lambda: client.translate(["word " * 400], split_sentences="off"), INVALID, "the limit is 256"),
        (lambda: client.translate(["a"] * 65), INVALID, "the limit is 64"),
        (lambda: client.translate(["a"], beam_size=9), INVALID, "beam_size 9 exceeds the limit 8"),
        (lambda: client.translate(["a"], temperature=0.5, beam_size=2), INVALID, "cannot be combined"),
        (lambda: client.translate(["a"], top_p=1.5, temperature=1.0), INVALID, "top_p 1.5"),
        (lambda: client.translate(["a"], max_output_tokens=10_000), INVALID, "max_output_tokens"),
        (lambda: client.translate(["a"], num_hypotheses=3), INVALID, "num_hypotheses 3"),
        (lambda: client.translate(["a"], repetition_penalty=-1.0), INVALID, "repetition_penalty -1.0 must be a finite number in (0, 10]"),
        (lambda: client.translate(["a"], repetition_penalty=float("nan")), INVALID, "repetition_penalty nan"),
        (lambda: client.translate(["a"], no_repeat_ngram_size=11), INVALID, "no_repeat_ngram_size 11 must be in [0, 10]"),
        (lambda: client.translate(["a"], max_output_tokens=5, min_output_tokens=6), INVALID, "min_output_tokens 6 must be in [0, 5]"),
        (lambda: client.translate(["a"], target_prefix="Hund " * 300), INVALID, "leave room for a translation"),
        (lambda: client.translate(["a"], alternatives=2, beam_size=3), INVALID, "alternatives continue greedily"),
        (lambda: list(client.translate_stream("a", alternatives=2)), INVALID, "alternatives 0"),
        (lambda: list(client.translate_stream("")), INVALID, "texts is empty"),
        (lambda: list(client.translate_stream("a", beam_size=3, num_hypotheses=2)), INVALID, "streaming"),
        (lambda: client.embed([]), INVALID, "texts is empty"),
        (lambda: client.translate(["a"], model="no-such-model"), grpc.StatusCode.NOT_FOUND, "no-such-model"),
    ]
    before = server.metric("nmt_requests_total", missing_ok=True, rpc="Translate", code="INVALID_ARGUMENT")
    for call, code, words in cases:
        got, details = code_of(call)
        assert got == code and words in details, (got, details)
    assert server.settled_metric("nmt_requests_total", before + 15, rpc="Translate", code="INVALID_ARGUMENT") == before + 15
    server.wait_idle()
    assert client.translate(["A man is riding a bike."]).translations[0].hypotheses[0].text


@pytest.fixture(scope="module")
def unguarded():
    """A server whose decodes run as long as the model goes on: the runaway guard (on by default)
    would end a long request by itself within ~3 x its source length, hiding whether a deadline or
    a cancel was what stopped it."""
    srv = ServerThread(runaway_guard=False, metrics_port=0).start()
    with TranslatorClient(srv.target, timeout=120) as c:
        yield srv, c
    srv.stop()


# ~uniform sampling, and EOS banned until the budget: the request surely runs 250 steps
LONG = dict(max_output_tokens=250, min_output_tokens=250, temperature=5.0, seed=1)


def test_deadline_frees_the_slot(unguarded):
    server, client = unguarded
    model = server.app.models["multi30k-en-de-small"]
    before = server.metric("nmt_requests_total", missing_ok=True, rpc="Translate", code="DEADLINE_EXCEEDED")
    with EngineGate(model, let_through=1) as gate, cf.ThreadPoolExecutor(1) as pool:
        # Running (one step done), then held past the deadline; the deadline leaves the request two
        # seconds to reach the engine, which the test waits for rather than assumes.
        call = pool.submit(code_of, lambda: client.translate(["A dog runs on the beach."], timeout=2.0, **LONG))
        assert wait_for(lambda: gate.done == 1 and gate.held.is_set(), timeout=2.0)
        got, _ = call.result(30)
        assert got == grpc.StatusCode.DEADLINE_EXCEEDED
        assert server.metric("nmt_running_requests") == 1  # still holding its slot: nothing ran since
        gate.step()  # the next iteration drops it (expired, and cancelled by the client's going away)
        assert server.metric("nmt_running_requests") == 0 and server.metric("nmt_kv_cache_usage_ratio") == 0
    assert server.settled_metric("nmt_requests_total", before + 1, rpc="Translate",
                                 code="DEADLINE_EXCEEDED") == before + 1
    assert client.translate(["A dog."]).translations[0].hypotheses[0].text


def test_the_engine_drops_expired_work_itself(unguarded):
    """The engine's own deadline, with no client cancel to help: a job submitted in-process with a
    deadline is failed DEADLINE_EXCEEDED at the first step after it passes, running or queued."""
    server, _ = unguarded
    model = server.app.models["multi30k-en-de-small"]
    events: list = []
    with EngineGate(model, let_through=1) as gate:
        deadline = time.monotonic() + 0.3
        running = model.jobs(["A dog runs on the beach."], DecodingParams(**LONG), events.append, deadline)
        model.here.scheduler.submit(running)
        assert wait_for(lambda: gate.held.is_set() and gate.done == 1)
        queued = model.jobs(["A cat."], DecodingParams(), events.append, deadline)
        model.here.scheduler.submit(queued)
        time.sleep(max(0.0, deadline - time.monotonic()) + 0.01)  # past the deadline (a time, not a state)
        gate.step()
        ends = [e for e in events if isinstance(e, (ErrorEvent, FinishEvent))]
        assert [type(e.error).__name__ for e in ends] == ["DeadlineExceeded", "DeadlineExceeded"], ends
        assert sorted(str(e.error) for e in ends) == ["deadline exceeded after 1 decode steps",
                                                      "deadline exceeded while queued"]
        assert server.metric("nmt_running_requests") == 0


def test_cancelled_stream_frees_the_slot_within_a_step(unguarded):
    server, client = unguarded
    model = server.app.models["multi30k-en-de-small"]
    with EngineGate(model, let_through=3) as gate:  # a few tokens out, then held: surely still running
        stream = client.translate_stream("A dog runs on the beach.", **{**LONG, "seed": 2})
        next(stream)  # one message only: a slow reader may find all three tokens coalesced in it
        # Held at the gate before the cancel: else an iteration still let through could drop the job
        # and the engine, idle, would never come round to the gate again (seen once in ~10 runs).
        assert wait_for(lambda: gate.held.is_set())
        assert server.metric("nmt_running_requests") == 1
        stream.cancel()
        model_saw_cancel = wait_for(lambda: all(st.job.cancelled for st in model.here.scheduler.running))
        gate.step()  # one step after the cancel reached the server: the slot is free
        assert model_saw_cancel and server.metric("nmt_running_requests") == 0
        assert server.metric("nmt_kv_cache_usage_ratio") == 0
    assert not gate.timed_out


def test_metrics_move(server, client):
    before = {name: server.metric(name) for name in (
        "nmt_time_to_first_token_seconds_count", "nmt_inter_token_seconds_count", "nmt_output_tokens_total",
        "nmt_input_tokens_total", "nmt_decode_step_duration_seconds_count", "nmt_encode_duration_seconds_count",
        "nmt_queue_duration_seconds_count", "nmt_encode_padding_ratio_count", "nmt_sequence_duration_seconds_count")}
    ok = server.metric("nmt_requests_total", rpc="Translate", code="OK")
    messages = server.metric("nmt_stream_messages_total", missing_ok=True)
    client.translate(["A man is riding a bike.", "Two dogs are playing in the snow."])
    for name, value in before.items():
        assert server.metric(name) > value, name
    n = len(list(client.translate_stream("A man is riding a bike.")))
    assert server.metric("nmt_stream_messages_total") == messages + n
    assert server.settled_metric("nmt_requests_total", ok + 1, rpc="Translate", code="OK") == ok + 1
    text = server.metrics_text()
    assert 'nmt_request_duration_seconds_bucket{le="0.005",rpc="Translate"}' in text
    assert "nmt_kv_cache_usage_ratio" in text
    server.wait_idle()
    assert server.metric("nmt_kv_cache_usage_ratio") == 0


def test_overload_is_refused_at_once(client):
    """A queue of 2 with the engine held: exactly 2 calls wait, the other 10 are refused with
    RESOURCE_EXHAUSTED while the engine is still held (so at once), and the 2 complete after."""
    tight = ServerThread(max_batch_size=2, max_queue_size=2, max_texts_per_request=2, max_sentences_per_request=2,
                         warmup=False).start()
    try:
        model = tight.app.models["multi30k-en-de-small"]
        with TranslatorClient(tight.target, timeout=60, retries=0) as c, EngineGate(model) as gate:
            calls = [c.stub.Translate.future(pb.TranslateRequest(texts=[f"A man number {i} is riding a bike."]),
                                             timeout=60) for i in range(12)]
            end = time.monotonic() + 30  # bounds a failure only: the held two cannot finish before open()
            while sum(f.done() for f in calls) < 10 and time.monotonic() < end:
                time.sleep(0.01)
            done = [f for f in calls if f.done()]
            assert len(done) == 10 and not gate.released.is_set()
            assert all(f.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for f in done)
            assert all("retry later" in f.details() for f in done)
            gate.open()
            waited = [f for f in calls if f not in done]
            assert [f.result(timeout=60).translations[0].hypotheses[0].text != "" for f in waited] == [True, True]
            assert not gate.timed_out
            tight.wait_idle()
            assert c.translate(["A dog."]).translations[0].hypotheses[0].text
    finally:
        tight.stop()


def test_reflection_lists_and_describes_the_service(server):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
    with grpc.insecure_channel(server.target) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        reqs = [reflection_pb2.ServerReflectionRequest(list_services=""),
                reflection_pb2.ServerReflectionRequest(file_containing_symbol="nmt.v1.Translator")]
        answers = list(stub.ServerReflectionInfo(iter(reqs)))
    names = {s.name for s in answers[0].list_services_response.service}
    assert {"nmt.v1.Translator", "grpc.health.v1.Health"} <= names
    assert answers[1].file_descriptor_response.file_descriptor_proto  # the .proto, for grpcurl


def test_every_bundle_in_the_repository_is_served(tmp_path, start_server):
    import json
    import shutil

    from tests.serving import REPOSITORY
    src = next(p for p in REPOSITORY.iterdir() if p.is_dir())
    version = sorted(v for v in src.iterdir() if v.is_dir())[-1]
    for name in ("alpha", "beta"):
        dst = tmp_path / name / "3"
        shutil.copytree(version, dst)
        config = json.loads((dst / "config.json").read_text())
        config.update(name=name, version=3)
        (dst / "config.json").write_text(json.dumps(config))
    srv = start_server(model_repository=str(tmp_path), default_model="beta", warmup=False)
    with TranslatorClient(srv.target) as c:
        models = c.list_models()
        assert [m.name for m in models.models] == ["alpha", "beta"] and models.default_model == "beta"
        assert [m.version for m in models.models] == [3, 3]
        assert c.translate(["A dog."]).model == "beta"
        assert c.translate(["A dog."], model="alpha").model == "alpha"


def test_an_engine_failure_fails_its_batch_and_the_server_recovers(server, client):
    engine = server.app.models["multi30k-en-de-small"].here.engine
    real = engine.decode_step
    calls = []

    def failing_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected failure")
        return real(*args, **kwargs)
    engine.decode_step = failing_once
    try:
        got, details = code_of(lambda: client.translate(["A dog runs on the beach."]))
    finally:
        del engine.decode_step  # back to the class method
    assert got == grpc.StatusCode.INTERNAL and "injected failure" in details
    server.wait_idle()
    assert server.metric("nmt_kv_cache_usage_ratio") == 0
    assert client.translate(["A dog runs on the beach."]).translations[0].hypotheses[0].text


def test_admission_reports_every_problem_of_a_request_at_once(server):
    """One INVALID_ARGUMENT names all that is wrong (server/frontend/admission.py): the texts' shape, the document
    options and the decoding options, so a caller fixes them in one go."""
    request = pb.TranslateRequest(texts=["A dog."] * 65 + ["", "x" * 60_000], mime_type="application/pdf",
                                  options=pb.DecodingOptions(beam_size=100, temperature=float("nan"),
                                                             repetition_penalty=20))
    with grpc.insecure_channel(server.target) as channel:
        stub = pb_grpc.TranslatorStub(channel)
        with pytest.raises(grpc.RpcError) as e:
            stub.Translate(request, timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for words in ("67 texts in one request", "longer than 50000 characters", "texts[65] is empty",
                  "mime_type must be", "beam_size 100 exceeds", "temperature nan", "repetition_penalty 20"):
        assert words in e.value.details(), (words, e.value.details())
