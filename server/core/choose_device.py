"""Greedy choice where the logits are: on a CUDA device, only each row's token id and log-probability
cross the bus.

Measured problem (docs/benchmarks/gpu/README.md, an H200): copying the logits to the host and choosing
there took 374 µs for 64 rows of the shipped 8,000-token vocabulary and 20.5 ms for 256 rows of an
OPUS-MT 58,101-token one, against 29-40 µs for ArgMax on the device. On the CPU the logits are already
where numpy works (docs/benchmarks/choice_ops.md: numpy beat ArgMax in ONNX Runtime there), so the engine
takes this path only for logits in device memory (server/core/engine.py).

Design: the common step, every row plain greedy (no decoding controls, no alternatives, no glossary
bonus, nothing suppressed; forced tokens and scored rows allowed), is chosen by the array module of the
logits (CuPy on the device, numpy in the tests), by TokenChooser's own rules: the first best token, the
forced token where there is one, log p = logit - logsumexp of the raw row. Anything else, and any row
whose best score is not finite (NaN, +inf: the chooser's failed rows; all -inf: its EOS rule), returns
None and the engine hands the logits to TokenChooser on the host, so every rule stays in one place.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from models.core.device_arrays import array_module, to_host
from server.core.choose import GREEDY, Choices, RowControls


def plain_greedy(c: RowControls, suppress: list[int]) -> bool:
    """Every row greedy and nothing to apply to its logits first."""
    return not suppress and bool((c.kind == GREEDY).all() and (c.rank == 0).all() and (c.penalty == 1.0).all()
                                 and (c.no_repeat == 0).all() and not c.ban_unk.any() and not c.ban_eos.any()
                                 and (c.boost < 0).all())


def choose_where_they_are(logits: Any, c: RowControls) -> Optional[Choices]:
    """logits (B, V) on the host or a device -> Choices, or None when a row needs the host's rules."""
    xp = array_module(logits)
    top = logits.max(axis=-1)  # (B,): NaN propagates, +inf and all -inf show
    if not bool(xp.isfinite(top).all()):
        return None
    b = len(logits)
    token = to_host(logits.argmax(axis=-1)).astype(np.int64)  # the first best, as numpy's argmax
    forced = np.flatnonzero(c.forced >= 0)
    token[forced] = c.forced[forced]
    logprob = np.zeros(b, np.float32)
    scored = np.flatnonzero(c.scored)
    if len(scored):
        rows = xp.asarray(scored)
        x = logits[rows].astype(xp.float32)  # (S, V)
        peak = x.max(axis=-1)
        lse = peak + xp.log(xp.exp(x - peak[:, None]).sum(axis=-1))
        picked = x[xp.arange(len(scored)), xp.asarray(token[scored])]
        logprob[scored] = to_host(picked - lse)
    return Choices(token, logprob, np.zeros((b, 0), np.int64), np.full((b, 0), -np.inf, np.float32))
