"""server/core/chooser.py (token choice over all rows at once) against the per-row code it replaced.

The oracle below is the per-row sampler and beam step as they were before the choice moved into
the engine (git history: server/sampler.py, models/core/beam.py): row by row, float64 tempering,
a partition for top-k, a stable sort for top-p, one running sum over the vocabulary, the full
K x V ranking for beam. The vectorised chooser must give the same greedy and forced tokens,
log-probabilities and beam continuations on every row of a mixed batch; a sampled token may differ
from the float64 oracle's only where the row's draw lies within float32 rounding of a boundary of
the cumulative distribution (the chooser sums in float32 blocks: docs/benchmarks/engine_overhead.md). And every
row chooses the same alone and in any batch. Pure numpy, no model: milliseconds.
"""
from __future__ import annotations

import numpy as np
import pytest

from models.core.beam import BeamState, log_softmax, logsumexp
from server.core.chooser import BEAM, GREEDY, SAMPLE, RowControls, TokenChooser, ngram_bans

pytestmark = pytest.mark.unit  # the fast layer: `make test-fast`

V = 300


# -- the per-row oracle ----------------------------------------------------------------------------
def filter_logits(logits, temperature, top_k, top_p):
    z = logits.astype(np.float64) / temperature
    if 0 < top_k < z.shape[0]:
        kth = np.partition(z, -top_k)[-top_k]
        z = np.where(z < kth, -np.inf, z)
    if 0.0 < top_p < 1.0:
        order = np.argsort(-z, kind="stable")
        probs = np.exp(z[order] - z[order[0]])
        probs /= probs.sum()
        keep = int(np.searchsorted(np.cumsum(probs), top_p)) + 1
        z[order[keep:]] = -np.inf
    return z


def sample_row(logits, temperature, top_k, top_p, u) -> tuple[int, float]:
    """(token, the draw's distance to the nearest boundary of the CDF, relative to its total)."""
    z = filter_logits(logits, temperature, top_k, top_p)
    probs = np.exp(z - z.max())
    cdf = np.cumsum(probs)
    target = u * cdf[-1]
    token = int(min(np.searchsorted(cdf, target, side="right"), len(cdf) - 1))
    return token, float(np.abs(cdf - target).min() / cdf[-1])


def full_vocab_beam(logp, scores, k):
    """The old BeamState ranking: top 2K over the whole K x V matrix -> [(score, parent, token)]."""
    cand = (scores[:, None] + logp).reshape(-1)
    top = np.argpartition(-cand, 2 * k - 1)[: 2 * k]
    top = top[np.argsort(-cand[top], kind="stable")]
    return [(float(cand[i]), *divmod(int(i), logp.shape[1])) for i in top if cand[i] > -np.inf]


def banned_ngrams(history, n):
    """transformers' NoRepeatNGramLogitsProcessor for one row, by rescanning the whole history."""
    length = len(history)
    if length + 1 < n:
        return []
    prefix = history[length - n + 1:] if n > 1 else []
    return [history[i + n - 1] for i in range(length - n + 1) if history[i:i + n - 1] == prefix]


def mixed_batch(rng, b, controls=False):
    """Logits, controls and (with controls) each row's history as the slot cache holds it: (B, T), lengths."""
    logits = (rng.standard_normal((b, V)) * rng.uniform(0.5, 4.0, (b, 1))).astype(np.float32)
    c = RowControls.greedy(b)
    history, lengths = np.zeros((b, 16), np.int64), np.zeros(b, np.int64)
    for i in range(b):
        kind = rng.choice([GREEDY, SAMPLE, SAMPLE, BEAM])
        c.kind[i], c.scored[i] = kind, rng.random() < 0.5
        if kind == SAMPLE:
            c.temperature[i] = rng.choice([0.3, 1.0, 2.5])
            c.top_k[i] = rng.choice([0, 0, 1, 5, 40, V + 10])
            c.top_p[i] = rng.choice([1.0, 0.9, 0.5, 0.01])
            c.noise[i] = rng.random()
        if kind == BEAM:
            c.beam[i] = rng.choice([2, 4])
        if rng.random() < 0.1:
            c.forced[i] = rng.integers(0, V)
        if controls and rng.random() < 0.4:  # decoding controls (checked against transformers elsewhere)
            c.penalty[i], c.no_repeat[i] = rng.choice([1.0, 1.5, 0.7]), rng.choice([0, 1, 2, 3])
            c.ban_unk[i], c.ban_eos[i] = rng.random() < 0.5, rng.random() < 0.5
            lengths[i] = rng.integers(0, 12)
            history[i, :lengths[i]] = rng.integers(0, 20, lengths[i])
    return (logits, c, history, lengths) if controls else (logits, c)


@pytest.mark.parametrize("suppress", [(), (0, 7)])
def test_every_row_chooses_what_the_per_row_code_chose(suppress):
    rng = np.random.default_rng(0)
    chooser = TokenChooser(suppress)
    near_boundary = [0]
    for _ in range(30):
        logits, c = mixed_batch(rng, int(rng.integers(1, 24)))
        raw = logits.copy()
        out = chooser.choose(logits, c)
        masked = raw.copy()
        masked[:, list(suppress)] = -np.inf
        for i in range(len(raw)):
            if c.kind[i] == BEAM:
                continue
            if c.forced[i] >= 0:
                want = int(c.forced[i])
            elif c.kind[i] == GREEDY:
                want = int(masked[i].argmax())
            else:
                want, margin = sample_row(masked[i], c.temperature[i], c.top_k[i], c.top_p[i], c.noise[i])
                if out.token[i] != want:  # only a draw on a boundary, within float32 rounding
                    assert margin < 1e-5, (i, out.token[i], want, margin)
                    want = int(out.token[i])
                    near_boundary[0] += 1
                assert np.isfinite(masked[i, want])  # never a suppressed or filtered-out token
            assert out.token[i] == want, (i, c.kind[i])
            if c.scored[i]:  # log p against the unsuppressed normaliser, as the model gave it
                assert out.logprob[i] == pytest.approx(raw[i, want] - logsumexp(raw[i:i + 1])[0], abs=1e-5)
            assert want not in suppress or c.forced[i] >= 0
    assert near_boundary[0] <= 2


@pytest.mark.parametrize("suppress,renormalize", [((), False), ((0, 7), False), ((0, 7), True)])
def test_beam_candidates_rank_as_the_full_vocabulary_did(suppress, renormalize):
    rng = np.random.default_rng(1)
    chooser = TokenChooser(suppress, renormalize)
    for _ in range(30):
        k = int(rng.choice([2, 3, 4]))
        logits = (rng.standard_normal((k, V)) * 3).astype(np.float32)
        c = RowControls.greedy(k)
        c.kind[:], c.beam[:] = BEAM, k
        raw = logits.copy()
        out = chooser.choose(logits, c)
        # The old per-request log-probs: log_softmax after suppression (renormalised), or against the
        # unsuppressed normaliser.
        masked = raw.copy()
        masked[:, list(suppress)] = -np.inf
        logp = log_softmax(masked) if renormalize or not suppress else \
            masked - np.logaddexp(logsumexp(raw), logsumexp(raw[:, list(suppress)]))[:, None]
        scores = np.sort(rng.standard_normal(k).astype(np.float32))[::-1] * 3
        scores[rng.integers(0, k)] = -np.inf if rng.random() < 0.3 else scores[0]
        want = full_vocab_beam(logp, scores, k)
        ids, lp = out.beam_ids[:, :2 * k], out.beam_logp[:, :2 * k]
        cand = (scores[:, None] + lp).reshape(-1)
        order = np.argsort(-cand, kind="stable")[:2 * k]
        got = [(float(cand[j]), int(j // (2 * k)), int(ids[j // (2 * k), j % (2 * k)])) for j in order
               if cand[j] > -np.inf]
        assert [(p, t) for _, p, t in got] == [(p, t) for _, p, t in want]
        assert np.allclose([s for s, _, _ in got], [s for s, _, _ in want], atol=1e-5)


def test_controls_ban_and_penalise_what_they_name():
    assert banned_ngrams([5, 6, 7, 5, 6], 3) == [7] and banned_ngrams([5, 6, 5], 2) == [6]
    assert banned_ngrams([5, 6], 4) == [] and sorted(banned_ngrams([4, 5, 4], 1)) == [4, 4, 5]
    logits = np.zeros((2, V), np.float32)
    logits[:, 10], logits[:, 11], logits[:, 2], logits[:, 3] = 4.0, -1.0, 9.0, 8.0
    c = RowControls.greedy(2)
    history, lengths = np.array([[1, 10, 11, 10, 1]] * 2), np.array([5, 0])  # repeats: penalised once
    c.penalty[0] = 2.0
    c.ban_eos[:], c.ban_unk[:] = True, True
    out = TokenChooser(eos_id=2, unk_id=3).choose(logits.copy(), c, history, lengths)
    assert out.token.tolist() == [10, 10]  # EOS and unk banned; row 0's 10 halved (2.0) still beats 0
    c.penalty[0] = 5.0  # 4.0 / 5 = 0.8 still beats the zeros; 11 (negative) is pushed further down
    processed = TokenChooser(eos_id=2, unk_id=3)._process(logits[:1].copy(), np.array([0]), np.array([0]), c,
                                                          history, lengths)
    assert processed[0, 10] == pytest.approx(0.8) and processed[0, 11] == pytest.approx(-5.0)
    assert np.isneginf(processed[0, [2, 3]]).all()


def test_ngram_bans_over_rows_equal_a_rescan_of_each_history():
    rng = np.random.default_rng(5)
    for n in range(1, 5):
        for _ in range(20):
            rows = int(rng.integers(1, 9))
            lengths = rng.integers(0, 40, rows)
            history = rng.integers(0, 4, (rows, 40))  # a small alphabet: many repeated n-grams
            r, tokens = ngram_bans(history, lengths, n)
            for i in range(rows):
                got = sorted(tokens[r == i].tolist())
                assert got == sorted(banned_ngrams(history[i, :lengths[i]].tolist(), n)), (n, i)


def test_a_forced_beam_step_has_one_continuation():
    c = RowControls.greedy(3)
    c.kind[:], c.beam[:], c.forced[:] = BEAM, 3, 42
    out = TokenChooser().choose(np.random.default_rng(2).standard_normal((3, V)).astype(np.float32), c)
    assert (out.beam_ids[:, 0] == 42).all() and (out.beam_logp[:, 0] == 0).all()
    assert np.isneginf(out.beam_logp[:, 1:]).all()


def test_a_row_chooses_the_same_alone_and_in_any_batch():
    rng = np.random.default_rng(3)
    logits, c, history, lengths = mixed_batch(rng, 32, controls=True)
    together = TokenChooser((0,), eos_id=2, unk_id=3).choose(logits.copy(), c, history, lengths)
    for i in range(16):
        one = RowControls(*(getattr(c, f)[i:i + 1] for f in RowControls.__dataclass_fields__))
        alone = TokenChooser((0,), eos_id=2, unk_id=3).choose(logits[i:i + 1].copy(), one, history[i:i + 1],
                                                              lengths[i:i + 1])
        assert alone.token[0] == together.token[i] and alone.logprob[0] == together.logprob[i]
        if c.kind[i] == BEAM:
            w = 2 * int(c.beam[i])
            assert (alone.beam_ids[0, :w] == together.beam_ids[i, :w]).all()


def test_beam_state_advance_over_candidates_equals_the_full_vocabulary():
    """models/core/beam.py ranks each row's top 2K: the same search as over K x V (static decoding)."""
    rng = np.random.default_rng(4)
    for _ in range(20):
        a, b = BeamState(3, eos_id=2), BeamState(3, eos_id=2)
        for step in range(12):
            logp = log_softmax(rng.standard_normal((3, V)).astype(np.float32) * 3)
            want = full_vocab_beam(logp, a.scores.copy(), 3)
            pa, ta = a.advance(logp, step, step == 11)
            top = np.argsort(-logp, axis=-1)[:, :6]
            pb, tb = b.advance_candidates(top, np.take_along_axis(logp, top, -1), step, step == 11)
            assert (pa == pb).all() and (ta == tb).all() and a.history == b.history
            if step < 11:  # the live continuations: the full ranking's best non-EOS ones
                live = [(p, t) for _, p, t in want if t != 2][:3]
                assert list(zip(pa.tolist(), ta.tolist()))[:len(live)] == live
            if a.finished:
                break
        assert [(h.tokens, h.score) for h in a.done] == [(h.tokens, h.score) for h in b.done]
