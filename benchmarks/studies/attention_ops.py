"""Cross-attention over a preallocated buffer: GroupQueryAttention (what the in-place step uses) vs the
opset-24 `Attention` with per-row valid lengths (the standard-op candidate), on this machine's provider.

    python -m benchmarks.studies.attention_ops [--rows 64] [--capacity 64,256] [--provider cpu|cuda] [--dtype fp32|fp16]

docs/design/inplace-cache.md leaves one question open before the standard ops can replace the
contrib op: does `Attention` with `nonpad_kv_seqlen` cost what the valid lengths cost, or what the
buffer costs? Each op attends one query per row over a (rows, heads, capacity, head_dim) key/value
buffer in which row r holds 8-24 real entries (the shipped model's source lengths), the way the
in-place step's cross-attention does: GroupQueryAttention with `seqlens_k` = length - 1 and the
row's last real key/value as its "new" entry (rewritten in place, IO binding), `Attention` with
`nonpad_kv_seqlen` = length. Both are checked against a float64 reference of the real entries
first, then timed (median of 5 runs of 200 calls, one intra-op thread). The shipped model's shape: 4
heads of 32.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

HEADS, HEAD_DIM = 4, 32


def make_session(graph, opsets: dict, provider: str) -> ort.InferenceSession:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    model.ir_version = 10
    providers = ["CUDAExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # one core: steadier than two threads sharing the machine's two
    try:
        return ort.InferenceSession(model.SerializeToString(), options, providers=providers)
    except Exception as e:  # noqa: BLE001 (this process made ONNX Runtime's global pool first: use it)
        if "global thread pool" not in str(e):
            raise
        options = ort.SessionOptions()
        options.use_per_session_threads = False
        return ort.InferenceSession(model.SerializeToString(), options, providers=providers)


def gqa(rows: int, cap: int, elem: int, provider: str) -> ort.InferenceSession:
    h, d = HEADS, HEAD_DIM
    io = [("q", elem, [rows, 1, h * d]), ("k", elem, [rows, 1, h * d]), ("v", elem, [rows, 1, h * d]),
          ("pk", elem, [rows, h, cap, d]), ("pv", elem, [rows, h, cap, d]), ("sl", TensorProto.INT32, [rows]),
          ("tot", TensorProto.INT32, [])]
    node = helper.make_node("GroupQueryAttention", [n for n, _, _ in io], ["y", "pko", "pvo"], domain="com.microsoft",
                            num_heads=h, kv_num_heads=h)
    graph = helper.make_graph([node], "gqa", [helper.make_tensor_value_info(*x) for x in io],
                              [helper.make_tensor_value_info(n, elem, None) for n in ("y", "pko", "pvo")])
    return make_session(graph, {"": 21, "com.microsoft": 1}, provider)


def attention(rows: int, cap: int, elem: int, provider: str) -> ort.InferenceSession:
    h, d = HEADS, HEAD_DIM
    io = [("Q", elem, [rows, h, 1, d]), ("K", elem, [rows, h, cap, d]), ("V", elem, [rows, h, cap, d]),
          ("nonpad", TensorProto.INT64, [rows])]
    node = helper.make_node("Attention", ["Q", "K", "V", "", "", "", "nonpad"], ["Y"])
    graph = helper.make_graph([node], "attention", [helper.make_tensor_value_info(*x) for x in io],
                              [helper.make_tensor_value_info("Y", elem, None)])
    return make_session(graph, {"": 24}, provider)


def bound_gqa(q, k, v, lengths, elem: int, provider: str) -> tuple[ort.InferenceSession, ort.IOBinding]:
    """GroupQueryAttention as the in-place step calls it, bound: q (R, H, 1, D) over k, v (R, H, C, D) of
    which row r holds lengths[r] real entries, the last of them given as the "new" one and rewritten in
    place (the buffers are bound as input and output). Its first output, y, is (R, 1, H * D)."""
    rows, cap = k.shape[0], k.shape[2]
    device = ("cuda", 0) if provider == "cuda" else ("cpu", 0)
    flat = lambda x: np.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(rows, 1, HEADS * HEAD_DIM))  # noqa: E731
    on = lambda x: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x), *device)  # noqa: E731
    last = lengths - 1
    g = gqa(rows, cap, elem, provider)
    bg = g.io_binding()
    kv = {"pk": on(k), "pv": on(v)}
    for name, x in (("q", flat(q)), ("k", flat(k[np.arange(rows), :, last][:, :, None])),
                    ("v", flat(v[np.arange(rows), :, last][:, :, None])), ("sl", last.astype(np.int32)),
                    ("tot", np.array(cap, np.int32))):
        bg.bind_ortvalue_input(name, on(x))
    bg.bind_output("y", device[0])  # first: get_outputs() follows the binding order
    for name, value in kv.items():  # the buffer is both input and output: the op rewrites it in place
        bg.bind_ortvalue_input(name, value)
        bg.bind_ortvalue_output(name + "o", value)
    return g, bg


def measure(rows: int, cap: int, dtype: str, provider: str, rng) -> dict:
    np_t, elem = (np.float16, TensorProto.FLOAT16) if dtype == "fp16" else (np.float32, TensorProto.FLOAT)
    device = ("cuda", 0) if provider == "cuda" else ("cpu", 0)
    lengths = rng.integers(8, 25, rows)
    q = rng.standard_normal((rows, HEADS, 1, HEAD_DIM)).astype(np_t)
    k = rng.standard_normal((rows, HEADS, cap, HEAD_DIM)).astype(np_t)
    v = rng.standard_normal((rows, HEADS, cap, HEAD_DIM)).astype(np_t)
    ref = np.zeros((rows, HEADS, 1, HEAD_DIM))
    for r, n in enumerate(lengths):
        s = q[r].astype(np.float64) @ k[r, :, :n].astype(np.float64).transpose(0, 2, 1) / np.sqrt(HEAD_DIM)
        p = np.exp(s - s.max(-1, keepdims=True))
        ref[r] = (p / p.sum(-1, keepdims=True)) @ v[r, :, :n].astype(np.float64)
    on = lambda x: ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(x), *device)  # noqa: E731

    g, bg = bound_gqa(q, k, v, lengths, elem, provider)
    a = attention(rows, cap, elem, provider)
    ba = a.io_binding()
    for name, x in (("Q", q), ("K", k), ("V", v), ("nonpad", lengths.astype(np.int64))):
        ba.bind_ortvalue_input(name, on(x))
    ba.bind_output("Y", device[0])

    g.run_with_iobinding(bg)
    a.run_with_iobinding(ba)
    got_g = bg.get_outputs()[0].numpy().reshape(rows, 1, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
    got_a = ba.get_outputs()[0].numpy()
    out = {"rows": rows, "capacity": cap, "gqa_err": float(np.abs(got_g - ref).max()),
           "attention_err": float(np.abs(got_a - ref).max())}
    for label, (session, binding) in (("gqa", (g, bg)), ("attention", (a, ba))):
        runs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(200):
                session.run_with_iobinding(binding)
            runs.append((time.perf_counter() - t0) / 200)
        out[f"{label}_us"] = 1e6 * statistics.median(runs)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--capacity", type=lambda s: [int(x) for x in s.split(",")], default=[64, 256],
                   help="buffer positions per row (the real entries are 8-24)")
    p.add_argument("--provider", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32",
                   help="fp16 for CUDA, whose GroupQueryAttention kernel takes no fp32")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"`python -m benchmarks.studies.attention_ops {' '.join(argv if argv is not None else sys.argv[1:])}` — "
          f"ONNX Runtime {ort.__version__}, {args.provider}, {args.dtype}\n")
    print("| rows | capacity | GroupQueryAttention µs | Attention (nonpad_kv_seqlen) µs | max error vs float64 "
          "(GQA / Attention) |\n|---|---|---|---|---|")
    for cap in args.capacity:
        r = measure(args.rows, cap, args.dtype, args.provider, rng)
        print(f"| {r['rows']} | {r['capacity']} | {r['gqa_us']:.0f} | {r['attention_us']:.0f} | "
              f"{r['gqa_err']:.1e} / {r['attention_err']:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
