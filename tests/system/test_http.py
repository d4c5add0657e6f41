"""The HTTP port, called with the clients people use: curl, httpx with an SSE client, the official
`deepl` library, `libretranslatepy`. A real server on loopback ports (gRPC and HTTP), real models.

What must hold: the same translations as the gRPC API for the same input; every API's own
error shapes and statuses for bad input, never a traceback; the gRPC side keeps serving and
answering health meanwhile; keys, permissions, rate limits and quotas are those of gRPC.
"""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time

import deepl
import grpc
import httpx
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from httpx_sse import connect_sse
from libretranslatepy import LibreTranslateAPI

from client.client import TranslatorClient
from protos.nmt.v1 import translator_pb2 as pb
from server.security import keys
from tests.serving import REPOSITORY, ServerThread, flickr_sentences, key_file

KEYS = {"alice": "nmt_alice_key", "slow": "nmt_slow_key", "thrifty": "nmt_thrifty_key", "fr-only": "nmt_fr_only"}
FRENCH = "Deux jeunes hommes blancs sont dehors près de buissons."
GERMAN = "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."

deepl.http_client.max_network_retries = 0  # a 429 must reach the test, not be retried for seconds


@pytest.fixture(scope="module")
def srv(shipped_server):
    return shipped_server


@pytest.fixture(scope="module")
def keyed(tmp_path_factory):
    path = key_file(tmp_path_factory.mktemp("keys"), keys.file_line("alice", KEYS["alice"]),
                    keys.file_line("slow", KEYS["slow"], rpm=1), keys.file_line("thrifty", KEYS["thrifty"], characters=40),
                    keys.file_line("fr-only", KEYS["fr-only"], ["multi30k-en-fr-small"]))
    s = ServerThread(api_keys_file=path).start()
    yield s
    s.stop()


def grpc_texts(srv: ServerThread, texts: list[str], **fields) -> list[str]:
    """The gRPC API's translations (through the project's client library, with a key the server accepts)."""
    with TranslatorClient(srv.target, api_key=KEYS["alice"] if srv.cfg.api_keys_file else None) as client:
        response = client.translate(texts, timeout=60, **fields)
    return [t.hypotheses[0].text for t in response.translations]


# -- the native API ---------------------------------------------------------------------------
def test_native_translate_with_curl_equals_grpc(srv):
    texts = flickr_sentences(3)
    body = json.dumps({"texts": texts, "targetLanguage": "de", "returnScores": True})
    out = subprocess.run(["curl", "-sS", "--fail-with-body", "-H", "Content-Type: application/json", "-d", body,
                          f"{srv.http}/v1/translate"], capture_output=True, text=True, timeout=60, check=True)
    reply = json.loads(out.stdout)
    assert [t["hypotheses"][0]["text"] for t in reply["translations"]] == \
        grpc_texts(srv, texts, target_language="de")
    assert reply["model"] == "multi30k-en-de-small"
    assert all("score" in t["hypotheses"][0] and t["finishReason"] == "FINISH_REASON_EOS"
               for t in reply["translations"])
    stream = subprocess.run(["curl", "-sSN", "--fail-with-body", "-H", "Content-Type: application/json", "-d",
                             json.dumps({"text": " ".join(texts), "targetLanguage": "de"}),
                             f"{srv.http}/v1/translate:stream"], capture_output=True, text=True, timeout=60, check=True)
    events = [json.loads(line[len("data: "):]) for line in stream.stdout.splitlines() if line.startswith("data: ")]
    assert events[-1]["final"] and "".join(e.get("delta", "") for e in events) == \
        grpc_texts(srv, [" ".join(texts)], target_language="de")[0]


def test_native_stream_is_server_sent_events_equal_to_unary(srv):
    text = " ".join(flickr_sentences(4))
    with httpx.Client(timeout=60) as http:
        with connect_sse(http, "POST", f"{srv.http}/v1/translate:stream",
                         json={"text": text, "targetLanguage": "fr"}) as source:
            assert source.response.headers["content-type"].startswith("text/event-stream")
            events = [json.loads(e.data) for e in source.iter_sse()]
    assert len(events) >= 2 and events[-1]["final"] and not any(e.get("final") for e in events[:-1])
    assert "".join(e.get("delta", "") for e in events) == grpc_texts(srv, [text], target_language="fr")[0]
    assert events[-1]["finishReason"] == "FINISH_REASON_EOS" and events[-1]["model"] == "multi30k-en-fr-small"


def test_native_stream_error_before_the_first_message_is_a_plain_error(srv):
    r = httpx.post(f"{srv.http}/v1/translate:stream", json={"text": "", "targetLanguage": "fr"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT"


def test_native_models_embed_and_openapi(srv):
    models = httpx.get(f"{srv.http}/v1/models", timeout=30).json()
    assert {m["name"] for m in models["models"]} == {"multi30k-en-de-small", "multi30k-en-fr-small"}
    embedded = httpx.post(f"{srv.http}/v1/embed", json={"texts": ["A dog."], "normalize": True}, timeout=30).json()
    assert len(embedded["embeddings"][0]["values"]) == embedded["dimension"] == 128
    spec = httpx.get(f"{srv.http}/openapi.json", timeout=30).json()
    assert spec["openapi"].startswith("3.")
    assert {"/v1/translate", "/v1/translate:stream", "/v1/embed", "/v1/models"} <= set(spec["paths"])
    request = spec["components"]["schemas"]["nmt.v1.TranslateRequest"]["properties"]
    assert request["texts"] == {"type": "array", "items": {"type": "string"}}
    assert "targetLanguage" in request and "splitSentences" in request


def test_native_decoding_controls_equal_grpc_and_are_range_checked(srv):
    """DecodingOptions in the JSON mapping: the decoding controls (docs/api.md) reach the engine as they
    do through gRPC, and an out-of-range value gets 400 naming the range."""
    text = "A man in a blue shirt is standing on a ladder cleaning windows."
    options = {"repetitionPenalty": 1.3, "noRepeatNgramSize": 2, "minOutputTokens": 3, "targetPrefix": "Ein",
               "beamSize": 3}
    r = httpx.post(f"{srv.http}/v1/translate", json={"texts": [text], "targetLanguage": "de", "options": options},
                   timeout=60)
    with TranslatorClient(srv.target) as client:
        want = client.stub.Translate(pb.TranslateRequest(
            texts=[text], target_language="de", options=pb.DecodingOptions(
                repetition_penalty=1.3, no_repeat_ngram_size=2, min_output_tokens=3, target_prefix="Ein",
                beam_size=3)), timeout=60)
    assert r.status_code == 200
    assert r.json()["translations"][0]["hypotheses"][0]["text"] == want.translations[0].hypotheses[0].text
    assert want.translations[0].hypotheses[0].text.startswith("Ein")
    alternatives = httpx.post(f"{srv.http}/v1/translate", json={"texts": [text], "options": {"alternatives": 3}},
                              timeout=60).json()["translations"][0]["hypotheses"]
    assert len(alternatives) == 3 and len({h["text"] for h in alternatives}) == 3
    bad = httpx.post(f"{srv.http}/v1/translate", json={"texts": [text], "options": {"repetitionPenalty": 11}},
                     timeout=60)
    assert bad.status_code == 400 and "(0, 10]" in bad.json()["error"]["message"]
    unknown = httpx.post(f"{srv.http}/v1/translate", json={"texts": [text], "targetLanguage": "xx"}, timeout=60)
    assert unknown.status_code == 400 and "en->de" in unknown.json()["error"]["message"]


# -- the same translations through every API --------------------------------------------------
def test_every_api_translates_like_grpc_on_200_test_sentences(srv):
    sentences = flickr_sentences(200)
    translator = deepl.Translator("any-key", server_url=srv.http)
    libre = LibreTranslateAPI(srv.http)
    for target in ("de", "fr"):
        want = []
        for i in range(0, 200, 50):
            want += grpc_texts(srv, sentences[i:i + 50], source_language="en", target_language=target)
        native, via_deepl = [], []
        for i in range(0, 200, 50):
            r = httpx.post(f"{srv.http}/v1/translate", json={"texts": sentences[i:i + 50], "sourceLanguage": "en",
                                                             "targetLanguage": target}, timeout=120)
            native += [t["hypotheses"][0]["text"] for t in r.json()["translations"]]
            via_deepl += [t.text for t in translator.translate_text(sentences[i:i + 50], source_lang="EN",
                                                                     target_lang=target.upper())]
        assert native == want
        assert via_deepl == want
        assert [libre.translate(s, "en", target) for s in sentences[:20]] == want[:20]


# -- DeepL ------------------------------------------------------------------------------------
def test_deepl_library_against_the_server(keyed):
    translator = deepl.Translator(KEYS["alice"], server_url=keyed.http)
    one = translator.translate_text("A man is riding a bike.", target_lang="DE")
    assert one.detected_source_lang == "EN"
    assert one.text == grpc_texts(keyed, ["A man is riding a bike."], target_language="de")[0]
    many = translator.translate_text(["A dog runs.", "Two women sit on a bench."], source_lang="EN",
                                     target_lang="FR")
    assert [r.text for r in many] == grpc_texts(keyed, ["A dog runs.", "Two women sit on a bench."],
                                                target_language="fr")
    html = translator.translate_text("<p>A dog <b>runs</b> in the park.</p>", target_lang="DE",
                                     tag_handling="html")
    assert html.text.startswith("<p>") and html.text.count("<b>") == 1 and html.text.endswith("</p>")
    assert [(lang.code, lang.name) for lang in translator.get_source_languages()] == [("EN", "English")]
    assert {lang.code for lang in translator.get_target_languages()} == {"DE", "FR"}
    usage = translator.get_usage()
    assert usage.character.count >= len("A man is riding a bike.A dog runs.Two women sit on a bench.")


def test_deepl_refusals_raise_the_libraries_exceptions(keyed):
    with pytest.raises(deepl.AuthorizationException):
        deepl.Translator("not-a-key", server_url=keyed.http).translate_text("A dog.", target_lang="DE")
    with pytest.raises(deepl.AuthorizationException):  # a model the key may not use
        deepl.Translator(KEYS["fr-only"], server_url=keyed.http).translate_text("A dog.", target_lang="DE")
    slow = deepl.Translator(KEYS["slow"], server_url=keyed.http)
    slow.translate_text("A dog.", target_lang="DE")  # rpm=1: the first passes
    with pytest.raises(deepl.TooManyRequestsException):
        slow.translate_text("A dog.", target_lang="DE")
    raw = httpx.post(f"{keyed.http}/v2/translate", json={"text": ["A dog."], "target_lang": "DE"},
                     headers={"Authorization": f"DeepL-Auth-Key {KEYS['slow']}"}, timeout=30)
    assert raw.status_code == 429 and 1 <= int(raw.headers["Retry-After"]) <= 60 and "rate limit" in raw.json()["message"]
    thrifty = deepl.Translator(KEYS["thrifty"], server_url=keyed.http)
    thrifty.translate_text("A dog runs in the park.", target_lang="DE")  # 23 of 40 characters
    with pytest.raises(deepl.QuotaExceededException):
        thrifty.translate_text("Two women sit on a bench.", target_lang="DE")
    usage = thrifty.get_usage().character
    assert (usage.count, usage.limit) == (23, 40)
    with pytest.raises(deepl.DeepLException, match="Bad request"):
        deepl.Translator(KEYS["alice"], server_url=keyed.http).translate_text("A dog.", target_lang="XX")


def test_deepl_raw_errors_have_deepls_shape(srv):
    url = f"{srv.http}/v2/translate"
    cases = [({"target_lang": "DE"}, 400), ({"text": "A dog.", "target_lang": "DE", "formality": "more"}, 400),
             ({"text": "A dog.", "target_lang": "DE", "glossary_id": "g1"}, 400),
             ({"text": "A dog.", "target_lang": "DE", "split_sentences": "2"}, 400),
             ({"text": 5, "target_lang": "DE"}, 400), ({"text": [FRENCH], "target_lang": "DE"}, 400)]
    for body, status in cases:
        r = httpx.post(url, json=body, timeout=30)
        assert r.status_code == status and isinstance(r.json()["message"], str), (body, r.text)
    r = httpx.post(url, json={"text": ["A dog."], "target_lang": "DE", "formality": "prefer_more"}, timeout=30)
    assert r.status_code == 200
    r = httpx.post(url, data={"text": ["A dog.", "A cat."], "target_lang": "FR"}, timeout=30)  # a form body
    assert r.status_code == 200 and len(r.json()["translations"]) == 2


# -- LibreTranslate ---------------------------------------------------------------------------
def test_libretranslatepy_against_the_server(srv):
    lt = LibreTranslateAPI(srv.http)
    assert lt.translate("A man is riding a bike.", "en", "de") == grpc_texts(srv, ["A man is riding a bike."],
                                                                             target_language="de")[0]
    assert lt.languages() == [{"code": "en", "name": "English", "targets": ["de", "fr"]}]
    best = lt.detect(FRENCH)[0]
    assert best["language"] == "fr" and 50 < best["confidence"] <= 100
    auto = httpx.post(f"{srv.http}/translate", json={"q": ["A dog.", "A cat."], "source": "auto", "target": "fr",
                                                     "alternatives": 2}, timeout=30).json()
    assert len(auto["translatedText"]) == 2 and [d["language"] for d in auto["detectedLanguage"]] == ["en", "en"]
    assert all(len(a) == 2 for a in auto["alternatives"])
    html = httpx.post(f"{srv.http}/translate", data={"q": "<p>A <i>dog</i>.</p>", "source": "en", "target": "de",
                                                     "format": "html"}, timeout=30).json()
    assert html["translatedText"].startswith("<p>") and html["translatedText"].count("<i>") == 1


def test_libretranslate_errors_have_its_shape(keyed):
    url = f"{keyed.http}/translate"
    r = httpx.post(url, data={"q": "A dog.", "source": "en", "target": "de"}, timeout=30)
    assert r.status_code == 403 and "error" in r.json()
    good = {"source": "en", "target": "de", "api_key": KEYS["alice"]}
    for body, status in (({**good}, 400), ({**good, "q": "A dog.", "format": "pdf"}, 400),
                         ({**good, "q": "A dog.", "target": "xx"}, 400), ({**good, "q": "A dog."}, 200)):
        r = httpx.post(url, data=body, timeout=30)
        assert r.status_code == status and ("error" in r.json()) == (status != 200), (body, r.text)
    assert LibreTranslateAPI(keyed.http, KEYS["alice"]).translate("A dog.", "en", "fr")


# -- source-language detection and routing ----------------------------------------------------
@pytest.fixture(scope="module")
def two_sources(tmp_path_factory):
    """The shipped en->de model, and the en->fr bundle relabelled fr->de: two models into German from
    different languages, so a request without a source language must be routed by detection."""
    repo = tmp_path_factory.mktemp("repo")
    (repo / "multi30k-en-de-small").symlink_to(REPOSITORY / "multi30k-en-de-small")
    version = next((REPOSITORY / "multi30k-en-fr-small").iterdir())
    target = repo / "relabelled-fr-de" / version.name
    target.mkdir(parents=True)
    for item in version.iterdir():
        if item.name != "config.json":
            (target / item.name).symlink_to(item)
    config = json.loads((version / "config.json").read_text())
    config.update(name="relabelled-fr-de", source_language="fr", target_language="de")
    config.pop("languages", None)
    (target / "config.json").write_text(json.dumps(config))
    s = ServerThread(model_repository=str(repo)).start()
    yield s
    s.stop()


def test_requests_without_a_source_language_are_routed_by_it(two_sources):
    with TranslatorClient(two_sources.target) as client:
        en = client.stub.Translate(pb.TranslateRequest(texts=["A man is riding a bike."], target_language="de"))
        fr = client.stub.Translate(pb.TranslateRequest(texts=[FRENCH], target_language="de"))
        assert (en.model, en.detected_source_language) == ("multi30k-en-de-small", "en")
        assert (fr.model, fr.detected_source_language) == ("relabelled-fr-de", "fr")
        assert 0.5 < fr.detection_confidence <= 1.0
        named = client.stub.Translate(pb.TranslateRequest(texts=[FRENCH], source_language="en", target_language="de"))
        assert named.model == "multi30k-en-de-small" and not named.detected_source_language
        with pytest.raises(grpc.RpcError) as e:
            client.stub.Translate(pb.TranslateRequest(texts=[GERMAN], target_language="de"))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "'de' (detected" in e.value.details() and "en->de" in e.value.details() \
            and "fr->de" in e.value.details()
    mixed = deepl.Translator("k", server_url=two_sources.http).translate_text(
        ["A man is riding a bike.", FRENCH, "Two dogs play in the snow."], target_lang="DE")
    assert [r.detected_source_lang for r in mixed] == ["EN", "FR", "EN"]
    assert mixed[0].text == grpc_texts(two_sources, ["A man is riding a bike."], source_language="en",
                                       target_language="de")[0]
    assert mixed[1].text == grpc_texts(two_sources, [FRENCH], source_language="fr", target_language="de")[0]
    r = httpx.post(f"{two_sources.http}/translate", json={"q": GERMAN, "source": "auto", "target": "de"}, timeout=30)
    assert r.status_code == 400 and "en->de" in r.json()["error"]
    assert two_sources.metric("nmt_language_detections_total", language="fr") >= 2


def test_a_call_naming_its_model_is_not_identified(srv):
    """Language identification routes calls that name neither a model nor a source language (and refuses
    text confidently in an unserved language, even with the shipped pair, both from English); a call
    naming its model skips it, which is what the benchmarks do (docs/serving_speed.md: ~10% of the
    tokens/s at 64 streams)."""
    with TranslatorClient(srv.target) as client:
        before = srv.metric("nmt_language_detections_total", missing_ok=True)
        named = client.stub.Translate(pb.TranslateRequest(texts=["A man is riding a bike."],
                                                          model="multi30k-en-de-small"))
        assert not named.detected_source_language
        assert srv.metric("nmt_language_detections_total", missing_ok=True) == before
        plain = client.stub.Translate(pb.TranslateRequest(texts=["A man is riding a bike."]))
        assert (plain.model, plain.detected_source_language) == ("multi30k-en-de-small", "en")
        assert srv.metric("nmt_language_detections_total", missing_ok=True) == before + 1
        with pytest.raises(grpc.RpcError) as e:
            client.stub.Translate(pb.TranslateRequest(texts=[GERMAN]))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


# -- bad input, hostile clients, health ---------------------------------------------------------
def test_bad_input_gets_each_apis_error_and_the_grpc_side_keeps_serving(srv):
    big = b'{"texts": ["' + b"a" * (50 << 20) + b'"]}'
    cases = [
        ("/v1/translate", {"content": b'{"texts": "not a list"}'}, 400, "error"),
        ("/v1/translate", {"content": b'{"texts": ["a"], "unknownField": 1}'}, 400, "error"),
        ("/v1/translate", {"content": b'{"texts": ["\xff\xfe"]}'}, 400, "error"),
        ("/v1/translate", {"content": b"[1, 2"}, 400, "error"),
        ("/v1/translate", {"content": b'{"texts": []}'}, 400, "error"),
        ("/v1/translate", {"content": b'{"texts": ["a"], "model": "nope"}'}, 404, "error"),
        ("/v1/translate", {"content": big}, 413, "error"),
        ("/v1/translate", {"content": b"<xml/>", "headers": {"content-type": "application/xml"}}, 415, "error"),
        ("/v2/translate", {"content": big, "headers": {"content-type": "application/json"}}, 413, "message"),
        ("/v2/translate", {"content": b"text=%FF&target_lang=DE",
                           "headers": {"content-type": "application/x-www-form-urlencoded"}}, 400, "message"),
        ("/translate", {"content": b'{"q": ["a", 3], "source": "en", "target": "de"}',
                        "headers": {"content-type": "application/json"}}, 400, "error"),
        ("/translate", {"content": big, "headers": {"content-type": "application/json"}}, 413, "error"),
    ]
    with httpx.Client(timeout=60) as http:
        for path, kwargs, status, field in cases:
            kwargs.setdefault("headers", {"content-type": "application/json"})
            r = http.post(f"{srv.http}{path}", **kwargs)
            assert r.status_code == status and field in r.json(), (path, status, r.status_code, r.text[:200])
        for path, body, status, field in (("/v1/embed", {"texts": "A dog."}, 400, "error"),
                                          ("/v1/embed", {"texts": [" "]}, 400, "error"),
                                          ("/detect", {}, 400, "error"), ("/detect", {"q": ["a", "b"]}, 400, "error"),
                                          ("/v2/languages", {"type": "both"}, 400, "message"),
                                          ("/translate", {"q": "a", "source": "en", "target": "de",
                                                          "alternatives": 99}, 400, "error")):
            r = http.post(f"{srv.http}{path}", json=body)
            assert r.status_code == status and field in r.json(), (path, body, r.status_code, r.text[:200])
        assert http.get(f"{srv.http}/v1/translate").status_code == 405
        assert http.get(f"{srv.http}/no/such/path").json()["error"]["status"] == "NOT_FOUND"
        assert http.get(f"{srv.http}/readyz").status_code == 200
    assert grpc_texts(srv, ["A dog."], target_language="de")
    assert "Traceback" not in srv.metrics_text()
    assert srv.metric("nmt_http_requests_total", api="native", operation="Translate", status="413") >= 1


def test_slow_clients_hold_no_one_up(srv):
    """Slow-loris: connections that trickle their headers, and one that trickles its body, while
    others are served: the stalled ones cost a socket each, the body one is cut off with 408."""
    host, port = "127.0.0.1", srv.app.http_port
    stalled = []
    for _ in range(20):
        s = socket.create_connection((host, port))
        s.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        stalled.append(s)
    try:
        r = httpx.post(f"{srv.http}/v1/translate", json={"texts": ["A dog."]}, timeout=30)
        assert r.status_code == 200
        with grpc.insecure_channel(srv.target) as channel:
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        for s in stalled:
            s.close()


def test_a_body_that_trickles_is_cut_off_with_408(start_server):
    s = start_server(http_body_timeout_s=0.5)
    conn = socket.create_connection(("127.0.0.1", s.app.http_port))
    conn.sendall(b"POST /v1/translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100\r\n\r\n{\"texts\"")
    conn.settimeout(20)
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = conn.recv(4096)
        if not chunk:
            break
        reply += chunk
    conn.close()
    assert reply.startswith(b"HTTP/1.1 408"), reply[:200]


def test_readiness_follows_the_grpc_health_through_lame_duck():
    s = ServerThread(lame_duck_s=30).start()
    stopping = None
    try:
        assert httpx.get(f"{s.http}/readyz", timeout=10).status_code == 200
        stopping = s.begin_stop(5.0)
        deadline = time.monotonic() + 20
        while httpx.get(f"{s.http}/readyz", timeout=10).status_code != 503 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert httpx.get(f"{s.http}/readyz", timeout=10).status_code == 503
        assert httpx.get(f"{s.http}/healthz", timeout=10).status_code == 200  # alive: still serving
        r = httpx.post(f"{s.http}/v1/translate", json={"texts": ["A dog."]}, timeout=30)
        assert r.status_code == 200  # lame duck: new work is still served
    finally:
        s.finish_stop(stopping)  # a second stop ends the lame duck


def test_http_calls_are_counted_and_logged_like_grpc_calls(srv):
    before = srv.metric("nmt_requests_total", missing_ok=True, rpc="Translate", code="OK")
    r = httpx.post(f"{srv.http}/v1/translate", json={"texts": ["A dog."]}, headers={"x-request-id": "http-call-1"},
                   timeout=30)
    assert r.status_code == 200 and r.headers["x-request-id"] == "http-call-1"
    assert srv.settled_metric("nmt_requests_total", before + 1, rpc="Translate", code="OK") == before + 1


def test_curl_is_installed():
    assert shutil.which("curl"), "curl is needed by the native API test"


def test_http_can_be_turned_off(start_server):
    s = start_server(http_port=-1)
    assert s.app.http is None and s.app.http_port == 0
