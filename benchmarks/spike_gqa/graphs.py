"""Hand-built ONNX attention graphs for the GQA spike (onnx.helper only, no weights).

Every graph here is attention alone: the projections are left out, so the
inputs are already-projected q/k/v. Shapes use B = rows of the step,
H = heads, Dh = head size, D = H * Dh, C = self-attention cache capacity,
S = cross-attention (source) capacity, P = gathered past length.

    gqa_self_graph        L layers of com.microsoft.GroupQueryAttention over a
                          per-layer (B, H, C, Dh) cache updated in place
    concat_self_graph     the server's current scheme: stacked past
                          (L, B, H, P, Dh) + bool past_mask, Concat with the
                          new entry, MatMul/Softmax/MatMul; new_k/new_v out
    mha_cross_graph       com.microsoft.MultiHeadAttention, 4-D BNSH key/value
                          and a key_padding_mask or an attention_bias
    plain_cross_graph     MatMul/Softmax/MatMul with an additive (B,1,1,S) mask
    gqa_cross_graph       GroupQueryAttention abused for cross-attention: the
                          row's last source key is re-written in place
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

OPSET = 17
MS_OPSET = 1
F32, I32, I64, BOOL = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL


def _model(nodes, inputs, outputs, inits=(), name="spike") -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET),
                                                    helper.make_opsetid("com.microsoft", MS_OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)  # contrib ops are unknown to onnx: only the standard part is checked
    return model


def _const(name: str, values, dtype=np.int64):
    return helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(np.dtype(dtype)),
                              np.shape(values), np.asarray(values, dtype=dtype).ravel().tolist())


def layer_names(kind: str, layers: int) -> list[str]:
    return [f"{kind}_{i}" for i in range(layers)]


# -- self-attention -----------------------------------------------------------
def gqa_self_graph(heads: int = 4, head_dim: int = 64, layers: int = 1,
                   total_from_shape: bool = False) -> onnx.ModelProto:
    """Inputs query/key/value (B, 1, D); past_key_i/past_value_i (B, H, C, Dh) per layer;
    seqlens_k int32 (B,); total_sequence_length int32 scalar (omitted when total_from_shape:
    then the graph uses C, read from past_key_0's shape).
    Outputs output_i (B, 1, D); present_key_i/present_value_i (B, H, C, Dh).
    Every layer reads the same q/k/v: this measures attention only."""
    d = heads * head_dim
    inputs = [helper.make_tensor_value_info(n, F32, ["B", 1, d]) for n in ("query", "key", "value")]
    outputs, nodes = [], []
    for i in range(layers):
        for kind in ("past_key", "past_value"):
            inputs.append(helper.make_tensor_value_info(f"{kind}_{i}", F32, ["B", heads, "C", head_dim]))
    inputs.append(helper.make_tensor_value_info("seqlens_k", I32, ["B"]))
    total = "total_sequence_length"
    if total_from_shape:
        nodes += [helper.make_node("Shape", ["past_key_0"], ["cap64"], start=2, end=3),
                  helper.make_node("Squeeze", ["cap64"], ["cap64_s"]),
                  helper.make_node("Cast", ["cap64_s"], [total], to=I32)]
    else:
        inputs.append(helper.make_tensor_value_info(total, I32, []))
    for i in range(layers):
        nodes.append(helper.make_node(
            "GroupQueryAttention",
            ["query", "key", "value", f"past_key_{i}", f"past_value_{i}", "seqlens_k", total],
            [f"output_{i}", f"present_key_{i}", f"present_value_{i}"],
            domain="com.microsoft", name=f"gqa_{i}", num_heads=heads, kv_num_heads=heads))
        outputs += [helper.make_tensor_value_info(f"output_{i}", F32, ["B", 1, d]),
                    helper.make_tensor_value_info(f"present_key_{i}", F32, ["B", heads, "C", head_dim]),
                    helper.make_tensor_value_info(f"present_value_{i}", F32, ["B", heads, "C", head_dim])]
    return _model(nodes, inputs, outputs, name="gqa_self")


def _split_heads(nodes, src: str, dst: str, heads: int, head_dim: int) -> None:
    """(B, T, D) -> (B, H, T, Dh)."""
    nodes += [helper.make_node("Reshape", [src, "shape_bthd"], [dst + "_r"]),
              helper.make_node("Transpose", [dst + "_r"], [dst], perm=[0, 2, 1, 3])]


def _merge_heads(nodes, src: str, dst: str) -> None:
    """(B, H, T, Dh) -> (B, T, D)."""
    nodes += [helper.make_node("Transpose", [src], [src + "_t"], perm=[0, 2, 1, 3]),
              helper.make_node("Reshape", [src + "_t", "shape_btd"], [dst])]


def concat_self_graph(heads: int = 4, head_dim: int = 64, layers: int = 1) -> onnx.ModelProto:
    """What export/onnx.py's decoder does today, attention only.

    Inputs query/key/value (B, 1, D); past_k/past_v (L, B, H, P, Dh); past_mask bool (B, P).
    Outputs output_i (B, 1, D) per layer; new_k/new_v (L, B, H, 1, Dh)."""
    d = heads * head_dim
    inits = [_const("shape_bthd", [0, 0, heads, head_dim]), _const("shape_btd", [0, 0, d]),
             _const("scale", np.float32(1.0 / np.sqrt(head_dim)), np.float32),
             _const("neg", np.float32(np.finfo(np.float32).min), np.float32),
             _const("zero", np.float32(0.0), np.float32), _const("axis0", [0])]
    inputs = [helper.make_tensor_value_info(n, F32, ["B", 1, d]) for n in ("query", "key", "value")]
    inputs += [helper.make_tensor_value_info(n, F32, ["L", "B", heads, "P", head_dim]) for n in ("past_k", "past_v")]
    inputs.append(helper.make_tensor_value_info("past_mask", BOOL, ["B", "P"]))
    nodes = []
    for n in ("query", "key", "value"):
        _split_heads(nodes, n, n + "_h", heads, head_dim)  # (B, H, 1, Dh)
    # the step's own entry is always visible: mask (B, 1, 1, P + 1)
    nodes += [helper.make_node("Shape", ["past_mask"], ["pm_shape"], start=0, end=1),
              helper.make_node("Concat", ["pm_shape", "one_1"], ["self_shape"], axis=0),
              helper.make_node("ConstantOfShape", ["self_shape"], ["self_true"],
                               value=helper.make_tensor("v", BOOL, [1], [True])),
              helper.make_node("Concat", ["past_mask", "self_true"], ["mask2"], axis=1),
              helper.make_node("Unsqueeze", ["mask2", "axes12"], ["mask4"])]
    inits += [_const("one_1", [1]), _const("axes12", [1, 2])]
    outputs = []
    for i in range(layers):
        p = f"l{i}_"
        inits.append(_const(p + "idx", np.int64(i)))
        nodes += [helper.make_node("Gather", ["past_k", p + "idx"], [p + "pk"], axis=0),  # (B, H, P, Dh)
                  helper.make_node("Gather", ["past_v", p + "idx"], [p + "pv"], axis=0),
                  helper.make_node("Concat", [p + "pk", "key_h"], [p + "k"], axis=2),
                  helper.make_node("Concat", [p + "pv", "value_h"], [p + "v"], axis=2),
                  helper.make_node("Transpose", [p + "k"], [p + "kt"], perm=[0, 1, 3, 2]),
                  helper.make_node("MatMul", ["query_h", p + "kt"], [p + "s0"]),
                  helper.make_node("Mul", [p + "s0", "scale"], [p + "s1"]),
                  helper.make_node("Where", ["mask4", p + "s1", "neg"], [p + "s2"]),
                  helper.make_node("Softmax", [p + "s2"], [p + "w0"], axis=-1),
                  helper.make_node("Where", ["mask4", p + "w0", "zero"], [p + "w"]),
                  helper.make_node("MatMul", [p + "w", p + "v"], [p + "o"])]
        _merge_heads(nodes, p + "o", f"output_{i}")
        outputs.append(helper.make_tensor_value_info(f"output_{i}", F32, ["B", 1, d]))
    # new entries stacked on L, as the real graph returns them
    nodes += [helper.make_node("Unsqueeze", ["key_h", "axis0"], ["nk1"]),
              helper.make_node("Unsqueeze", ["value_h", "axis0"], ["nv1"]),
              helper.make_node("Concat", ["nk1"] * layers, ["new_k"], axis=0),
              helper.make_node("Concat", ["nv1"] * layers, ["new_v"], axis=0)]
    outputs += [helper.make_tensor_value_info(n, F32, [layers, "B", heads, 1, head_dim]) for n in ("new_k", "new_v")]
    return _model(nodes, inputs, outputs, inits, name="concat_self")


# -- cross-attention ----------------------------------------------------------
def mha_cross_graph(heads: int = 4, head_dim: int = 64, mask: str = "key_padding_2d") -> onnx.ModelProto:
    """MultiHeadAttention, query (B, 1, D), key/value (B, H, S, Dh) BNSH, and per mask:
    key_padding_2d: key_padding_mask int32 (B, S) 1 = real; key_padding_1d: int32 (B,) real lengths;
    bias: attention_bias float (B, 1, 1, S) additive."""
    d = heads * head_dim
    inputs = [helper.make_tensor_value_info("query", F32, ["B", 1, d]),
              helper.make_tensor_value_info("cross_k", F32, ["B", heads, "S", head_dim]),
              helper.make_tensor_value_info("cross_v", F32, ["B", heads, "S", head_dim])]
    if mask == "key_padding_2d":
        inputs.append(helper.make_tensor_value_info("mask", I32, ["B", "S"]))
        ins = ["query", "cross_k", "cross_v", "", "mask"]
    elif mask == "key_padding_1d":
        inputs.append(helper.make_tensor_value_info("mask", I32, ["B"]))
        ins = ["query", "cross_k", "cross_v", "", "mask"]
    elif mask == "bias":
        inputs.append(helper.make_tensor_value_info("mask", F32, ["B", 1, 1, "S"]))
        ins = ["query", "cross_k", "cross_v", "", "", "mask"]
    else:
        raise ValueError(mask)
    node = helper.make_node("MultiHeadAttention", ins, ["output"], domain="com.microsoft", num_heads=heads)
    return _model([node], inputs, [helper.make_tensor_value_info("output", F32, ["B", 1, d])], name="mha_cross")


def plain_cross_graph(heads: int = 4, head_dim: int = 64) -> onnx.ModelProto:
    """query (B, 1, D), cross_k/cross_v (B, H, S, Dh), mask float (B, 1, 1, S) additive (0 / -inf-ish)."""
    d = heads * head_dim
    inits = [_const("shape_bthd", [0, 0, heads, head_dim]), _const("shape_btd", [0, 0, d]),
             _const("scale", np.float32(1.0 / np.sqrt(head_dim)), np.float32)]
    inputs = [helper.make_tensor_value_info("query", F32, ["B", 1, d]),
              helper.make_tensor_value_info("cross_k", F32, ["B", heads, "S", head_dim]),
              helper.make_tensor_value_info("cross_v", F32, ["B", heads, "S", head_dim]),
              helper.make_tensor_value_info("mask", F32, ["B", 1, 1, "S"])]
    nodes = []
    _split_heads(nodes, "query", "q", heads, head_dim)
    nodes += [helper.make_node("Transpose", ["cross_k"], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["s0"]),
              helper.make_node("Mul", ["s0", "scale"], ["s1"]),
              helper.make_node("Add", ["s1", "mask"], ["s2"]),
              helper.make_node("Softmax", ["s2"], ["w"], axis=-1),
              helper.make_node("MatMul", ["w", "cross_v"], ["o"])]
    _merge_heads(nodes, "o", "output")
    return _model(nodes, inputs, [helper.make_tensor_value_info("output", F32, ["B", 1, d])], inits, "plain_cross")


def gqa_cross_graph(heads: int = 4, head_dim: int = 64) -> onnx.ModelProto:
    """Cross-attention through GroupQueryAttention over only each row's real source length.

    Inputs query (B, 1, D); cross_k/cross_v (B, H, S, Dh) (bind present_* to the same memory);
    src_len int32 (B,). GQA appends the step's key at seqlens_k = src_len - 1 and attends to
    positions [0, src_len): giving it the row's own last source key/value (gathered here) as the
    'new' entry re-writes an identical value, so the cache is unchanged and the attention is
    exactly over the real source. total_sequence_length is S (from the shape), never 1, so the
    op never takes its first-prompt path (which writes at position 0)."""
    d = heads * head_dim
    inits = [_const("one", np.int32(1), np.int32), _const("shape_b1d", [0, 1, d]),
             _const("shape_b111", [-1, 1, 1, 1])]
    inputs = [helper.make_tensor_value_info("query", F32, ["B", 1, d]),
              helper.make_tensor_value_info("cross_k", F32, ["B", heads, "S", head_dim]),
              helper.make_tensor_value_info("cross_v", F32, ["B", heads, "S", head_dim]),
              helper.make_tensor_value_info("src_len", I32, ["B"])]
    nodes = [helper.make_node("Sub", ["src_len", "one"], ["seqlens_k"]),
             helper.make_node("Shape", ["cross_k"], ["s_shape"], start=2, end=3),
             helper.make_node("Squeeze", ["s_shape"], ["s_scalar"]),
             helper.make_node("Cast", ["s_scalar"], ["total"], to=I32),
             # index (B, H, 1, Dh) filled with src_len - 1, for GatherElements on the S axis
             helper.make_node("Cast", ["seqlens_k"], ["last64"], to=I64),
             helper.make_node("Reshape", ["last64", "shape_b111"], ["last4"]),
             helper.make_node("Shape", ["cross_k"], ["kshape"]),
             helper.make_node("Slice", ["kshape", "sl_start", "sl_end"], ["bh"]),
             helper.make_node("Concat", ["bh", "one64", "dh64"], ["idx_shape"], axis=0),
             helper.make_node("Expand", ["last4", "idx_shape"], ["idx"])]
    inits += [_const("sl_start", [0]), _const("sl_end", [2]), _const("one64", [1]), _const("dh64", [head_dim])]
    for kind, src in (("k", "cross_k"), ("v", "cross_v")):
        nodes += [helper.make_node("GatherElements", [src, "idx"], [f"last_{kind}"], axis=2),  # (B, H, 1, Dh)
                  helper.make_node("Transpose", [f"last_{kind}"], [f"last_{kind}_t"], perm=[0, 2, 1, 3]),
                  helper.make_node("Reshape", [f"last_{kind}_t", "shape_b1d"], [f"new_{kind}"])]
    nodes.append(helper.make_node(
        "GroupQueryAttention", ["query", "new_k", "new_v", "cross_k", "cross_v", "seqlens_k", "total"],
        ["output", "present_cross_k", "present_cross_v"], domain="com.microsoft", num_heads=heads,
        kv_num_heads=heads))
    outputs = [helper.make_tensor_value_info("output", F32, ["B", 1, d]),
               helper.make_tensor_value_info("present_cross_k", F32, ["B", heads, "S", head_dim]),
               helper.make_tensor_value_info("present_cross_v", F32, ["B", heads, "S", head_dim])]
    return _model(nodes, inputs, outputs, inits, name="gqa_cross")


# -- sessions and binding -----------------------------------------------------
def session(model: onnx.ModelProto, threads: int = 1):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def bind_view(binding, name: str, view: np.ndarray, output: bool = False) -> None:
    """Bind a C-contiguous numpy view by pointer (no copy), as an input or as an output."""
    assert view.flags.c_contiguous, f"{name}: a strided view cannot be bound by pointer"
    ptr = view.ctypes.data
    if output:
        binding.bind_output(name, "cpu", 0, view.dtype, list(view.shape), ptr)
    else:
        binding.bind_input(name, "cpu", 0, view.dtype, list(view.shape), ptr)


def reference_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, lengths) -> np.ndarray:
    """q (B, H, Dh); k, v (B, H, T, Dh); row b attends to its first lengths[b] keys -> (B, H, Dh), float64."""
    out = np.zeros(q.shape, dtype=np.float64)
    for b, n in enumerate(lengths):
        kb, vb = k[b, :, :n].astype(np.float64), v[b, :, :n].astype(np.float64)
        s = np.einsum("hd,htd->ht", q[b].astype(np.float64), kb) / np.sqrt(q.shape[-1])
        w = np.exp(s - s.max(-1, keepdims=True))
        w /= w.sum(-1, keepdims=True)
        out[b] = np.einsum("ht,htd->hd", w, vb)
    return out
