"""The seeds' GRU + additive-attention baseline against the Transformer, side by side.

    python -m benchmarks.gru_vs_transformer --gru runs/en-de-gru-small/avg.pt \\
        [--transformer models/pretrained/multi30k-en-de-small/model.pt] [--out docs/gru_vs_transformer.md]

For each checkpoint: parameters, training time and epochs (from the train.jsonl beside it),
validation BLEU per epoch (the curves, plotted to docs/gru_vs_transformer.png),
sacreBLEU on test_2016_flickr greedy and beam 5 (models/evaluate.py, cased, detokenised),
and PyTorch decoding speed (greedy, batch 1 and batch 32, 1 thread, same sentences), all in
one run on one machine. Training time is as recorded by each run: the shipped Transformer
trained with bf16 autocast on 2 threads in an earlier session, the GRU in fp32 on 1 thread
next to other work, so it compares budgets, not architectures' speed.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from models.evaluate import bleu, load_checkpoint, translate

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "multi30k"


def training_log(checkpoint: Path) -> list[dict]:
    log = checkpoint.parent / "train.jsonl"
    if not log.exists():
        return []
    return [r for r in map(json.loads, log.read_text().splitlines()) if r.get("kind") == "epoch"]


def speed(model, tok, texts: list[str], batch: int) -> float:
    """Greedy output tokens per second over `texts`, `batch` sentences per call."""
    t0, produced = time.perf_counter(), 0
    for i in range(0, len(texts), batch):
        produced += sum(len(tok.encode(h)) for h in translate(model, tok, texts[i:i + batch], max_tokens=10 ** 9))
    return produced / (time.perf_counter() - t0)


def measure(name: str, path: Path, src: list[str], refs: list[str], speed_texts: list[str]) -> dict:
    model, tok, _ = load_checkpoint(path)
    epochs = training_log(path)
    row = {"name": name, "checkpoint": str(path), "params": sum(p.numel() for p in model.parameters()),
           "epochs": len(epochs), "train_minutes": sum(e.get("train_seconds", 0) for e in epochs) / 60,
           "val_bleu": [round(e["val_bleu"], 2) for e in epochs]}
    print(f"{name}: greedy", flush=True)
    row["bleu_greedy"] = bleu(translate(model, tok, src), refs).score
    print(f"{name}: beam 5", flush=True)
    row["bleu_beam5"] = bleu(translate(model, tok, src, beam=5), refs).score
    row["tok_s_b1"] = speed(model, tok, speed_texts[:50], 1)
    row["tok_s_b32"] = speed(model, tok, speed_texts, 32)
    return row


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for r in rows:
        ax.plot(range(1, len(r["val_bleu"]) + 1), r["val_bleu"], marker=".", label=r["name"])
    ax.set_xlabel("epoch")
    ax.set_ylabel("validation BLEU (greedy)")
    ax.set_title("Multi30k En→De, small presets")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=120)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gru", required=True, help="GRU checkpoint (train.jsonl beside it)")
    p.add_argument("--transformer", default=str(ROOT / "models/pretrained/multi30k-en-de-small/model.pt"))
    p.add_argument("--src-file", default=str(DATA / "test_2016_flickr.en"))
    p.add_argument("--ref-file", default=str(DATA / "test_2016_flickr.de"))
    p.add_argument("--out", default=str(ROOT / "docs/gru_vs_transformer.md"))
    args = p.parse_args()
    torch.set_num_threads(1)
    src = Path(args.src_file).read_text().splitlines()
    refs = Path(args.ref_file).read_text().splitlines()
    rows = [measure("Transformer small", Path(args.transformer), src, refs, src[:256]),
            measure("GRU + attention small", Path(args.gru), src, refs, src[:256])]
    out = Path(args.out)
    plot(rows, out.with_suffix(".png"))
    lines = ["# GRU + attention vs Transformer (Multi30k En→De, test_2016_flickr)", "",
             f"`python -m benchmarks.gru_vs_transformer --gru {args.gru}`; {platform.machine()}, PyTorch "
             f"{torch.__version__}, 1 thread. BLEU: sacreBLEU, cased, detokenised, beam 5 with length penalty 1.0.", "",
             "| model | parameters | epochs | training minutes | best val BLEU | test BLEU greedy | test BLEU beam 5 "
             "| greedy tok/s batch 1 | greedy tok/s batch 32 |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['params']:,} | {r['epochs']} | {r['train_minutes']:.0f} | "
                     f"{max(r['val_bleu'], default=0):.2f} | {r['bleu_greedy']:.2f} | {r['bleu_beam5']:.2f} | "
                     f"{r['tok_s_b1']:.0f} | {r['tok_s_b32']:.0f} |")
    lines += ["", f"![validation BLEU per epoch]({out.with_suffix('.png').name})", "",
              "Checkpoints: " + "; ".join(f"{r['name']}: `{r['checkpoint']}`" for r in rows), ""]
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
