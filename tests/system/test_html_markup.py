"""Real HTML keeps its markup whatever the model does; blank-looking text is layout, not an error.

The corpus is generated HTML nobody here wrote (tests/html_corpus.py); the property test puts
random inline markup around random text and renders it with translations of any shape.
"""
from __future__ import annotations

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.html_corpus import corpus, skeleton
from tests.system.test_texts import source_text
from tests.serving import ServerThread, flickr_sentences

from protos.nmt.v1 import translator_pb2 as pb
from protos.nmt.v1 import translator_pb2_grpc as pb_grpc
from server.texts.html import plan_html
from models.core.text import blank
from server.texts.segment import plan_text

SPAN = ("<td nowrap=\"nowrap\"><span class=\"diff_add\">A&nbsp;YOUNG&nbsp;WOMAN&nbsp;AND&nbsp;OLDER&nbsp;WOMAN&nbsp;"
        "WEAR&nbsp;TRADITIONAL&nbsp;SARIS&nbsp;AS&nbsp;THEY&nbsp;SPIN&nbsp;TEXTILES,&nbsp;THREE&nbsp;PEOPLE&nbsp;ARE"
        "&nbsp;PICTURED&nbsp;AT&nbsp;ONLY&nbsp;THE&nbsp;WAISTS,&nbsp;AND&nbsp;WEAR&nbsp;MODERN&nbsp;CLOTHES.</span></td>")
HTML_SPACERS = ["<td>&nbsp;</td>", "<p>A dog.</p><p>&nbsp;</p>",
                "<td><a href=\"x\"><code>f</code></a>:</td><td>&nbsp;</td>", SPAN]
# Every kind of space and invisible character a blank-looking cell is made of.
BLANKS = ["\u00a0", "\u2007", "\u202f", "\u3000", "\u200b", "\ufeff", "\u2060", "\u3164", " \t\n",
          "\u00a0\u200b\u3000", "\u00ad"]


@pytest.mark.unit
def test_blank_knows_every_unicode_space_and_invisible_character():
    assert all(blank(b) for b in BLANKS) and blank("")
    assert not any(blank(b + "a") for b in BLANKS)
    for text in BLANKS + ["A dog.\n\u00a0\nA cat.", "\u200bA dog.\u200b"]:
        plan = plan_text(text, "on", "en", lambda s: True)
        assert source_text(plan) == text
        assert [u.source for u in plan.units] == [s for s in ("A dog.", "A cat.") if s in text]


@pytest.mark.unit
def test_nbsp_text_is_decoded_for_the_model_and_kept_byte_for_byte_around_it():
    plan = plan_html(SPAN, "on", "en", lambda s: len(s.split()) <= 8)  # a budget that forces cuts
    assert source_text(plan) == SPAN
    assert " ".join(u.source for u in plan.units).startswith("A YOUNG WOMAN AND OLDER WOMAN")
    out = plan.render(["X"] * len(plan.units))
    assert out.startswith("<td nowrap=\"nowrap\"><span class=\"diff_add\">X&nbsp;X") and skeleton(out) == skeleton(SPAN)
    for spacer in HTML_SPACERS[:3]:
        assert plan_html(spacer, "on", "en", lambda s: True).render(["Ein Hund."]).count("&nbsp;") == 1


# -- property: random inline markup, random text, translations of any shape ------------------------
WORDS = ["A", "man", "dog", "rides", "a", "bike", "Two", "women", "&nbsp;", "&amp;", "&eacute;t&eacute;", "&lt;b&gt;",
         "{0}", "%s", "\u00a0", "\u200b", "x>y", "Dr.", "3.", "words,", "end.", "Why?", "\n", "  "]
OPEN = ["<b>", "<i>", "<span class=\"diff_add\">", "<a href=\"/p?a=1&amp;b=2\" title='x > y'>", "<em>",
        "<o:p>", "<font color=red>", "<code>", "<span translate=\"no\">"]
BLOCKS = ["<p>", "</p>", "<br>", "<td>", "</td>", "<!-- a comment. -->", "<li>"]


@st.composite
def fragments(draw):
    out, stack = [], []
    for _ in range(draw(st.integers(1, 40))):
        kind = draw(st.sampled_from(["word", "word", "word", "open", "close", "block", "void"]))
        if kind == "word":
            out.append(draw(st.sampled_from(WORDS)) + draw(st.sampled_from([" ", "", "&nbsp;", "\n"])))
        elif kind == "open":
            tag = draw(st.sampled_from(OPEN))
            out.append(tag)
            stack.append(tag[1:].split(">")[0].split()[0])
        elif kind == "close" and stack:
            out.append(f"</{stack.pop()}>")
        elif kind == "block" and not stack:  # blocks only between inline elements (well-formed input)
            out.append(draw(st.sampled_from(BLOCKS)))
        elif kind == "void":
            out.append(draw(st.sampled_from(["<img src=\"a.png\" alt=\"A dog.\">", "<br/>", "<wbr>"])))
    out += [f"</{name}>" for name in reversed(stack)]
    return "".join(out)


TRANSLATIONS = st.lists(st.text(alphabet=st.sampled_from(list("Ein Mann fährt.<>&\u00a0\ue000{}%s ")), max_size=60)
                        | st.sampled_from(["", "nicht " * 40, "Ein Hund."]), min_size=0, max_size=50)


@pytest.mark.unit
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fragments(), TRANSLATIONS, st.integers(1, 12), st.sampled_from(["on", "off", "newlines"]))
def test_markup_skeleton_survives_any_output(fragment, translations, budget, split):
    plan = plan_html(fragment, split, "en", lambda s: len(s.split()) <= budget)
    assert source_text(plan) == fragment
    n = len(plan.units)
    out = plan.render([translations[i % len(translations)] if translations else "" for i in range(n)])
    assert skeleton(out) == skeleton(fragment)
    assert all(u.source.strip() and "\ue000" not in u.source for u in plan.units)


# -- through the server ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stub():
    srv = ServerThread(max_text_chars=200_000, max_sentences_per_request=5_000, max_queue_size=5_000).start()
    with grpc.insecure_channel(srv.target) as channel:
        yield pb_grpc.TranslatorStub(channel)
    srv.stop()


def _unary_and_stream(stub, text: str, mime: str, **options) -> tuple[str, str]:
    opts = pb.DecodingOptions(**options)
    unary = stub.Translate(pb.TranslateRequest(texts=[text], mime_type=mime, options=opts), timeout=120)
    messages = list(stub.TranslateStream(pb.TranslateStreamRequest(text=text, mime_type=mime, options=opts),
                                         timeout=120))
    assert messages[-1].final
    return unary.translations[0].hypotheses[0].text, "".join(m.delta for m in messages)


def test_spacers_answer_ok_and_come_back_byte_for_byte(stub):
    for html_text in HTML_SPACERS:
        unary, streamed = _unary_and_stream(stub, html_text, "text/html")
        assert unary == streamed and skeleton(unary) == skeleton(html_text)
        if html_text != SPAN:  # (the span's are inside its sentence: translated with it)
            assert unary.count("&nbsp;") == html_text.count("&nbsp;")
    for text in BLANKS:
        for mime in ("text/plain", "text/html"):
            assert _unary_and_stream(stub, text, mime) == (text, text)
    r = stub.Translate(pb.TranslateRequest(texts=["A dog.", "\u00a0", "\u3000\u200b"]))
    assert [t.hypotheses[0].text for t in r.translations][1:] == ["\u00a0", "\u3000\u200b"]
    assert [t.sentences for t in r.translations] == [1, 0, 0]
    with pytest.raises(grpc.RpcError) as e:
        stub.Translate(pb.TranslateRequest(texts=["A dog.", ""]))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "texts[1] is empty" in e.value.details()


def test_the_span_survives_a_runaway_cut_and_any_length_limit(stub):
    for options in ({}, {"max_output_tokens": 1}, {"max_output_tokens": 3}, {"beam_size": 3}):
        unary, streamed = _unary_and_stream(stub, SPAN, "text/html", **options)
        assert unary == streamed and skeleton(unary) == skeleton(SPAN)
        assert unary.startswith("<td nowrap=\"nowrap\"><span class=\"diff_add\">") and unary.endswith("</span></td>")


def test_generated_html_corpus_keeps_its_skeleton_unary_equals_stream(stub):
    pages = corpus([s.strip() for s in flickr_sentences(200)])
    assert len(pages) >= 20, [name for name, _ in pages]
    # All pages in one call, short outputs (a forced length limit on every sentence)...
    r = stub.Translate(pb.TranslateRequest(texts=[p for _, p in pages], mime_type="text/html",
                                           options=pb.DecodingOptions(max_output_tokens=6)), timeout=300)
    sentences = 0
    for (name, page), t in zip(pages, r.translations):
        assert skeleton(t.hypotheses[0].text) == skeleton(page), name
        sentences += t.sentences
    assert sentences > 1000
    # ... each streamed alone: the same text.
    for (name, page), t in zip(pages, r.translations):
        messages = stub.TranslateStream(pb.TranslateStreamRequest(
            text=page, mime_type="text/html", options=pb.DecodingOptions(max_output_tokens=6)), timeout=120)
        assert "".join(m.delta for m in messages) == t.hypotheses[0].text, name
    # The HtmlDiff page decoded in full (loops, runaway cuts and all).
    name, page = pages[0]
    unary, streamed = _unary_and_stream(stub, page, "text/html")
    assert unary == streamed and skeleton(unary) == skeleton(page)
