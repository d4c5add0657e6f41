"""Small trained models for parity tests: a random model decodes one repeated token, so two
engines can agree on it while disagreeing on everything a real model does.

`reverser()` trains the tiny preset for a few seconds to reverse sequences of its vocabulary:
its greedy and beam outputs vary with every source (different tokens, lengths and orders), which
is what a parity test between two decoders needs to mean something.
"""
from __future__ import annotations

import functools
import random

import torch

from models.core.config import preset
from models.train import collate, inverse_sqrt, loss_fn
from models.transformer import Transformer

FIRST = 4  # ids below are pad, bos, eos, unk


def reverse_pairs(rng: random.Random, n: int, vocab_size: int, lengths=(2, 9)) -> list[tuple[list[int], list[int]]]:
    out = []
    for _ in range(n):
        x = [rng.randrange(FIRST, vocab_size) for _ in range(rng.randint(*lengths))]
        out.append((x + [2], x[::-1] + [2]))
    return out


@functools.lru_cache(maxsize=None)
def _trained(vocab_size: int, steps: int, items: tuple) -> dict:
    torch.manual_seed(0)
    rng = random.Random(0)
    model = Transformer(preset("tiny", vocab_size=vocab_size, **dict(items)))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: inverse_sqrt(s, 50))
    model.train()
    for _ in range(steps):
        src, tgt_in, tgt_out = collate(reverse_pairs(rng, 64, vocab_size), pad_id=0, bos_id=1)
        loss = loss_fn(model(src, tgt_in), tgt_out, 0, 0.05) / (tgt_out != 0).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return {k: v.clone() for k, v in model.state_dict().items()}


def reverser(vocab_size: int, steps: int = 300, **overrides) -> Transformer:
    """The tiny preset trained to reverse its input (a fresh copy each call; training is cached)."""
    model = Transformer(preset("tiny", vocab_size=vocab_size, **overrides))
    model.load_state_dict(_trained(vocab_size, steps, tuple(sorted(overrides.items()))))
    return model.eval()


def varied(outputs: list[list[int]]) -> bool:
    """No output is empty or one token repeated 3+ times, and most outputs differ from each other."""
    return all(o and (len(o) < 3 or len(set(o)) > 1) for o in outputs) \
        and len({tuple(o) for o in outputs}) >= 0.8 * len(outputs)


def reverser_bundle(root, name: str):
    """The reverser exported with every variant `python -m export --fp16` writes (fp32 and fp16, each with
    its in-place graph), loaded: the bundle the GPU and fp16 tests decode with."""
    from export.__main__ import main as export_main
    from models.core.bundle import load_bundle
    from models.core.tokenizer import train_tokenizer
    tok = train_tokenizer(["a b c d e f g h i j k l m n o p"] * 5, vocab_size=40, min_frequency=1)
    ckpt = root / name
    ckpt.mkdir()
    tok.save(ckpt / "tokenizer.json")
    model = reverser(tok.vocab_size)  # trained: a random model decodes one repeated token
    torch.save({"config": model.cfg.to_dict(), "model": model.state_dict(), "meta": {}}, ckpt / "model.pt")
    assert export_main(["--checkpoint", str(ckpt / "model.pt"), "--out", str(root / "repo"), "--fp16"]) == 0
    return load_bundle(root / "repo" / name / "1")
