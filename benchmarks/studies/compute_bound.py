"""How close the engine's ONNX Runtime passes come to this CPU's own fp32 GEMM rate.

    python -m benchmarks.studies.compute_bound [--bundle model_repository/multi30k-en-de-small/4]
        [--rows 1,8,32,64] [--sources 8] [--source-len 16] [--threads 1]

Question (issue 35): the fp32 targets against CTranslate2 ask for an engine a quarter faster than today's
on unary batches and at 64 streams, where the engine's ONNX Runtime passes are most of the server's CPU.
Is that much left to take on this machine, and in which pass? Each pass's multiply-adds are counted from
the bundle's config (every product, and attention over the rows' positions), its time is measured alone
(the encoder over `--sources` sources of `--source-len` tokens; the in-place step at the server's cache
shape, benchmarks/studies/inplace_device.py's step_ms, whose rows have 16-token sources), and the rate
is set against what this CPU reaches on a plain fp32 product of the model's own widest shape: ONNX
Runtime's MatMul of the vocabulary projection (rows x d_model times d_model x vocabulary) at 256 rows,
with the same threads (tests/integration/test_compute_bound.py checks the count). A pass near that
rate gets faster only with fewer or cheaper multiply-adds (int8 where the CPU's int8 pays); the distance
below it is what a better kernel (attention, the small products, the nodes between them) could take.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from benchmarks.harness import machine_line
from benchmarks.studies.attention_ops import make_session
from benchmarks.studies.inplace_device import SOURCE_LEN, STEPS, step_ms
from models.core.bundle import load_bundle, newest_version
from models.core.runtime import OnnxModel, RuntimeOptions

ROOT = Path(__file__).resolve().parents[2]


def encoder_macs(cfg: dict, source_len: int) -> float:
    """Multiply-adds per source token of one encoder pass: the encoder layers' products and attention over the
    source, and every decoder layer's cross keys and values (computed once, in the encoder graph)."""
    d, f = cfg["d_model"], cfg["d_ff"]
    layer = 4 * d * d + 2 * d * f + 2 * source_len * d  # q|k|v and out, the feed-forward pair, scores and mix
    return cfg["n_enc_layers"] * layer + cfg["n_dec_layers"] * 2 * d * d


def step_macs(cfg: dict, positions: float, source_len: int) -> float:
    """Multiply-adds per row of one decode step: per layer self-attention's q|k|v and out, cross-attention's
    q and out, the feed-forward pair, attention over `positions` past entries and `source_len` source
    entries; then the vocabulary projection."""
    d, f = cfg["d_model"], cfg["d_ff"]
    vocab = cfg.get("tgt_vocab_size") or cfg["vocab_size"]
    layer = 4 * d * d + 2 * d * d + 2 * d * f + 2 * (positions + source_len) * d
    return cfg["n_dec_layers"] * layer + d * vocab


def timed(fn, runs: int) -> float:
    """Median seconds of `runs` calls after two warm-up calls."""
    for _ in range(2):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gemm_seconds(rows: int, d: int, vocab: int) -> float:
    """Median seconds of ONNX Runtime's fp32 MatMul (rows, d) x (d, vocab), the weights an initializer, alone."""
    w = np.random.default_rng(0).standard_normal((d, vocab)).astype(np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "gemm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, d])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, vocab])],
                              [numpy_helper.from_array(w, "w")])
    session = make_session(graph, {"": 17}, "cpu")  # on the shared pool of `threads` the engine's OnnxModel made
    x = np.random.default_rng(1).standard_normal((rows, d)).astype(np.float32)
    return timed(lambda: session.run(None, {"x": x}), 50)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", default=str(newest_version(ROOT / "model_repository" / "multi30k-en-de-small")))
    p.add_argument("--rows", default="1,8,32,64", help="running rows per decode step")
    p.add_argument("--sources", type=int, default=8, help="sources per encoder pass")
    p.add_argument("--source-len", type=int, default=16, help="tokens per source of the encoder pass (the step's rows have 16: step_ms's)")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    args = p.parse_args(argv)
    bundle = load_bundle(Path(args.bundle))
    cfg = bundle.config["model"]
    d, vocab = cfg["d_model"], cfg.get("tgt_vocab_size") or cfg["vocab_size"]
    model = OnnxModel(bundle, RuntimeOptions(variant="fp32", provider="cpu", decoder="auto",
                                             intra_op_threads=args.threads))
    peak = 2 * 256 * d * vocab / gemm_seconds(256, d, vocab) / 1e9
    print(f"{bundle.name} v{bundle.version}, fp32, {args.threads} intra-op thread(s); {machine_line()}")
    print(f"this CPU's fp32 GEMM rate (ONNX Runtime MatMul, 256 x {d} x {vocab}): {peak:.1f} GFLOPS\n")
    print("| pass | shape | ms | MFLOP | GFLOPS | of the GEMM rate |")
    print("|---|---|---|---|---|---|")

    def row(name: str, shape: str, seconds: float, macs: float) -> None:
        gflops = 2 * macs / seconds / 1e9
        print(f"| {name} | {shape} | {1000 * seconds:.3f} | {2 * macs / 1e6:.1f} | {gflops:.1f} | {gflops / peak:.0%} |",
              flush=True)

    b, s = args.sources, args.source_len
    src = np.random.default_rng(2).integers(4, cfg["vocab_size"], (b, s)).astype(np.int64)
    mask = np.ones_like(src, dtype=bool)
    row("encoder pass", f"{b} sources x {s} tokens", timed(lambda: model.encode(src, mask), 40),
        b * s * encoder_macs(cfg, s))
    for rows in (int(r) for r in args.rows.split(",")):
        row("vocabulary projection alone", f"{rows} rows", gemm_seconds(rows, d, vocab),
            rows * d * vocab)
        # step_ms's rows have SOURCE_LEN-token sources, start at position 0 and take 4 + STEPS steps, the last
        # STEPS timed: those average this many past positions
        positions = 4 + STEPS / 2
        row("decode step (server cache shape)", f"{rows} rows, ~{positions:.0f} positions, {SOURCE_LEN} source",
            step_ms(model, rows, max(256, rows), 257, 256) / 1000, rows * step_macs(cfg, positions, SOURCE_LEN))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
