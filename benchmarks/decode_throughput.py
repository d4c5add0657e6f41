"""Greedy decoding throughput: PyTorch (with / without cache), ONNX Runtime fp32 / int8, CTranslate2 float32 / int8.

    python -m benchmarks.decode_throughput --checkpoint models/pretrained/multi30k-en-de-small/model.pt \\
        --bundle model_repository/multi30k-en-de-small/4

Fairness rules: the same source sentences (the first --sentences of
test_2016_flickr.en), exactly --tokens target tokens per sentence for every
engine (EOS suppressed until then), each engine in its own process (two
OpenMP runtimes in one process slow each other down), and each engine at its
best intra-op thread count among --threads. Writes a Markdown table to --out.

CTranslate2 picks its CPU GEMM library itself: Intel MKL on Intel CPUs, oneDNN elsewhere
(`CT2_USE_MKL` overrides it; `CT2_USE_EXPERIMENTAL_PACKED_GEMM` packs the weights for MKL).
--ct2-backends runs each CTranslate2 engine under each named setting (benchmarks/ct2_server.py's
GEMM_BACKENDS), and every ratio is taken against the fastest of them at that batch size: the peer at its
best on this CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from benchmarks.ct2_server import GEMM_BACKENDS as BACKENDS
from benchmarks.ct2_server import backend_env
from benchmarks.harness import TEST_SOURCES, date_line, machine_line, rotations

ROOT = Path(__file__).resolve().parents[1]
# ort-int8: what `--variant int8` serves (int8-static where the bundle has it); ort-int8-row: the row-wise int8
ENGINES = ["torch-recompute", "torch-cache", "ort-fp32", "ort-int8", "ort-int8-row", "ct2-float32", "ct2-int8"]


def batches_of(items: list, size: int) -> list[list]:
    return [items[i:i + size] for i in range(0, len(items), size)]


def run_worker(args: argparse.Namespace) -> dict:
    """Inside a fresh process: decode all sentences at one batch size, report tokens/s."""
    from models.core.tokenizer import SubwordTokenizer
    from models.data import normalize

    engine, threads, batch, n_tok = args.worker, args.worker_threads, args.batch, args.tokens
    tok = SubwordTokenizer.load(Path(args.bundle) / "tokenizer.json")
    texts = Path(args.src_file).read_text(encoding="utf-8").splitlines()[: args.sentences]
    ids = [tok.encode(normalize(t)) for t in texts]
    groups = batches_of(ids, batch)
    profile: dict[str, float] = {}
    if engine.startswith("torch"):
        import torch

        from models.evaluate import load_checkpoint
        from models.search import greedy
        torch.set_num_threads(threads)
        model, _, _ = load_checkpoint(args.checkpoint)

        def decode(group):
            width = max(len(x) for x in group)
            src = torch.tensor([x + [0] * (width - len(x)) for x in group])
            return greedy(model, src, max_len=n_tok, min_len=n_tok, use_cache=engine == "torch-cache")
    elif engine.startswith("ort"):
        from models.core import static_decode
        from models.core.bundle import load_bundle
        from models.core.runtime import OnnxModel, RuntimeOptions
        model = OnnxModel(load_bundle(args.bundle), RuntimeOptions(
            variant=engine.split("-")[1], provider="cpu", intra_op_threads=threads,
            int8_activations="row" if engine.endswith("-row") else "auto"))
        # Split each step into ONNX Runtime vs numpy/Python: the step session static greedy runs
        # (the in-place graph when the bundle has it).
        from benchmarks.serving_load import time_inside
        inside_step = time_inside(model.inplace if model.inplace is not None else model.decoder)

        def decode(group):
            src, mask = static_decode.pad_batch(group, 0)
            return static_decode.greedy(model, src, mask, max_len=n_tok, min_len=n_tok)
    else:
        import ctranslate2
        translator = ctranslate2.Translator(args.ct2_dirs[engine], device="cpu", intra_threads=threads,
                                            inter_threads=1)

        def decode(group):
            res = translator.translate_batch([[tok.piece(i) for i in x] for x in group], beam_size=1,
                                             max_decoding_length=n_tok, min_decoding_length=n_tok,
                                             max_batch_size=batch)
            return [[tok.tok.token_to_id(p) for p in r.hypotheses[0]] for r in res]
    decode(groups[0])  # warm-up: first-run allocations, lazy initialisation
    step0 = inside_step() if engine.startswith("ort") else 0.0
    t0 = time.perf_counter()
    outputs = [out for g in groups for out in decode(g)]
    elapsed = time.perf_counter() - t0
    produced = sum(len(o) for o in outputs)
    if engine.startswith("ort"):
        steps = len(groups) * n_tok
        profile = {"ms_per_step": 1e3 * elapsed / steps, "ort_ms_per_step": 1e3 * (inside_step() - step0) / steps}
    return {"engine": engine, "threads": threads, "batch": batch, "tokens": produced, "seconds": elapsed,
            "tokens_per_s": produced / elapsed, "outputs": outputs, "profile": profile}


def prepare(args: argparse.Namespace, work: Path) -> dict[str, str]:
    """int8 bundle variant (if the bundle lacks one) and the CTranslate2 conversions."""
    from benchmarks.ct2_convert import convert
    bundle = Path(args.bundle)
    config = json.loads((bundle / "config.json").read_text())
    if "int8" not in config["variants"]:
        repo = work / "repo"
        subprocess.run([sys.executable, "-m", "export", "--checkpoint", args.checkpoint, "--out", str(repo),
                        "--name", "bench", "--int8"], check=True, cwd=ROOT)
        args.bundle = str(repo / "bench" / "1")
    return {"ct2-float32": str(convert(args.checkpoint, work / "ct2-float32", None)),
            "ct2-int8": str(convert(args.checkpoint, work / "ct2-int8", "int8"))}


def split_backend(cell: str) -> tuple[str, str]:
    """"ct2-int8@mkl" -> ("ct2-int8", "mkl"); an engine without a suffix runs with the default setting."""
    engine, _, backend = cell.partition("@")
    return engine, backend or "default"


def worker_env(threads: int, backend: str, base: dict | None = None) -> dict:
    """A worker's environment: this one's without any CTranslate2 backend override it may carry (the cell
    names its own), with the cell's override and `threads` OpenMP threads."""
    return {**backend_env(backend, os.environ if base is None else base), "OMP_NUM_THREADS": str(threads)}


def spawn(args: argparse.Namespace, cell: str, threads: int, batch: int, ct2_dirs: dict) -> dict:
    engine, backend = split_backend(cell)
    cmd = [sys.executable, "-m", "benchmarks.decode_throughput", "--worker", engine, "--worker-threads", str(threads),
           "--batch", str(batch), "--checkpoint", args.checkpoint, "--bundle", args.bundle,
           "--src-file", args.src_file, "--sentences", str(args.sentences), "--tokens", str(args.tokens),
           "--ct2-dirs", json.dumps(ct2_dirs)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=worker_env(threads, backend), check=True)
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "engine": cell, "backend": backend}


def cells_of(engines: list[str], backends: list[str]) -> list[str]:
    """Every engine to run: each CTranslate2 engine once per backend ("ct2-int8@mkl"; the default unsuffixed)."""
    return [e if b == "default" else f"{e}@{b}" for e in engines for b in (backends if e.startswith("ct2") else
                                                                           ["default"])]


def best_ct2(results: dict, engine: str, batch: int) -> dict | None:
    """The fastest backend's result of CTranslate2 engine `engine` at `batch` (None if none ran)."""
    runs = [r for (cell, b), r in results.items() if b == batch and split_backend(cell)[0] == engine]
    return max(runs, key=lambda r: r["tokens_per_s"]) if runs else None


def measure(args: argparse.Namespace, ct2_dirs: dict, lengths: list[int]) -> dict:
    """{(engine, batch, forced length): the result of the median round, best over args.threads}.

    Each cell runs in its own process (spawn); rounds rotate the engines' order, so a slow spell
    of a shared machine does not hit one engine alone.
    """
    runs: dict = {}  # (engine, batch, tokens, threads) -> results of every round
    for rnd, order in enumerate(rotations(cells_of(args.engines, args.ct2_backends), args.repeats)):
        for engine in order:
            for b in args.batch_sizes:
                for n in lengths:
                    for t in args.threads:
                        args.tokens = n
                        r = spawn(args, engine, t, b, ct2_dirs)
                        print(f"round {rnd + 1} {engine:24s} batch {b:3d} tokens {n:4d} threads {t}: "
                              f"{r['tokens_per_s']:8.0f} tok/s", file=sys.stderr)
                        runs.setdefault((engine, b, n, t), []).append(r)
    best: dict = {}
    for (engine, b, n, _), rs in runs.items():
        r = sorted(rs, key=lambda x: x["tokens_per_s"])[len(rs) // 2]  # the median round
        if (engine, b, n) not in best or r["tokens_per_s"] > best[(engine, b, n)]["tokens_per_s"]:
            best[(engine, b, n)] = r
    return best


def render(results: dict, args: argparse.Namespace, versions: dict) -> str:
    batch_sizes = args.batch_sizes
    lines = ["# Greedy decoding throughput", "",
             "What it measures: static greedy decoding with no serving code, ONNX Runtime with this repository's "
             "decoder step against PyTorch and CTranslate2 on the same checkpoint. `python -m "
             "benchmarks.decode_throughput` rewrites this page.", "",
             f"Target tokens/s, {args.sentences} sentences of test_2016_flickr.en, exactly {args.tokens} "
             "target tokens each (EOS suppressed), best intra-op thread count of "
             f"{args.threads} per cell (in brackets), each engine in its own process; the median of "
             f"{args.repeats} rounds with the engines' order rotating.", "",
             f"Command: `python -m benchmarks.decode_throughput {' '.join(args.argv)}`", "",
             date_line(), "",
             machine_line(", ".join(f"{k} {v}" for k, v in versions.items())), "",
             "| engine | " + " | ".join(f"batch {b}" for b in batch_sizes) + " |",
             "|---|" + "---|" * len(batch_sizes)]
    for engine in cells_of([e for e in ENGINES if e in args.engines], args.ct2_backends):
        cells = []
        for b in batch_sizes:
            r = results.get((engine, b))
            cells.append(f"{r['tokens_per_s']:,.0f} ({r['threads']})" if r else "-")
        name = engine if "@" not in engine else f"{split_backend(engine)[0]}, `{split_backend(engine)[1]}`"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    several = len(args.ct2_backends) > 1
    lines += ["", "Ratios (same run" + ("; CTranslate2 at its fastest backend per batch size, named" if several else "")
              + "):", "", "| ratio | " + " | ".join(f"batch {b}" for b in batch_sizes) + " |",
              "|---|" + "---|" * len(batch_sizes)]
    pairs = [("ort-fp32", "ct2-float32"), ("ort-int8", "ct2-int8"), ("ort-int8-row", "ct2-int8"), ("ort-int8", "ort-fp32"),
             ("ort-int8", "ort-int8-row"), ("ort-fp32", "torch-cache"),
             ("torch-cache", "torch-recompute")]
    for a, b_ in [(a, b_) for a, b_ in pairs if a in args.engines and b_ in args.engines]:
        cells = []
        for b in batch_sizes:
            ref = best_ct2(results, b_, b) if b_.startswith("ct2") else results.get((b_, b))
            if (a, b) not in results or ref is None:
                cells.append("-")
                continue
            named = f" (`{ref['backend']}`)" if several and b_.startswith("ct2") else ""
            cells.append(f"{results[(a, b)]['tokens_per_s'] / ref['tokens_per_s']:.2f}x{named}")
        lines.append(f"| {a} / {b_} | " + " | ".join(cells) + " |")
    lines += ["", "Token agreement with CTranslate2 float32 (same sentences, same forced length):", ""]
    for engine in ("torch-cache", "ort-fp32", "ort-int8", "ort-int8-row", "ct2-int8"):
        for b in batch_sizes:
            if (engine, b) in results and ("ct2-float32", b) in results:
                ours, ref = results[(engine, b)]["outputs"], results[("ct2-float32", b)]["outputs"]
                same = sum(x == y for x, y in zip(ours, ref))
                lines.append(f"- {engine}, batch {b}: {same}/{len(ref)} sentences identical")
    lines += ["", "ONNX Runtime step profile (ms per decode step, the encoder pass amortised into it, vs time "
              "inside the decoder's session run; the rest is the encoder, numpy and Python):", ""]
    for engine in ("ort-fp32", "ort-int8", "ort-int8-row"):
        for b in batch_sizes:
            p = results.get((engine, b), {}).get("profile")
            if p:
                lines.append(f"- {engine}, batch {b}: {p['ms_per_step']:.2f} ms/step, "
                             f"{p['ort_ms_per_step']:.2f} in ONNX Runtime "
                             f"({100 * p['ort_ms_per_step'] / p['ms_per_step']:.0f}%)")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--bundle", required=True, help="bundle version directory (fp32; int8 is made if missing)")
    p.add_argument("--src-file", default=str(TEST_SOURCES))
    p.add_argument("--sentences", type=int, default=128)
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    p.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    p.add_argument("--engines", type=lambda s: s.split(","), default=ENGINES)
    p.add_argument("--ct2-backends", type=lambda s: s.split(","), default=["default"],
                   help=f"CTranslate2's GEMM library settings to run each CTranslate2 engine under, of "
                        f"{', '.join(BACKENDS)} (default: CTranslate2's own choice for this CPU only)")
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks" / "decode_throughput.md"))
    p.add_argument("--repeats", type=int, default=1,
                   help="rounds over all engines (rotating their order); each cell is the median round")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--worker-threads", type=int, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--ct2-dirs", type=json.loads, default={}, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = [b for b in args.ct2_backends if b not in BACKENDS]
    if unknown:
        p.error(f"unknown --ct2-backends {', '.join(unknown)}; known: {', '.join(BACKENDS)}")
    if args.worker:
        print(json.dumps(run_worker(args)))
        return 0
    args.argv = argv
    import ctranslate2
    import onnxruntime
    import torch
    versions = {"torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
                "ctranslate2": ctranslate2.__version__}
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        ct2_dirs = prepare(args, Path(tmp))
        cells = measure(args, ct2_dirs, [args.tokens])
    results = {(engine, b): r for (engine, b, _), r in cells.items()}
    table = render(results, args, versions)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    (out.with_suffix(".json")).write_text(json.dumps(
        [{k: v for k, v in r.items() if k != "outputs"} for r in results.values()], indent=1))
    print(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
