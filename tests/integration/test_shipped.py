"""The shipped default model: its files, its bundle, and ONNX-vs-PyTorch parity on test_2016_flickr."""
import json
from pathlib import Path

import pytest
import sacrebleu
from tests.serving import REPOSITORY, ROOT, SHARED

from export.parity import near_ties, token_parity
from models.core.bundle import discover
from models.core.runtime import OnnxModel, RuntimeOptions, cpu_has_vnni
from models.core.tokenizer import normalize
from models.evaluate import load_checkpoint

PRETRAINED = ROOT / "models" / "pretrained" / "multi30k-en-de-small"
QUALITY = ROOT / "docs" / "quality.json"


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


# A difference between ONNX Runtime and PyTorch is allowed only where the two best choices tie to
# within float noise: the top-2 logit gap where greedy outputs part (fp32 kernels differ by ~1e-5),
# or the two beam winners' normalised scores.
TIE = 1e-3
# No data here: a skip with the reason; under NMT_REQUIRE_TOOLS=1 (CI) tests/conftest.py fails it.
needs_data = pytest.mark.skipif(not SHARED.exists(), reason="no ../shared/data/multi30k here")


@needs_data
def test_onnx_greedy_matches_pytorch_on_the_whole_test_set(shipped):
    model, tok, _, _, onnx_model = shipped
    src = (SHARED / "test_2016_flickr.en").read_text().splitlines()
    refs = [normalize(r) for r in (SHARED / "test_2016_flickr.de").read_text().splitlines()]
    sources = [tok.encode(normalize(s)) for s in src]
    result = token_parity(model, onnx_model, sources, beam=1)
    assert result.sentences == 1000 and len({tuple(x) for x in result.torch_ids}) > 990  # varied outputs
    ties = near_ties(model, sources, result.torch_ids, result.onnx_ids)
    assert all(d.gap < TIE for d in ties), [(d.index, d.gap) for d in ties if d.gap >= TIE]
    torch_bleu, onnx_bleu = _bleu(result.torch_ids, tok, refs), _bleu(result.onnx_ids, tok, refs)
    assert abs(torch_bleu - onnx_bleu) <= 0.1
    # The figures in the model card and docs/quality.json are this measurement.
    quality = json.loads(QUALITY.read_text())
    assert abs(quality["pytorch"]["greedy"] - torch_bleu) < 0.01
    assert abs(quality["onnx_fp32_greedy"]["bleu"] - onnx_bleu) < 0.01


@needs_data
def test_onnx_beam_matches_pytorch(shipped):
    model, tok, _, _, onnx_model = shipped
    sources = [tok.encode(normalize(s)) for s in (SHARED / "test_2016_flickr.en").read_text().splitlines()[:120]]
    result = token_parity(model, onnx_model, sources, beam=5)
    ties = near_ties(model, sources, result.torch_ids, result.onnx_ids, beam=5)
    assert all(d.gap < TIE for d in ties), [(d.index, d.gap) for d in ties if d.gap >= TIE]


@needs_data
@pytest.mark.parametrize("weights", ["7", "8", "static"])
def test_int8_quality_is_remeasured_on_the_whole_test_set(shipped, weights):
    """The int8 variants' greedy BLEU, measured now (not read from a file): within 0.5 of PyTorch's,
    equal to what docs/quality.json and the card report, most outputs token-identical; rows quantised while
    serving with 7-bit weights (every CPU) and 8-bit (int8-vnni, for CPUs with VNNI), and int8-static
    (ranges calibrated at export: what `--variant int8` serves by default)."""
    if weights == "8" and not cpu_has_vnni():
        pytest.skip("int8-vnni is served only on a CPU with VNNI, and this one has none")
    model, tok, _, bundle, _ = shipped
    options = RuntimeOptions(variant="int8", provider="cpu") if weights == "static" else \
        RuntimeOptions(variant="int8", provider="cpu", int8_weights=weights, int8_activations="row")
    int8 = OnnxModel(bundle, options)
    assert int8.variant == {"7": "int8", "8": "int8-vnni", "static": "int8-static"}[weights]
    key = f"onnx_{int8.variant}_greedy"
    src = (SHARED / "test_2016_flickr.en").read_text().splitlines()
    refs = [normalize(r) for r in (SHARED / "test_2016_flickr.de").read_text().splitlines()]
    quality = json.loads(QUALITY.read_text())
    result = token_parity(model, int8, [tok.encode(normalize(s)) for s in src], beam=1)
    bleu = _bleu(result.onnx_ids, tok, refs)
    assert abs(bleu - quality["pytorch"]["greedy"]) <= 0.5 and abs(bleu - quality[key]["bleu"]) < 0.01
    assert abs(result.identical / result.sentences - quality[key]["identical_to_pytorch"]) <= 0.003
    # 7-bit weights (export/quantize.py: no saturation on CPUs without VNNI) keep 87% of the greedy
    # outputs token-identical, 8-bit ones (exact on VNNI CPUs only) more; constant ranges 85%.
    assert result.identical / result.sentences >= {"7": 0.85, "8": 0.9, "static": 0.84}[weights]


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
