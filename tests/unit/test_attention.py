"""Masks and attention against PyTorch's reference implementation."""
import pytest
import torch
import torch.nn.functional as F

from models.attention import (MultiHeadAttention, causal_mask, local_window_mask, masked_softmax,
                              padding_mask, scaled_dot_product_attention)

pytestmark = pytest.mark.unit  # the fast layer: `make test-fast`


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_padding_and_causal_masks():
    ids = torch.tensor([[5, 6, 0], [7, 0, 0]])
    assert padding_mask(ids, 0).tolist() == [[True, True, False], [True, False, False]]
    assert causal_mask(3).tolist() == [[True, False, False], [True, True, False], [True, True, True]]


def test_local_window_mask_is_a_band():
    m = local_window_mask(6, 2)
    for i in range(6):
        for j in range(6):
            assert bool(m[i, j]) == (abs(i - j) <= 2)


@pytest.mark.parametrize("kind", ["padding", "causal", "both"])
def test_sdpa_matches_torch_reference(kind):
    b, h, t, d = 3, 4, 7, 16
    q, k, v = (torch.randn(b, h, t, d) for _ in range(3))
    lengths = torch.tensor([7, 4, 2])
    pad = (torch.arange(t)[None, :] < lengths[:, None])[:, None, None, :]  # (B, 1, 1, T)
    mask = {"padding": pad, "causal": causal_mask(t)[None, None], "both": pad & causal_mask(t)}[kind]
    ours = scaled_dot_product_attention(q, k, v, mask)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask.expand(b, h, t, t))
    assert torch.allclose(ours, ref, atol=1e-6), (ours - ref).abs().max()


def test_masked_positions_get_exactly_zero_weight():
    scores = torch.randn(2, 1, 3, 5) * 50  # large scores: the mask must still win exactly
    mask = torch.tensor([True, False, True, False, False])[None, None, None, :]
    w = masked_softmax(scores, mask)
    assert (w[..., ~mask[0, 0, 0]] == 0).all()
    assert torch.allclose(w.sum(-1), torch.ones(2, 1, 3))


def test_fully_masked_row_yields_zeros_not_nan():
    q, k, v = (torch.randn(2, 2, 3, 8) for _ in range(3))
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool)
    mask[1, :, 2, :] = False  # row 2 of item 1 sees nothing
    mask[0] = False  # item 0 sees nothing at all
    out = scaled_dot_product_attention(q, k, v, mask)
    assert not torch.isnan(out).any()
    assert (out[0] == 0).all() and (out[1, :, 2] == 0).all()
    assert (out[1, :, :2].abs() > 0).any()
    # The gradient through a fully masked row is finite too (training on padded batches).
    q.requires_grad_(True)
    scaled_dot_product_attention(q, k, v, mask).sum().backward()
    assert torch.isfinite(q.grad).all()


@pytest.mark.parametrize("kind", ["dot", "additive"])
def test_multi_head_attention_respects_key_padding(kind):
    mha = MultiHeadAttention(32, 4, kind=kind).eval()
    x = torch.randn(2, 5, 32)
    mem = torch.randn(2, 6, 32)
    mask = torch.tensor([[True] * 6, [True] * 3 + [False] * 3])[:, None, None, :]
    out = mha(x, mem, mask)
    assert out.shape == (2, 5, 32)
    # Changing masked keys must not change the output at all.
    mem2 = mem.clone()
    mem2[1, 3:] = torch.randn(3, 32) * 100
    assert torch.equal(mha(x, mem2, mask)[1], out[1])
    # ... and changing a visible key must.
    mem3 = mem.clone()
    mem3[1, 0] += 1.0
    assert not torch.allclose(mha(x, mem3, mask)[1], out[1])


def test_multi_head_dot_matches_torch_multihead_attention():
    d, h = 32, 4
    ours = MultiHeadAttention(d, h).eval()
    ref = torch.nn.MultiheadAttention(d, h, batch_first=True).eval()
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
        ref.out_proj.weight.copy_(ours.out_proj.weight)
        ref.out_proj.bias.copy_(ours.out_proj.bias)
    x, mem = torch.randn(3, 4, d), torch.randn(3, 6, d)
    keep = torch.tensor([[True] * 6, [True] * 4 + [False] * 2, [True] + [False] * 5])
    got = ours(x, mem, keep[:, None, None, :])
    want, _ = ref(x, mem, mem, key_padding_mask=~keep, need_weights=False)
    assert torch.allclose(got, want, atol=1e-5)


def test_additive_scores_are_bahdanau():
    from models.attention import additive_scores
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)
    v_a = torch.randn(2, 4)
    s = additive_scores(q, k, v_a)
    i, j, head = 2, 4, 1
    assert torch.allclose(s[0, head, i, j], (torch.tanh(q[0, head, i] + k[0, head, j]) * v_a[head]).sum())
