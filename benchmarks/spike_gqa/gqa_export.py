"""Question 5: emit com.microsoft::GroupQueryAttention from torch.onnx.export (TorchScript, opset 17).

    .venv/bin/python benchmarks/spike_gqa/gqa_export.py [out_dir]

A torch.autograd.Function whose eager forward is the op's math (write the new
entry at each row's own position, attend over positions <= seqlens_k) and whose
`symbolic` emits the contrib op. A toy two-layer self-attention module using it
is exported with dynamo=False, loaded in ONNX Runtime, and run with the cache
bound in place; outputs and cache contents are compared to eager PyTorch.
"""
from __future__ import annotations

import math
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch
from torch import Tensor, nn

sys.path.insert(0, str(Path(__file__).parent))
from graphs import bind_view, session  # noqa: E402


class GroupQueryAttentionFn(torch.autograd.Function):
    """query/key/value (B, 1, H*Dh); past_key/past_value (B, H, C, Dh); seqlens_k int32 (B,);
    total_sequence_length int32 scalar -> output (B, 1, H*Dh), present_key, present_value (B, H, C, Dh).

    Eager: functional (present is a new tensor). In ONNX Runtime the caller aliases past and
    present by binding them to the same memory, which turns the same op into an in-place append."""

    @staticmethod
    def forward(ctx, query: Tensor, key: Tensor, value: Tensor, past_key: Tensor, past_value: Tensor,
                seqlens_k: Tensor, total_sequence_length: Tensor, num_heads: int):
        b, _, d = query.shape
        dh = d // num_heads
        cap = past_key.shape[2]
        rows = torch.arange(b)
        pos = seqlens_k.long()
        present_key, present_value = past_key.clone(), past_value.clone()
        present_key[rows, :, pos] = key.view(b, num_heads, dh)
        present_value[rows, :, pos] = value.view(b, num_heads, dh)
        q = query.view(b, num_heads, 1, dh)
        scores = torch.matmul(q, present_key.transpose(-2, -1)) / math.sqrt(dh)  # (B, H, 1, C)
        visible = (torch.arange(cap)[None, :] <= pos[:, None])[:, None, None, :]
        weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        out = torch.matmul(weights, present_value).reshape(b, 1, d)
        return out, present_key, present_value

    @staticmethod
    def symbolic(g, query, key, value, past_key, past_value, seqlens_k, total_sequence_length, num_heads):
        out, present_key, present_value = g.op(
            "com.microsoft::GroupQueryAttention", query, key, value, past_key, past_value, seqlens_k,
            total_sequence_length, num_heads_i=num_heads, kv_num_heads_i=num_heads, outputs=3)
        # the exporter has no shape inference for contrib ops: the outputs are shaped like these inputs
        out.setType(query.type())
        present_key.setType(past_key.type())
        present_value.setType(past_value.type())
        return out, present_key, present_value


class ToyDecoderAttention(nn.Module):
    """Self-attention blocks over a per-layer slot cache; positions (B, 1) int64 = entries so far."""

    def __init__(self, d_model: int = 256, heads: int = 4, layers: int = 2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.ModuleList(nn.Linear(d_model, 3 * d_model) for _ in range(layers))
        self.out = nn.ModuleList(nn.Linear(d_model, d_model) for _ in range(layers))

    def forward(self, x: Tensor, positions: Tensor, *past: Tensor):
        seqlens_k = positions[:, 0].to(torch.int32)
        # the capacity, read from the shape so that it stays dynamic in the trace
        total = torch._shape_as_tensor(past[0])[2].to(torch.int32)
        presents = []
        for i, (qkv, out) in enumerate(zip(self.qkv, self.out)):
            q, k, v = qkv(x).chunk(3, dim=-1)
            a, pk, pv = GroupQueryAttentionFn.apply(q, k, v, past[2 * i], past[2 * i + 1], seqlens_k, total,
                                                    self.heads)
            x = x + out(a)
            presents += [pk, pv]
        return (x, *presents)


def main() -> int:
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    layers, heads, d, cap = 2, 4, 256, 32
    model = ToyDecoderAttention(d, heads, layers).eval()
    b = 3
    x = torch.randn(b, 1, d)
    positions = torch.tensor([[0], [5], [17]])
    past = []
    for _ in range(2 * layers):
        p = torch.zeros(b, heads, cap, d // heads)
        for r, n in enumerate(positions[:, 0].tolist()):
            p[r, :, :n] = torch.randn(heads, n, d // heads)
        past.append(p)
    past_names = [f"past_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]
    present_names = [f"present_{kind}_{i}" for i in range(layers) for kind in ("key", "value")]
    axes = {"x": {0: "batch"}, "positions": {0: "batch"}, "y": {0: "batch"}}
    axes.update({n: {0: "batch", 2: "capacity"} for n in past_names + present_names})
    path = out_dir / "toy_gqa.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x, positions, *past), str(path), dynamo=False, opset_version=17,
                          input_names=["x", "positions", *past_names], output_names=["y", *present_names],
                          dynamic_axes=axes, custom_opsets={"com.microsoft": 1}, do_constant_folding=True)
        eager = model(x, positions, *past)
    proto = onnx.load(str(path))
    ops = [(n.domain or "ai.onnx", n.op_type) for n in proto.graph.node]
    gqa = [n for n in proto.graph.node if n.op_type == "GroupQueryAttention"]
    print("exported", path, "opsets", [(o.domain or "ai.onnx", o.version) for o in proto.opset_import])
    print("ops:", sorted(set(ops)))
    print("GQA node:", gqa[0].domain, list(gqa[0].input), list(gqa[0].output),
          {a.name: onnx.helper.get_attribute_value(a) for a in gqa[0].attribute})
    print("graph outputs:", [(o.name, [dd.dim_param or dd.dim_value for dd in o.type.tensor_type.shape.dim])
                             for o in proto.graph.output])

    # Run in ORT: every layer's cache is a view of one (L*2, N, H, C, Dh) host array, bound in place.
    sess = session(proto)
    n_slots = 5
    big = np.zeros((2 * layers, n_slots, heads, cap, d // heads), np.float32)
    for j, p in enumerate(past):
        big[j, :b] = p.numpy()
    xs, pos = x.numpy(), positions.numpy()
    binding = sess.io_binding()
    binding.bind_output("y")
    bind_view(binding, "x", xs)
    bind_view(binding, "positions", pos)
    for j, (pn, qn) in enumerate(zip(past_names, present_names)):
        bind_view(binding, pn, big[j, :b])
        bind_view(binding, qn, big[j, :b], output=True)
    sess.run_with_iobinding(binding)
    y = binding.get_outputs()[0].numpy()
    y_err = float(np.abs(y - eager[0].numpy()).max())
    # the new entries come from ORT's projection, so compare within float tolerance
    cache_err = max(float(np.abs(big[j, :b] - eager[1 + j].numpy()).max()) for j in range(2 * layers))
    cache_ok = cache_err < 1e-5
    untouched = not big[:, b:].any()
    print(f"ORT vs eager: max |y| diff {y_err:.2e}; cache after the in-place run vs eager presents: "
          f"max diff {cache_err:.2e}; free slots untouched: {untouched}")
    ok = bool(gqa) and y_err < 1e-5 and cache_ok and untouched
    print("export check", "passed" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
