"""A tiny model learns to reverse sequences in seconds, with exact greedy and beam output.

This is the end-to-end check of the training math (collate, shifted targets,
label smoothing, masks) and of both search procedures.
"""
import random

import pytest
import torch

from models.core.config import preset
from models.search import beam_search, greedy
from models.train import collate, inverse_sqrt, loss_fn
from models.transformer import Transformer

SYMBOLS = list(range(4, 14))  # ten real tokens after the four specials


def sample(rng, n):
    out = []
    for _ in range(n):
        x = [rng.choice(SYMBOLS) for _ in range(rng.randint(2, 7))]
        out.append((x + [2], x[::-1] + [2]))
    return out


def pad(seqs):
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [0] * (width - len(s)) for s in seqs])


@pytest.fixture(scope="module")
def reverser():
    torch.manual_seed(0)
    rng = random.Random(0)
    model = Transformer(preset("tiny", vocab_size=14, dropout=0.0, attn_dropout=0.0))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: inverse_sqrt(s, 50))
    model.train()
    for _ in range(400):
        src, tgt_in, tgt_out = collate(sample(rng, 64), pad_id=0, bos_id=1)
        loss = loss_fn(model(src, tgt_in), tgt_out, 0, 0.05) / (tgt_out != 0).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return model.eval()


def test_greedy_output_is_exact(reverser):
    tests = sample(random.Random(123), 50)
    hyps = greedy(reverser, pad([x for x, _ in tests]), max_len=10)
    assert hyps == [y[:-1] for _, y in tests]


def test_beam_output_is_exact_and_scored(reverser):
    tests = sample(random.Random(7), 20)
    results = beam_search(reverser, pad([x for x, _ in tests]), beam=4, n_best=2, max_len=10)
    for (_, y), hyps in zip(tests, results):
        assert hyps[0].tokens == y[:-1]
        assert len(hyps) == 2 and hyps[0].score >= hyps[1].score and hyps[0].tokens != hyps[1].tokens


def test_beam_of_one_is_greedy(reverser):
    torch.manual_seed(3)
    src = torch.randint(4, 14, (6, 5))  # includes inputs the model never saw
    beams = [h[0].tokens for h in beam_search(reverser, src, beam=1, max_len=8)]
    assert beams == greedy(reverser, src, max_len=8)
