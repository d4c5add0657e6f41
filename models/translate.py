"""Translate from the command line with a PyTorch checkpoint.

    python -m models.translate "A man is riding a bike."
    echo "Two dogs play in the snow." | python -m models.translate --beam 5

With no --checkpoint, the shipped default model (Multi30k En->De) is used.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

DEFAULT_CHECKPOINT = Path(__file__).resolve().parent / "pretrained" / "multi30k-en-de-small" / "model.pt"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("text", nargs="*", help="sentences to translate (default: one per line on stdin)")
    p.add_argument("--checkpoint", default=str(DEFAULT_CHECKPOINT))
    p.add_argument("--beam", type=int, default=5, help="1 = greedy")
    p.add_argument("--alpha", type=float, default=1.0, help="length penalty exponent")
    args = p.parse_args(argv)

    from models.evaluate import load_checkpoint, translate  # torch import only once arguments are fine

    texts = args.text or [line.rstrip("\n") for line in sys.stdin]
    model, tok, _ = load_checkpoint(args.checkpoint)
    for line in translate(model, tok, texts, beam=args.beam, alpha=args.alpha):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
