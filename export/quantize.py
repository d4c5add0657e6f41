"""Batch-invariant int8: weights per output channel, activations per row, integer GEMM.

ONNX Runtime's `quantize_dynamic` quantises each MatMul's activations with one
scale and zero point for the whole input tensor, computed from the tensor's own
min and max (DynamicQuantizeLinear). In a continuous batch that tensor holds
every running row, so a row's quantisation, and with it its tokens, depended
on which strangers shared its step: 191 of 200 sentences agreed between
sequential and concurrent runs. A service that promises the same output alone
and in any batch cannot ship that.

Here every MatMul (and the tied output projection's Gemm) with a constant
weight W (K, N) becomes:

    s   = max(|x|, last axis) / 127                    # (..., 1): one scale per row (token)
    q   = uint8(round(x / s) + 128)                    # symmetric, stored with zero point 128
    y   = MatMulInteger(q, W_q, 128)                   # int32, exact; W_q int8 (K, N)
    out = float(y) * s * w_scale                       # w_scale (N,): max(|W[:, n]|) / 127

A row's result depends on that row alone, and the integer product is exact,
so the graph is as batch-invariant as its fp32 parts. The uint8-activation,
int8-weight product is the pair ONNX Runtime's CPU GEMM (MLAS) runs fastest on
AVX2 and VNNI. The attention products (between two activations) and
everything else stay fp32. K * 127 * 127 must stay below 2^24 for the int32 ->
float cast to be exact (K <= 1040); larger K is refused.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

MAX_K = (1 << 24) // (127 * 127)


def _weight_of(node: onnx.NodeProto, inits: dict) -> np.ndarray | None:
    """W (K, N) if `node` multiplies an activation by a constant 2-D weight (MatMul, or a plain Gemm)."""
    if node.op_type == "MatMul" and node.input[1] in inits and len(inits[node.input[1]].dims) == 2 \
            and node.input[0] not in inits:
        return numpy_helper.to_array(inits[node.input[1]])
    if node.op_type == "Gemm" and node.input[1] in inits and node.input[0] not in inits:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
            return None
        w = numpy_helper.to_array(inits[node.input[1]])
        return w.T if attrs.get("transB", 0) else w
    return None


def quantize_rowwise(src: Path, dst: Path) -> int:
    """Rewrite `src` into `dst` as above; returns how many products became int8."""
    model = onnx.load(str(src))
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    shared = [numpy_helper.from_array(np.array(127.0, np.float32), "q_127"),
              numpy_helper.from_array(np.array(1e-12, np.float32), "q_eps"),
              numpy_helper.from_array(np.array(128.0, np.float32), "q_128f"),
              numpy_helper.from_array(np.array(128, np.uint8), "q_zero")]
    nodes, count = [], 0
    for node in graph.node:
        w = _weight_of(node, inits)
        if w is None or w.shape[0] > MAX_K:
            nodes.append(node)
            continue
        count += 1
        p = f"q{count}_"
        w_scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / 127.0  # (N,)
        w_q = np.clip(np.round(w / w_scale), -127, 127).astype(np.int8)
        graph.initializer.extend([numpy_helper.from_array(w_q, p + "w"),
                                  numpy_helper.from_array(w_scale.astype(np.float32), p + "w_scale")])
        x, out = node.input[0], node.output[0]
        y = p + "y" if node.op_type == "Gemm" and len(node.input) > 2 else out
        nodes += [
            helper.make_node("Abs", [x], [p + "abs"]),
            helper.make_node("ReduceMax", [p + "abs"], [p + "max"], axes=[-1], keepdims=1),
            helper.make_node("Max", [p + "max", "q_eps"], [p + "max_eps"]),
            helper.make_node("Div", [p + "max_eps", "q_127"], [p + "s"]),  # (..., 1)
            helper.make_node("Div", [x, p + "s"], [p + "xs"]),
            helper.make_node("Round", [p + "xs"], [p + "xr"]),
            helper.make_node("Add", [p + "xr", "q_128f"], [p + "xo"]),
            helper.make_node("Cast", [p + "xo"], [p + "xq"], to=TensorProto.UINT8),
            helper.make_node("MatMulInteger", [p + "xq", p + "w", "q_zero"], [p + "acc"]),
            helper.make_node("Cast", [p + "acc"], [p + "accf"], to=TensorProto.FLOAT),
            helper.make_node("Mul", [p + "accf", p + "s"], [p + "rows"]),
            helper.make_node("Mul", [p + "rows", p + "w_scale"], [y]),
        ]
        if y != out:  # Gemm's bias
            nodes.append(helper.make_node("Add", [y, node.input[2]], [out]))
    graph.ClearField("node")
    graph.node.extend(nodes)
    graph.initializer.extend(shared)
    used = {i for n in graph.node for i in n.input}
    keep = [i for i in graph.initializer if i.name in used]
    graph.ClearField("initializer")
    graph.initializer.extend(keep)
    onnx.save(model, str(dst))
    return count
