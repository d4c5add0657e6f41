"""Next-token choice for non-beam rows: greedy, or temperature / top-k / top-p sampling.

Every sampling row owns a numpy Generator seeded from (request seed,
hypothesis index) and draws exactly one number per step, so a seeded request
gives the same output whatever else shares its batch.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from server.request import DecodingParams


def make_rng(seed: Optional[int], hypothesis: int) -> np.random.Generator:
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([seed, hypothesis])


def filter_logits(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """(V,) logits -> tempered logits with everything outside top-k / the top-p nucleus at -inf."""
    z = logits.astype(np.float64) / temperature
    if 0 < top_k < z.shape[0]:
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z < kth, -np.inf, z)
    if 0.0 < top_p < 1.0:
        order = np.argsort(-z, kind="stable")
        probs = np.exp(z[order] - z[order[0]])
        probs /= probs.sum()
        # Keep the smallest prefix whose mass reaches top_p (always at least one token).
        keep = int(np.searchsorted(np.cumsum(probs), top_p)) + 1
        z[order[keep:]] = -np.inf
    return z


def sample_token(logits: np.ndarray, params: DecodingParams, rng: np.random.Generator) -> int:
    z = filter_logits(logits, params.temperature, params.top_k, params.top_p)
    probs = np.exp(z - z.max())
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(cdf) - 1))

