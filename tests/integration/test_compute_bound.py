"""benchmarks/studies/compute_bound.py counts each engine pass's multiply-adds from the bundle's config;
its rates are only as good as that count. Here the count of the products is set against the shipped
graphs themselves: every MatMul or Gemm with a weight (an initializer, or the transposed embedding the
output projection ties to) contributes its K x N per row or per source token."""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from benchmarks.studies.compute_bound import encoder_macs, step_macs
from models.core.bundle import load_bundle, newest_version

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = newest_version(ROOT / "model_repository" / "multi30k-en-de-small")


def product_macs(graph_path: Path) -> int:
    """Multiply-adds per input row of every product whose right-hand side is a weight of the graph."""
    graph = onnx.load(str(graph_path), load_external_data=False).graph
    weights = {w.name: list(w.dims) for w in graph.initializer}
    for node in graph.node:  # the tied output projection multiplies by the embedding, transposed
        if node.op_type == "Transpose" and node.input[0] in weights:
            weights[node.output[0]] = list(reversed(weights[node.input[0]]))
    shapes = [weights[n.input[1]] for n in graph.node if n.op_type in ("MatMul", "Gemm") and n.input[1] in weights]
    assert shapes, f"{graph_path.name}: no weighted product found"
    return sum(k * n for k, n in shapes)


@pytest.fixture(scope="module")
def bundle():
    return load_bundle(BUNDLE)


def test_the_decode_steps_products_are_counted_as_the_graph_has_them(bundle):
    # positions and source 0: the count's attention terms vanish, its products remain
    assert step_macs(bundle.config["model"], 0, 0) == product_macs(bundle.path / "decoder_inplace.onnx")


def test_the_encoders_products_are_counted_as_the_graph_has_them(bundle):
    # per source token: the encoder layers and every decoder layer's cross keys and values
    assert encoder_macs(bundle.config["model"], 0) == product_macs(bundle.path / "encoder.onnx")


def test_attention_adds_two_products_of_the_width_per_entry(bundle):
    cfg = bundle.config["model"]
    d, layers = cfg["d_model"], cfg["n_dec_layers"]
    # scores and the weighted sum: 2 x d multiply-adds per entry attended, in every layer
    assert step_macs(cfg, 10, 6) - step_macs(cfg, 0, 0) == layers * 2 * d * 16
    assert encoder_macs(cfg, 16) - encoder_macs(cfg, 0) == cfg["n_enc_layers"] * 2 * d * 16
