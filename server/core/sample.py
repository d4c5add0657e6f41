"""Sampling rows' token choice: tempered, top-k / top-p filtered, inverse-CDF over each row's own draw.

Total over every setting admission accepts (temperature in (0, 100], top-k >= 0, top-p in [0, 1])
and every score a row can hold after the decoding controls (finite, -inf for a banned token, +inf
where a repetition penalty near 0 divided a positive logit; NaN never reaches here: the chooser
replaced it). The rules, in the order they act:

  * a row with no token left (every score -inf)            -> `eos_id`
  * tempering is (x - max) / T: the best token keeps mass 1 whatever T is, so no temperature can
    make a row's mass underflow to nothing (1e-45 did: x / T overflowed and every exp was 0, and the
    fallback search found no token -- issue 33). T below float32's smallest normal acts as that
    value (the division is float32; a smaller T chooses the same, the best tokens only).
  * +inf scores share the row's mass equally and everything else gets none.
  * a drawn token with no mass (float32 rounding at a block's end) -> the nearest token with mass
    below it, else the row's best token.

The draw is located in two levels (which block of 64 tokens, then which token in it): a running sum
over the whole vocabulary, row by row, was most of the cost (docs/benchmarks/engine_overhead.md).
A row's result depends on its own scores, settings and draw only: batch-invariant.
"""
from __future__ import annotations

import numpy as np

_BLOCK = 64  # tokens per block of the two-level inverse-CDF search
_TINY = np.float32(np.finfo(np.float32).tiny)  # the smallest normal float32: the floor of a temperature


def temper(scores: np.ndarray, best: np.ndarray, temperature: np.ndarray) -> np.ndarray:
    """(n, V) scores and each row's best score (n,) -> (n, V) float32 log-weights with each row's best at 0
    (rows with no finite best left as they are: the caller answers them first). +inf scores become 0,
    everything else -inf."""
    t = np.maximum(temperature.astype(np.float32), _TINY)[:, None]
    with np.errstate(over="ignore", invalid="ignore"):
        z = (scores - best[:, None]) / t  # inf - inf (a +inf best) is NaN: one of the best tokens
    z[np.isnan(z)] = 0.0
    return z


def top_k_filter(z: np.ndarray, top_k: np.ndarray) -> None:
    """Keep each row's k best (ties at the k-th kept too), in place; k = 0 or >= V is off."""
    vocab = z.shape[1]
    for k in np.unique(top_k[(top_k > 0) & (top_k < vocab)]):  # one partition per distinct k
        group = np.flatnonzero(top_k == k)
        kth = np.partition(z[group], vocab - k, axis=-1)[:, vocab - k]
        z[group] = np.where(z[group] < kth[:, None], -np.inf, z[group])


def top_p_filter(z: np.ndarray, top_p: np.ndarray) -> None:
    """Keep the smallest prefix of each row's ranking whose mass reaches p (at least one token), in
    place; p of 0 or 1 is off. The best token has weight 1, so the mass is never 0."""
    nucleus = np.flatnonzero((top_p > 0.0) & (top_p < 1.0))
    if not len(nucleus):
        return
    vocab = z.shape[1]
    zs = z[nucleus]
    order = np.argsort(-zs, axis=-1, kind="stable")
    ranked = np.take_along_axis(zs, order, axis=-1)
    probs = np.exp(ranked - ranked[:, :1])
    probs /= probs.sum(axis=-1, keepdims=True)
    keep = (np.cumsum(probs, axis=-1) < top_p[nucleus, None]).sum(axis=-1) + 1
    cut = np.arange(vocab)[None, :] >= keep[:, None]  # (m, V) in ranked order
    np.put_along_axis(zs, order, np.where(cut, -np.inf, ranked), axis=-1)
    z[nucleus] = zs


def draw(z: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """Inverse CDF of exp(z) at each row's uniform draw in [0, 1): (n,) token ids. Each row's best
    is 0 (weight 1), so every row has mass."""
    n, vocab = z.shape
    probs = np.exp(z)  # (n, V) float32, in (0, 1]
    pad = -vocab % _BLOCK
    if pad:
        probs = np.concatenate([probs, np.zeros((n, pad), np.float32)], axis=-1)
    blocks = probs.reshape(n, -1, _BLOCK).sum(axis=-1, dtype=np.float64)  # (n, V / 64)
    ends = np.cumsum(blocks, axis=-1)
    target = np.clip(noise, 0.0, 1.0) * ends[:, -1]  # where the draw falls in the row's total mass
    j = np.minimum((ends <= target[:, None]).sum(axis=-1), ends.shape[1] - 1)  # its block
    before = np.where(j > 0, np.take_along_axis(ends, np.maximum(j - 1, 0)[:, None], -1)[:, 0], 0.0)
    inside = np.take_along_axis(probs.reshape(n, -1, _BLOCK), j[:, None, None], 1)[:, 0]  # (n, 64)
    at = (np.cumsum(inside, axis=-1, dtype=np.float64) <= (target - before)[:, None]).sum(axis=-1)
    drawn = np.minimum(j * _BLOCK + np.minimum(at, _BLOCK - 1), vocab - 1)
    for i in np.flatnonzero(probs[np.arange(n), drawn] == 0):  # rounding at a block's end: rare
        below = np.flatnonzero(probs[i, :drawn[i] + 1] > 0)
        drawn[i] = below[-1] if len(below) else int(z[i].argmax())
    return drawn


def sample(scores: np.ndarray, temperature: np.ndarray, top_k: np.ndarray, top_p: np.ndarray,
           noise: np.ndarray, eos_id: int) -> np.ndarray:
    """(n, V) scores of sampling rows (not changed) -> (n,) chosen tokens, by the rules above."""
    tokens = np.full(len(scores), eos_id, np.int64)
    best = scores.max(axis=-1)  # (n,): tempering's reference, and whether a row has a token left
    alive = np.flatnonzero(best > -np.inf)
    if not len(alive):
        return tokens
    every = len(alive) == len(scores)
    z = temper(scores if every else scores[alive], best[alive], temperature[alive])
    top_k_filter(z, top_k[alive])
    top_p_filter(z, top_p[alive])
    tokens[alive] = draw(z, noise[alive])
    return tokens
