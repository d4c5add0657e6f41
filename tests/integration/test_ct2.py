"""The CTranslate2 converter (benchmark baseline): float32 decodes exactly our greedy tokens."""
import numpy as np
import pytest
import torch

from benchmarks.ct2_convert import convert
from models.core.bundle import newest_version
from models.core.config import preset
from models.core.tokenizer import train_tokenizer
from models.search import greedy
from models.transformer import Transformer
from tests.tiny_models import reverser, varied

ctranslate2 = pytest.importorskip("ctranslate2")


def test_float32_conversion_gives_our_greedy_tokens(tmp_path):
    tok = train_tokenizer(["a b c d e f g h i j k l m n o p q r s t"] * 5, vocab_size=50, min_frequency=1)
    tok.save(tmp_path / "tokenizer.json")
    model = reverser(tok.vocab_size)  # trained: a random model decodes one repeated token
    torch.save({"config": model.cfg.to_dict(), "model": model.state_dict(), "meta": {}}, tmp_path / "model.pt")
    out = convert(tmp_path / "model.pt", tmp_path / "ct2")
    translator = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    rng = np.random.default_rng(0)
    sources = [[int(x) for x in rng.integers(4, tok.vocab_size, rng.integers(2, 9))] + [2] for _ in range(20)]
    res = translator.translate_batch([[tok.piece(i) for i in s] for s in sources], beam_size=1,
                                     max_decoding_length=12)
    theirs = [[tok.tok.token_to_id(p) for p in r.hypotheses[0]] for r in res]
    ours = [greedy(model, torch.tensor([s]), max_len=12)[0] for s in sources]
    assert varied(ours) and theirs == ours


def test_unsupported_architectures_are_refused(tmp_path):
    from benchmarks.ct2_convert import build_spec
    model = Transformer(preset("tiny", vocab_size=40, pre_norm=False, attention="additive"))
    with pytest.raises(ValueError, match="pre-norm.*additive"):
        build_spec(model, [str(i) for i in range(40)])


def test_baseline_server_gives_our_servers_tokens(tmp_path):
    """benchmarks/ct2_server.py over the shipped model: the same tokens as our server, unary and
    streamed (the serving comparison is only fair if both do the same work)."""
    from benchmarks.harness import PeerProcess
    from tests.serving import ROOT, ServerThread, flickr_sentences

    from client import TranslatorClient

    ckpt = ROOT / "models/pretrained/multi30k-en-de-small/model.pt"
    model_dir = convert(ckpt, tmp_path / "ct2")
    tokenizer = newest_version(ROOT / "model_repository/multi30k-en-de-small") / "tokenizer.json"
    peer = PeerProcess("--model", str(model_dir), "--tokenizer", str(tokenizer), "--replicas", "2", "--threads", "1",
                       "--max-batch", "8", log_path=tmp_path / "peer.log").start(timeout=60)
    ours = ServerThread(metrics_port=-1, warmup=False).start()
    texts = flickr_sentences(24)
    try:
        with TranslatorClient(peer.target, timeout=60, retries=0) as base, \
                TranslatorClient(ours.target, timeout=60, retries=0) as mine:
            want = [t.hypotheses[0] for t in mine.translate(texts, return_tokens=True).translations]
            got = [t.hypotheses[0] for t in base.translate(texts, return_tokens=True).translations]
            assert [list(h.token_ids) for h in got] == [list(h.token_ids) for h in want]
            assert [h.text for h in got] == [h.text for h in want]
            for text, w in zip(texts[:6], want):
                msgs = list(base.translate_stream(text))
                assert msgs[-1].final and "".join(m.delta for m in msgs) == w.text
                assert [t for m in msgs for t in m.token_ids] == list(w.token_ids)
    finally:
        ours.stop()
        status = peer.stop(timeout=10)
    assert status == 0, peer.log_tail()  # SIGTERM ends the peer cleanly (a kill after 10 s would be -9)


def test_alternatives_equal_ctranslate2_return_alternatives(tmp_path):
    """alternatives = CTranslate2's return_alternatives (an independent engine) on the shipped model:
    after a target prefix, the n most likely next tokens, each continued greedily, in that order."""
    from tests.serving import ROOT, ServerThread, flickr_sentences

    from client import TranslatorClient

    model_dir = convert(ROOT / "models/pretrained/multi30k-en-de-small/model.pt", tmp_path / "ct2")
    translator = ctranslate2.Translator(str(model_dir), device="cpu", intra_threads=1)
    srv = ServerThread(metrics_port=-1, warmup=False, runaway_guard=False).start()
    tok = srv.app.models["multi30k-en-de-small"].tok
    try:
        with TranslatorClient(srv.target, timeout=60, retries=0) as client:
            for k, text in enumerate(flickr_sentences(24)):
                prefix = ["", "Ein", "Eine Frau", "Zwei Hunde"][k % 4]
                r = client.translate([text], target_prefix=prefix, alternatives=4, return_tokens=True,
                                     max_output_tokens=60, split_sentences="off")
                ours = [list(h.token_ids) for h in r.translations[0].hypotheses]
                res = translator.translate_batch([[tok.piece(i) for i in tok.encode(text)]],
                                                 target_prefix=[[tok.piece(i) for i in tok.encode_target(prefix)]],
                                                 return_alternatives=True, num_hypotheses=4, beam_size=1,
                                                 max_decoding_length=60 + len(tok.encode_target(prefix)))
                theirs = [[tok.token_id(p) for p in h] for h in res[0].hypotheses]
                assert len(ours) == 4 and len({tuple(o) for o in ours}) == 4, ours
                assert ours == theirs, (text, prefix, ours, theirs)
    finally:
        srv.stop()
