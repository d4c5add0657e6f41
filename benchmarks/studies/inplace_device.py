"""The in-place decode step alone, at the static benchmark's cache shape and at the server's, per variant.

    python -m benchmarks.studies.inplace_device [--provider cuda|cpu] [--variants fp32,fp16] [--rows 32,256]

Measured problem (docs/benchmarks/gpu/README.md, an H200): served in fp16 on the device, the in-place
step (decoder_inplace.fp16.onnx, GroupQueryAttention over an fp16 slot cache in device memory) stayed at
~2,400 tokens/s from 32 to 256 streams with 89% of the time inside ONNX Runtime, while the same graph in
the static benchmark (a cache sized to the batch and to 33 positions) did 12,205 at batch 32, and fp32's
standard-op step served 11,260. What differs is the cache's shape: the server's holds 256 slots of 257
target and 256 source positions (the server's --max-source-tokens default), the static benchmark's a
batch of 33 and the batch's longest source. This study times InPlaceStep.run alone for each variant at
both shapes, so one GPU call says whether the slow step follows the capacity, the slots or the variant,
and as the server runs it (rows of different ages, a row count that changes every step: the
first H200 run of this study found the step alone fast at every shape), and lists the nodes ONNX Runtime
did not place on the provider (a node on the CPU in a device graph moves its inputs across the bus
every step), from the session's own verbose log.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from models.core.bundle import load_bundle, newest_version
from models.core.device_arrays import as_device_array, settle
from models.core.inplace_step import InPlaceStep
from models.core.kv_cache import SlotCache
from models.core.runtime import OnnxModel, RuntimeOptions

ROOT = Path(__file__).resolve().parents[2]
SOURCE_LEN = 16
STEPS = 24


def filled_cache(model: OnnxModel, rows: int, slots: int, max_target: int, max_source: int = SOURCE_LEN) -> SlotCache:
    """A slot cache with `rows` rows of random SOURCE_LEN-token sources (seeded: every call gives the same rows)."""
    spec = model.spec
    src = np.random.default_rng(0).integers(4, spec.vocab_size, (rows, SOURCE_LEN)).astype(np.int64)
    mask = np.ones_like(src, dtype=bool)
    _, cross_k, cross_v = model.encode(src, mask)
    cross_k, cross_v = as_device_array(cross_k), as_device_array(cross_v)
    cache = SlotCache(spec, slots, max_source, max_target, model.cache_dtype, model.cache_device)
    for i in range(rows):
        cache.allocate(cross_k[:, i], cross_v[:, i], mask[i], 1, spec.bos_id)
    return cache


def step_ms(model: OnnxModel, rows: int, slots: int, max_target: int, max_source: int = SOURCE_LEN,
            mixed: bool = False) -> float:
    """Median wall time of one step with `rows` running rows, over STEPS steps after 4 warm-up steps.
    `mixed`: as a server runs them: rows of different ages (0-40 positions) and a row count that changes
    every step (all rows, then all but 3)."""
    spec = model.spec
    cache = filled_cache(model, rows, slots, max_target, max_source)
    if mixed:
        # up to 40 positions, and room for every step the study runs
        cache.length[:rows] = np.random.default_rng(1).integers(0, min(40, max_target - 4 - STEPS), rows)
    every = list(cache.rows)
    runner = InPlaceStep(model.inplace, cache, spec.out_vocab_size)
    times = []
    for step in range(4 + STEPS):
        if mixed:  # the study's own row handling: the hidden rows keep their slots and ages
            cache.rows = every[:max(1, rows - 3 * (step % 2))]
        for row in cache.rows:
            row.token = 4 + (step % 50)
        t0 = time.perf_counter()
        logits = runner.run()
        settle(logits)
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times[4:])


def placement(bundle: Path, variant: str, provider: str) -> list[str]:
    """The lines of ONNX Runtime's verbose session log that say where the in-place graph's nodes went."""
    code = ("import onnxruntime as ort, sys; o = ort.SessionOptions(); o.log_severity_level = 0; "
            f"ort.InferenceSession(sys.argv[1], o, providers={_providers(provider)!r})")
    config = load_bundle(bundle)
    graph = config.graph_path(variant, "decoder_inplace_std" if variant == "fp32" and provider == "cuda"
                              else "decoder_inplace")
    proc = subprocess.run([sys.executable, "-c", code, str(graph)], capture_output=True, text=True, timeout=300)
    keep, lines = False, []
    for line in (proc.stderr + proc.stdout).splitlines():
        if "placed on" in line or "not assigned" in line:
            keep = "Node(s) placed on" in line
            lines.append(line.split("] ")[-1].strip())
        elif keep and line.startswith(" "):
            lines.append("  " + line.strip())
        else:
            keep = False
    return lines


def _providers(provider: str) -> list[str]:
    return ["CUDAExecutionProvider", "CPUExecutionProvider"] if provider == "cuda" else ["CPUExecutionProvider"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", default=str(newest_version(ROOT / "model_repository" / "multi30k-en-de-small")))
    p.add_argument("--provider", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--variants", default="fp32,fp16",
                   help="variants of the bundle to time (those it has), e.g. fp32,int8,int8-static")
    p.add_argument("--rows", default="32,256", help="running rows per step")
    p.add_argument("--threads", type=int, default=0, help="intra-op threads (0: ONNX Runtime's default)")
    p.add_argument("--server-shape", default="256,257,256",
                   help="slots,target positions,source positions of the server's cache (the shipped model's, "
                        "at the server's defaults)")
    args = p.parse_args(argv)
    bundle = load_bundle(Path(args.bundle))
    slots, positions, sources = (int(x) for x in args.server_shape.split(","))
    print(f"in-place step alone, {args.provider}, {bundle.name} v{bundle.version}; ms per step (median of {STEPS})")
    print(f"| variant | rows | static shape (rows slots, 33 positions, {SOURCE_LEN} source positions) | server shape "
          f"({slots} slots, {positions} positions, {sources} source positions) | {slots} slots, 33 positions, "
          f"{SOURCE_LEN} source | {slots} slots, 33 positions, {sources} source | server shape, mixed ages and row "
          "counts |")
    print("|---|---|---|---|---|---|---|")
    for variant in args.variants.split(","):
        if variant not in bundle.variants:
            print(f"| {variant} | - | not in the bundle | | | |")
            continue
        # a bundle variant by its own name: int8 the row-wise graphs (int8-vnni on a VNNI CPU), int8-static the others
        model = OnnxModel(bundle, RuntimeOptions(variant=variant, provider=args.provider, decoder="auto",
                                                    intra_op_threads=args.threads, int8_activations="row"))
        if model.inplace is None:
            print(f"| {variant} | - | no in-place step here (CuPy missing?) | | | |")
            continue
        for rows in (int(r) for r in args.rows.split(",")):
            wide = max(slots, rows)
            cells = [step_ms(model, rows, rows, 33), step_ms(model, rows, wide, positions, sources),
                     step_ms(model, rows, wide, 33), step_ms(model, rows, wide, 33, sources),
                     step_ms(model, rows, wide, positions, sources, mixed=True)]
            print(f"| {variant} | {rows} | " + " | ".join(f"{c:.2f}" for c in cells) + " |", flush=True)
    for variant in args.variants.split(","):
        if variant in bundle.variants:
            lines = placement(bundle.path, variant, args.provider)
            print(f"\nnode placement, {variant}:", *(lines or ["(the session's log said nothing about placement)"]),
                  sep="\n  ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
