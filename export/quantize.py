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
    q   = QuantizeLinear(x, s, 128, block_size=K)      # uint8 round(x / s) + 128: one block per row
    y   = MatMulIntegerToFloat(q, W_q, 1, w_scale, 128)  # (q - 128) @ W_q, exact in int32, times w_scale (N,)
    out = y * s (+ bias)                               # w_scale = max(|W[:, n]|) / 63: 7-bit weights

A row's result depends on that row alone, and the integer product is exact,
so the graph is as batch-invariant as its fp32 parts. The uint8-activation,
int8-weight product is the pair ONNX Runtime's CPU GEMM (MLAS) runs fastest on
AVX2 and VNNI: int8 activations would save the zero point's two nodes per
activation, but measured 5.8x slower on an AVX-512 VNNI machine (3,255 vs 563
tokens/s at batch 1; MLAS has no fast s8s8 kernel there). The attention products (between two activations) and
everything else stay fp32. K * 127 * 63 must stay below 2^24 for the int32 ->
float conversion to be exact (K <= 2096 with 7-bit weights, 1040 with 8-bit); a longer
product stays fp32.

Why the weights use 7 bits (-63..63), as ONNX Runtime's own `reduce_range` does: a CPU
without VNNI (AVX2 only, e.g. AMD Zen 3; or AVX-512 without VNNI) multiplies uint8 by
int8 with `vpmaddubsw`, which adds each pair of products into a *saturating int16*:
255 x 127 x 2 = 64,770 overflows 32,767, so the "exact" integer product silently was
not. Measured on an AMD EPYC (Zen 3, AVX2, no VNNI) with 8-bit weights: the tiny test
model's int8 logits were off by up to 0.9-1.2 (0.25 on a VNNI machine), an imported
M2M100's by 3.2, and the shipped model's int8 greedy BLEU fell 0.56 below PyTorch's. With
7-bit weights a pair stays at most 255 x 63 x 2 = 32,130, so every MLAS kernel (AVX2,
AVX-512, VNNI) computes the same exact int32 sums, and an int8 bundle gives the same
tokens on every x86 CPU. The cost is one bit of weight resolution per output channel
(the shipped model's card gives the int8 BLEU measured with it).

Where the CPU has VNNI (or AMX), the byte products are summed in int32 and 8-bit weights are exact as
well, one bit finer: `export --int8` also writes them as the `int8-vnni` variant, and the runtime serves
that one for `int8` on such a CPU (models/core/runtime.py: `int8_weights`, "auto"; "7" keeps every
machine of a mixed fleet on the same tokens). Same operators, same cost: the choice is fidelity to fp32.

Why these two operators (chosen by profile, benchmarks/ort_profile.py): the
first version spelled the same arithmetic as Div, Round, Add, Cast before
MatMulInteger and Cast, Mul, Mul after it: nine full passes over the
activations around each GEMM, which at batch 32 cost as much as the GEMMs
themselves (the logits product's (B, V) output alone went through three).
QuantizeLinear with one block per row (opset 21's blocked quantisation) is one
pass, and MatMulIntegerToFloat applies the per-column weight scale inside the
GEMM's output stage. The graph is moved to opset 21 for it, after checking
that every operator in it means the same there (OPSET_SAFE).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

# 7-bit weights (see above): 8-bit activations with 7-bit weights kept more tokens identical to fp32
# than the reverse (shipped model, greedy: 87.3% vs 85.9% of the test set; BLEU 36.88 vs 36.85).
ACT_LEVELS = 127  # activations: q - zero point in -127..127
WEIGHT_BITS = 7  # the int8 variant's, recorded in config.json (int8_weight_bits); exact on every x86 CPU
VNNI_WEIGHT_BITS = 8  # the int8-vnni variant's: exact only where VNNI (or AMX) sums the byte products in int32
ZERO_POINT = ACT_LEVELS + 1  # uint8 activations in 1..255


def weight_levels(bits: int) -> int:
    """Largest weight magnitude with `bits` bits and the sign: 63 for 7, 127 for 8."""
    return (1 << (bits - 1)) - 1


def max_k(bits: int) -> int:
    """Longest product whose int32 sum converts to float exactly (K x 127 x levels < 2^24): 2096 for 7-bit
    weights, 1040 for 8-bit; longer products stay fp32."""
    return (1 << 24) // (ACT_LEVELS * weight_levels(bits))


# The decoder step quantises only products with at least this many weights (K x N). A decode step runs
# on one row per sentence, and around a small product the row quantisation's nodes (7 per activation,
# 2 per product) cost more than the int8 GEMM saves: for the default model's 128-wide products ONNX
# Runtime measured +2 us per product at 1-8 rows against fp32 Gemm and -2..-8 us only from 32-64 rows
# (one thread, VNNI), while the 128 x 8,000 vocabulary projection is 1.4-2x faster in int8 at every row
# count. The whole step (`benchmarks.studies.inplace_device`, 2026-11-28, two alternating rounds): every
# product quantised 0.19-0.22 / 0.29-0.30 / 0.66-0.71 ms at 1 / 8 / 32 rows, against 0.12-0.13 /
# 0.23 / 0.65-0.66 with only the projection, and fp32 0.14 / 0.26-0.27 / 0.88-1.14. 2^18 keeps an
# OPUS-MT-sized model's 512 x 512 and 512 x 2,048 products in int8 (their GEMMs dwarf the quantisation)
# and the default model's 128-wide ones in fp32. The encoder, whose rows are every source token of a
# batch, quantises every product.
DECODER_MIN_WEIGHTS = 1 << 18

OPSET = 21  # blocked QuantizeLinear
# Operators whose schema changed between opset 13 and 21 only by accepting more types
# (float8, int4, strings): a graph using nothing else means the same at opset 21.
OPSET_SAFE = {"Cast", "CastLike", "Constant", "ConstantOfShape", "Equal", "Flatten", "Identity", "Reshape",
              "Shape", "Size", "Squeeze", "Transpose", "Unsqueeze"}


def _move_to_opset(model: onnx.ModelProto) -> None:
    """Raise the default-domain opset to OPSET, refusing (with every culprit named) a graph that
    uses an operator whose meaning changed on the way."""
    from onnx import defs

    current = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if current is None or current >= OPSET:
        return
    changed = sorted({n.op_type for n in model.graph.node if n.domain in ("", "ai.onnx")
                      and defs.get_schema(n.op_type, current).since_version
                      != defs.get_schema(n.op_type, OPSET).since_version
                      and n.op_type not in OPSET_SAFE})
    if changed:
        raise ValueError(f"int8: moving the graph from opset {current} to {OPSET} (blocked QuantizeLinear) would "
                         f"change the meaning of: {', '.join(changed)}")
    for o in model.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = OPSET
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))


def constant_weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Every constant 2-D weight a product can read, by the name the product reads it under: initializers, and
    a Transpose of one (the tied output projection reads the embedding transposed)."""
    inits = {i.name: i for i in model.graph.initializer if len(i.dims) == 2}
    weights = {name: numpy_helper.to_array(init) for name, init in inits.items()}
    for node in model.graph.node:
        if node.op_type == "Transpose" and node.input[0] in inits:
            perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), [1, 0])
            weights[node.output[0]] = weights[node.input[0]].transpose(perm)
    return weights


def products(model: onnx.ModelProto) -> list[tuple[onnx.NodeProto, np.ndarray]]:
    """(node, W (K, N)) for every MatMul or plain Gemm of an activation by a constant 2-D weight."""
    weights = constant_weights(model)
    found = []
    for node in model.graph.node:
        if node.op_type == "MatMul" and node.input[1] in weights and node.input[0] not in weights:
            found.append((node, weights[node.input[1]]))
        elif node.op_type == "Gemm" and node.input[1] in weights and node.input[0] not in weights:
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            if not attrs.get("transA", 0) and attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0:
                w = weights[node.input[1]]
                found.append((node, w.T if attrs.get("transB", 0) else w))
    return found


def quantize_rowwise(src: Path, dst: Path, weight_bits: int = WEIGHT_BITS, min_weights: int = 0) -> int:
    """Rewrite `src` into `dst` as above, weights in `weight_bits` bits (7: exact on every x86 CPU; 8: exact
    with VNNI only, one bit finer); products with fewer than `min_weights` weights stay fp32 (see
    DECODER_MIN_WEIGHTS). Returns how many products became int8."""
    levels, longest = weight_levels(weight_bits), max_k(weight_bits)
    model = onnx.load(str(src))
    _move_to_opset(model)
    graph = model.graph
    found = {node.output[0]: w for node, w in products(model)}
    shared = [numpy_helper.from_array(np.array(1.0 / ACT_LEVELS, np.float32), "q_inv_levels"),
              numpy_helper.from_array(np.array(1e-12, np.float32), "q_eps"),
              numpy_helper.from_array(np.array(1.0, np.float32), "q_one"),
              numpy_helper.from_array(np.array(ZERO_POINT, np.uint8), "q_zero"),
              numpy_helper.from_array(np.array([-1], np.int64), "q_last")]
    nodes, count = [], 0
    quantized: dict[str, tuple[str, str]] = {}  # activation -> (uint8 rows, row scales): once per activation
    for node in graph.node:
        w = found.get(node.output[0])
        if w is None or w.shape[0] > longest or w.size < min_weights:
            nodes.append(node)
            continue
        count += 1
        p = f"q{count}_"
        w_q, w_scale = quantize_weights(w, levels)  # (K, N) int8, (N,)
        graph.initializer.extend([numpy_helper.from_array(w_q, p + "w"), numpy_helper.from_array(w_scale, p + "w_scale")])
        x, out = node.input[0], node.output[0]
        bias = node.input[2] if node.op_type == "Gemm" and len(node.input) > 2 else None
        if x not in quantized:
            nodes += [
                helper.make_node("Abs", [x], [p + "abs"]),
                helper.make_node("ReduceMax", [p + "abs", "q_last"], [p + "max"], keepdims=1),
                helper.make_node("Max", [p + "max", "q_eps"], [p + "max_eps"]),
                helper.make_node("Mul", [p + "max_eps", "q_inv_levels"], [p + "s"]),  # (..., 1)
                helper.make_node("Shape", [p + "s"], [p + "s_shape"]),
                helper.make_node("Expand", ["q_zero", p + "s_shape"], [p + "zp"]),  # (..., 1) uint8 ZERO_POINT
                helper.make_node("QuantizeLinear", [x, p + "s", p + "zp"], [p + "xq"], axis=-1,
                                 block_size=int(w.shape[0])),
            ]
            quantized[x] = (p + "xq", p + "s")
        xq, s = quantized[x]
        nodes += [
            helper.make_node("MatMulIntegerToFloat", [xq, p + "w", "q_one", p + "w_scale", "q_zero"], [p + "acc"],
                             domain="com.microsoft"),
            helper.make_node("Mul", [p + "acc", s], [p + "y" if bias else out]),
        ]
        if bias:  # Gemm's bias, after the row scale
            nodes.append(helper.make_node("Add", [p + "y", bias], [out]))
    graph.initializer.extend(shared)
    save_rewritten(model, nodes, dst)
    return count


def quantize_weights(w: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """W (K, N) -> (int8 codes in -levels..levels, scale per output channel (N,)): W ~ codes x scale."""
    scale = np.maximum(np.abs(w).max(axis=0), 1e-12) / levels
    return np.clip(np.round(w / scale), -levels, levels).astype(np.int8), scale.astype(np.float32)


def save_rewritten(model: onnx.ModelProto, nodes: list[onnx.NodeProto], dst: Path) -> None:
    """Give `model` the rewritten `nodes`, less any whose outputs nothing reads any more (the tied projection's
    Transpose of the embedding once a product holds its own int8 copy) and the initializers no node reads,
    and save it to `dst`."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    while True:
        read = outputs | {i for n in nodes for i in n.input}
        live = [n for n in nodes if any(o in read for o in n.output)]
        if len(live) == len(nodes):
            break
        nodes = live
    graph.ClearField("node")
    graph.node.extend(nodes)
    used = {i for n in graph.node for i in n.input}
    keep = [i for i in graph.initializer if i.name in used]
    graph.ClearField("initializer")
    graph.initializer.extend(keep)
    onnx.save(model, str(dst))
