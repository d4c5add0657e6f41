"""Attention: masks, scoring functions and multi-head attention.

Mask convention everywhere in this project: a boolean tensor where True means
"this query may attend to this key". Masks broadcast to (B, H, Tq, Tk).

A masked position gets exactly zero weight, and a query row whose keys are all
masked yields a zero vector, never NaN: the engine runs batches in which some
cache positions (or whole padded rows) are empty, and a NaN there would poison
the rest of the batch through later matmuls.
"""
from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """(B, T) ids -> (B, T) bool, True on real tokens."""
    return ids != pad_id


def causal_mask(size: int, device: Optional[torch.device] = None) -> Tensor:
    """(T, T) bool, True where key j <= query i (no look-ahead)."""
    return torch.ones(size, size, dtype=torch.bool, device=device).tril()


def local_window_mask(size: int, window: int, device: Optional[torch.device] = None) -> Tensor:
    """(T, T) bool, True where |i - j| <= window: truncated self-attention as a mask."""
    idx = torch.arange(size, device=device)
    return (idx[:, None] - idx[None, :]).abs() <= window


def masked_softmax(scores: Tensor, mask: Optional[Tensor]) -> Tensor:
    """Softmax over the last axis with exact zeros where mask is False.

    Filling with the dtype's most negative finite value (not -inf) keeps the
    graph NaN-free when a whole row is masked; the final `where` turns that
    row's uniform weights into zeros.
    """
    if mask is None:
        return scores.softmax(dim=-1)
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = scores.softmax(dim=-1)
    return torch.where(mask, weights, torch.zeros((), dtype=weights.dtype, device=weights.device))


def dot_product_scores(q: Tensor, k: Tensor) -> Tensor:
    """q (B, H, Tq, Dh), k (B, H, Tk, Dh) -> (B, H, Tq, Tk), scaled by 1/sqrt(Dh)."""
    return torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.size(-1))


def additive_scores(q: Tensor, k: Tensor, v_a: Tensor) -> Tensor:
    """Bahdanau scoring v_a . tanh(q + k) per head.

    q (B, H, Tq, Dh), k (B, H, Tk, Dh) are already projected (the W_a / U_a of
    the paper are the multi-head input projections); v_a is (H, Dh).
    """
    hidden = torch.tanh(q.unsqueeze(-2) + k.unsqueeze(-3))  # (B, H, Tq, Tk, Dh)
    return torch.einsum("bhqkd,hd->bhqk", hidden, v_a)  # (B, H, Tq, Tk)


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor] = None,
                                 dropout_p: float = 0.0, training: bool = False) -> Tensor:
    """The reference-checked core: softmax(q k^T / sqrt(Dh)) v with a boolean mask."""
    weights = masked_softmax(dot_product_scores(q, k), mask)
    if dropout_p > 0.0 and training:
        weights = F.dropout(weights, p=dropout_p)
    return torch.matmul(weights, v)  # (B, H, Tq, Dh)


class MultiHeadAttention(nn.Module):
    """Multi-head attention split into phases the KV cache needs.

    `project_kv` turns key/value inputs into per-head tensors once (cross
    attention is projected once per sequence; self attention once per new
    token); `attend` runs the queries against whatever keys/values the caller
    assembled (cache + new step).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, kind: str = "dot"):
        super().__init__()
        assert d_model % n_heads == 0
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.kind = kind
        self.dropout = dropout
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.out_proj = nn.Linear(d_model, d_model)
        if kind == "additive":
            self.v_a = nn.Parameter(torch.randn(n_heads, self.head_dim) / math.sqrt(self.head_dim))
        elif kind != "dot":
            raise ValueError(f"unknown attention kind {kind!r}")

    def split_heads(self, x: Tensor) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, Dh)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x (B, T, D) -> keys, values (B, H, T, Dh)."""
        return self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))

    def attend(self, x: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor]) -> Tensor:
        """x (B, Tq, D) queries against k, v (B, H, Tk, Dh) -> (B, Tq, D)."""
        q = self.split_heads(self.q_proj(x))  # (B, H, Tq, Dh)
        if self.kind == "dot":
            out = scaled_dot_product_attention(q, k, v, mask, self.dropout, self.training)
        else:
            weights = masked_softmax(additive_scores(q, k, self.v_a), mask)
            if self.dropout > 0.0 and self.training:
                weights = F.dropout(weights, p=self.dropout)
            out = torch.matmul(weights, v)  # (B, H, Tq, Dh)
        b, _, tq, _ = out.shape
        out = out.transpose(1, 2).reshape(b, tq, self.n_heads * self.head_dim)  # (B, Tq, D)
        return self.out_proj(out)

    def forward(self, x: Tensor, memory: Tensor, mask: Optional[Tensor]) -> Tensor:
        k, v = self.project_kv(memory)
        return self.attend(x, k, v, mask)
