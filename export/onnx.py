"""The two ONNX graphs a bundle serves: the encoder, and one decoder step.

encoder.onnx
    inputs   src_ids   int64 (batch, src_len)
             src_mask  bool  (batch, src_len)         True on real tokens
    outputs  memory    float (batch, src_len, d_model)  (for Embed: mean-pool under src_mask)
             cross_k   float (layers, batch, heads, src_len, head_dim)
             cross_v   float (layers, batch, heads, src_len, head_dim)

decoder_step.onnx
    inputs   tokens    int64 (batch, step)            usually step = 1
             positions int64 (batch, step)            per row: rows may be of different ages
             past_k    float (layers, batch, heads, past_len, head_dim)
             past_v    float (layers, batch, heads, past_len, head_dim)
             past_mask bool  (batch, past_len)        True where the cache holds a real entry
             cross_k, cross_v                          as the encoder returned them
             src_mask  bool  (batch, src_len)
    outputs  logits    float (batch, step, vocab)
             new_k     float (layers, batch, heads, step, head_dim)   only this step's entries
             new_v     float (layers, batch, heads, step, head_dim)

Why past in / new out rather than a shared past-present buffer (ONNX Runtime
GenAI's `past_present_share_buffer`): a shared buffer updated inside the graph
assumes every row writes at the same index, which breaks as soon as rows of
different ages share a step. Here the engine owns a preallocated cache and
writes each row's new entry at that row's own position; the graph never sees
the buffer's capacity, only the `past_len` columns the batch needs, with the
holes masked. Layers are stacked on a leading axis (one tensor per kind, not
Optimum's `past_key_values.{i}.key` per layer) so the engine moves one array
per step.
"""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper
from torch import Tensor, nn

from models.transformer import Transformer

OPSET = 17

ENCODER_INPUTS = ["src_ids", "src_mask"]
ENCODER_OUTPUTS = ["memory", "cross_k", "cross_v"]
DECODER_INPUTS = ["tokens", "positions", "past_k", "past_v", "past_mask", "cross_k", "cross_v", "src_mask"]
DECODER_OUTPUTS = ["logits", "new_k", "new_v"]

ENCODER_AXES = {
    "src_ids": {0: "batch", 1: "src_len"},
    "src_mask": {0: "batch", 1: "src_len"},
    "memory": {0: "batch", 1: "src_len"},
    "cross_k": {1: "batch", 3: "src_len"},
    "cross_v": {1: "batch", 3: "src_len"},
}
DECODER_AXES = {
    "tokens": {0: "batch", 1: "step"},
    "positions": {0: "batch", 1: "step"},
    "past_k": {1: "batch", 3: "past_len"},
    "past_v": {1: "batch", 3: "past_len"},
    "past_mask": {0: "batch", 1: "past_len"},
    "cross_k": {1: "batch", 3: "src_len"},
    "cross_v": {1: "batch", 3: "src_len"},
    "src_mask": {0: "batch", 1: "src_len"},
    "logits": {0: "batch", 1: "step"},
    "new_k": {1: "batch", 3: "step"},
    "new_v": {1: "batch", 3: "step"},
}


def linear_rows(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x (N, K) @ weight (M, K).T + bias, spelled as MatMul and Add: the exporter folds the transpose into
    a (K, M) constant, the layout decoder_step.onnx's 3-D products hold too, so the bundle stores a shared
    weight once (F.linear would export Gemm on the (M, K) parameter, a second layout of it), and ONNX
    Runtime fuses the pair into Gemm at load because x is 2-D (it does not for 3-D inputs)."""
    y = x @ weight.t()
    return y if bias is None else y + bias


def ffn_rows(ffn: nn.Module, x: Tensor) -> Tensor:
    """A FeedForward (models/transformer.py) on 2-D rows, its two products through linear_rows."""
    return linear_rows(ffn.act(linear_rows(x, ffn.fc1.weight, ffn.fc1.bias)), ffn.fc2.weight, ffn.fc2.bias)


def packed_linear(*linears: nn.Linear) -> tuple[Tensor, Tensor | None]:
    """Several projections of one input as one: weights stacked on the output axis, biases likewise."""
    biases = [p.bias for p in linears]
    return torch.cat([p.weight for p in linears]), None if any(b is None for b in biases) else torch.cat(biases)


class EncoderGraph(nn.Module):
    """encoder.onnx: the model's encode and cross_kv, exported as they are for any model, and in a form with
    fewer, larger kernels for dot-product attention without a local window: every product on (B*S, D) rows
    (ONNX Runtime fuses each bias Add into Gemm, each ReLU into FusedGemm), each layer's query, key and value
    from one packed product, the padding mask added to the scores once per layer as one (B, 1, 1, S) bias,
    and every decoder layer's cross keys and values from one product. 209 -> 136 nodes after ONNX Runtime's
    fusions for the default model; 226-235 -> 190-197 us for one 15-token sentence, -4..-7% for 32 (one
    thread, 2026-11-28, docs/serving_speed.md). Same math: parity with PyTorch is checked at export."""

    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model
        self.rows = model.cfg.attention == "dot" and model.cfg.local_window is None

    def forward(self, src_ids: Tensor, src_mask: Tensor):
        if not self.rows:
            memory = self.model.encode(src_ids, src_mask)
            cross_k, cross_v = self.model.cross_kv(memory)
            return memory, cross_k, cross_v
        m, cfg = self.model, self.model.cfg
        heads, dh, d, layers = cfg.n_heads, cfg.head_dim, cfg.d_model, cfg.n_dec_layers
        b, s = src_ids.shape
        x = m._embed(m.embed, src_ids, torch.arange(s).expand(b, s)).reshape(b * s, d)  # (B*S, D)
        # As masked_softmax: masked keys get the most negative float before the softmax, and their weights
        # are zeroed after it (which matters only for a row masked whole: its uniform weights become zeros).
        keep = src_mask[:, None, None, :]  # (B, 1, 1, S)
        bias = torch.zeros(keep.shape).masked_fill(~keep, torch.finfo(torch.float32).min)
        for layer in m.encoder:
            sa = layer.self_attn
            h = layer.norm1(x) if layer.pre_norm else x
            qkv = linear_rows(h, *packed_linear(sa.q_proj, sa.k_proj, sa.v_proj))  # (B*S, 3D)
            qkv = qkv.view(b, s, 3, heads, dh).permute(2, 0, 3, 1, 4)  # (3, B, H, S, Dh)
            q, k, v = qkv[0], qkv[1], qkv[2]  # Gathers: a Split would change meaning on int8's way to opset 21
            weights = (torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(dh) + bias).softmax(-1)  # (B, H, S, S)
            weights = torch.where(keep, weights, 0.0)
            a = torch.matmul(weights, v).permute(0, 2, 1, 3).reshape(b * s, d)
            a = linear_rows(a, sa.out_proj.weight, sa.out_proj.bias)
            x = x + a if layer.pre_norm else layer.norm1(x + a)
            h = layer.norm2(x) if layer.pre_norm else x
            a = ffn_rows(layer.ffn, h)
            x = x + a if layer.pre_norm else layer.norm2(x + a)
        memory = m.enc_norm(x)
        cross = [layer.cross_attn for layer in m.decoder]  # every layer's keys, then every layer's values
        kv = linear_rows(memory, *packed_linear(*[c.k_proj for c in cross], *[c.v_proj for c in cross]))
        kv = kv.view(b, s, 2 * layers, heads, dh).permute(2, 0, 3, 1, 4)  # (2L, B, H, S, Dh)
        return memory.view(b, s, d), kv[:layers], kv[layers:]


class DecoderStepGraph(nn.Module):
    def __init__(self, model: Transformer):
        super().__init__()
        self.model = model

    def forward(self, tokens, positions, past_k, past_v, past_mask, cross_k, cross_v, src_mask):
        return self.model.decode_step(tokens, positions, past_k, past_v, past_mask, cross_k, cross_v, src_mask)


def example_inputs(model: Transformer, batch: int = 2, src_len: int = 5, past_len: int = 3, step: int = 1,
                   seed: int = 0) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...]]:
    """Random but valid inputs for both graphs (ragged rows, masked holes in the past)."""
    cfg = model.cfg
    g = torch.Generator().manual_seed(seed)
    src_ids = torch.randint(4, cfg.vocab_size, (batch, src_len), generator=g)
    src_mask = torch.ones(batch, src_len, dtype=torch.bool)
    src_mask[-1, src_len // 2:] = False
    src_ids[~src_mask] = cfg.pad_id
    kv_shape = (cfg.n_dec_layers, batch, cfg.n_heads, src_len, cfg.head_dim)
    past_shape = (cfg.n_dec_layers, batch, cfg.n_heads, past_len, cfg.head_dim)
    past_mask = torch.ones(batch, past_len, dtype=torch.bool)
    past_mask[0, past_len // 2:] = False  # row 0 is younger than the others
    positions = past_mask.sum(1, keepdim=True) + torch.arange(step)[None, :]
    dec = (torch.randint(4, cfg.out_vocab_size, (batch, step), generator=g), positions,
           torch.randn(past_shape, generator=g), torch.randn(past_shape, generator=g), past_mask,
           torch.randn(kv_shape, generator=g), torch.randn(kv_shape, generator=g), src_mask)
    return (src_ids, src_mask), dec


def export_graphs(model: Transformer, out_dir: Path, opset: int = OPSET) -> dict[str, Path]:
    """Write encoder.onnx and decoder_step.onnx for `model` (fp32) into out_dir."""
    model = model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    enc_inputs, dec_inputs = example_inputs(model)
    paths = {"encoder": out_dir / "encoder.onnx", "decoder": out_dir / "decoder_step.onnx"}
    with warnings.catch_warnings(), torch.no_grad():
        # The TorchScript exporter is deprecated in favour of dynamo; it is kept
        # here because it gives plain, optimiser-friendly graphs with named
        # dynamic axes for this control-flow-free model.
        warnings.simplefilter("ignore")
        torch.onnx.export(EncoderGraph(model), enc_inputs, str(paths["encoder"]), dynamo=False,
                          input_names=ENCODER_INPUTS, output_names=ENCODER_OUTPUTS,
                          dynamic_axes=ENCODER_AXES, opset_version=opset, do_constant_folding=True)
        torch.onnx.export(DecoderStepGraph(model), dec_inputs, str(paths["decoder"]), dynamo=False,
                          input_names=DECODER_INPUTS, output_names=DECODER_OUTPUTS,
                          dynamic_axes=DECODER_AXES, opset_version=opset, do_constant_folding=True)
    return paths


def share_tied_embedding(path: Path) -> int:
    """Replace folded transposed copies of initializers by a Transpose node.

    Constant folding stores the tied output projection as a second,
    transposed copy of the embedding (8 MB for the default model). Pointing the
    MatMul at Transpose(embedding) instead keeps one copy on disk; ONNX Runtime
    folds the transpose once at session load. Run it after quantisation, which
    needs the folded MatMul weight to find it. Returns the bytes saved.
    """
    model = onnx.load(str(path))
    inits = {i.name: i for i in model.graph.initializer}
    by_shape: dict[tuple, list[str]] = {}
    for name, init in inits.items():
        if len(init.dims) == 2:
            by_shape.setdefault(tuple(init.dims), []).append(name)
    saved = 0
    # Only folded constants (unnamed by the exporter) are replaced; named parameters stay.
    for name, init in list(inits.items()):
        if len(init.dims) != 2 or not name.startswith("onnx::"):
            continue
        arr = numpy_helper.to_array(init)
        for other in by_shape.get((init.dims[1], init.dims[0]), []):
            if not other.startswith("onnx::") and np.array_equal(numpy_helper.to_array(inits[other]).T, arr):
                model.graph.initializer.remove(init)
                model.graph.node.insert(0, onnx.helper.make_node("Transpose", [other], [name], perm=[1, 0],
                                                                 name=f"share_{name}"))
                saved += arr.nbytes
                break
    if saved:
        onnx.save(model, str(path))
    return saved
