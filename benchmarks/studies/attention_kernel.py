"""Would a hand-written attention kernel read the slot cache's gapped rows faster than GroupQueryAttention?

    python -m benchmarks.studies.attention_kernel [--rows 64] [--lengths 16] [--capacity 16,256] [--ahead 0,2,8]

Measured problem (docs/serving_speed.md): the in-place step's cross-attention reads each row's source keys
and values as one block per row and head inside a buffer of `--max-source-tokens` positions; when the
blocks fill the buffer (capacity = length) the four cross-attention nodes took ~250 µs at 64 rows, with
a gap of 4 positions or more after each block 600-800 µs, and inside a step, where the rest of the step
has pushed the cache out, each row's block is read cold. ONNX Runtime's CPU provider has no attention
kernel that takes per-row offsets or prefetches the next block; a native one would. Before building
one into the graphs (a custom operator), this asks what it could gain: one attention node's work
(one query per row and head over its `--lengths` real entries) done by ONNX Runtime's
GroupQueryAttention (benchmarks/studies/attention_ops.py's graph, IO-bound buffers) and by a plain C
loop compiled here (`cc -O3 -march=native -ffast-math`, through ctypes) that prefetches the blocks
`--ahead` row-heads ahead (0: none), on the same buffers, with 16 MB read between calls as the step's
other traffic would. Both are checked against a float64 reference first. Needs a C compiler (`cc`);
the server never uses this code.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto

from benchmarks.studies.attention_ops import HEADS, HEAD_DIM, bound_gqa

KERNEL = r"""
#include <math.h>
#include <stddef.h>

/* q (R, H, D); k, v (R, H, C, D); len (R,); out (R, H, D). One query per row and head over its first
   len[r] entries; the blocks `ahead` row-heads further on are prefetched first. */
void attend(const float *q, const float *k, const float *v, const int *len, float *out,
            int rows, int heads, int cap, int dim, int ahead) {
    const float scale = 1.0f / sqrtf((float)dim);
    float scores[4096];
    int blocks = rows * heads;
    for (int b = 0; b < blocks; b++) {
        if (ahead > 0 && b + ahead < blocks) {
            int nb = b + ahead;
            const char *nk = (const char *)(k + (size_t)nb * cap * dim);
            const char *nv = (const char *)(v + (size_t)nb * cap * dim);
            size_t bytes = (size_t)len[nb / heads] * dim * sizeof(float);
            for (size_t o = 0; o < bytes; o += 64) {
                __builtin_prefetch(nk + o, 0, 3);
                __builtin_prefetch(nv + o, 0, 3);
            }
        }
        int n = len[b / heads];
        const float *kb = k + (size_t)b * cap * dim, *vb = v + (size_t)b * cap * dim, *qb = q + (size_t)b * dim;
        float top = -INFINITY, sum = 0.0f;
        for (int t = 0; t < n; t++) {
            float s = 0.0f;
            for (int d = 0; d < dim; d++) s += qb[d] * kb[(size_t)t * dim + d];
            scores[t] = s * scale;
            if (scores[t] > top) top = scores[t];
        }
        for (int t = 0; t < n; t++) { scores[t] = expf(scores[t] - top); sum += scores[t]; }
        float *ob = out + (size_t)b * dim;
        for (int d = 0; d < dim; d++) ob[d] = 0.0f;
        for (int t = 0; t < n; t++) {
            float p = scores[t] / sum;
            for (int d = 0; d < dim; d++) ob[d] += p * vb[(size_t)t * dim + d];
        }
    }
}
"""


def build(tmp: Path):
    """The kernel compiled for this CPU, as a ctypes function."""
    src, lib = tmp / "attend.c", tmp / "attend.so"
    src.write_text(KERNEL)
    subprocess.run(["cc", "-O3", "-march=native", "-ffast-math", "-shared", "-fPIC", str(src), "-o", str(lib), "-lm"],
                   check=True)
    fn = ctypes.CDLL(str(lib)).attend
    fn.restype = None
    fn.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 5
    return fn


def timed_cold(call, junk: np.ndarray, calls: int = 300) -> float:
    """Median µs of `call`, with `junk` read before each (the rest of a step's traffic)."""
    times = []
    for _ in range(calls):
        junk.sum()
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def measure(rows: int, span: tuple[int, int], cap: int, aheads: list[int], attend, junk: np.ndarray, rng) -> dict:
    lengths = rng.integers(span[0], span[1] + 1, rows).astype(np.int32)
    q = rng.standard_normal((rows, HEADS, HEAD_DIM)).astype(np.float32)
    k = rng.standard_normal((rows, HEADS, cap, HEAD_DIM)).astype(np.float32)
    v = rng.standard_normal((rows, HEADS, cap, HEAD_DIM)).astype(np.float32)
    ref = np.zeros((rows, HEADS, HEAD_DIM))
    for r, n in enumerate(lengths):
        s = np.einsum("hd,htd->ht", q[r].astype(np.float64), k[r, :, :n].astype(np.float64)) / np.sqrt(HEAD_DIM)
        w = np.exp(s - s.max(-1, keepdims=True))
        ref[r] = np.einsum("ht,htd->hd", w / w.sum(-1, keepdims=True), v[r, :, :n].astype(np.float64))

    # GroupQueryAttention as the step calls it: the row's last real entry as the "new" one, rewritten in place
    g, binding = bound_gqa(q[:, :, None], k, v, lengths, TensorProto.FLOAT, "cpu")
    g.run_with_iobinding(binding)
    err = {"gqa": float(np.abs(binding.get_outputs()[0].numpy().reshape(rows, HEADS, HEAD_DIM) - ref).max())}
    out = {"gqa": timed_cold(lambda: g.run_with_iobinding(binding), junk)}

    y = np.zeros((rows, HEADS, HEAD_DIM), np.float32)
    for ahead in aheads:
        def call(ahead=ahead):
            attend(q.ctypes.data, k.ctypes.data, v.ctypes.data, lengths.ctypes.data, y.ctypes.data,
                   rows, HEADS, cap, HEAD_DIM, ahead)
        call()
        err[f"c{ahead}"] = float(np.abs(y - ref).max())
        out[f"c{ahead}"] = timed_cold(call, junk)
    wrong = {name: e for name, e in err.items() if e > 1e-4}
    if wrong:  # a fast wrong answer answers nothing
        raise SystemExit(f"attention differs from the float64 reference: {wrong}")
    return {"us": out, "err": err}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--lengths", default="16", help="real entries per row, N or A-B (each row's drawn in A..B): "
                   "16 as the shipped model's sources; 1-40 as the self-attention's rows of mixed ages")
    p.add_argument("--capacity", type=lambda s: [int(x) for x in s.split(",")], default=[16, 256],
                   help="buffer positions per row and head (16: no gaps; 256: the server's default)")
    p.add_argument("--ahead", type=lambda s: [int(x) for x in s.split(",")], default=[0, 2, 8],
                   help="the C loop's prefetch distance in row-heads (0: none)")
    args = p.parse_args(argv)
    lo, _, hi = args.lengths.partition("-")
    span = (int(lo), int(hi or lo))
    if max(args.capacity) < span[1] or span[1] > 4096:  # the C loop keeps a row's scores on its stack: 4096
        p.error(f"--capacity must hold {span[1]} entries, and the loop takes at most 4096")
    rng = np.random.default_rng(0)
    junk = rng.standard_normal(4 << 20).astype(np.float32)  # 16 MB
    with tempfile.TemporaryDirectory() as tmp:
        attend = build(Path(tmp))
        print(f"`python -m benchmarks.studies.attention_kernel {' '.join(argv if argv is not None else sys.argv[1:])}` "
              f"— ONNX Runtime {ort.__version__}, one thread; µs per cross-attention node, median of 300 calls, "
              "16 MB read before each\n")
        heads = " | ".join(f"C loop, prefetch {a} ahead" if a else "C loop, no prefetch" for a in args.ahead)
        print(f"| rows | real entries | capacity | GroupQueryAttention | {heads} | max error vs float64 |")
        print("|---|---|---|---|" + "---|" * len(args.ahead) + "---|")
        for cap in args.capacity:
            if cap < span[1]:
                continue
            r = measure(args.rows, span, cap, args.ahead, attend, junk, rng)
            cells = " | ".join(f"{r['us'][f'c{a}']:.0f}" for a in args.ahead)
            print(f"| {args.rows} | {args.lengths} | {cap} | {r['us']['gqa']:.0f} | {cells} | "
                  f"{max(r['err'].values()):.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
