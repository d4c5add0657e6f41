"""Incremental decoding with a KV cache equals full recomputation.

The serving engine runs rows of different ages in one step, with a cache
whose unused positions are masked; these tests build exactly that situation
in PyTorch and demand the same logits (max abs diff <= 1e-5).
"""
import pytest
import torch

from models.core.config import preset
from models.search import greedy
from models.transformer import Transformer, sinusoidal_table
from tests.tiny_models import reverser, varied

VOCAB = 50


def make_model(**overrides):
    torch.manual_seed(0)
    return Transformer(preset("tiny", vocab_size=VOCAB, **overrides)).eval()


def ragged_src(lengths, pad=0):
    torch.manual_seed(1)
    s = max(lengths)
    src = torch.randint(4, VOCAB, (len(lengths), s))
    for i, n in enumerate(lengths):
        src[i, n:] = pad
    return src


VARIANTS = [dict(), dict(pre_norm=False), dict(attention="additive"), dict(local_window=2)]


@pytest.mark.parametrize("overrides", VARIANTS, ids=["prenorm", "postnorm", "additive", "local"])
def test_cached_steps_equal_full_recompute_with_padding(overrides):
    model = make_model(**overrides)
    src = ragged_src([7, 3, 5])
    src_mask = src != 0
    b, t = 3, 6
    tgt = torch.randint(4, VOCAB, (b, t))
    with torch.no_grad():
        cross_k, cross_v = model.cross_kv(model.encode(src, src_mask))
        full = model(src, tgt)  # (B, T, V), teacher forced in one pass
        past_k, past_v, past_mask = model.empty_past(b)
        for step in range(t):
            logits, nk, nv = model.decode_step(tgt[:, step:step + 1], torch.full((b, 1), step),
                                               past_k, past_v, past_mask, cross_k, cross_v, src_mask)
            assert (logits[:, 0] - full[:, step]).abs().max() <= 1e-5
            past_k, past_v = torch.cat([past_k, nk], 3), torch.cat([past_v, nv], 3)
            past_mask = torch.cat([past_mask, torch.ones(b, 1, dtype=torch.bool)], 1)


def test_rows_at_different_positions_share_one_step():
    """Continuous batching: each row has its own age and a cache with holes at the end."""
    model = make_model()
    lengths = [6, 2, 4]
    ages = [5, 1, 3]  # tokens already decoded per row
    src = ragged_src(lengths)
    src_mask = src != 0
    torch.manual_seed(2)
    tgts = [torch.randint(4, VOCAB, (a + 1,)) for a in ages]
    cap = max(ages)
    L, H, Dh = model.cfg.n_dec_layers, model.cfg.n_heads, model.cfg.head_dim
    cache_k = torch.randn(L, 3, H, cap, Dh) * 7  # garbage in unused positions must not matter
    cache_v = torch.randn(L, 3, H, cap, Dh) * 7
    past_mask = torch.zeros(3, cap, dtype=torch.bool)
    with torch.no_grad():
        cross_k, cross_v = model.cross_kv(model.encode(src, src_mask))
        expected = []
        for i, a in enumerate(ages):
            # Per row, alone: teacher-force its prefix, keep its cache.
            row = slice(i, i + 1)
            logits, k, v = model.decode_step(tgts[i][None, :a], torch.arange(a)[None],
                                             *model.empty_past(1), cross_k[:, row], cross_v[:, row],
                                             src_mask[row])
            cache_k[:, i, :, :a], cache_v[:, i, :, :a] = k[:, 0], v[:, 0]
            past_mask[i, :a] = True
            full = model(src[row], tgts[i][None])
            expected.append(full[0, a])
        tokens = torch.tensor([[tgts[i][a]] for i, a in enumerate(ages)])
        positions = torch.tensor([[a] for a in ages])
        logits, _, _ = model.decode_step(tokens, positions, cache_k, cache_v, past_mask,
                                         cross_k, cross_v, src_mask)
    for i in range(3):
        assert (logits[i, 0] - expected[i]).abs().max() <= 1e-5


# Token-level checks on a trained model (tests/tiny_models.py): a random one decodes one repeated
# token, which a broken cache or a batch leak would decode just the same.
def test_greedy_with_cache_equals_recompute_tokens():
    model = reverser(VOCAB)
    src = ragged_src([8, 5, 3, 6])
    cached = greedy(model, src, max_len=12, use_cache=True)
    assert varied(cached) and cached == greedy(model, src, max_len=12, use_cache=False)


def test_batched_greedy_equals_one_at_a_time():
    model = reverser(VOCAB)
    lengths = [8, 5, 3, 6]
    src = ragged_src(lengths)
    batched = greedy(model, src, max_len=12)
    single = [greedy(model, src[i:i + 1, :n], max_len=12)[0] for i, n in enumerate(lengths)]
    assert varied(batched) and batched == single


def test_sinusoidal_positions_are_per_row():
    table = sinusoidal_table(torch.arange(10), 8)
    rows = sinusoidal_table(torch.tensor([[3], [7]]), 8)
    assert torch.equal(rows[0, 0], table[3]) and torch.equal(rows[1, 0], table[7])
    assert torch.allclose(table[0], torch.tensor([0.0] * 4 + [1.0] * 4))
