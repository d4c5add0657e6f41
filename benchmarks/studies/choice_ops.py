"""Greedy token choice where the logits are (a small second graph on the session's provider) vs on the
host (the logits handed over, numpy's argmax), per decode step.

    python -m benchmarks.studies.choice_ops [--rows 64,256] [--vocab 8000,58101,256206] [--provider cpu|cuda]

The decode-step issue asks that only token ids leave the device. This measures the choice alone, for
the shipped model's vocabulary (8,000), OPUS-MT's (58,101) and NLLB's (256,206): the host path
reads (B, V) float32 logits (on CUDA: copies them to the host first) and takes numpy's argmax, plus
the chosen token's log-probability for scored rows (a log-sum-exp over the row); the graph path
runs ONNX Runtime's ArgMax (and ReduceLogSumExp with the chosen logit for scores) where the logits
already are and hands back B ids (and B log-probabilities). Both are checked against each other
first, then timed (median of 5 runs of 100 calls, one intra-op thread on CPU).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from benchmarks.studies.attention_ops import make_session


def choice_graph(scored: bool):
    """logits (B, V) -> token (B, 1) int64 [, logprob (B, 1): logit of the token - logsumexp of the row]."""
    nodes = [helper.make_node("ArgMax", ["logits"], ["token"], axis=1, keepdims=1)]
    outputs = [helper.make_tensor_value_info("token", TensorProto.INT64, ["B", 1])]
    inits = []
    if scored:
        inits.append(numpy_helper.from_array(np.array([1], np.int64), "axis"))
        nodes += [helper.make_node("ReduceMax", ["logits", "axis"], ["best"], keepdims=1),
                  helper.make_node("ReduceLogSumExp", ["logits", "axis"], ["lse"], keepdims=1),
                  helper.make_node("Sub", ["best", "lse"], ["logprob"])]
        outputs.append(helper.make_tensor_value_info("logprob", TensorProto.FLOAT, ["B", 1]))
    return helper.make_graph(nodes, "choose", [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["B", "V"])],
                             outputs, initializer=inits)


def host_choice(logits: np.ndarray, scored: bool):
    token = logits.argmax(axis=1)
    if not scored:
        return token, None
    best = logits[np.arange(len(token)), token]
    top = logits.max(axis=1, keepdims=True)
    return token, best - (top[:, 0] + np.log(np.exp(logits - top).sum(axis=1)))


def _median_us(call, n: int = 100) -> float:
    call()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        runs.append((time.perf_counter() - t0) / n)
    return 1e6 * statistics.median(runs)


def measure(rows: int, vocab: int, scored: bool, provider: str, rng) -> dict:
    logits = (rng.standard_normal((rows, vocab)) * 4).astype(np.float32)
    device = "cuda" if provider == "cuda" else "cpu"
    on_device = ort.OrtValue.ortvalue_from_numpy(logits, device, 0)  # where the decoder's step leaves them
    session = make_session(choice_graph(scored), {"": 18}, provider)
    binding = session.io_binding()
    binding.bind_ortvalue_input("logits", on_device)
    token = np.zeros((rows, 1), np.int64)
    binding.bind_output("token", "cpu", 0, np.int64, [rows, 1], token.ctypes.data)
    logprob = np.zeros((rows, 1), np.float32)
    if scored:
        binding.bind_output("logprob", "cpu", 0, np.float32, [rows, 1], logprob.ctypes.data)

    def on_host():
        return host_choice(on_device.numpy() if provider == "cuda" else logits, scored)

    session.run_with_iobinding(binding)
    want_token, want_logprob = on_host()
    assert (token[:, 0] == want_token).all(), "ArgMax and numpy chose different tokens"
    err = float(np.abs(logprob[:, 0] - want_logprob).max()) if scored else 0.0
    return {"rows": rows, "vocab": vocab, "scored": scored, "host_us": _median_us(on_host),
            "graph_us": _median_us(lambda: session.run_with_iobinding(binding)),
            "host_bytes": rows * vocab * 4, "graph_bytes": rows * (8 + (4 if scored else 0)), "logprob_err": err}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=lambda s: [int(x) for x in s.split(",")], default=[64, 256])
    p.add_argument("--vocab", type=lambda s: [int(x) for x in s.split(",")], default=[8000, 58101, 256206])
    p.add_argument("--provider", choices=["cpu", "cuda"], default="cpu")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"`python -m benchmarks.studies.choice_ops {' '.join(argv if argv is not None else sys.argv[1:])}` — "
          f"ONNX Runtime {ort.__version__}, numpy {np.__version__}, {args.provider}\n")
    print("| rows | vocabulary | scores | host: logits out + numpy µs | graph: ArgMax on the provider µs | "
          "graph / host | bytes to the host per row (host / graph) | log-prob max error |\n"
          "|---|---|---|---|---|---|---|---|")
    for vocab in args.vocab:
        for rows in args.rows:
            for scored in (False, True):
                r = measure(rows, vocab, scored, args.provider, rng)
                print(f"| {rows} | {vocab:,} | {'yes' if scored else 'no'} | {r['host_us']:.0f} | {r['graph_us']:.0f} | "
                      f"{r['graph_us'] / r['host_us']:.2f} | {r['host_bytes'] // rows:,} / {r['graph_bytes'] // rows} | "
                      f"{r['logprob_err']:.1e} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
