"""Question 2: cross-attention over a preallocated (N, H, S_cap, Dh) cross cache, bound by pointer.

    .venv/bin/python benchmarks/spike_gqa/cross_attention.py [--threads 1] [--skip-timing]

Correctness first (ragged source lengths, garbage or NaN past each row's
source), then per-call timing of one layer's cross-attention:

  mha_kpm2d   com.microsoft.MultiHeadAttention, BNSH key/value views of the cache
              (B, H, S_cap, Dh), key_padding_mask int32 (B, S_cap)
  mha_bias    the same with attention_bias float (B, 1, 1, S_cap)
  plain_cap   MatMul/Softmax/MatMul over the views, additive (B, 1, 1, S_cap) mask
  gqa_real    GroupQueryAttention over only each row's real source length: the row's
              last source key/value is re-written in place (see graphs.gqa_cross_graph)
  current     plain MatMul/Softmax graph over a contiguous (B, H, s_max, Dh) copy
              (s_max = longest source of the batch) that the engine re-gathers only
              when rows join, leave or move; the gather is timed separately
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from graphs import (bind_view, gqa_cross_graph, mha_cross_graph, plain_cross_graph,  # noqa: E402
                    reference_attention, session)
from timing import alternate, fmt  # noqa: E402

H, DH = 4, 64
D = H * DH
NEG = np.float32(-1e9)


def make_cross(n: int, cap: int, lens, rng, fill: str = "zeros"):
    k = np.zeros((n, H, cap, DH), np.float32)
    v = np.zeros_like(k)
    if fill == "garbage":
        k[:] = rng.standard_normal(k.shape) * 50
        v[:] = rng.standard_normal(v.shape) * 50
    elif fill == "nan":
        k[:] = np.nan
        v[:] = np.nan
    for i, s in enumerate(lens):
        k[i, :, :s] = rng.standard_normal((H, s, DH))
        v[i, :, :s] = rng.standard_normal((H, s, DH))
    return k, v


def masks(lens, cap):
    lens = np.asarray(lens)
    real = np.arange(cap)[None, :] < lens[:, None]  # (B, S)
    return {"kpm2d": real.astype(np.int32), "kpm1d": lens.astype(np.int32),
            "bias": np.where(real, 0.0, NEG).astype(np.float32)[:, None, None, :],
            "src_len": lens.astype(np.int32)}


class Runner:
    """One session per variant and the arrays it binds."""

    def __init__(self, threads: int):
        self.s = {"mha_kpm2d": session(mha_cross_graph(H, DH, "key_padding_2d"), threads),
                  "mha_kpm1d": session(mha_cross_graph(H, DH, "key_padding_1d"), threads),
                  "mha_bias": session(mha_cross_graph(H, DH, "bias"), threads),
                  "plain": session(plain_cross_graph(H, DH), threads),
                  "gqa_real": session(gqa_cross_graph(H, DH), threads)}

    def run(self, variant: str, q, ck, cv, m):
        """ck, cv: C-contiguous (B, H, S, Dh), bound by pointer. Returns output (B, 1, D)."""
        mask_of = {"mha_kpm2d": "kpm2d", "mha_kpm1d": "kpm1d", "mha_bias": "bias", "plain": "bias"}
        sess = self.s[variant]
        binding = sess.io_binding()
        binding.bind_output("output")
        bind_view(binding, "query", q)
        bind_view(binding, "cross_k", ck)
        bind_view(binding, "cross_v", cv)
        if variant == "gqa_real":
            bind_view(binding, "src_len", m["src_len"])
            bind_view(binding, "present_cross_k", ck, output=True)
            bind_view(binding, "present_cross_v", cv, output=True)
        else:
            bind_view(binding, "mask", m[mask_of[variant]])
        sess.run_with_iobinding(binding)
        return binding.get_outputs()[0].numpy()


def correctness(r: Runner) -> list[str]:
    failed = []
    rng = np.random.default_rng(0)
    n, cap, lens = 8, 64, [5, 12, 64, 1]
    b = len(lens)
    q = rng.standard_normal((b, 1, D)).astype(np.float32)
    for fill in ("zeros", "garbage", "nan"):
        ck, cv = make_cross(n, cap, lens, rng, fill)
        ref = reference_attention(q[:, 0].reshape(b, H, DH), ck[:b], cv[:b], lens)
        m = masks(lens, cap)
        for variant in r.s:
            before_k, before_v = ck.tobytes(), cv.tobytes()
            try:
                out = r.run(variant, q, ck[:b], cv[:b], m)
            except Exception as e:  # noqa: BLE001
                print(f"  {variant:10s} fill={fill:8s} error: {str(e).splitlines()[0][:150]}")
                failed.append(f"{variant}/{fill}")
                continue
            err = float(np.abs(out.reshape(b, H, DH) - ref).max())
            unchanged = ck.tobytes() == before_k and cv.tobytes() == before_v
            ok = err < 1e-5 and unchanged
            print(f"  {variant:10s} fill={fill:8s} max |out-ref| {err:9.2e}  cache unchanged {unchanged}"
                  + ("" if ok else "   <- not usable with this fill"))
            if not ok and fill != "nan":
                failed.append(f"{variant}/{fill}")
    return failed


def timing(r: Runner, threads: int, rounds: int, inner: int, batches, cap: int = 256, lo: int = 10,
           hi: int = 60) -> list[dict]:
    slots = 64
    out = []
    print(f"\ncross-attention, one layer, H={H} Dh={DH}, S_cap={cap}, source lengths {lo}..{hi}, "
          f"intra-op threads {threads}; median [p25-p75] per call, {rounds} alternating rounds of {inner}")
    for batch in batches:
        rng = np.random.default_rng(100 + batch)
        lens = rng.integers(lo, hi + 1, batch)
        s_max = int(lens.max())
        ck, cv = make_cross(slots, cap, lens, rng)
        q = rng.standard_normal((batch, 1, D)).astype(np.float32)
        m_cap = masks(lens, cap)
        m_real = masks(lens, s_max)
        gathered = {"k": np.empty(slots * H * cap * DH, np.float32), "v": np.empty(slots * H * cap * DH, np.float32)}

        def gather():
            res = []
            for kind, src in (("k", ck), ("v", cv)):
                part = src[:batch, :, :s_max]
                dst = gathered[kind][:part.size].reshape(part.shape)
                np.copyto(dst, part)
                res.append(dst)
            return res

        gk, gv = gather()
        variants = {name: (lambda name=name: r.run(name, q, ck[:batch], cv[:batch], m_cap))
                    for name in ("mha_kpm2d", "mha_bias", "plain", "gqa_real")}
        variants["current"] = lambda: r.run("plain", q, gk, gv, m_real)
        variants["current_gather"] = gather
        ref = r.run("plain", q, gk, gv, m_real)
        diffs = {n: float(np.abs(variants[n]() - ref).max()) for n in ("mha_kpm2d", "mha_bias", "plain", "gqa_real")}
        stats = alternate(variants, rounds=rounds, inner=inner)
        print(f"B={batch:>3} s_max={s_max:>3} mean src {lens.mean():5.1f}  (max diff vs current "
              f"{max(diffs.values()):.1e})")
        for name, st in stats.items():
            print(f"    {name:15s} {fmt(st)}")
        out.append({"batch": batch, "s_max": s_max, "src_lens": lens.tolist(), "max_diff": diffs, "stats": stats})
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-timing", action="store_true")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--inner", type=int, default=10)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    r = Runner(args.threads)
    print("correctness, source lengths [5, 12, 64, 1], S_cap 64, positions past each source filled with:")
    failed = correctness(r)
    print("FAILED: " + ", ".join(failed) if failed else "all variants correct with finite fill")
    if not args.skip_timing:
        res = timing(r, args.threads, args.rounds, args.inner, [int(x) for x in args.batches.split(",")])
        if args.json:
            Path(args.json).write_text(json.dumps({"args": vars(args), "results": res}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
