"""Glossaries end to end: DeepL's glossary API (v2 and v3) through the official `deepl` client, a
Weblate-shaped sync, per-key isolation, durability across a restart, 40 malformed glossary requests refused
in DeepL's shape while the server keeps serving, and the terms obeyed in decoding (greedy, beam,
sampling, streams, the native API), with untouched sentences token-identical and batch invariance.

A real server on loopback ports with the shipped models; each server here has a glossary database
of its own in a temporary directory (NMT_GLOSSARY_DB).
"""
from __future__ import annotations

import concurrent.futures
import os

import deepl
import grpc
import httpx
import pytest
from deepl.api_data import MultilingualGlossaryDictionaryEntries as Dictionary

from protos.nmt.v1 import translator_pb2 as pb
from protos.nmt.v1 import translator_pb2_grpc as pb_grpc
from server.glossary import store as glossary_store
from server.security import keys
from tests.serving import ServerThread, key_file

KEYS = {"alice": "nmt_alice_glossaries", "bob": "nmt_bob_glossaries"}
SENTENCE = "A man is riding a bike down the street."
deepl.http_client.max_network_retries = 0


@pytest.fixture(scope="module")
def database(tmp_path_factory):
    path = tmp_path_factory.mktemp("glossaries") / "glossaries.sqlite3"
    old = os.environ.get("NMT_GLOSSARY_DB")
    os.environ["NMT_GLOSSARY_DB"] = str(path)
    yield path
    if old is None:
        os.environ.pop("NMT_GLOSSARY_DB", None)
    else:
        os.environ["NMT_GLOSSARY_DB"] = old


@pytest.fixture(scope="module")
def srv(database):
    """The default layout (engine core in its own process: the terms cross the core's protocol)."""
    s = ServerThread().start()
    yield s
    s.stop()


@pytest.fixture
def client(srv):
    return deepl.DeepLClient("any-key", server_url=srv.http)


@pytest.fixture(scope="module")
def keyed(database, tmp_path_factory):
    path = key_file(tmp_path_factory.mktemp("keys"), *(keys.file_line(k, v) for k, v in KEYS.items()))
    s = ServerThread(api_keys_file=path, engine_core="thread").start()
    yield s
    s.stop()


def stub(srv: ServerThread) -> pb_grpc.TranslatorStub:
    return pb_grpc.TranslatorStub(grpc.insecure_channel(srv.target))


def entries(**pairs: str) -> list[pb.GlossaryEntry]:
    return [pb.GlossaryEntry(source=s.replace("_", " "), target=t) for s, t in pairs.items()]


# -- the DeepL API --------------------------------------------------------------------------------
def test_v2_create_get_list_entries_delete_with_the_deepl_client(client, tmp_path):
    g = client.create_glossary("v2 test", "EN", "DE", {"artist": "Maler", "prize": "Gewinn", "A%=&": "B&=%",
                                                       "\u0394\u3041": "\u6df1", "\U0001faa8": "\U0001fab5"})
    assert (g.name, g.source_lang, g.target_lang, g.entry_count, g.ready) == ("v2 test", "EN", "DE", 5, True)
    assert g.creation_time.tzinfo is not None and g.creation_time.microsecond  # fractional seconds and a zone
    got = client.get_glossary(g.glossary_id)
    assert (got.name, got.creation_time, got.entry_count) == (g.name, g.creation_time, 5)
    assert client.get_glossary_entries(g)["\U0001faa8"] == "\U0001fab5"
    assert g.glossary_id in {x.glossary_id for x in client.list_glossaries()}
    csv = 'sourceEntry1,targetEntry1,en,de\n"source""Entry","target,Entry",en,de'
    c = client.create_glossary_from_csv("csv test", "EN", "DE", csv_data=csv)
    assert client.get_glossary_entries(c) == {"sourceEntry1": "targetEntry1", 'source"Entry': "target,Entry"}
    raw = httpx.get(f"{client.server_url}/v2/glossaries/{g.glossary_id}/entries",
                    headers={"Accept": "application/json"}, timeout=30)
    assert raw.status_code == 415 and isinstance(raw.json()["message"], str)
    raw = httpx.get(f"{client.server_url}/v2/glossaries/{g.glossary_id}/entries", timeout=30)
    assert raw.headers["content-type"].startswith("text/tab-separated-values") and "artist\tMaler" in raw.text
    for glossary in (g, c):
        client.delete_glossary(glossary)
    with pytest.raises(deepl.GlossaryNotFoundException):
        client.get_glossary(g.glossary_id)
    with pytest.raises(deepl.DeepLException):  # not a glossary id: 400
        client.delete_glossary("invalid_glossary_id")
    pairs = {(p.source_lang, p.target_lang) for p in client.get_glossary_languages()}
    assert {("en", "de"), ("en", "fr"), ("de", "en")} <= pairs and ("en", "en") not in pairs


def test_v3_dictionaries_patch_put_entries_and_delete(client):
    g = client.create_multilingual_glossary("v3 test", [Dictionary("EN", "DE", {"Hello": "Hallo"}),
                                                         Dictionary("DE", "EN", {"Hallo": "Hello"})])
    assert [(d.source_lang, d.target_lang, d.entry_count) for d in g.dictionaries] == [("EN", "DE", 1), ("DE", "EN", 1)]
    merged = client.update_multilingual_glossary_dictionary(g, Dictionary("EN", "DE", {"Hello": "Guten Tag",
                                                                                       "Apple": "Apfel"}))
    assert [d.entry_count for d in merged.dictionaries] == [2, 1]
    got = client.get_multilingual_glossary_entries(g, "EN", "DE").dictionaries[0].entries
    assert got == "Hello\tGuten Tag\nApple\tApfel"
    assert client.replace_multilingual_glossary_dictionary(g, Dictionary("EN", "DE", {"Dog": "Hund"})).entry_count == 1
    assert client.update_multilingual_glossary_name(g, "renamed").name == "renamed"
    client.delete_multilingual_glossary_dictionary(g, source_lang="EN", target_lang="DE")
    left = client.get_multilingual_glossary(g.glossary_id)
    assert (left.name, [(d.source_lang, d.target_lang) for d in left.dictionaries]) == ("renamed", [("DE", "EN")])
    assert g.glossary_id not in {x.glossary_id for x in client.list_glossaries()} or len(left.dictionaries) == 1
    client.delete_multilingual_glossary(g)
    with pytest.raises(deepl.GlossaryNotFoundException):
        client.get_multilingual_glossary(g.glossary_id)


def test_weblate_sync_sequence(srv):
    """Weblate's GlossaryMachineTranslationMixin.get_glossary_id, as it calls DeepL: list the glossaries by
    name, delete the stale ones of the project's language pair (same name prefix, other checksum), create
    one from TSV, list again and find it at once, then translate with it (Weblate's request shape)."""
    base, auth = f"{srv.http}/v2", {"Authorization": "DeepL-Auth-Key weblate-key"}
    stale = "weblate:7:EN:DE:0123abcd"
    httpx.post(f"{base}/glossaries", headers=auth, timeout=30, json={
        "name": stale, "source_lang": "EN", "target_lang": "DE", "entries": "bike\tRad", "entries_format": "tsv"})
    wanted = "weblate:7:EN:DE:89abcdef"
    listed = {g["name"]: g["glossary_id"] for g in httpx.get(f"{base}/glossaries", headers=auth,
                                                             timeout=30).json()["glossaries"]}
    assert wanted not in listed and stale in listed
    for name, glossary_id in listed.items():
        if name.startswith("weblate:7:EN:DE:"):
            assert httpx.delete(f"{base}/glossaries/{glossary_id}", headers=auth, timeout=30).status_code == 204
    created = httpx.post(f"{base}/glossaries", headers=auth, timeout=30, json={
        "name": wanted, "source_lang": "EN", "target_lang": "DE", "entries": "bike\tDrahtesel\nstreet\tGasse",
        "entries_format": "tsv"})
    assert created.status_code == 201
    listed = {g["name"]: g["glossary_id"] for g in httpx.get(f"{base}/glossaries", headers=auth,
                                                             timeout=30).json()["glossaries"]}
    assert stale not in listed and listed[wanted] == created.json()["glossary_id"]
    reply = httpx.post(f"{base}/translate", headers=auth, timeout=60, json={
        "text": [f'{SENTENCE} <x id="3"></x>'], "source_lang": "EN", "target_lang": "DE", "formality": "default",
        "tag_handling": "xml", "ignore_tags": ["x"], "glossary_id": listed[wanted]})
    text = reply.json()["translations"][0]["text"]
    assert reply.status_code == 200 and "Drahtesel" in text and "Gasse" in text and '<x id="3"></x>' in text


def test_each_key_has_its_own_glossaries(keyed):
    alice, bob = (deepl.DeepLClient(KEYS[k], server_url=keyed.http) for k in ("alice", "bob"))
    g = alice.create_glossary("alice's", "EN", "DE", {"bike": "Drahtesel"})
    assert [x.name for x in bob.list_glossaries()] == []
    for call in (lambda: bob.get_glossary(g.glossary_id), lambda: bob.get_glossary_entries(g.glossary_id),
                 lambda: bob.delete_glossary(g.glossary_id)):
        with pytest.raises(deepl.GlossaryNotFoundException):
            call()
    with pytest.raises(deepl.DeepLException, match="Not found"):  # nor use it
        bob.translate_text(SENTENCE, source_lang="EN", target_lang="DE", glossary=g.glossary_id)
    assert "Drahtesel" in alice.translate_text(SENTENCE, source_lang="EN", target_lang="DE", glossary=g).text
    with pytest.raises(deepl.AuthorizationException):
        deepl.DeepLClient("not-a-key", server_url=keyed.http).list_glossaries()
    alice.delete_glossary(g)


def test_glossaries_survive_a_restart(tmp_path):
    path = tmp_path / "restart.sqlite3"
    old = os.environ.get("NMT_GLOSSARY_DB")
    os.environ["NMT_GLOSSARY_DB"] = str(path)
    try:
        first = ServerThread(engine_core="thread", warmup=False, metrics_port=-1).start()
        try:
            g = deepl.DeepLClient("k", server_url=first.http).create_glossary("kept", "EN", "FR", {"bike": "bécane"})
        finally:
            first.stop()
        glossary_store.open_store(path).close()  # the process's connection goes: the next one reads the file
        glossary_store._stores.pop(path, None)
        second = ServerThread(engine_core="thread", warmup=False, metrics_port=-1).start()
        try:
            client = deepl.DeepLClient("k", server_url=second.http)
            got = client.get_glossary(g.glossary_id)
            assert (got.name, got.creation_time, client.get_glossary_entries(got)) == \
                ("kept", g.creation_time, {"bike": "bécane"})
            assert "bécane" in client.translate_text(SENTENCE, source_lang="EN", target_lang="FR", glossary=got).text
        finally:
            second.stop()
    finally:
        if old is None:
            os.environ.pop("NMT_GLOSSARY_DB", None)
        else:
            os.environ["NMT_GLOSSARY_DB"] = old


# -- malformed glossaries -------------------------------------------------------------------------
def _v2(**fields):
    body = {"name": "bad", "source_lang": "EN", "target_lang": "DE", "entries": "a\tb", "entries_format": "tsv"}
    body.update(fields)
    return ("POST", "/v2/glossaries", {k: v for k, v in body.items() if v is not ...})


def _v3(dictionaries, **fields):
    body = {"name": "bad", "dictionaries": dictionaries}
    body.update(fields)
    return ("POST", "/v3/glossaries", {k: v for k, v in body.items() if v is not ...})


UNKNOWN = "96ab91fd-e715-41a1-adeb-5d701f84a483"
MALFORMED = [
    (_v2(name=...), 400), (_v2(name=""), 400), (_v2(name="   "), 400), (_v2(name="x" * 1025), 400),
    (_v2(name="bad\u0007name"), 400), (_v2(name=5), 400), (_v2(source_lang=...), 400), (_v2(target_lang="XX"), 400),
    (_v2(source_lang="EN", target_lang="EN"), 400), (_v2(source_lang=["EN"]), 400), (_v2(entries=...), 400),
    (_v2(entries=""), 400), (_v2(entries="\n\n"), 400), (_v2(entries=5), 400), (_v2(entries_format="xml"), 400),
    (_v2(entries="no tab here"), 400), (_v2(entries="a\tb\tc"), 400), (_v2(entries="a\tb\na\tc"), 400),
    (_v2(entries="\tb"), 400), (_v2(entries="a\t "), 400), (_v2(entries="a\x00\tb"), 400),
    (_v2(entries="a\tb\x85"), 400), (_v2(entries="a\u2028b\tc"), 400), (_v2(entries="x" * 1025 + "\tb"), 400),
    (_v2(entries="a,b,c", entries_format="csv"), 400), (_v2(entries='"a,b', entries_format="csv"), 400),
    (_v2(entries="a,b,en,fr", entries_format="csv"), 400), (_v2(entries="a,b\na,c", entries_format="csv"), 400),
    (_v2(entries="a\tb\n" * 8 + "x" * (11 << 20)), 413),
    (_v3(dictionaries=...), 400), (_v3(dictionaries=[]), 400), (_v3(dictionaries="EN-DE"), 400),
    (_v3(dictionaries=["a\tb"]), 400), (_v3(dictionaries=[{"source_lang": "EN", "target_lang": "DE"}]), 400),
    (_v3(dictionaries=[{"source_lang": "EN", "target_lang": "DE", "entries": "a\tb"}] * 2), 400),
    (_v3(dictionaries=[{"source_lang": "EN", "target_lang": "ZZ", "entries": "a\tb"}]), 400),
    (("PATCH", f"/v3/glossaries/{UNKNOWN}", {"name": "x"}), 404), (("PATCH", "/v3/glossaries/nope", {"name": "x"}), 400),
    (("GET", f"/v3/glossaries/{UNKNOWN}/entries?source_lang=EN", None), 400),
    (("PUT", f"/v3/glossaries/{UNKNOWN}/dictionaries", {"source_lang": "EN", "target_lang": "DE",
                                                         "entries": "a\tb"}), 404),
]


def test_malformed_glossaries_are_refused_in_deepls_shape_while_serving(srv):
    auth = {"Authorization": "DeepL-Auth-Key malformed-tenant"}
    assert len(MALFORMED) >= 30
    for (method, path, body), status in MALFORMED:
        r = httpx.request(method, f"{srv.http}{path}", json=body, headers=auth, timeout=60)
        assert r.status_code == status, (method, path, str(body)[:200], r.text[:300])
        assert isinstance(r.json()["message"], str) and set(r.json()) <= {"message", "detail"}, r.text[:300]
        # The server keeps serving throughout: health, and a translation, after each refusal.
        assert httpx.get(f"{srv.http}/readyz", timeout=30).status_code == 200
    r = httpx.post(f"{srv.http}/v2/glossaries", data={"name": "form", "source_lang": "EN", "target_lang": "DE",
                                                       "entries": "dog\tHund"}, headers=auth, timeout=30)
    assert r.status_code == 201  # a form body, as DeepL takes it
    listed = httpx.get(f"{srv.http}/v3/glossaries", headers=auth, timeout=30).json()["glossaries"]
    assert "form" in [g["name"] for g in listed] and "bad" not in [g["name"] for g in listed]  # none was kept
    reply = stub(srv).Translate(pb.TranslateRequest(texts=[SENTENCE]), timeout=60)
    assert reply.translations[0].hypotheses[0].text


def test_bad_glossary_requests_on_translate(srv):
    s = stub(srv)
    for request, code in ((pb.TranslateRequest(texts=[SENTENCE], glossary_id=UNKNOWN), grpc.StatusCode.NOT_FOUND),
                          (pb.TranslateRequest(texts=[SENTENCE], glossary_id="nope"), grpc.StatusCode.INVALID_ARGUMENT),
                          (pb.TranslateRequest(texts=[SENTENCE], glossary_entries=entries(bike="A", Bike="B") +
                                               entries(bike="C")), grpc.StatusCode.INVALID_ARGUMENT),
                          (pb.TranslateRequest(texts=[SENTENCE], glossary_id=UNKNOWN, glossary_entries=entries(a="b")),
                           grpc.StatusCode.INVALID_ARGUMENT)):
        with pytest.raises(grpc.RpcError) as failure:
            s.Translate(request, timeout=60)
        assert failure.value.code() == code, request
    r = httpx.post(f"{srv.http}/v2/translate", json={"text": [SENTENCE], "target_lang": "DE",
                                                     "glossary_id": UNKNOWN}, timeout=30)
    assert r.status_code == 400 and "source_lang" in r.json()["message"]  # a glossary is for one pair
    r = httpx.post(f"{srv.http}/translate", json={"q": SENTENCE, "source": "en", "target": "de",
                                                  "glossary_id": UNKNOWN}, timeout=30)
    assert r.status_code == 200  # LibreTranslate has no glossaries: the field is not read


# -- decoding obeys the terms ---------------------------------------------------------------------
def test_terms_appear_greedy_beam_sampling_stream_and_native(srv):
    s = stub(srv)
    terms = entries(bike="Drahtesel", street="Gasse")
    for options in (pb.DecodingOptions(), pb.DecodingOptions(beam_size=4),
                    pb.DecodingOptions(temperature=0.7, seed=3)):
        reply = s.Translate(pb.TranslateRequest(texts=[SENTENCE, "Two dogs play."], glossary_entries=terms,
                                                options=options), timeout=60)
        first, second = reply.translations
        assert "Drahtesel" in first.hypotheses[0].text and "Gasse" in first.hypotheses[0].text, options
        assert [(h.source, h.target, h.occurrences, h.applied) for h in first.glossary_hits] == \
            [("bike", "Drahtesel", 1, True), ("street", "Gasse", 1, True)]
        assert list(second.glossary_hits) == []
    streamed = list(s.TranslateStream(pb.TranslateStreamRequest(text=SENTENCE, glossary_entries=terms), timeout=60))
    text = "".join(m.delta for m in streamed)
    assert "Drahtesel" in text and [h.applied for h in streamed[-1].glossary_hits] == [True, True]
    native = httpx.post(f"{srv.http}/v1/translate", timeout=60, json={
        "texts": ["A bike."], "glossaryEntries": [{"source": "bike", "target": "Drahtesel"}]}).json()
    assert "Drahtesel" in native["translations"][0]["hypotheses"][0]["text"]
    whole = s.Translate(pb.TranslateRequest(texts=["Bike", "bike."], glossary_entries=terms), timeout=60)
    assert [t.hypotheses[0].text for t in whole.translations] == ["Drahtesel", "Drahtesel."]  # a term alone
    assert srv.metric("nmt_glossary_lookups_total", result="inline") >= 6
    assert srv.metric("nmt_glossary_terms_total", outcome="applied") >= 10


def test_sentences_without_terms_are_token_identical_and_batches_do_not_change_tokens(srv):
    s = stub(srv)
    plain = ["Two dogs play in the snow.", "A woman sits on a bench.", "Children run on the beach."]
    terms = entries(bike="Drahtesel", man="Herr")
    alone = s.Translate(pb.TranslateRequest(texts=plain, return_tokens=True), timeout=60)
    glossed = s.Translate(pb.TranslateRequest(texts=plain, return_tokens=True, glossary_entries=terms), timeout=60)
    assert [list(t.hypotheses[0].token_ids) for t in glossed.translations] == \
        [list(t.hypotheses[0].token_ids) for t in alone.translations]

    def one(text: str, with_terms: bool, beam: int) -> list[int]:
        reply = s.Translate(pb.TranslateRequest(texts=[text], return_tokens=True, options=pb.DecodingOptions(
            beam_size=beam), glossary_entries=terms if with_terms else []), timeout=120)
        return list(reply.translations[0].hypotheses[0].token_ids)
    cases = [(SENTENCE, True, 1), (SENTENCE, True, 4), (plain[0], True, 1), (plain[1], False, 1),
             ("A man rides a bike.", True, 1), ("A man rides a bike.", False, 4)]
    solo = [one(*case) for case in cases]
    with concurrent.futures.ThreadPoolExecutor(24) as pool:  # the same requests, many at once, mixed
        together = list(pool.map(lambda case: one(*case), cases * 4))
    assert together == solo * 4


def test_a_term_never_begun_goes_where_the_model_found_it_likeliest(srv):
    """The shipped en-de model translates "guy" as "Mann" and ends; the row goes back to after "Ein",
    where it found "Typ" likeliest, instead of writing "Typ" before the full stop (docs/glossaries.md).
    Streamed and unary give the same tokens; so does the same request among others."""
    s = stub(srv)
    terms = entries(guy="Typ")
    text = "A guy is running away from a black bull."
    before = srv.metric("nmt_glossary_rewinds_total", missing_ok=True)
    unary = s.Translate(pb.TranslateRequest(texts=[text], return_tokens=True, glossary_entries=terms), timeout=60)
    got = unary.translations[0].hypotheses[0]
    assert got.text.startswith("Ein Typ ") and got.text.endswith(".") and " Typ." not in got.text
    assert srv.settled_metric("nmt_glossary_rewinds_total", before + 1) == before + 1
    streamed = list(s.TranslateStream(pb.TranslateStreamRequest(text=text, glossary_entries=terms), timeout=60))
    assert "".join(m.delta for m in streamed) == got.text
    texts = [text, SENTENCE, "A guy rides a bike.", text] * 2
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        many = list(pool.map(lambda t: list(s.Translate(pb.TranslateRequest(
            texts=[t], return_tokens=True, glossary_entries=terms), timeout=60).translations[0].hypotheses[0].token_ids),
            texts))
    assert [ids for t, ids in zip(texts, many) if t == text] == [list(got.token_ids)] * 4
