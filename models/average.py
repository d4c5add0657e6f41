"""Average the weights of several checkpoints of one run (the last N epochs, typically).

    python -m models.average --out runs/en-de-small/avg5.pt runs/en-de-small/epoch_02[1-5].pt

Checkpoint averaging smooths the noise of the last updates and usually gains a
fraction of a BLEU point for free; the result is a weights-only checkpoint in
the same format, with the sources recorded in its metadata.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import torch


def average(paths: Sequence[str | Path]) -> dict:
    states = [torch.load(p, map_location="cpu", weights_only=True) for p in paths]
    problems = [f"{p}: config differs from {paths[0]}" for p, s in zip(paths[1:], states[1:])
                if s["config"] != states[0]["config"] or s.get("arch") != states[0].get("arch")]
    keys = set(states[0]["model"])
    problems += [f"{p}: parameter names differ" for p, s in zip(paths[1:], states[1:]) if set(s["model"]) != keys]
    if problems:
        raise ValueError("cannot average: " + "; ".join(problems))
    model = {k: sum(s["model"][k].double() for s in states).div(len(states)).to(states[0]["model"][k].dtype)
             for k in states[0]["model"]}
    # Keep tied parameters tied (one tensor under two names), or the file stores them twice.
    first: dict[int, str] = {}
    for k, v in states[0]["model"].items():
        ptr = v.data_ptr()
        if ptr in first:
            model[k] = model[first[ptr]]
        else:
            first[ptr] = k
    meta = dict(states[-1].get("meta", {}))
    meta["averaged_from"] = [Path(p).name for p in paths]
    arch = {"arch": states[0]["arch"]} if "arch" in states[0] else {}  # a GRU average must load as a GRU
    return {**arch, "config": states[0]["config"], "model": model, "meta": meta}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoints", nargs="+")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    torch.save(average(args.checkpoints), args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
