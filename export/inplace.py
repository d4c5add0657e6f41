"""decoder_inplace.onnx: one decoder step that reads and writes the engine's slot cache in place.

The serving engine keeps every running row's keys/values in preallocated slot
buffers, (L, N, H, C, Dh) for self-attention and (L, N, H, S, Dh) for
cross-attention. With decoder_step.onnx it copies the batch's part of them into
fresh contiguous arrays each step and scatters the new entries back, a cost
that grows with rows x past length. This graph instead takes each layer's
buffer view `cache[l, :B]` as an input *and* as an output, and the engine binds
both to the same memory (ONNX Runtime IO binding by pointer):

    inputs   tokens                int64 (batch, 1)
             positions             int64 (batch, 1)    entries the row already has = where its new one goes
             total_len             int32 scalar         max(positions) + 1 (the batch's longest attention span)
             src_len               int64 (batch,)       real source positions of each row
             past_key_{l}, past_value_{l}      float (batch, heads, capacity, head_dim)
             cross_key_{l}, cross_value_{l}    float (batch, heads, src_capacity, head_dim)
             cross_last_key_{l}, cross_last_value_{l}  float (batch, 1, heads * head_dim)
                                   each row's last real source key/value (the slot cache keeps them)
    outputs  logits                float (batch, vocab)
             present_key_{l}, present_value_{l}, present_cross_key_{l}, present_cross_value_{l}
                                   the same tensors as the inputs above; bind them to the same memory

Self-attention is ONNX Runtime's com.microsoft.GroupQueryAttention with
`seqlens_k = positions`: it writes the new key/value at each row's own
position and attends over exactly that row's first positions + 1 entries, so
rows of different ages share a step and nothing past a row's length is ever
read (docs/design/inplace-cache.md: checked with NaN-filled tails).
`total_len` is only the op's "is this the first prompt" test and its present
size: with every row at age 0 it is 1 and the prompt path writes at 0, which
is each row's own position.

Cross-attention uses the same op over the cross buffers with
`seqlens_k = src_len - 1` and, as the "new" key/value, the row's own last
source key/value (cross_last_*, written once when the row starts): the op
rewrites an identical value and attends over exactly the row's real source
positions, with no mask, no copy and no work on the padding up to src_capacity.
(Read back from the buffer inside the graph instead, the gather and its shape
plumbing were 40 of the step's 197 nodes: docs/serving_speed.md.)

Layers are separate inputs because slicing a stacked (L, ...) input inside the
graph would copy it and lose the aliasing. One new token per row: the op
refuses several new tokens for several rows with a past, and the engine never
needs that. Only dot-product attention has this form (the additive-attention
option keeps decoder_step.onnx).
"""
from __future__ import annotations

import warnings
from pathlib import Path

import onnx
import torch
from torch import Tensor, nn

from export.onnx import ffn_rows, linear_rows, packed_linear
from models.attention import scaled_dot_product_attention
from models.transformer import Transformer

CONTRIB_OPSET = {"com.microsoft": 1}


def cache_names(layers: int) -> tuple[list[str], list[str]]:
    """Per-layer cache input and output names, in graph order."""
    inputs = [f"{kind}_{l}" for l in range(layers) for kind in ("past_key", "past_value", "cross_key", "cross_value")]
    outputs = [f"present_{kind}_{l}" for l in range(layers) for kind in ("key", "value", "cross_key", "cross_value")]
    return inputs, outputs


def last_names(layers: int) -> list[str]:
    """Per-layer inputs of each row's last source key/value, in graph order (after the caches)."""
    return [f"cross_last_{kind}_{l}" for l in range(layers) for kind in ("key", "value")]


def io_names(layers: int) -> tuple[list[str], list[str]]:
    cache_in, cache_out = cache_names(layers)
    return ["tokens", "positions", "total_len", "src_len", *cache_in, *last_names(layers)], ["logits", *cache_out]


def io_axes(layers: int) -> dict[str, dict[int, str]]:
    cache_in, cache_out = cache_names(layers)
    axes = {"tokens": {0: "batch"}, "positions": {0: "batch"}, "src_len": {0: "batch"}, "logits": {0: "batch"}}
    for name in cache_in + cache_out:
        axes[name] = {0: "batch", 2: "src_capacity" if "cross" in name else "capacity"}
    for name in last_names(layers):
        axes[name] = {0: "batch"}
    return axes


class GroupQueryAttention(torch.autograd.Function):
    """query, key, value (B, 1, H*Dh); past_key, past_value (B, H, C, Dh); seqlens_k int32 (B,);
    total_len int32 () -> output (B, 1, H*Dh), present_key, present_value (B, H, C, Dh).

    Eager PyTorch: the op's semantics, functionally (present is a new tensor).
    Exported: com.microsoft.GroupQueryAttention, which the engine runs in place.
    """

    @staticmethod
    def forward(ctx, query: Tensor, key: Tensor, value: Tensor, past_key: Tensor, past_value: Tensor,
                seqlens_k: Tensor, total_len: Tensor, heads: int):
        b, _, d = query.shape
        dh = d // heads
        rows, pos = torch.arange(b), seqlens_k.long()
        present_key, present_value = past_key.clone(), past_value.clone()
        present_key[rows, :, pos] = key.view(b, heads, dh)
        present_value[rows, :, pos] = value.view(b, heads, dh)
        q = query.view(b, 1, heads, dh).transpose(1, 2)  # (B, H, 1, Dh)
        visible = torch.arange(past_key.shape[2])[None, :] <= pos[:, None]  # (B, C)
        out = scaled_dot_product_attention(q, present_key, present_value, visible[:, None, None, :])
        return out.transpose(1, 2).reshape(b, 1, d), present_key, present_value

    @staticmethod
    def symbolic(g, query, key, value, past_key, past_value, seqlens_k, total_len, heads):
        out, present_key, present_value = g.op(
            "com.microsoft::GroupQueryAttention", query, key, value, past_key, past_value, seqlens_k, total_len,
            num_heads_i=heads, kv_num_heads_i=heads, outputs=3)  # default scale: 1/sqrt(head_dim)
        # No shape inference for contrib ops in the exporter: the outputs are shaped like these inputs.
        out.setType(query.type())
        present_key.setType(past_key.type())
        present_value.setType(past_value.type())
        return out, present_key, present_value


class PackedGroupQueryAttention(torch.autograd.Function):
    """The same op fed one packed (B, 1, 3*H*Dh) query|key|value product, as GroupQueryAttention takes it
    when its key and value inputs are absent: one GEMM for the three projections and no split.

    The TorchScript exporter cannot spell an absent optional input, so the symbolic repeats the packed
    input in the key and value places and `export_inplace` blanks them (`_blank_packed_inputs`)."""

    @staticmethod
    def forward(ctx, qkv: Tensor, past_key: Tensor, past_value: Tensor, seqlens_k: Tensor, total_len: Tensor,
                heads: int):
        q, k, v = qkv.chunk(3, dim=-1)
        return GroupQueryAttention.forward(ctx, q, k, v, past_key, past_value, seqlens_k, total_len, heads)

    @staticmethod
    def symbolic(g, qkv, past_key, past_value, seqlens_k, total_len, heads):
        out, present_key, present_value = g.op(
            "com.microsoft::GroupQueryAttention", qkv, qkv, qkv, past_key, past_value, seqlens_k, total_len,
            num_heads_i=heads, kv_num_heads_i=heads, outputs=3)
        out.setType(past_key.type().with_sizes([None, 1, None]))  # (B, 1, H*Dh): a third of qkv's width
        present_key.setType(past_key.type())
        present_value.setType(past_value.type())
        return out, present_key, present_value


def _blank_packed_inputs(model) -> int:
    """Blank the key and value inputs PackedGroupQueryAttention's symbolic repeated; returns how many nodes."""
    count = 0
    for node in model.graph.node:
        if node.op_type == "GroupQueryAttention" and node.input[1] == node.input[0] == node.input[2]:
            node.input[1] = node.input[2] = ""
            count += 1
    return count


class InPlaceDecoderStep(nn.Module):
    """The model's decoder step over per-layer slot-cache views (the graph this module documents).

    One new token per row, so the step runs on (B, D) rows rather than (B, 1, D): ONNX Runtime fuses a
    2-D MatMul and its bias Add into one Gemm (and a Gemm and its ReLU into FusedGemm), which it does not
    for 3-D inputs, and self-attention's query, key and value come from one packed product. Only the
    attention op sees (B, 1, ...), through Unsqueeze/Squeeze on constant axes (no shape arithmetic).
    129 -> 92 nodes after ONNX Runtime's own fusions for the default model (docs/serving_speed.md)."""

    def __init__(self, model: Transformer):
        super().__init__()
        if model.cfg.attention != "dot":
            raise ValueError(f"attention {model.cfg.attention!r} has no in-place form (dot only)")
        self.model = model

    def forward(self, tokens: Tensor, positions: Tensor, total_len: Tensor, src_len: Tensor, *inputs: Tensor):
        m, heads = self.model, self.model.cfg.n_heads
        layers = m.cfg.n_dec_layers
        caches, lasts = inputs[:4 * layers], inputs[4 * layers:]
        x = m._embed(m.tgt_embed, tokens, positions).squeeze(1)  # (B, D)
        seqlens = positions.reshape(-1).to(torch.int32)  # (B,)
        last_src = (src_len - 1).to(torch.int32)  # (B,)
        # The op needs total != 1 for the cross buffers (1 means "first prompt": write at 0).
        src_total = torch._shape_as_tensor(caches[2])[2].to(torch.int32)
        presents = []
        for i, layer in enumerate(m.decoder):
            past_k, past_v, cross_k, cross_v = caches[4 * i:4 * i + 4]
            sa, ca = layer.self_attn, layer.cross_attn
            h = layer.norm1(x) if layer.pre_norm else x
            qkv = linear_rows(h, *packed_linear(sa.q_proj, sa.k_proj, sa.v_proj))  # (B, 3D)
            a, pk, pv = PackedGroupQueryAttention.apply(qkv.unsqueeze(1), past_k, past_v, seqlens, total_len,
                                                        heads)
            a = linear_rows(a.squeeze(1), sa.out_proj.weight, sa.out_proj.bias)  # (B, D)
            x = x + a if layer.pre_norm else layer.norm1(x + a)

            h = layer.norm2(x) if layer.pre_norm else x
            last_k, last_v = lasts[2 * i:2 * i + 2]  # (B, 1, D)
            q = linear_rows(h, ca.q_proj.weight, ca.q_proj.bias).unsqueeze(1)  # (B, 1, D)
            a, ck, cv = GroupQueryAttention.apply(q, last_k, last_v, cross_k, cross_v, last_src, src_total, heads)
            a = linear_rows(a.squeeze(1), ca.out_proj.weight, ca.out_proj.bias)
            x = x + a if layer.pre_norm else layer.norm2(x + a)

            h = layer.norm3(x) if layer.pre_norm else x
            a = ffn_rows(layer.ffn, h)
            x = x + a if layer.pre_norm else layer.norm3(x + a)
            presents += [pk, pv, ck, cv]
        # (B, V) straight from the projection into the engine's bound buffer: given as (B, 1, V), the graph's last
        # node was an Unsqueeze that copied every row's logits once more (at 64 rows 2 MB, ~4% of the step).
        logits = m.logits_rows(x)  # (B, V)
        if m.final_logits_bias is not None:
            # Subtracted as its negation: the same float sum, but ONNX Runtime fuses a bias Add after a 2-D MatMul
            # into its Gemm, whose rounding moved the logits where Marian's bias holds -1e4 (tests/integration/
            # test_export.py); it fuses no Sub.
            logits = logits - (-m.final_logits_bias)
        return (logits, *presents)


def example_inputs(model: Transformer, batch: int = 3, capacity: int = 8, src_capacity: int = 6,
                   seed: int = 0) -> tuple[Tensor, ...]:
    """Rows of different ages and source lengths; the buffers' unused tails hold garbage on purpose."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed)
    ages = torch.tensor([0, 3, capacity - 1][:batch] + [1] * max(0, batch - 3))
    src_len = torch.tensor([1, src_capacity, 2][:batch] + [3] * max(0, batch - 3))
    tokens = torch.randint(4, cfg.out_vocab_size, (batch, 1), generator=g)
    caches = []
    for _ in range(cfg.n_dec_layers):
        for cap in (capacity, capacity, src_capacity, src_capacity):
            caches.append(torch.randn(batch, cfg.n_heads, cap, cfg.head_dim, generator=g))
    total = (ages.max() + 1).to(torch.int32)
    lasts = []  # each row's last real source entry, as the slot cache keeps it: (B, 1, H * Dh)
    for layer in range(cfg.n_dec_layers):
        for cross in caches[4 * layer + 2:4 * layer + 4]:
            last = cross[torch.arange(batch), :, src_len - 1]  # (B, H, Dh)
            lasts.append(last.reshape(batch, 1, -1).contiguous())
    return (tokens, ages[:, None], total, src_len, *caches, *lasts)


def export_inplace(model: Transformer, path: Path, opset: int) -> Path:
    """Write decoder_inplace.onnx for `model` (fp32)."""
    layers = model.cfg.n_dec_layers
    inputs, outputs = io_names(layers)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # TorchScript exporter deprecation; see export/onnx.py
        torch.onnx.export(InPlaceDecoderStep(model.eval()), example_inputs(model), str(path), dynamo=False,
                          input_names=inputs, output_names=outputs, dynamic_axes=io_axes(layers),
                          opset_version=opset, custom_opsets=CONTRIB_OPSET, do_constant_folding=True)
    graph = onnx.load(str(path), load_external_data=False)  # a large model's weights stay where they are
    if _blank_packed_inputs(graph) != layers:
        raise RuntimeError(f"{path.name}: expected {layers} packed self-attention nodes")
    onnx.save(graph, str(path))
    return path
