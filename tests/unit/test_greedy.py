"""The greedy lane where the logits are (server/core/greedy.py) chooses exactly as TokenChooser.

On a device the array module is CuPy; here it is numpy, the same code: the tokens must equal the host
chooser's and the log-probabilities agree to float32 rounding, and every case the lane does not cover
must be handed back (None, or `plain` False) rather than chosen by other rules. (Without controls, the
host engine's common step, tests/unit/test_choice_total.py holds it to `choose` over adversarial scores.)
"""
from __future__ import annotations

import numpy as np
import pytest

from server.core.chooser import SAMPLE, RowControls, TokenChooser
from server.core.greedy import choose_greedy, plain

B, V = 48, 300


def controls(rng: np.random.Generator) -> RowControls:
    c = RowControls.greedy(B)
    c.forced[rng.random(B) < 0.2] = 7  # a language token, EOS at the limit
    c.scored[:] = rng.random(B) < 0.5
    return c


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_plain_greedy_rows_choose_as_the_host_chooser(dtype):
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal((B, V)) * 4).astype(dtype)
    logits[3, [5, 9]] = logits[3].max() + 1  # a tie: the first best, as numpy's argmax
    logits[4, :] = -np.inf
    logits[4, 11] = 0.0  # one token left
    c = controls(rng)
    assert plain(c)
    got = choose_greedy(logits, c, [])
    want = TokenChooser().choose(logits.astype(np.float32), c)
    assert got is not None and got.token[3] == 5 and got.token[4] == 11
    np.testing.assert_array_equal(got.token, want.token)
    np.testing.assert_allclose(got.logprob, want.logprob, rtol=0, atol=1e-5)
    assert got.beam_ids.shape == (B, 0) and got.failed is None


@pytest.mark.parametrize("bad", [np.nan, np.inf, "all -inf"])
def test_a_row_the_host_rules_decide_is_handed_back(bad):
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((B, V)).astype(np.float32)
    if bad == "all -inf":
        logits[7, :] = -np.inf  # the chooser's rule: EOS
    else:
        logits[7, 3] = bad  # the chooser's rule: the row fails alone
    assert choose_greedy(logits, controls(rng), []) is None


@pytest.mark.parametrize("change", ["sample", "penalty", "no_repeat", "ban_unk", "ban_eos", "rank", "boost"])
def test_anything_beyond_plain_greedy_goes_to_the_host(change):
    c = RowControls.greedy(B)
    if change == "sample":
        c.kind[2] = SAMPLE
    elif change == "penalty":
        c.penalty[2] = 1.2
    elif change == "no_repeat":
        c.no_repeat[2] = 3
    elif change in ("ban_unk", "ban_eos"):
        getattr(c, change)[2] = True
    elif change == "rank":
        c.rank[2] = 1
    else:
        c.boost = np.full((B, 1), -1, np.int64)
        c.boost[2, 0] = 42
    assert not plain(c)


def test_suppressed_tokens_hand_back_only_a_suppressed_best_or_a_score():
    """With tokens suppressed the lane still chooses every row whose best is not one of them (the chooser's
    first best too), forced rows included; a suppressed best, or a scored row (its log p would be over
    what suppression leaves), goes to the host."""
    rng = np.random.default_rng(2)
    suppress = [0, 5]
    logits = rng.standard_normal((B, V)).astype(np.float32)
    logits[:, suppress] = -1.0  # never the best ...
    logits[9, 5] = 50.0  # ... but here
    c = RowControls.greedy(B)
    c.forced[[1, 9]] = 7
    assert choose_greedy(logits, c, suppress) is None
    logits[9, 5] = -1.0
    got = choose_greedy(logits, c, suppress)
    want = TokenChooser(tuple(suppress)).choose(logits.copy(), c)
    assert got is not None and got.token[1] == got.token[9] == 7
    np.testing.assert_array_equal(got.token, want.token)
    c.scored[3] = True
    assert choose_greedy(logits, c, suppress) is None
    assert choose_greedy(logits, c, []) is not None
