"""models/marian_train.py writes what the Hugging Face importer reads as it reads OPUS-MT: a short run on
a slice of Multi30k, exported by `python -m export --from-huggingface`, the import's checks all passed."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")

from export.__main__ import main as export_main  # noqa: E402
from models.marian_train import DATA, main as train_main  # noqa: E402


@pytest.mark.skipif(not (DATA / "train.en").exists(), reason="needs ../shared/data/multi30k")
def test_a_trained_marian_is_imported_as_opus_mt_is(tmp_path):
    out = tmp_path / "run"
    train_main(["--out", str(out), "--limit", "300", "--vocab-size", "400", "--d-model", "32", "--layers", "1",
                "--heads", "2", "--ffn", "64", "--epochs", "1", "--threads", "1", "--max-tokens", "1500"])
    hf = out / "hf"
    cfg = json.loads((hf / "config.json").read_text())
    assert cfg["model_type"] == "marian" and cfg["decoder_start_token_id"] == cfg["pad_token_id"]
    vocab = json.loads((hf / "vocab.json").read_text())
    assert vocab["</s>"] == 0 and vocab["<unk>"] == 1 and vocab["<pad>"] == len(vocab) - 1  # OPUS-MT's layout
    assert (hf / "source.spm").exists() and (hf / "target.spm").exists()
    assert json.loads((hf / "TRAINING.json").read_text())["best_epoch"] == 1
    repo = tmp_path / "repo"
    assert export_main(["--from-huggingface", str(hf), "--out", str(repo), "--name", "marian-check"]) == 0
    assert list(repo.glob("marian-check/*/config.json"))
