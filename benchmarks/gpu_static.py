"""Static greedy decoding on the CUDA execution provider: fp32 and fp16, batch 1 to 256.

    python -m benchmarks.gpu_static --bundle model_repository/multi30k-en-de-small/4 \\
        --src-file tests/data/test_2016_flickr.head200.en --out docs/benchmarks/gpu/gpu_static.md

Every cell decodes the same sentences with exactly --tokens target tokens each
(EOS suppressed), so engines and batch sizes do the same work; the CPU provider
runs in the same process as a reference row. fp16 is derived from the fp32
graphs here when the bundle lacks it (export.variants.fp16_graphs). Agreement
columns count sentences whose greedy tokens equal the CPU fp32 run's at the
model's own output lengths (no forced length).
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from benchmarks.harness import date_line, machine_line
from models.core.bundle import newest_version

ROOT = Path(__file__).resolve().parents[1]


def with_fp16(bundle_dir: Path, work: Path) -> Path:
    """A copy of the bundle with an fp16 variant (the shipped bundle carries fp32 only)."""
    from export.variants import fp16_graphs
    config = json.loads((bundle_dir / "config.json").read_text())
    if "fp16" in config["variants"]:
        return bundle_dir
    dst = work / bundle_dir.parent.name / bundle_dir.name
    shutil.copytree(bundle_dir, dst)
    config["variants"]["fp16"] = fp16_graphs(dst, config["variants"]["fp32"])  # as `export --fp16` writes them
    (dst / "config.json").write_text(json.dumps(config, indent=1))
    return dst


def device_name() -> str:
    try:
        import subprocess
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, check=True)
        return out.stdout.strip().splitlines()[0]
    except Exception:  # noqa: BLE001 (no GPU tools: say so in the table)
        return "no CUDA device"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", default=str(newest_version(ROOT / "model_repository" / "multi30k-en-de-small")))
    p.add_argument("--src-file", default=str(ROOT / "tests/data/test_2016_flickr.head200.en"))
    p.add_argument("--sentences", type=int, default=512, help="sentences per cell (the file is cycled)")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32, 128, 256])
    p.add_argument("--cpu-batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32])
    p.add_argument("--runs", type=lambda s: [tuple(x.split(":")) for x in s.split(",")],
                   default=[("cpu", "fp32"), ("cuda", "fp32"), ("cuda", "fp16")],
                   help="provider:variant cells, the first is the reference (cpu:fp32 alone checks the plumbing "
                        "on a machine without a GPU)")
    p.add_argument("--out", default=str(ROOT / "docs/benchmarks/gpu/gpu_static.md"))
    args = p.parse_args(argv)

    import onnxruntime as ort

    from models.core import static_decode
    from models.core.bundle import load_bundle
    from models.core.runtime import OnnxModel, RuntimeOptions
    from models.core.bundle_tokenizer import load_tokenizer
    from models.core.tokenizer import normalize

    work = Path(tempfile.mkdtemp())
    fp16 = any(variant == "fp16" for _, variant in args.runs)
    bundle = load_bundle(with_fp16(Path(args.bundle), work) if fp16 else Path(args.bundle))
    tok = load_tokenizer(bundle.tokenizer_entry, bundle.path)
    lines = Path(args.src_file).read_text(encoding="utf-8").splitlines()
    texts = [lines[i % len(lines)] for i in range(args.sentences)]
    ids = [tok.encode(normalize(t)) for t in texts]

    def run(model, batch: int, forced: bool) -> tuple[float, list]:
        outs = []
        for i in range(0, len(ids), batch):
            src, mask = static_decode.pad_batch(ids[i:i + batch], bundle.spec.pad_id)
            n = args.tokens if forced else None
            outs += static_decode.greedy(model, src, mask, max_len=n, min_len=n or 0)
        return sum(len(o) for o in outs), outs

    cells: list[dict] = []
    reference = None
    for provider, variant, batches in [(pv, v, args.cpu_batch_sizes if pv == "cpu" else args.batch_sizes)
                                       for pv, v in args.runs]:
        model = OnnxModel(bundle, RuntimeOptions(provider=provider, variant=variant))
        _, free = run(model, 32, forced=False)
        if reference is None:
            reference = free
        agree = sum(a == b for a, b in zip(free, reference))
        for b in batches:
            run(model, b, forced=True)  # warm-up: kernels, allocator, this batch's shapes
            t0 = time.perf_counter()
            produced, _ = run(model, b, forced=True)
            dt = time.perf_counter() - t0
            cells.append({"provider": provider, "variant": variant, "batch": b, "tokens_per_s": produced / dt,
                          "ms_per_step": 1e3 * dt / (args.tokens * -(-len(ids) // b)),
                          "agree_with_cpu_fp32": f"{agree}/{len(ids)}"})
            print(json.dumps(cells[-1]), flush=True)

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"device": device_name(), "cells": cells}, indent=1))
    batches = sorted({c["batch"] for c in cells})
    rows = ["# Static greedy decoding on the GPU", "",
            f"Command: `python -m benchmarks.gpu_static {' '.join(argv)}`", "",
            date_line(), "", machine_line(f"GPU: {device_name()}"), "",
            f"onnxruntime {ort.__version__}. {args.sentences} sentences of {Path(args.src_file).name} "
            f"(cycled), exactly {args.tokens} target tokens each.", "",
            "| provider / variant | " + " | ".join(f"batch {b}" for b in batches) + " | greedy = CPU fp32 |",
            "|---|" + "---|" * (len(batches) + 1)]
    for key in dict.fromkeys((c["provider"], c["variant"]) for c in cells):
        by = {c["batch"]: c for c in cells if (c["provider"], c["variant"]) == key}
        row = [f"{by[b]['tokens_per_s']:,.0f} tok/s ({by[b]['ms_per_step']:.2f} ms/step)" if b in by else "-"
               for b in batches]
        agree = next(iter(by.values()))["agree_with_cpu_fp32"]
        rows.append(f"| {key[0]} {key[1]} | " + " | ".join(row) + f" | {agree} |")
    out.write_text("\n".join(rows) + "\n")
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
