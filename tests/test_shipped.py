"""The shipped default model: its files, its bundle, and ONNX-vs-PyTorch parity on test_2016_flickr."""
import json
from pathlib import Path

import pytest
import sacrebleu
from serving import REPOSITORY, ROOT, SHARED

from export.parity import token_parity
from models.core.bundle import discover
from models.core.runtime import OnnxModel, RuntimeOptions
from models.core.tokenizer import normalize
from models.evaluate import load_checkpoint

PRETRAINED = ROOT / "models" / "pretrained" / "multi30k-en-de-small"
QUALITY = ROOT / "docs" / "quality.json"
needs_data = pytest.mark.skipif(not SHARED.exists(), reason="no ../shared/data/multi30k here")


@pytest.fixture(scope="module")
def shipped():
    model, tok, meta = load_checkpoint(PRETRAINED / "model.pt")
    bundle = next(b for b in discover(REPOSITORY) if b.name == PRETRAINED.name)  # the default model
    return model, tok, meta, bundle, OnnxModel(bundle, RuntimeOptions(provider="cpu"))


SHIPPED = sorted(b.name for b in discover(REPOSITORY))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_files_fit_the_budget(name):
    """Each shipped model: its checkpoint folder and its served bundle together <= 80 MB, a card
    that is the same in both places, languages recorded, no optimizer state."""
    pretrained, served = ROOT / "models" / "pretrained" / name, REPOSITORY / name
    files = [p for p in list(pretrained.rglob("*")) + list(served.rglob("*")) if p.is_file()]
    assert sum(p.stat().st_size for p in files) <= 80 * 2**20
    for file in ("model.pt", "tokenizer.json", "MODEL_CARD.md", "curve.png", "train.jsonl"):
        assert (pretrained / file).exists(), file
    bundle = next(b for b in discover(REPOSITORY) if b.name == name)
    src, tgt = name.split("-")[1:3]  # multi30k-<src>-<tgt>-<preset>
    assert (bundle.source_language, bundle.target_language) == (src, tgt)
    assert (bundle.path / "MODEL_CARD.md").read_text() == (pretrained / "MODEL_CARD.md").read_text()
    _, _, meta = load_checkpoint(pretrained / "model.pt")
    assert "optimizer" not in meta


def _bleu(ids, tok, refs) -> float:
    return sacrebleu.corpus_bleu([tok.decode(x) for x in ids], [refs]).score


@needs_data
def test_onnx_greedy_matches_pytorch_on_the_whole_test_set(shipped):
    model, tok, _, _, onnx_model = shipped
    src = (SHARED / "test_2016_flickr.en").read_text().splitlines()
    refs = [normalize(r) for r in (SHARED / "test_2016_flickr.de").read_text().splitlines()]
    result = token_parity(model, onnx_model, [tok.encode(normalize(s)) for s in src], beam=1)
    assert result.sentences == 1000 and result.ratio >= 0.99
    torch_bleu, onnx_bleu = _bleu(result.torch_ids, tok, refs), _bleu(result.onnx_ids, tok, refs)
    assert abs(torch_bleu - onnx_bleu) <= 0.1
    # The figures in the model card and docs/quality.json are this measurement.
    quality = json.loads(QUALITY.read_text())
    assert abs(quality["pytorch"]["greedy"] - torch_bleu) < 0.01
    assert abs(quality["onnx_fp32_greedy"]["bleu"] - onnx_bleu) < 0.01


@needs_data
def test_onnx_beam_matches_pytorch(shipped):
    model, tok, _, _, onnx_model = shipped
    src = (SHARED / "test_2016_flickr.en").read_text().splitlines()[:120]
    result = token_parity(model, onnx_model, [tok.encode(normalize(s)) for s in src], beam=5)
    assert result.ratio >= 0.99


def test_the_card_reports_the_measured_quality():
    card = (PRETRAINED / "MODEL_CARD.md").read_text()
    quality = json.loads(QUALITY.read_text())
    assert quality["signature"] in card
    assert f"{quality['pytorch']['beam5']:.2f}" in card and f"{quality['onnx_int8_beam5']['bleu']:.2f}" in card
    assert Path(PRETRAINED / "curve.png").stat().st_size > 10_000


def test_the_card_is_what_its_files_give(tmp_path, monkeypatch):
    """The card is generated, never edited by hand: regenerated from the shipped checkpoint, log,
    selection and run history it is byte-identical (a continued run's stages included)."""
    from models import card
    monkeypatch.chdir(ROOT)  # the card names docs/quality.json as the repository does
    out = tmp_path / "MODEL_CARD.md"
    assert card.main(["--checkpoint", str(PRETRAINED / "model.pt"), "--train-log", str(PRETRAINED / "train.jsonl"),
                      "--quality", "docs/quality.json", "--selection", str(PRETRAINED / "selection.jsonl"),
                      "--runs", str(PRETRAINED / "RUNS.md"), "--out", str(out)]) == 0
    assert out.read_text() == (PRETRAINED / "MODEL_CARD.md").read_text()
