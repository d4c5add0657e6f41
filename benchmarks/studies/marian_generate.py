"""PyTorch `generate` on the GPU with static batches: the baseline the imported Marian is measured against.

    python -m benchmarks.studies.marian_generate --hf-dir DIR [--batch-sizes 1,8,32,128] [--tokens 32]

The decode-step issue's target for an imported model: served on the device, at least 1.3x what PyTorch's
own `generate` does with static batches of the same size on the same GPU. This times exactly that
baseline: Hugging Face's MarianMTModel (the OPUS-MT-shaped model benchmarks.hf_compare builds, random
weights with EOS never chosen, so every row decodes exactly --tokens tokens), greedy, KV cache on (the
library's default), in fp32 and in fp16, the sentences of --src-file cycled into batches of each size.
Each cell: one warm-up call, then the median of --calls calls; tokens/s = batch x tokens / seconds.
The same sentences, batch sizes and token count go to `benchmarks.gpu_static --bundle <the exported
bundle>` for our engine's static figure and to `benchmarks.serving_load` for the served one (the GPU
suite's marian steps run all three).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--hf-dir", required=True, help="a Hugging Face Marian directory (model and tokenizer)")
    p.add_argument("--src-file", default=str(ROOT / "tests/data/test_2016_flickr.head200.en"))
    p.add_argument("--batch-sizes", default="1,8,32,128")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--calls", type=int, default=3)
    p.add_argument("--dtypes", default="fp32,fp16")
    p.add_argument("--out", help="write the table here as markdown (and the cells beside it as .json)")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)

    import torch
    from transformers import MarianMTModel, MarianTokenizer

    from benchmarks.harness import date_line, machine_line

    device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "no CUDA device"
    tok = MarianTokenizer.from_pretrained(args.hf_dir)
    lines = [line for line in Path(args.src_file).read_text(encoding="utf-8").splitlines() if line.strip()]
    cells = []
    for dtype in args.dtypes.split(","):
        model = MarianMTModel.from_pretrained(args.hf_dir).eval().to(device)
        if dtype == "fp16":
            model = model.half()
        for b in (int(x) for x in args.batch_sizes.split(",")):
            texts = [lines[i % len(lines)] for i in range(b)]
            batch = tok(texts, return_tensors="pt", padding=True).to(device)
            times = []
            for call in range(1 + args.calls):
                if device == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                with torch.inference_mode():
                    out = model.generate(**batch, max_new_tokens=args.tokens, min_new_tokens=args.tokens,
                                         num_beams=1, do_sample=False)
                if device == "cuda":
                    torch.cuda.synchronize()
                if call:
                    times.append(time.perf_counter() - t0)
            produced = b * (out.shape[1] - 1)  # the start token is not produced
            seconds = statistics.median(times)
            cells.append({"dtype": dtype, "batch": b, "tokens_per_s": produced / seconds,
                          "ms_per_step": 1e3 * seconds / args.tokens, "tokens_per_row": out.shape[1] - 1})
            print(json.dumps(cells[-1]), flush=True)
        del model
    batches = sorted({c["batch"] for c in cells})
    rows = ["# PyTorch generate, static batches (the imported Marian's baseline)", "",
            f"Command: `python -m benchmarks.studies.marian_generate {' '.join(argv)}`", "",
            date_line(), "", machine_line(f"GPU: {gpu}"), "",
            f"torch {torch.__version__}, greedy with the KV cache, exactly {args.tokens} new tokens per row, "
            f"median of {args.calls} calls after one warm-up.", "",
            "| dtype | " + " | ".join(f"batch {b}" for b in batches) + " |", "|---|" + "---|" * len(batches)]
    for dtype in dict.fromkeys(c["dtype"] for c in cells):
        by = {c["batch"]: c for c in cells if c["dtype"] == dtype}
        rows.append(f"| {dtype} | " + " | ".join(
            f"{by[b]['tokens_per_s']:,.0f} tok/s ({by[b]['ms_per_step']:.2f} ms/step)" for b in batches) + " |")
    text = "\n".join(rows) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
        Path(args.out).with_suffix(".json").write_text(json.dumps({"device": gpu, "cells": cells}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
