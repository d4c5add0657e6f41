"""Hugging Face import (export/huggingface.py): real Marian and M2M100 checkpoints built here, exported,
served, and compared token for token with transformers itself."""
from __future__ import annotations

import json
import shutil
import threading

import grpc
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")

from tests import hf_models  # noqa: E402
from tests.serving import ServerThread  # noqa: E402

from export.__main__ import main as export_main  # noqa: E402
from models.core.bundle import load_bundle  # noqa: E402
from models.core.bundle_tokenizer import load_tokenizer  # noqa: E402

AWKWARD = [
    "A man is riding a bike.",
    "  Extra   spaces\tand\ttabs  ",
    "Unknown characters: ☃ § ¿ ñ ß Ω",
    "Emoji 😀🚲 and CJK 漢字かな 한국어",
    "Numbers 3.14, 1,000 and e-mail a.b@example.com",
    ">>yy<< Language code at the start.",
    "A >>xx<< code in the middle.",
    "Ünïcödé ǅ ﬁ ligature ①",
]
N_SENTENCES = 60
MAX_NEW = 14


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {"marian": hf_models.build_marian(root / "marian"), "m2m": hf_models.build_m2m100(root / "m2m"),
            "sep": hf_models.build_marian(root / "sep", separate_vocabs=True),
            "nllb": hf_models.build_nllb(root / "nllb")}


@pytest.fixture(scope="module")
def repo(hf_dirs, tmp_path_factory):
    out = tmp_path_factory.mktemp("repo")
    for name in ("marian", "sep"):
        assert export_main(["--from-huggingface", str(hf_dirs[name]), "--out", str(out), "--name", name]) == 0
    assert export_main(["--from-huggingface", str(hf_dirs["m2m"]), "--out", str(out), "--name", "m2m",
                        "--src-lang", "en", "--tgt-lang", "de", "--int8"]) == 0
    assert export_main(["--from-huggingface", str(hf_dirs["nllb"]), "--out", str(out), "--name", "nllb",
                        "--src-lang", "eng_Latn", "--tgt-lang", "deu_Latn"]) == 0
    return out


@pytest.fixture(scope="module")
def reference(hf_dirs):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
    return {k: (AutoTokenizer.from_pretrained(str(d)), AutoModelForSeq2SeqLM.from_pretrained(str(d)).eval())
            for k, d in hf_dirs.items()}


def ours(repo, name):
    bundle = load_bundle(repo / name / "1")
    return bundle, load_tokenizer(bundle.tokenizer_entry, bundle.path)


def test_bundle_records_the_model_family_rules(repo):
    marian, _ = ours(repo, "marian")
    assert marian.config["model"]["pre_norm"] is False and marian.config["model"]["activation"] == "swish"
    assert marian.config["model"]["output_bias"] and marian.spec.suppress_ids == (marian.spec.pad_id,)
    assert marian.config["model"]["bos_id"] == marian.spec.pad_id  # Marian starts decoding from its pad id
    assert marian.languages.target_rule == "source_prefix" and set(marian.languages.targets) == {"xx", "yy"}
    assert marian.config["generation"]["force_eos_at_limit"] and marian.config["generation"]["renormalize"]
    m2m, _ = ours(repo, "m2m")
    assert m2m.config["model"]["pre_norm"] and m2m.config["model"]["final_norms"]
    assert m2m.config["model"]["position_offset"] == 2 and m2m.config["model"]["position_freq_shift"] == 1
    assert m2m.languages.target_rule == "forced_bos" and ("en", "fr") in m2m.languages.pairs
    # --int8 on an import: written only after the exporter's int8 logits check passed
    assert {"encoder", "decoder_step", "decoder_inplace"} <= set(m2m.variants["int8"])
    nllb, _ = ours(repo, "nllb")  # its own tokenizer.json, language codes as special tokens
    assert nllb.config["tokenizer"]["kind"] == "tokenizer.json" and nllb.languages.target_rule == "forced_bos"
    assert set(nllb.languages.sources) == set(hf_models.NLLB_LANGS)
    sep, _ = ours(repo, "sep")  # separate vocabularies: the target's is smaller, the output is tied to it
    assert sep.spec.out_vocab_size == sep.config["model"]["tgt_vocab_size"] < sep.spec.vocab_size
    assert sep.config["tokenizer"]["target_vocab"] == "target_vocab.json"


def test_tokenizer_ids_equal_transformers(repo, reference):
    for name in ("marian", "sep"):
        tok_ref, _ = reference[name]
        _, tok = ours(repo, name)
        for text in AWKWARD:
            assert tok.encode(text) == tok_ref(text)["input_ids"], (name, text)
    m2m_ref, _ = reference["m2m"]
    m2m, m2m_tok = ours(repo, "m2m")
    for lang in ("en", "de", "fr"):
        m2m_ref.src_lang = lang
        for text in AWKWARD:
            assert [m2m.languages.source_tokens[lang]] + m2m_tok.encode(text) == m2m_ref(text)["input_ids"], text
    m2m_ref.src_lang = "en"
    nllb_ref, _ = reference["nllb"]
    nllb, nllb_tok = ours(repo, "nllb")
    for lang in hf_models.NLLB_LANGS:
        nllb_ref.src_lang = lang
        for text in AWKWARD:
            assert [nllb.languages.source_tokens[lang]] + nllb_tok.encode(text) == nllb_ref(text)["input_ids"], text
    nllb_ref.src_lang = "eng_Latn"


def test_decoding_ids_to_text_equals_transformers(repo, reference):
    for name in ("marian", "m2m", "sep", "nllb"):
        tok_ref, _ = reference[name]
        _, tok = ours(repo, name)
        for text in AWKWARD + hf_models.test_sentences(10):
            ids = tok_ref(text_target=text)["input_ids"]  # target-side ids: what decoding reads
            assert tok.decode(ids) == tok_ref.decode(ids, skip_special_tokens=True), (name, text)


@torch.no_grad()
def test_logits_equal_transformers_on_a_padded_ragged_batch(hf_dirs, reference):
    from export.huggingface import import_checkpoint, reference_parity
    for name, src, tgt in (("marian", None, None), ("m2m", "en", "de"), ("sep", None, None),
                           ("nllb", "eng_Latn", "deu_Latn")):
        imported = import_checkpoint(str(hf_dirs[name]), src, tgt)
        # The checkpoint's tokenizer files carry the names the bundle gives them.
        tok = load_tokenizer(imported.tokenizer_entry, imported.hf_dir)
        diff, problems = reference_parity(imported, reference[name][1], tok, hf_models.test_sentences(12), steps=9)
        assert problems == [] and diff <= 1e-4, (name, diff)


def _generate(reference, name: str, texts: list[str], lang: str, beams: int, **controls) -> list[list[int]]:
    """model.generate as its users call it; the outputs stripped to the translation's token ids."""
    tok, model = reference[name]
    if name in ("marian", "sep"):
        prefix = f">>{lang}<< " if name == "marian" else ""  # "sep" has one target language, no codes
        batch = tok([prefix + t for t in texts], return_tensors="pt", padding=True)
        kwargs, skip = {"max_new_tokens": MAX_NEW}, 1
    else:
        tok.src_lang = "en" if name == "m2m" else "eng_Latn"
        batch = tok(texts, return_tensors="pt", padding=True)
        kwargs, skip = {"max_new_tokens": MAX_NEW + 1, "forced_bos_token_id": tok.convert_tokens_to_ids(
            f"__{lang}__" if name == "m2m" else lang)}, 2
    with torch.no_grad():
        # The checkpoint's own generation config otherwise (early_stopping False, bad words, forced EOS...).
        out = model.generate(**batch, num_beams=beams, length_penalty=1.0, do_sample=False, **kwargs, **controls)
    eos = model.config.eos_token_id
    rows = []
    for seq in out.tolist():
        seq = seq[skip:]
        rows.append(seq[:seq.index(eos)] if eos in seq else seq)
    return rows


def test_server_output_equals_generate_greedy_and_beam_in_a_shared_batch(repo, reference):
    from client import TranslatorClient
    texts = hf_models.test_sentences(N_SENTENCES)
    # transformers has no runaway guard, and these tiny models repeat themselves: compare without it
    srv = ServerThread(model_repository=str(repo), default_model="marian", warmup=False, runaway_guard=False).start()
    try:
        with TranslatorClient(srv.target, timeout=300, retries=0) as client:
            stop = threading.Event()

            def other_traffic():  # keeps the other model's engine (and its batch) busy meanwhile
                while not stop.is_set():
                    list(client.translate_stream(texts[0], model="m2m", target_language="fr"))
            side = threading.Thread(target=other_traffic, daemon=True)
            side.start()
            try:
                for name, lang in (("marian", "xx"), ("m2m", "de"), ("m2m", "fr"), ("sep", "xx"),
                                   ("nllb", "deu_Latn"), ("nllb", "fra_Latn")):
                    for beams in (1, 4):
                        got = client.translate(texts, model=name, target_language=lang, return_tokens=True,
                                               beam_size=beams, max_output_tokens=MAX_NEW)
                        ours_ids = [list(t.hypotheses[0].token_ids) for t in got.translations]
                        want = _generate(reference, name, texts, lang, beams)
                        same = sum(a == b for a, b in zip(ours_ids, want))
                        assert same == len(texts), (name, lang, beams, same,
                                                    next((a, b) for a, b in zip(ours_ids, want) if a != b))
                        tok_ref = reference[name][0]
                        assert [t.hypotheses[0].text for t in got.translations] == \
                            [tok_ref.decode(ids, skip_special_tokens=True) for ids in want]
            finally:
                stop.set()
                side.join(60)
            assert srv.metric("nmt_decode_batch_size_sum", model="m2m") > \
                srv.metric("nmt_decode_batch_size_count", model="m2m")  # rows did share steps
    finally:
        srv.stop()


# Decoding controls as the server takes them, and as transformers' generate takes them.
CONTROLS = [dict(repetition_penalty=1.4, no_repeat_ngram_size=2), dict(min_output_tokens=8, no_unknown_token=True),
            dict(repetition_penalty=0.8, no_repeat_ngram_size=3, min_output_tokens=4, no_unknown_token=True)]


def _hf_controls(reference, name: str, ours: dict) -> dict:
    """Our options -> generate's: min_new_tokens counts a forced language token (M2M100/NLLB), and
    bad_words_ids replaces the checkpoint's own list (Marian's pad), so it carries it too."""
    _, model = reference[name]
    out = {k: ours[k] for k in ("repetition_penalty", "no_repeat_ngram_size") if k in ours}
    if "min_output_tokens" in ours:
        out["min_new_tokens"] = ours["min_output_tokens"] + (name in ("m2m", "nllb"))
    if ours.get("no_unknown_token"):
        out["bad_words_ids"] = list(model.generation_config.bad_words_ids or []) + [[reference[name][0].unk_token_id]]
    return out


def test_decoding_controls_equal_generate_in_a_shared_batch(repo, reference):
    """Repetition penalty, no repeated n-grams, a minimum length and no unknown token: the server's
    tokens = transformers' generate with the same settings, greedy and beam 4, every sentence, while
    requests with the other settings (and none) share the engine's steps."""
    import concurrent.futures as cf

    from client import TranslatorClient
    texts = hf_models.test_sentences(24)
    srv = ServerThread(model_repository=str(repo), default_model="marian", warmup=False, runaway_guard=False).start()
    try:
        with TranslatorClient(srv.target, timeout=300, retries=0) as client:
            for name, lang in (("marian", "xx"), ("m2m", "de"), ("nllb", "deu_Latn")):
                for beams in (1, 4):
                    def call(opts):
                        r = client.translate(texts, model=name, target_language=lang, return_tokens=True,
                                             beam_size=beams, max_output_tokens=MAX_NEW, **opts)
                        return [list(t.hypotheses[0].token_ids) for t in r.translations]
                    with cf.ThreadPoolExecutor(len(CONTROLS) + 1) as pool:  # every setting at once
                        got = list(pool.map(call, CONTROLS + [{}]))
                    # each setting changes some outputs (else this would prove nothing about it)
                    assert all(g != got[-1] for g in got[:-1]), (name, beams)
                    for opts, ours_ids in zip(CONTROLS + [{}], got):
                        want = _generate(reference, name, texts, lang, beams, **_hf_controls(reference, name, opts))
                        diff = [(t, a, b) for t, a, b in zip(texts, ours_ids, want) if a != b]
                        assert not diff, (name, beams, opts, len(diff), diff[0])
            assert srv.metric("nmt_decode_batch_size_sum", model="marian") > \
                srv.metric("nmt_decode_batch_size_count", model="marian")  # rows did share steps
    finally:
        srv.stop()


def _generate_with_prefix(reference, name: str, texts: list[str], lang: str, beams: int,
                          prefix: list[int]) -> list[list[int]]:
    """generate with the prefix as decoder_input_ids (after the decoder start and, for M2M100/NLLB, the
    target-language token), as interactive-translation tools call it; outputs keep the prefix."""
    tok, model = reference[name]
    start = [model.config.decoder_start_token_id]
    if name == "marian":
        batch = tok([f">>{lang}<< " + t for t in texts], return_tensors="pt", padding=True)
    else:
        tok.src_lang = "en" if name == "m2m" else "eng_Latn"
        batch = tok(texts, return_tensors="pt", padding=True)
        start.append(tok.convert_tokens_to_ids(f"__{lang}__" if name == "m2m" else lang))
    prompt = torch.tensor([start + prefix] * len(texts))
    with torch.no_grad():
        out = model.generate(**batch, decoder_input_ids=prompt, num_beams=beams, length_penalty=1.0,
                             do_sample=False, max_new_tokens=MAX_NEW)
    eos = model.config.eos_token_id
    rows = []
    for seq in out.tolist():
        seq = seq[len(start):]
        rows.append(seq[:seq.index(eos)] if eos in seq else seq)
    return rows


def test_target_prefix_equals_generate_with_decoder_input_ids(repo, reference):
    """The translation starts with the prefix (tokenised as transformers tokenises a target text) and
    goes on as generate goes on from it, greedy and beam 4, unary and streamed."""
    import concurrent.futures as cf

    from client import TranslatorClient
    texts = hf_models.test_sentences(16)
    srv = ServerThread(model_repository=str(repo), default_model="marian", warmup=False, runaway_guard=False).start()
    try:
        with TranslatorClient(srv.target, timeout=300, retries=0) as client:
            for name, lang in (("marian", "xx"), ("m2m", "de"), ("nllb", "deu_Latn")):
                tok_ref = reference[name][0]
                free = client.translate(texts[:1], model=name, target_language=lang, split_sentences="off")
                prefix_text = " ".join(free.translations[0].hypotheses[0].text.split()[:2]) or "x"
                prefix = tok_ref(text_target=prefix_text, add_special_tokens=False).input_ids
                _, ours_tok = ours(repo, name)
                assert ours_tok.encode_target(prefix_text) == prefix, name
                for beams in (1, 4):
                    with cf.ThreadPoolExecutor(2) as pool:  # a request without a prefix shares the steps
                        side = pool.submit(client.translate, texts, model=name, target_language=lang,
                                           beam_size=5 - beams, repetition_penalty=1.2)
                        got = client.translate(texts, model=name, target_language=lang, return_tokens=True,
                                               beam_size=beams, max_output_tokens=MAX_NEW,
                                               target_prefix=prefix_text, split_sentences="off")
                        side.result()
                    ours_ids = [list(t.hypotheses[0].token_ids) for t in got.translations]
                    want = _generate_with_prefix(reference, name, texts, lang, beams, prefix)
                    diff = [(t, a, b) for t, a, b in zip(texts, ours_ids, want) if a != b]
                    assert not diff, (name, beams, len(diff), diff[0])
                    assert all(ids[:len(prefix)] == prefix for ids in ours_ids)
                streamed = list(client.translate_stream(texts[3], model=name, target_language=lang,
                                                        target_prefix=prefix_text, split_sentences="off"))
                unary = client.translate([texts[3]], model=name, target_language=lang, target_prefix=prefix_text,
                                         split_sentences="off").translations[0].hypotheses[0].text
                assert "".join(m.delta for m in streamed) == unary
    finally:
        srv.stop()


def test_languages_route_requests_and_unknown_pairs_are_refused(repo):
    from client import TranslatorClient
    srv = ServerThread(model_repository=str(repo), default_model="marian", warmup=False).start()
    try:
        with TranslatorClient(srv.target, timeout=120, retries=0) as client:
            models = {m.name: m for m in client.list_models().models}
            assert {(p.source_language, p.target_language) for p in models["marian"].language_pairs} == \
                {("en", "xx"), ("en", "yy")}
            assert len(models["m2m"].language_pairs) == 100 * 99
            routed = client.translate(["Brown adult cleaning."], source_language="en", target_language="fr")
            assert routed.model == "m2m"
            routed = client.translate(["Brown adult cleaning."], target_language="yy")
            assert routed.model == "marian"
            routed = client.translate(["Brown adult cleaning."], source_language="eng_Latn", target_language="fra_Latn")
            assert routed.model == "nllb" and len(models["nllb"].language_pairs) == 6
            with pytest.raises(grpc.RpcError) as e:
                client.translate(["Hello."], model="m2m", source_language="en", target_language="tlh")
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'en'->'tlh'" in e.value.details()
            assert "it serves from 100 languages (af, am," in e.value.details()
            with pytest.raises(grpc.RpcError) as e:
                client.translate(["Hello."], source_language="tlh", target_language="en")
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "marian: en->xx, en->yy" in e.value.details()
            assert client.health() == "SERVING"
    finally:
        srv.stop()


def _export_problems(capsys, *args) -> str:
    assert export_main(list(args)) == 1
    return capsys.readouterr().err


def test_import_refuses_with_every_problem_named(hf_dirs, tmp_path, capsys):
    out = tmp_path / "repo"
    bad = tmp_path / "bart"
    shutil.copytree(hf_dirs["marian"], bad)
    cfg = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**cfg, "model_type": "bart"}))
    assert "unsupported architecture model_type='bart'" in _export_problems(
        capsys, "--from-huggingface", str(bad), "--out", str(out))

    (bad / "config.json").write_text(json.dumps({**cfg, "activation_function": "gelu_new", "decoder_ffn_dim": 64}))
    err = _export_problems(capsys, "--from-huggingface", str(bad), "--out", str(out))
    assert "activation_function='gelu_new'" in err and "decoder_ffn_dim=64" in err  # both, at once

    (bad / "config.json").write_text(json.dumps({**cfg, "vocab_size": cfg["vocab_size"] + 5}))
    assert "vocabulary sizes" in _export_problems(capsys, "--from-huggingface", str(bad), "--out", str(out))

    (bad / "config.json").write_text(json.dumps(cfg))
    (bad / "vocab.json").unlink()
    assert "tokenizer files missing: vocab.json" in _export_problems(
        capsys, "--from-huggingface", str(bad), "--out", str(out))

    assert "language 'tlh' is not among" in _export_problems(
        capsys, "--from-huggingface", str(hf_dirs["m2m"]), "--out", str(out), "--src-lang", "tlh")
    assert "not a directory with a Hugging Face checkpoint" in _export_problems(
        capsys, "--from-huggingface", str(tmp_path / "nowhere"), "--out", str(out))
    assert not out.exists()  # nothing written by any refused import
