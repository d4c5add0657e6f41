"""int8-static's pieces (export/calibrate.py, export/quantize_static.py) on small hand-made inputs: the code an
activation range gets, the calibrated range, how a product is recognised in another graph, and a rewritten
graph's rows independent of their batch and close to fp32."""
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from export.calibrate import Samples, ranges_for, weight_key
from export.quantize_static import activation_code, quantize_static
from models.core.runtime import use_shared_pool


def test_a_relu_range_spends_every_code_on_positives():
    scale, zero = activation_code(0.0, 6.0, depth=256, w_levels=63)
    assert zero == 0 and scale == pytest.approx(6.0 / 255)
    scale, zero = activation_code(-2.0, 6.0, depth=256, w_levels=63)
    assert zero == 64 and scale == pytest.approx(8.0 / 255)  # 0.0 is code 64 exactly, -2.0 code 0


def test_deep_products_fall_back_to_127_levels_then_to_fp32():
    """K x levels x 63 must stay below 2^24 for the int32 -> float conversion to be exact."""
    assert activation_code(-1.0, 3.0, depth=2048, w_levels=63) == (pytest.approx(3.0 / 127), 128)
    assert activation_code(-1.0, 3.0, depth=4096, w_levels=63) is None


def test_the_range_is_a_percentile_of_the_samples_and_spans_zero():
    rng = np.random.default_rng(0)
    samples = Samples()
    samples.add(np.concatenate([rng.uniform(1.0, 2.0, 100_000), [50.0]]).astype(np.float32), rng)
    assert samples.range(100) == (0.0, 50.0)  # the extremes, widened to 0
    lo, hi = samples.range(99.99)
    assert lo == 0.0 and 1.9 < hi < 2.0  # the outlier clipped (a sample of 4,096 kept per run)


def test_a_fused_product_is_found_by_its_first_columns():
    """decoder_inplace.onnx multiplies one activation by q|k|v fused: the same activation as the copying step's
    q, k and v products, whose ranges were measured."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.normal(size=(16, 16)).astype(np.float32) for _ in range(3))
    fused = np.concatenate([q, k, v], axis=1)
    assert weight_key(fused) == weight_key(q) != weight_key(k)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 16])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 48])],
                              [numpy_helper.from_array(fused, "w")])
    found, missing = ranges_for(helper.make_model(graph), {weight_key(q): (-1.0, 2.0)})
    assert found == {"x": (-1.0, 2.0)} and not missing
    found, missing = ranges_for(helper.make_model(graph), {weight_key(k): (-1.0, 2.0)})
    assert not found and missing and "(16, 48)" in missing[0]


def test_a_rewritten_product_is_batch_invariant_and_close(tmp_path):
    """x @ W + b, ReLU, @ W2 + b2, rewritten: each row alone = the row among others (bit for bit), within the
    quantisation's error of fp32, the biases folded into the products."""
    rng = np.random.default_rng(2)
    w1, w2 = rng.normal(size=(32, 64)).astype(np.float32), rng.normal(size=(64, 8)).astype(np.float32)
    b1, b2 = rng.normal(size=64).astype(np.float32), rng.normal(size=8).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["m1"]), helper.make_node("Add", ["m1", "b1"], ["a1"]),
             helper.make_node("Relu", ["a1"], ["h"]), helper.make_node("MatMul", ["h", "w2"], ["m2"]),
             helper.make_node("Add", ["b2", "m2"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 32])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8])],
                              [numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (b1, "b1"),
                                                                           (b2, "b2"))])
    src, dst = tmp_path / "fp32.onnx", tmp_path / "static.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(src))
    x = rng.normal(size=(20, 32)).astype(np.float32)
    h = np.maximum(x @ w1 + b1, 0)
    ranges = {"x": (float(x.min()), float(x.max())), "h": (0.0, float(h.max()))}
    assert quantize_static(src, dst, ranges) == 2
    model = onnx.load(str(dst))
    assert [n.op_type for n in model.graph.node] == ["QuantizeLinear", "MatMulIntegerToFloat", "Relu",
                                                      "QuantizeLinear", "MatMulIntegerToFloat"]
    options = ort.SessionOptions()  # a process whose OnnxModel made the shared pool refuses per-session threads
    options.use_per_session_threads = not use_shared_pool(0)
    session = ort.InferenceSession(str(dst), options, providers=["CPUExecutionProvider"])
    together = session.run(None, {"x": x})[0]
    for r in range(len(x)):
        assert np.array_equal(session.run(None, {"x": x[r:r + 1]})[0][0], together[r]), r
    want = h @ w2 + b2
    assert np.abs(together - want).max() < 0.05 * np.abs(want).max()
