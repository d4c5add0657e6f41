"""benchmarks/unary_vs_static.py: its static decoder that drops ended rows gives static_decode.greedy's
tokens, and a small run serves the same lengths as static decoding with no errors (the figure itself is
a benchmark's, never asserted)."""
from __future__ import annotations

import subprocess
import sys

from benchmarks.unary_vs_static import MODEL, SRC, greedy_dropping_finished
from models.core import static_decode
from models.core.bundle import load_bundle, newest_version
from models.core.runtime import OnnxModel, RuntimeOptions
from models.core.bundle_tokenizer import load_tokenizer
from tests.serving import ROOT


def test_dropping_ended_rows_keeps_every_rows_tokens():
    bundle = load_bundle(newest_version(ROOT / "model_repository" / MODEL))
    tok = load_tokenizer(bundle.tokenizer_entry, bundle.path)
    model = OnnxModel(bundle, RuntimeOptions())
    texts = SRC.read_text(encoding="utf-8").splitlines()[:48]
    ids, mask = static_decode.pad_batch(tok.encode_batch(texts), bundle.spec.pad_id)
    want = static_decode.greedy(model, ids, mask)
    assert len({len(w) for w in want}) > 5  # rows end at many different steps
    assert greedy_dropping_finished(model, ids, mask) == want


def test_a_small_run_serves_the_static_lengths(tmp_path):
    out = tmp_path / "page.md"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.unary_vs_static", "--sentences", "64", "--rounds", "1",
                           "--passes", "1", "--clients", "2", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    page = out.read_text()
    assert "| 1 | " in page and "on 64 of 64 texts" in page and "served errors: 0." in page, page
