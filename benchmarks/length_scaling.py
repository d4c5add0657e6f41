"""Does a token cost more when the output is long? Greedy tokens/s at 32, 128 and 256 forced tokens.

    python -m benchmarks.length_scaling --checkpoint models/pretrained/multi30k-en-de-small/model.pt \
        --bundle model_repository/multi30k-en-de-small/4 [--lengths 32,128,256] [--batch-sizes 1,32]

A decode step must attend over the row's past, so some growth is the work
itself; what a serving engine must not add is cost that grows with the past on
top of that (copying the cache each step did). Each cell is one engine in its
own process (benchmarks/decode_throughput.py's worker, EOS suppressed so every
sentence produces exactly that many tokens), the best of --threads, the median
of --repeats rounds with the engines' order rotating. "Kept" is tokens/s at
that length over tokens/s at the shortest: ours should keep as much as
CTranslate2 does. Writes a Markdown table, its JSON and a plot.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Sequence

from benchmarks.decode_throughput import measure, prepare

ROOT = Path(__file__).resolve().parents[1]
ENGINES = ["ort-fp32", "ct2-float32", "ort-int8", "ct2-int8"]


def measure_lengths(args: argparse.Namespace) -> dict:
    """{(engine, batch, length): best-of-threads median tokens/s}."""
    with tempfile.TemporaryDirectory(prefix="lengths-") as tmp:
        ct2_dirs = prepare(args, Path(tmp))
        cells = measure(args, ct2_dirs, args.lengths)
    return {key: r["tokens_per_s"] for key, r in cells.items()}


def render(best: dict, args: argparse.Namespace) -> str:
    lines = ["# Tokens/s against output length", "",
             f"Greedy decoding of the first {args.sentences} sentences of test_2016_flickr.en, EOS suppressed so "
             f"each produces exactly N tokens; each engine in its own process, best of {args.threads} intra-op "
             f"threads, median of {args.repeats} rounds (engines' order rotating). Kept = tokens/s at N over "
             f"tokens/s at {args.lengths[0]}.", "",
             f"Command: `python -m benchmarks.length_scaling {' '.join(args.argv)}`", ""]
    for b in args.batch_sizes:
        lines += [f"## Batch {b}", "", "| engine | " + " | ".join(f"{n} tok/s" for n in args.lengths) + " | "
                  + " | ".join(f"kept at {n}" for n in args.lengths[1:]) + " |",
                  "|---|" + "---|" * (2 * len(args.lengths) - 1)]
        for engine in args.engines:
            rates = [best.get((engine, b, n), 0.0) for n in args.lengths]
            kept = [f"{r / rates[0]:.2f}" if rates[0] else "-" for r in rates[1:]]
            lines.append(f"| {engine} | " + " | ".join(f"{r:,.0f}" for r in rates) + " | " + " | ".join(kept) + " |")
        lines.append("")
    lines += [f"![tokens/s against length]({Path(args.out).with_suffix('.png').name})", ""]
    return "\n".join(lines)


def plot(best: dict, args: argparse.Namespace, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.batch_sizes), figsize=(5 * len(args.batch_sizes), 4), squeeze=False)
    for ax, b in zip(axes[0], args.batch_sizes):
        for engine in args.engines:
            ax.plot(args.lengths, [best.get((engine, b, n), 0.0) for n in args.lengths], marker="o", label=engine)
        ax.set(title=f"batch {b}", xlabel="output tokens per sentence", ylabel="tokens/s", xscale="log")
        ax.set_xticks(args.lengths, [str(n) for n in args.lengths])
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, help="PyTorch checkpoint (converted for CTranslate2)")
    p.add_argument("--bundle", required=True, help="bundle version directory (int8 is made if missing)")
    p.add_argument("--src-file", default=str(ROOT.parent / "shared/data/multi30k/test_2016_flickr.en"))
    p.add_argument("--sentences", type=int, default=32)
    p.add_argument("--lengths", type=ints, default=[32, 128, 256], help="forced output lengths, shortest first")
    p.add_argument("--batch-sizes", type=ints, default=[1, 32])
    p.add_argument("--threads", type=ints, default=[1, 2])
    p.add_argument("--engines", type=lambda s: s.split(","), default=ENGINES)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=str(ROOT / "docs/benchmarks/length_scaling.md"))
    args = p.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    best = measure_lengths(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(best, args))
    out.with_suffix(".json").write_text(json.dumps(
        [{"engine": e, "batch": b, "tokens": n, "tokens_per_s": r} for (e, b, n), r in sorted(best.items())], indent=1))
    plot(best, args, out.with_suffix(".png"))
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
