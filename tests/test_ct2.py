"""The CTranslate2 converter (benchmark baseline): float32 decodes exactly our greedy tokens."""
import numpy as np
import pytest
import torch

from benchmarks.ct2_convert import convert
from models.config import preset
from models.search import greedy
from models.tokenizer import train_tokenizer
from models.transformer import Transformer

ctranslate2 = pytest.importorskip("ctranslate2")


def test_float32_conversion_gives_our_greedy_tokens(tmp_path):
    tok = train_tokenizer(["a b c d e f g h i j k l m n o p q r s t"] * 5, vocab_size=50, min_frequency=1)
    tok.save(tmp_path / "tokenizer.json")
    torch.manual_seed(0)
    model = Transformer(preset("tiny", vocab_size=tok.vocab_size)).eval()
    torch.save({"config": model.cfg.to_dict(), "model": model.state_dict(), "meta": {}}, tmp_path / "model.pt")
    out = convert(tmp_path / "model.pt", tmp_path / "ct2")
    translator = ctranslate2.Translator(str(out), device="cpu", intra_threads=1)
    rng = np.random.default_rng(0)
    sources = [[int(x) for x in rng.integers(4, tok.vocab_size, rng.integers(2, 9))] + [2] for _ in range(20)]
    res = translator.translate_batch([[tok.piece(i) for i in s] for s in sources], beam_size=1,
                                     max_decoding_length=12)
    theirs = [[tok.tok.token_to_id(p) for p in r.hypotheses[0]] for r in res]
    ours = [greedy(model, torch.tensor([s]), max_len=12)[0] for s in sources]
    assert theirs == ours


def test_unsupported_architectures_are_refused(tmp_path):
    from benchmarks.ct2_convert import build_spec
    model = Transformer(preset("tiny", vocab_size=40, pre_norm=False, attention="additive"))
    with pytest.raises(ValueError, match="pre-norm.*additive"):
        build_spec(model, [str(i) for i in range(40)])
