"""The DeepL and LibreTranslate API details their clients and localisation platforms rely on (issue 36):
model_type_used, unsupported languages named before any detection, DeepL's error shape on every /v2
and /v3 path, unlimited keys reported as DeepL reports them, `context`, DeepL's XML tag parameters
(ignore_tags, splitting_tags, non_splitting_tags, outline_detection), Weblate's request shape, and
LibreTranslate's /frontend/settings, /suggest and GET /languages with a body.

A real keyed server on loopback ports with the shipped models, called with the official `deepl`
library, httpx and libretranslatepy. docs/http.md keeps the table of DeepL's own client tests.
"""
from __future__ import annotations

import re

import deepl
import httpx
import pytest
from libretranslatepy import LibreTranslateAPI

from server.security import keys
from tests.serving import ServerThread, key_file

KEY = "nmt_weblate_key"  # a key without a character quota
GERMAN = "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche."
TAG = re.compile(r"<[^>]*>")

deepl.http_client.max_network_retries = 0


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    s = ServerThread(api_keys_file=key_file(tmp_path_factory.mktemp("keys"), keys.file_line("weblate", KEY))).start()
    yield s
    s.stop()


@pytest.fixture(scope="module")
def translator(srv):
    return deepl.Translator(KEY, server_url=srv.http)


def post(srv, body: dict, path: str = "/v2/translate") -> httpx.Response:
    return httpx.post(f"{srv.http}{path}", json=body, headers={"Authorization": f"DeepL-Auth-Key {KEY}"}, timeout=60)


def plain(translator, text: str) -> str:
    """The server's translation of `text` without any markup handling."""
    return translator.translate_text(text, source_lang="EN", target_lang="DE").text


def words(text: str) -> str:
    """The text with its tags taken out and its whitespace collapsed."""
    return " ".join(TAG.sub(" ", text).split())


# -- model_type -------------------------------------------------------------------------------
def test_model_type_is_answered_with_model_type_used(srv, translator):
    for model_type, used in ((deepl.ModelType.QUALITY_OPTIMIZED, "quality_optimized"),
                             (deepl.ModelType.PREFER_QUALITY_OPTIMIZED, "quality_optimized"),
                             (deepl.ModelType.LATENCY_OPTIMIZED, "latency_optimized")):
        result = translator.translate_text("A dog runs.", target_lang="DE", model_type=model_type)
        assert result.model_type_used == used
        assert result.text == plain(translator, "A dog runs.")  # one model serves the pair, whatever the type
    r = post(srv, {"text": ["A dog runs."], "target_lang": "DE"})
    assert r.status_code == 200 and "model_type_used" not in r.json()["translations"][0]  # only when asked
    r = post(srv, {"text": ["A dog runs."], "target_lang": "DE", "model_type": "fastest"})
    assert r.status_code == 400 and "model_type" in r.json()["message"]


# -- unsupported languages ----------------------------------------------------------------------
def test_unsupported_languages_name_the_parameter_before_any_detection(srv, translator):
    # A German text into an unknown target: the target is refused, the text is never identified.
    for text in ("A dog runs.", GERMAN):
        with pytest.raises(deepl.DeepLException, match="target_lang.*not supported") as refused:
            translator.translate_text(text, target_lang="XX")
        assert "detected" not in str(refused.value)
    with pytest.raises(deepl.DeepLException, match="source_lang.*not supported"):
        translator.translate_text("A dog runs.", source_lang="XX", target_lang="DE")
    unchecked = deepl.Translator(KEY, server_url=srv.http, skip_language_check=True)
    with pytest.raises(deepl.DeepLException, match="target_lang"):
        unchecked.translate_text("A dog runs.", target_lang="XX")
    r = post(srv, {"text": [GERMAN], "target_lang": "ES"})  # a DeepL language no loaded model translates into
    assert r.status_code == 400 and r.json()["message"].startswith("Value for 'target_lang' not supported")


# -- DeepL's error shape on every /v2 and /v3 path ------------------------------------------------
def test_every_v2_and_v3_path_answers_in_deepls_shape(srv):
    for method, path, status in (("GET", "/v2/no-such-endpoint", 404), ("POST", "/v3/no-such-endpoint", 404),
                                 ("GET", "/v2/translate", 405), ("DELETE", "/v2/usage", 405)):
        r = httpx.request(method, f"{srv.http}{path}", timeout=30)
        assert r.status_code == status and set(r.json()) == {"message"}, (method, path, r.text)
        assert isinstance(r.json()["message"], str) and path in r.json()["message"]
    assert "POST" in httpx.get(f"{srv.http}/v2/translate", timeout=30).headers["allow"]
    # The library reads DeepL's message: its exception says what the server said.
    with pytest.raises(deepl.DeepLException, match="Not found, message: .*style_rules"):
        deepl.DeepLClient(KEY, server_url=srv.http).get_all_style_rules()
    # The other APIs keep their own shapes.
    r = httpx.get(f"{srv.http}/translate", timeout=30)
    assert r.status_code == 405 and isinstance(r.json()["error"], str)
    r = httpx.get(f"{srv.http}/v1/no-such-endpoint", timeout=30)
    assert r.status_code == 404 and r.json()["error"]["status"] == "NOT_FOUND"


# -- /v2/usage ------------------------------------------------------------------------------------
def test_a_key_without_quota_is_reported_unlimited_as_deepl_reports_it(srv, translator):
    translator.translate_text("A dog runs.", target_lang="DE")
    usage = translator.get_usage()
    assert usage.character.limit == 1_000_000_000_000 and usage.character.count >= len("A dog runs.")
    assert not usage.character.limit_reached and not usage.any_limit_reached
    assert "of 1000000000000" in str(usage)


# -- tag_handling=xml: DeepL's tag parameters ------------------------------------------------------
DOCUMENT = """
<document>
    <meta>
        <title>A man is riding a bike.</title>
    </meta>
    <content>
        <par>Two dogs play in the snow. A woman sits on a bench.</par>
        <raw>This sentence will not be translated.</raw>
        <par>A child <raw>keeps  this</raw> in a park.</par>
    </content>
</document>
"""


def test_ignore_tags_keep_the_content_verbatim_and_every_tag_in_place(translator):
    result = translator.translate_text(DOCUMENT, source_lang="EN", target_lang="DE", tag_handling="xml",
                                       ignore_tags=["raw"]).text
    assert "<raw>This sentence will not be translated.</raw>" in result
    assert result.count("<raw>keeps  this</raw>") == 1
    assert TAG.findall(result) == TAG.findall(DOCUMENT)  # every tag once, in its order
    assert "<title>" + plain(translator, "A man is riding a bike.") + "</title>" in result
    # The layout between the elements is kept byte for byte.
    assert result.startswith("\n<document>\n    <meta>\n        <title>") and result.endswith("</content>\n</document>\n")


def test_splitting_and_non_splitting_tags_and_outline_detection(translator):
    def xml(text: str, **options) -> str:
        return translator.translate_text(text, source_lang="EN", target_lang="DE", tag_handling="xml", **options).text
    one, two = "A man is riding a bike", "Two dogs play in the snow"
    # outline detection (the default): <doc> holds no text of its own, so its <s> children are structure.
    doc = f"<doc> <s>{one}</s> <s>{two}</s> </doc>"
    assert words(xml(doc)) == f"{plain(translator, one)} {plain(translator, two)}"
    # without it, only splitting_tags split: the two are read as one sentence
    assert words(xml(doc, outline_detection=False)) == plain(translator, f"{one} {two}")
    assert words(xml(doc, outline_detection=False, splitting_tags="s")) == \
        f"{plain(translator, one)} {plain(translator, two)}"
    # non_splitting_tags never split, outline or not (DeepL's example: a sentence across two <span>s)
    spans = "<par> <span>A man is riding</span> <span>a bike.</span> </par>"
    assert words(xml(spans, non_splitting_tags=["span"])) == plain(translator, "A man is riding a bike.")
    assert words(xml(spans, outline_detection=False, splitting_tags=["span", "par"])) == \
        f"{plain(translator, 'A man is riding')} {plain(translator, 'a bike.')}"
    for text in (doc, spans):
        assert TAG.findall(xml(text, outline_detection=False)) == TAG.findall(text)


# -- Weblate -------------------------------------------------------------------------------------
def test_weblates_request_shape_keeps_every_placeable_once_and_unchanged(srv, translator):
    """Weblate's DeepL backend: JSON, tag_handling=xml, ignore_tags=["x"], each placeable an empty
    <x id="N"></x>, a context from the component's settings, model_type when next-gen is ticked."""
    texts = ['A man in <x id="2"></x> is riding a bike.', 'Delete <x id="0"></x> files from <x id="14"></x>?',
             '<x id="0"></x><x id="7"></x> Two women sit on a bench.', 'A dog runs <x id="3"></x>.']
    r = post(srv, {"text": texts, "source_lang": "EN", "target_lang": "DE", "formality": "default",
                   "tag_handling": "xml", "ignore_tags": ["x"], "context": "Buttons of a file manager",
                   "model_type": "prefer_quality_optimized"})
    assert r.status_code == 200, r.text
    for text, out in zip(texts, r.json()["translations"]):
        placeables = TAG.findall(text)
        assert TAG.findall(out["text"]) == placeables  # once each, unchanged, in order, and nothing else
        for placeable in set(placeables):
            assert out["text"].count(placeable) == placeables.count(placeable)
        assert words(out["text"]) != words(text)  # the words around them are translated
        assert "file manager" not in out["text"] and "Dateimanager" not in out["text"]  # context is not translated
        assert out["billed_characters"] == len(text) and out["model_type_used"] == "quality_optimized"
        assert out["detected_source_language"] == "EN"
    assert '<x id="0"></x><x id="7"></x> ' in r.json()["translations"][2]["text"]  # the space after them stays
    # context is taken (and checked for its type) by the library too; it changes nothing here
    assert translator.translate_text("A dog runs.", target_lang="DE", context="A pet").text == \
        plain(translator, "A dog runs.")
    assert post(srv, {"text": ["A dog."], "target_lang": "DE", "context": ["not", "a string"]}).status_code == 400


# -- LibreTranslate ------------------------------------------------------------------------------
def test_libretranslate_frontend_settings_suggest_and_languages_with_a_body(srv):
    settings = httpx.get(f"{srv.http}/frontend/settings", timeout=30)
    assert settings.status_code == 200
    body = settings.json()
    assert body["charLimit"] == srv.cfg.max_text_chars and isinstance(body["frontendTimeout"], int)
    assert (body["apiKeys"], body["keyRequired"], body["suggestions"], body["filesTranslation"]) == \
        (True, True, False, True)  # files: /translate_file (server/files/)
    assert ".docx" in body["supportedFilesFormat"] and ".srt" in body["supportedFilesFormat"]
    assert body["language"]["source"] == {"code": "auto", "name": "Auto Detect"}
    assert body["language"]["target"] == {"code": "de", "name": "German"}
    refused = httpx.post(f"{srv.http}/suggest", data={"q": "A dog.", "s": "Ein Hund.", "source": "en",
                                                      "target": "de", "api_key": KEY}, timeout=30)
    assert refused.status_code == 403 and refused.json() == {"error": "Suggestions are disabled on this server."}
    # libretranslatepy sends its api_key as a form body with GET /languages
    assert LibreTranslateAPI(srv.http, KEY).languages() == [{"code": "en", "name": "English",
                                                            "targets": ["de", "fr"]}]
    huge = httpx.request("GET", f"{srv.http}/languages", content=b"api_key=" + b"k" * (srv.cfg.max_request_bytes + 1),
                         headers={"Content-Type": "application/x-www-form-urlencoded"}, timeout=30)
    assert huge.status_code == 413 and isinstance(huge.json()["error"], str)


def test_the_xml_view_maps_back_to_every_byte_of_the_markup():
    """What the planner reads is the text with each piece of markup aliased; the aliases map back to the
    markup exactly, whatever it is: comments, CDATA, processing instructions, unclosed or stray tags,
    text that already says "nmt"."""
    from server.edge.http.deepl import XmlTags
    texts = ['<?xml version="1.0"?><!-- c --><doc a="1 > 2"><![CDATA[x < y]]> nmt <b>one</b><x/></doc>',
             '<x id="1">open <y>never</y> closed', '</stray> text </x> <br/> <nmt-i nmt="0"> a',
             'plain text', '<a><b><a>deep</a></b></a>', '']
    for options in ({}, {"ignore": frozenset({"x", "a"})}, {"outline": False, "splitting": frozenset({"b"})}):
        for text in texts:
            view, restore = XmlTags(**options).view(text)
            assert restore(view) == text
