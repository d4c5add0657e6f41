"""Translate a file with a checkpoint and score it with sacreBLEU.

    python -m models.evaluate --checkpoint PATH --src-file F --ref-file F [--beam 5] [--output HYP]

Prints sacreBLEU's score line with its signature (cased, detokenised output,
13a tokenisation: the WMT convention).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

import sacrebleu
import torch

from models.checkpoint import Model, load_model
from models.core.tokenizer import normalize
from models.search import beam_search, greedy
from models.core.tokenizer import SubwordTokenizer


def load_checkpoint(path: str | Path, device: str = "cpu") -> tuple[Model, SubwordTokenizer, dict]:
    """A checkpoint dir-or-file -> (model in eval mode, tokenizer, metadata).

    The model is a Transformer or a GRU, as the checkpoint's "arch" says.
    The tokenizer is looked up beside the checkpoint as tokenizer.json.
    """
    path = Path(path)
    model, state = load_model(path, device)
    tok = SubwordTokenizer.load(path.parent / "tokenizer.json")
    if tok.vocab_size != model.cfg.vocab_size:
        raise ValueError(f"tokenizer has {tok.vocab_size} tokens, model expects {model.cfg.vocab_size}")
    return model, tok, state.get("meta", {})


def _pad(batch: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    width = max(len(x) for x in batch)
    return torch.tensor([list(x) + [pad_id] * (width - len(x)) for x in batch], dtype=torch.long)


def translate(model: Model, tok: SubwordTokenizer, texts: Sequence[str], beam: int = 1,
              alpha: float = 1.0, max_tokens: int = 4000, progress: bool = False) -> list[str]:
    """Translate texts in length-sorted batches; output order follows input order."""
    ids = tok.encode_batch([normalize(t) for t in texts])
    ids = [x[: model.cfg.max_positions] for x in ids]
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    batches: list[list[int]] = [[]]
    for i in order:  # ascending length, so the newest row is the longest
        if batches[-1] and (len(batches[-1]) + 1) * len(ids[i]) * beam > max_tokens:
            batches.append([])
        batches[-1].append(i)
    out: list[str] = [""] * len(ids)
    done = 0
    for chunk in batches:
        if not chunk:
            continue
        src = _pad([ids[i] for i in chunk], tok.pad_id)
        if beam <= 1:
            hyps = greedy(model, src)
        else:
            hyps = [h[0].tokens for h in beam_search(model, src, beam=beam, alpha=alpha)]
        for i, h in zip(chunk, hyps):
            out[i] = tok.decode(h)
        done += len(chunk)
        if progress:
            print(f"\rtranslated {done}/{len(ids)}", end="", file=sys.stderr, flush=True)
    if progress:
        print(file=sys.stderr)
    return out


def bleu(hyps: Sequence[str], refs: Sequence[str]) -> sacrebleu.metrics.bleu.BLEUScore:
    return sacrebleu.corpus_bleu(list(hyps), [list(refs)])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True)
    p.add_argument("--src-file", required=True)
    p.add_argument("--ref-file", required=True)
    p.add_argument("--beam", type=int, default=1, help="1 = greedy")
    p.add_argument("--alpha", type=float, default=1.0, help="length penalty exponent for beam search")
    p.add_argument("--output", help="write hypotheses here, one per line")
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = default)")
    p.add_argument("--json", action="store_true", help="also print a JSON line with the figures")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok, _ = load_checkpoint(args.checkpoint)
    src = Path(args.src_file).read_text(encoding="utf-8").splitlines()
    refs = [normalize(r) for r in Path(args.ref_file).read_text(encoding="utf-8").splitlines()]
    if len(src) != len(refs):
        p.error(f"{args.src_file} has {len(src)} lines but {args.ref_file} has {len(refs)}")
    t0 = time.perf_counter()
    hyps = translate(model, tok, src, beam=args.beam, alpha=args.alpha, progress=sys.stderr.isatty())
    elapsed = time.perf_counter() - t0
    if args.output:
        Path(args.output).write_text("\n".join(hyps) + "\n", encoding="utf-8")
    metric = sacrebleu.BLEU()
    score = metric.corpus_score(hyps, [refs])
    print(f"{score} {metric.get_signature()}")
    print(f"{len(src)} sentences in {elapsed:.1f}s (beam={args.beam})", file=sys.stderr)
    if args.json:
        print(json.dumps({"checkpoint": args.checkpoint, "src_file": Path(args.src_file).name,
                          "bleu": round(score.score, 2), "signature": str(metric.get_signature()),
                          "beam": args.beam, "alpha": args.alpha, "sentences": len(src),
                          "seconds": round(elapsed, 1)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
