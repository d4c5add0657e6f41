"""The greedy lane: plain greedy rows chosen in one argmax pass where the logits are, host or device.

Measured problems, one per place the logits can be:
  * on the host, the full chooser (server/core/chooser.py) makes several passes over the logits and builds
    per-row controls even when every row is plain greedy, the common step (python -m
    benchmarks.engine_overhead, with this lane and the engine thread's batched histograms, one commit:
    Python per step 0.32-0.34 -> 0.17 ms at 1 row, 1.02-1.09 -> 0.79-0.80 at 32; docs/serving_speed.md);
  * on a CUDA device, copying the logits to the host and choosing there took 374 µs for 64 rows of the
    shipped 8,000-token vocabulary and 20.5 ms for 256 rows of an OPUS-MT 58,101-token one, against 29-40
    µs for an argmax on the device (docs/benchmarks/gpu/README.md, an H200): there only ids and scores
    should cross the bus.

Design: one function for both, in the array module of the logits (numpy on the host, CuPy on a device),
by TokenChooser's own rules: the first best token, the forced token where there is one, log p = logit -
logsumexp of the raw row. It never writes the logits. Whatever those rules would treat specially is
handed back (None) and the full chooser decides, so every rule stays in one place:
  * a row whose best score is not finite (NaN or +inf: the chooser fails the row; all -inf: its EOS rule);
  * a best token the model suppresses (suppression only lowers other entries, so an unsuppressed best is
    the chooser's first best too: it was first among the raw scores and nothing before it ties);
  * a scored row while the model suppresses tokens (the chooser's log p is over what is left).
The scheduler says "every row plain greedy, nothing forced or scored" with controls None (its common
step, Scheduler.controls); controls that need more than `plain` checks are the chooser's. On the host the
engine takes the lane only for None: a request's scores must not depend on which lane its batch took.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from models.core.device_arrays import array_module, to_host
from server.core.chooser import GREEDY, Choices, RowControls


def plain(c: RowControls) -> bool:
    """Every row greedy with nothing to apply to its logits first (forced and scored rows allowed)."""
    return bool((c.kind == GREEDY).all() and (c.rank == 0).all() and (c.penalty == 1.0).all()
                and (c.no_repeat == 0).all() and not c.ban_unk.any() and not c.ban_eos.any()
                and (c.boost < 0).all())


def choose_greedy(logits: Any, c: Optional[RowControls], suppress: Sequence[int]) -> Optional[Choices]:
    """logits (B, V), host or device; c None (every row plain, nothing forced or scored) or `plain` ->
    each row's choice, or None when a row needs the full chooser's rules (module docstring)."""
    xp = array_module(logits)
    b = len(logits)
    best = logits.argmax(axis=-1)  # (B,): the first best
    # numpy's argmax returns a NaN's index, so the gathered best shows a NaN as +inf and all -inf do; CuPy
    # does not document that, so a device takes the row maximum (NaN propagates), one more pass there.
    top = logits[np.arange(b), best] if xp is np else logits.max(axis=-1)
    if not bool(xp.isfinite(top).all()):
        return None
    token = to_host(best).astype(np.int64, copy=False)  # argmax's own new array (or its host copy): ours to write
    if len(suppress) and np.isin(token, suppress).any():
        return None
    logprob = np.zeros(b, np.float32)
    if c is not None:
        forced = np.flatnonzero(c.forced >= 0)
        token[forced] = c.forced[forced]
        scored = np.flatnonzero(c.scored)
        if len(scored):
            if len(suppress):
                return None
            rows = xp.asarray(scored)
            x = logits[rows].astype(xp.float32)  # (S, V)
            peak = x.max(axis=-1)
            lse = peak + xp.log(xp.exp(x - peak[:, None]).sum(axis=-1))
            picked = x[xp.arange(len(scored)), xp.asarray(token[scored])]
            logprob[scored] = to_host(picked - lse)
    return Choices(token, logprob, np.zeros((b, 0), np.int64), np.zeros((b, 0), np.float32))
