"""The in-place decode step replayed as a CUDA graph against the same step launched node by node.

    python -m benchmarks.studies.cuda_graph_step [--variants fp32,fp16] [--rows 1,8,32,128,256]

Measured problem (docs/benchmarks/gpu/README.md, an H200): the served device path did 11,260 tokens/s
in-process where ONNX Runtime alone reached 48,691 at batch 256, and at batch 1 a step took 1.5 ms for
a model whose arithmetic is a few microseconds: the step is launch-bound, ~130 kernels each waited for
by the host. ONNX Runtime can capture a session's kernels once and replay them as one CUDA graph
(provider option enable_cuda_graph) when every node runs on the device and every bound input and output
keeps its address and shape. The slot cache's buffers already keep theirs (fixed capacity, bound by
pointer); the per-step inputs live in one device array at a fixed address, refreshed by one copy before
each replay: the engine's bucketed step (models/core/inplace_step.py), which this study runs.

Per variant and number of rows (one captured graph per row count: shapes are part of the capture, so a
server would keep one per batch bucket), this prints the step's median wall time both ways at the static
shape (slots = rows, 33 positions, 16 source positions) and the server's (256 slots, 257 positions, 256
source positions), and checks the replay's greedy tokens against the ordinary step's over the same
steps from the same cache (the replay must be the same computation). A cell that fails says why
(ONNX Runtime refuses capture when a node is left on the CPU) and the study goes on.
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

from benchmarks.studies.inplace_device import SOURCE_LEN, STEPS, filled_cache
from models.core.bundle import load_bundle, newest_version
from models.core.device_arrays import settle, to_host
from models.core.inplace_step import InPlaceStep
from models.core.kv_cache import SlotCache
from models.core.runtime import OnnxModel, RuntimeOptions, session_options

ROOT = Path(__file__).resolve().parents[2]
WARMUP = 4  # ONNX Runtime runs the graph's kernels plainly before it captures


def timed(runner, cache: SlotCache) -> tuple[float, list[np.ndarray]]:
    """Median ms per step over STEPS steps after WARMUP, each row fed its own greedy token; the tokens chosen."""
    times, chosen = [], []
    for step in range(WARMUP + STEPS):
        t0 = time.perf_counter()
        logits = runner.run()
        settle(logits)
        times.append(time.perf_counter() - t0)
        tokens = to_host(logits.argmax(axis=-1))
        chosen.append(tokens)
        for row, token in zip(cache.rows, tokens):
            row.token = int(token)
    return 1000 * statistics.median(times[WARMUP:]), chosen


def cell(model: OnnxModel, graph_path: str, rows: int, slots: int, max_target: int, max_source: int) -> str:
    """'plain ms | graph ms | tokens equal' for one shape."""
    plain_ms, plain_tokens = timed(InPlaceStep(model.inplace, cache := filled_cache(
        model, rows, slots, max_target, max_source), model.spec.out_vocab_size), cache)
    try:
        # On the CPU (--provider cpu): the same bucketed step without graphs, the plumbing checked anywhere.
        providers = [("CUDAExecutionProvider", {"device_id": str(model.opts.device_id), "enable_cuda_graph": "1"}),
                     "CPUExecutionProvider"] if model.on_device else ["CPUExecutionProvider"]
        # the engine's sessions share one thread pool (models/core/runtime.py): a session beside them must too
        session = ort.InferenceSession(graph_path, session_options(model.opts, shared=True), providers=providers)
        if model.on_device and session.get_providers()[0] != "CUDAExecutionProvider":
            raise RuntimeError("ONNX Runtime fell back to the CPU provider (its error is printed above)")
        cache = filled_cache(model, rows, slots, max_target, max_source)
        # the engine's own bucketed step (models/core/inplace_step.py): rows is a bucket size here
        graph_ms, graph_tokens = timed(InPlaceStep(session, cache, model.spec.out_vocab_size, bucketed=True), cache)
    except Exception as e:  # noqa: BLE001 (a refused capture is this study's answer, not its end)
        return f"{plain_ms:.3f} | failed: {str(e).splitlines()[0][:160]} | -"
    same = sum(bool(np.array_equal(a, b)) for a, b in zip(plain_tokens, graph_tokens))
    return f"{plain_ms:.3f} | {graph_ms:.3f} ({plain_ms / graph_ms:.2f}x) | {same}/{len(plain_tokens)} steps"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repository", default=str(ROOT / "model_repository"),
                   help="model repository holding the model (the GPU suite's has an fp16 variant added)")
    p.add_argument("--model", default="multi30k-en-de-small")
    p.add_argument("--variants", default="fp32,fp16", help="variants of the bundle to time (those it has)")
    p.add_argument("--rows", default="1,8,32,128,256", help="running rows per step")
    p.add_argument("--server-shape", default="256,257,256", help="slots,target positions,source positions")
    p.add_argument("--provider", default="cuda", choices=["cuda", "cpu"],
                   help="cpu: no graphs, the bucketed step's plumbing and tokens only")
    args = p.parse_args(argv)
    bundle = load_bundle(newest_version(Path(args.repository) / args.model))
    slots, positions, sources = (int(x) for x in args.server_shape.split(","))
    print(f"in-place step, CUDA graph replay vs launched node by node; {bundle.name} v{bundle.version}; "
          f"ms per step, median of {STEPS}; greedy tokens of the replay vs the ordinary step", flush=True)
    print(f"| variant | rows | static shape: plain | graph | same tokens | server shape ({slots} slots, {positions} "
          f"positions, {sources} source): plain | graph | same tokens |")
    print("|---|---|---|---|---|---|---|---|")
    for variant in args.variants.split(","):
        if variant not in bundle.variants:
            print(f"| {variant} | - | not in the bundle |")
            continue
        model = OnnxModel(bundle, RuntimeOptions(variant=variant, provider=args.provider, decoder="auto"))
        if model.inplace is None:
            print(f"| {variant} | - | no in-place step on the device here (CuPy missing?) |")
            continue
        path = model.inplace._model_path  # the graph the engine runs for this variant on this provider
        for rows in (int(r) for r in args.rows.split(",")):
            static = cell(model, path, rows, rows, 33, SOURCE_LEN)
            server = cell(model, path, rows, max(slots, rows), positions, sources)
            print(f"| {variant} | {rows} | {static} | {server} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
