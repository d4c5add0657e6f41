"""decoder_inplace.std.onnx: the in-place decoder step in standard ONNX ops, for providers without GQA's kernels.

decoder_inplace.onnx appends each row's key/value and attends with com.microsoft.GroupQueryAttention,
whose CUDA kernels take fp16/bf16 only: an fp32 bundle on CUDA had to fall back to the copying step
(docs/benchmarks/gpu/README.md). Opset 24 has the same two operations as standard ops
(../shared/design/attention-opset24.md, checked on ONNX Runtime's CPU provider):

    TensorScatter(past, update, write_indices, axis=2)   the row's new key/value at its own position,
                                                         in place when present is bound to past's memory
    Attention(Q, K, V, nonpad_kv_seqlen=valid lengths)   each row over its own valid prefix

This module rewrites the exported graph node for node, so both graphs have the same weights, inputs
and math; the engine binds whichever the provider runs (models/core/runtime.py). Per GQA node:

    self-attention   q, k, v (B, 1, D) -> (B, H, 1, Dh), split first where GQA took them packed (B, 1, 3D);
                     present = TensorScatter(past, k, seqlens);
                     y = Attention(q, present_k, present_v, nonpad_kv_seqlen = seqlens + 1)
    cross-attention  y = Attention(q, cross_k, cross_v, nonpad_kv_seqlen = src_len); the cross buffers
                     are only read, so present_cross_* leave the graph's outputs

Everything the rewrite finds wrong (an attention node of another shape, an input it cannot trace) is
collected and reported before anything is written, as export/__main__.py does.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

OPSET = 24
IR_VERSION = 12  # TensorScatter and Attention's nonpad_kv_seqlen; the graph's other ops mean the same at 24


def _const(graph_nodes: list, name: str, values) -> str:
    graph_nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(
        np.asarray(values, dtype=np.int64), name)))
    return name


def _heads_first(nodes: list, prefix: str, x: str, split: str) -> str:
    """(B, 1, D) -> (B, H, 1, Dh)."""
    nodes.append(helper.make_node("Reshape", [x, split], [f"{prefix}/bshd"]))
    nodes.append(helper.make_node("Transpose", [f"{prefix}/bshd"], [f"{prefix}/bhsd"], perm=[0, 2, 1, 3]))
    return f"{prefix}/bhsd"


def rewrite(model: onnx.ModelProto, heads: int, head_dim: int) -> tuple[onnx.ModelProto, list[str]]:
    """The standard-op graph, and the problems found (the model is unusable unless the list is empty);
    onnx's checker runs on the saved file (export_standard)."""
    problems: list[str] = []
    graph = model.graph
    nodes: list = []
    split = _const(nodes, "std/split_heads", [0, 1, heads, head_dim])
    merge = _const(nodes, "std/merge_heads", [0, 1, heads * head_dim])
    one = _const(nodes, "std/one", 1)
    dropped_outputs: set[str] = set()
    for i, node in enumerate(graph.node):
        if node.op_type != "GroupQueryAttention":
            nodes.append(node)
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if attrs.get("num_heads") != heads or attrs.get("kv_num_heads") != heads:
            problems.append(f"{node.name or i}: heads {attrs} (expected {heads} query and key/value heads)")
            continue
        q, k, v, past_k, past_v, seqlens = node.input[:6]
        out, present_k, present_v = node.output[:3]
        p = f"std/{i}"
        if not k and not v:  # packed (B, 1, 3D) query|key|value (export/inplace.py): split it
            q, k, v = f"{p}/q_packed", f"{p}/k_packed", f"{p}/v_packed"
            nodes.append(helper.make_node("Split", [node.input[0]], [q, k, v], axis=-1, num_outputs=3))
        q4 = _heads_first(nodes, f"{p}/q", q, split)
        seq64 = f"{p}/seqlens64"
        nodes.append(helper.make_node("Cast", [seqlens], [seq64], to=onnx.TensorProto.INT64))
        valid = f"{p}/valid"
        nodes.append(helper.make_node("Add", [seq64, one], [valid]))  # (B,): entries to attend over
        if past_k.startswith("past_key_"):  # self-attention: append, then attend
            k4 = _heads_first(nodes, f"{p}/k", k, split)
            v4 = _heads_first(nodes, f"{p}/v", v, split)
            nodes.append(helper.make_node("TensorScatter", [past_k, k4, seq64], [present_k], axis=2))
            nodes.append(helper.make_node("TensorScatter", [past_v, v4, seq64], [present_v], axis=2))
            keys, values = present_k, present_v
        elif past_k.startswith("cross_key_"):  # cross-attention: the buffers are read, never written
            keys, values = past_k, past_v
            dropped_outputs |= {present_k, present_v}
        else:
            problems.append(f"{node.name or i}: cannot tell self- from cross-attention by its input {past_k!r}")
            continue
        y4 = f"{p}/y"
        nodes.append(helper.make_node("Attention", [q4, keys, values, "", "", "", valid], [y4]))
        nodes.append(helper.make_node("Transpose", [y4], [f"{p}/y_bshd"], perm=[0, 2, 1, 3]))
        nodes.append(helper.make_node("Reshape", [f"{p}/y_bshd", merge], [out]))
    kept_outputs = [o for o in graph.output if o.name not in dropped_outputs]
    nodes = _live(nodes, {o.name for o in kept_outputs})
    out = helper.make_model(
        helper.make_graph(nodes, graph.name, list(graph.input), kept_outputs, list(graph.initializer)),
        opset_imports=[helper.make_opsetid("", OPSET)],
        # The IR version opset 24 needs, not this onnx's newest (14): onnxruntime-gpu 1.31 reads at most 13.
        ir_version=IR_VERSION)
    return out, problems


def _live(nodes: list, wanted: set[str]) -> list:
    """The nodes the wanted outputs depend on, in order (the cross-attention's gathers of the last source
    position, GQA's dummy "new" key/value, are dead once Attention reads the buffers directly)."""
    needed, keep = set(wanted), []
    for node in reversed(nodes):
        if needed & set(node.output):
            keep.append(node)
            needed |= {x for x in node.input if x}
    return keep[::-1]


def export_standard(inplace_path: Path, out_path: Path, heads: int, head_dim: int) -> tuple[Path, list[str]]:
    """Rewrite a saved decoder_inplace.onnx (weights inline) into `out_path`; -> (path, problems).
    Nothing is written unless the problem list is empty."""
    # Weights stay where they are: inline ones inline, external ones as references to the same file and
    # offsets (the graph is written next to it), so a shipped bundle gains the graph and no bytes of weights.
    model = onnx.load(str(inplace_path), load_external_data=False)
    std, problems = rewrite(model, heads, head_dim)
    if problems:
        return out_path, problems
    onnx.save(std, str(out_path))
    try:  # by path: external weights resolve next to the graph
        onnx.checker.check_model(str(out_path))
    except onnx.checker.ValidationError as e:
        out_path.unlink()
        problems.append(f"the rewritten graph does not check: {e}")
    return out_path, problems
