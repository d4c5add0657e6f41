"""Glossary entries (DeepL's rules), the SQLite store (tenants, bounds, durability) and term matching."""
from __future__ import annotations

import pytest

from server.glossary.entries import GlossaryError, check_name, language_pair, parse_entries, to_tsv
from server.glossary.matching import Matcher, appears, variants
from server.glossary.store import GlossaryStore


# -- entries -------------------------------------------------------------------------------------
def test_tsv_and_csv_parse_as_deepl_defines_them():
    assert parse_entries("Hello\tHallo\r\n\n  A%=&\t B&=% \n", "tsv", "en", "de") == \
        [("Hello", "Hallo"), ("A%=&", "B&=%")]
    csv = 'sourceEntry1,targetEntry1,en,de\n"source""Entry","target,Entry",EN,DE\n\nx,y\n'
    assert parse_entries(csv, "csv", "en", "de") == \
        [("sourceEntry1", "targetEntry1"), ('source"Entry', "target,Entry"), ("x", "y")]
    assert parse_entries("\u0394\u3041\t\u6df1", None, "en", "ja") == [("\u0394\u3041", "\u6df1")]
    assert to_tsv([("a", "b"), ("c", "d")]) == "a\tb\nc\td"


@pytest.mark.parametrize("text, fmt, detail", [
    ("a\tb\na\tc", "tsv", "duplicates key"), ("a", "tsv", "one tab"), ("a\tb\tc", "tsv", "one tab"),
    ("\tb", "tsv", "source term is empty"), ("a\t  ", "tsv", "target term is empty"),
    ("a\x07\tb", "tsv", "U+0007"), ("a\tb\x9f", "tsv", "U+009F"), ("a\u2029\tb", "tsv", "U+2029"),
    ("x" * 1025 + "\tb", "tsv", "1025 UTF-8 bytes"), ("\u00e9" * 513 + "\tb", "tsv", "1026 UTF-8 bytes"),
    ("a,b,c", "csv", "3 fields"), ('"a,b', "csv", "does not parse"), ("a,b,en,fr", "csv", "names the languages"),
    ("", "tsv", "no entries"), ("\n \n", "tsv", "no entries"),
])
def test_invalid_entries_are_refused_with_deepls_message(text, fmt, detail):
    with pytest.raises(GlossaryError) as refused:
        parse_entries(text, fmt, "en", "de")
    assert (refused.value.status, refused.value.message) == (400, "Invalid glossary entries provided")
    assert detail in refused.value.detail


def test_other_refusals():
    for call, status in ((lambda: parse_entries("a\tb", "xml", "en", "de"), 400),
                         (lambda: parse_entries(None, "tsv", "en", "de"), 400),
                         (lambda: parse_entries("a\tb\n" + "x" * (10 << 20), "tsv", "en", "de"), 413),
                         (lambda: check_name(""), 400), (lambda: check_name("n" * 1025), 400),
                         (lambda: language_pair("EN", "XX"), 400), (lambda: language_pair("EN", "en-GB"), 400),
                         (lambda: language_pair(None, "DE"), 400)):
        with pytest.raises(GlossaryError) as refused:
            call()
        assert refused.value.status == status
    assert language_pair("EN-GB", "pt-BR") == ("en", "pt")
    assert language_pair("xx", "de", extra=("xx",)) == ("xx", "de")  # a served language is a glossary language


# -- the store -----------------------------------------------------------------------------------
def test_store_per_tenant_and_durable(tmp_path):
    path = tmp_path / "g.sqlite3"
    store = GlossaryStore(path)
    info = store.create("alice", "g", [("en", "de", [("Hello", "Hallo")]), ("de", "en", [("Hallo", "Hello")])])
    assert [(d.source_lang, d.target_lang, d.entry_count) for d in info.dictionaries] == [("en", "de", 1),
                                                                                         ("de", "en", 1)]
    assert info.creation_time.endswith("Z") and "." in info.creation_time
    assert store.list("bob") == []
    for call in (lambda: store.get("bob", info.glossary_id), lambda: store.delete("bob", info.glossary_id),
                 lambda: store.dictionary("bob", info.glossary_id, "en", "de")):
        with pytest.raises(GlossaryError) as refused:
            call()
        assert refused.value.status == 404
    with pytest.raises(GlossaryError) as refused:
        store.get("alice", "not-an-id")
    assert refused.value.status == 400
    updated = store.update("alice", info.glossary_id, name="g2", dictionaries=[("en", "de", [("Hello", "Servus"),
                                                                                           ("Dog", "Hund")])])
    assert updated.name == "g2" and updated.dictionaries[0].entry_count == 2
    first = store.dictionary("alice", info.glossary_id, "en", "de")
    assert first.entries == [("Hello", "Servus"), ("Dog", "Hund")]
    assert store.dictionary("alice", info.glossary_id, "en", "de") is first  # cached while unchanged
    store.update("alice", info.glossary_id, dictionaries=[("en", "de", [("Cat", "Katze")])], merge=False)
    assert store.dictionary("alice", info.glossary_id, "en", "de").entries == [("Cat", "Katze")]
    with pytest.raises(GlossaryError) as refused:
        store.dictionary("alice", info.glossary_id, "en", "fr")
    assert refused.value.status == 400 and "en->de" in refused.value.detail
    store.close()
    again = GlossaryStore(path)  # a restart: a new connection reads the file
    got = again.get("alice", info.glossary_id)
    assert (got.name, got.creation_time) == ("g2", info.creation_time)
    assert again.entries("alice", info.glossary_id, "en", "de") == "Cat\tKatze"
    again.delete_dictionary("alice", info.glossary_id, "en", "de")
    again.delete("alice", info.glossary_id)
    assert again.list("alice") == []


def test_store_bounds(tmp_path):
    store = GlossaryStore(tmp_path / "g.sqlite3", max_glossaries=2, max_tenant_bytes=100)
    store.create("t", "a", [("en", "de", [("a", "b")])])
    store.create("t", "b", [("en", "de", [("a", "b")])])
    with pytest.raises(GlossaryError) as refused:
        store.create("t", "c", [("en", "de", [("a", "b")])])
    assert refused.value.status == 456
    store.create("u", "other tenant", [("en", "de", [("a", "b")])])  # the bound is per key
    with pytest.raises(GlossaryError) as refused:
        store.create("u", "big", [("en", "de", [("x" * 60, "y" * 60)])])
    assert refused.value.status == 456
    with pytest.raises(GlossaryError):  # one language pair, one dictionary
        store.create("v", "twice", [("en", "de", [("a", "b")]), ("en", "de", [("c", "d")])])
    assert len(store.list("t")) == 2 and store.list("v") == []


# -- matching ------------------------------------------------------------------------------------
def test_matching_whole_words_longest_first_any_case():
    m = Matcher([("New York", "NY"), ("New York City", "NYC"), ("cat", "Katze"), ("us", "uns"), ("US", "USA"),
                 ("A%=&", "B"), ("\u0394\u3041", "x"), ("t-shirt", "T-Shirt")])
    found = [(x.source, x.target) for x in m.find("In New  York City a Cat, no category; US and us. A%=&!")]
    assert found == [("New York City", "NYC"), ("cat", "Katze"), ("US", "USA"), ("us", "uns"), ("A%=&", "B")]
    assert [x.source for x in m.find("\u65e5\u0394\u3041\u672c with a T-Shirt")] == ["\u0394\u3041", "t-shirt"]
    text = "Where is the cat?"
    (hit,) = m.find(text)
    assert text[hit.start:hit.end] == "cat"


def test_appears_reads_whole_words():
    assert appears("Hund", "Der Hund läuft.") and appears("Hund", "Hund")
    assert not appears("Hund", "Die Hunde laufen.") and not appears("Hund", "Ein Hundehalter")
    assert appears("chat", "Chat noir.")  # sentence-initial variant
    assert appears("shirt", "un T-shirt") and appears("hommes", "d'hommes")
    assert variants("chat") == ["chat", "Chat"] and variants("Hund") == ["Hund"]
