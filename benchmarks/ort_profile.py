"""Where a decode step's time goes inside ONNX Runtime, by operator type.

    python -m benchmarks.ort_profile --bundle model_repository/multi30k-en-de-small/4 \
        [--variant int8] [--batch 32] [--tokens 32] [--threads 1]

Runs static greedy decoding (models/core/static_decode.py, the in-place graph
when the bundle has it) over the first --batch sentences of test_2016_flickr
with ONNX Runtime's profiler on, then sums the profiler's per-node times by
operator type for the decoder-step session: which kernels a change to the
graph (fusions, quantisation) has to win back. The encoder is reported apart.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Sequence

from models.core.bundle import newest_version

ROOT = Path(__file__).resolve().parents[1]


def by_op_type(profile_file: str) -> tuple[dict[str, float], dict[str, int], int]:
    """{op type: microseconds}, {op type: node runs}, session runs, from one profiler JSON file."""
    events = json.loads(Path(profile_file).read_text())
    micros: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    runs = 0
    for e in events:
        if e.get("cat") == "Session" and e.get("name") == "model_run":
            runs += 1
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        op = e.get("args", {}).get("op_name", "?")
        micros[op] += e.get("dur", 0)
        counts[op] += 1
    return micros, counts, runs


def render(title: str, micros: dict[str, float], counts: dict[str, int], runs: int) -> str:
    total = sum(micros.values()) or 1.0
    lines = [f"## {title}: {runs} runs, {total / max(runs, 1) / 1e3:.3f} ms of kernels per run", "",
             "| op type | ms per run | share | nodes per run |", "|---|---|---|---|"]
    for op, us in sorted(micros.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {op} | {us / max(runs, 1) / 1e3:.4f} | {100 * us / total:.1f}% | "
                     f"{counts[op] / max(runs, 1):.0f} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--bundle", default=str(newest_version(ROOT / "model_repository" / "multi30k-en-de-small")))
    p.add_argument("--variant", default="int8", help="bundle variant: fp32, int8, ...")
    p.add_argument("--src-file", default=str(ROOT.parent / "shared/data/multi30k/test_2016_flickr.en"))
    p.add_argument("--batch", type=int, default=32, help="sentences decoded together")
    p.add_argument("--tokens", type=int, default=32, help="decode steps (EOS suppressed until then)")
    p.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    args = p.parse_args(argv)

    import onnxruntime as ort

    from models.core import static_decode
    from models.core.bundle import load_bundle
    from models.core.runtime import OnnxModel, RuntimeOptions
    from models.core.tokenizer import SubwordTokenizer
    from models.data import normalize

    bundle = load_bundle(args.bundle)
    tok = SubwordTokenizer.load(Path(args.bundle) / "tokenizer.json")
    texts = Path(args.src_file).read_text(encoding="utf-8").splitlines()[: args.batch]
    src, mask = static_decode.pad_batch([tok.encode(normalize(t)) for t in texts], bundle.spec.pad_id)
    opts = RuntimeOptions(variant=args.variant, provider="cpu", intra_op_threads=args.threads, shared_pool=False)
    model = OnnxModel(bundle, opts)
    static_decode.greedy(model, src, mask, max_len=args.tokens, min_len=args.tokens)  # warm-up, unprofiled

    with tempfile.TemporaryDirectory() as tmp:
        def profiled(graph: str) -> ort.InferenceSession:
            from models.core.runtime import session_options
            so = session_options(opts)
            so.enable_profiling = True
            so.profile_file_prefix = os.path.join(tmp, graph)
            return ort.InferenceSession(str(bundle.graph_path(args.variant, graph)), so, providers=model.providers)

        model.encoder = profiled("encoder")
        step_graph = "decoder_inplace" if model.inplace is not None else "decoder_step"
        if model.inplace is not None:
            model.inplace = profiled(step_graph)
        else:
            model._decoder = profiled(step_graph)
        static_decode.greedy(model, src, mask, max_len=args.tokens, min_len=args.tokens)
        files = {"encoder": model.encoder.end_profiling(),
                 step_graph: (model.inplace or model.decoder).end_profiling()}
        print(f"# ONNX Runtime profile: {Path(args.bundle).name} {args.variant}, batch {args.batch}, "
              f"{args.tokens} steps, {args.threads} thread(s), onnxruntime {ort.__version__}\n")
        for graph in (step_graph, "encoder"):
            print(render(graph, *by_op_type(files[graph])) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
