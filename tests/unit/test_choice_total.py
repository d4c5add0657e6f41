"""Token choice is total and one request never fails another (issue 33).

An outside soak found that a `temperature` of 1e-45, which admission accepts, made the sampler raise
(every token's tempered mass underflowed to zero and the fallback found no token), and the engine
then failed every request in the batch. These tests hold server/core/chooser.py to its stated rules
over the whole accepted range of every setting and adversarial scores (NaN, +-inf, every token
banned), with hypothesis drawing the cases:

  * every row gets a token in the vocabulary (beam rows: a first continuation with a finite
    log-probability), and choice never raises;
  * exactly the rows whose scores hold NaN or +inf are `failed`;
  * no row takes a suppressed or banned-unknown token unless it has nothing left (then EOS);
  * a row chooses the same alone as in the batch (batch invariance).

Then the engine core (the scripted runtime of test_engine_core_scripted.py): requests with extreme
settings beside ordinary ones leave the ordinary outputs exactly as they are without them; a row
with NaN scores fails alone; a choice that raises for one request fails that request alone.
Checked against the code before the fix: the sampling cases raise IndexError there.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server.core.chooser import BEAM, GREEDY, SAMPLE, RowControls, TokenChooser
from server.core.errors import Internal
from server.core.greedy import choose_greedy
from server.core.request import FinishEvent
from tests.unit.test_engine_core_scripted import EOS, UNK, Bench, ScriptedRuntime, says

pytestmark = pytest.mark.unit

V = 70  # a vocabulary that is not a multiple of the sampler's 64-token blocks
SUPPRESS = (0,)
MAX_BEAM = 8  # the largest --max-beam-size a test server runs with

# Every temperature admission accepts, (0, 100], weighted to the edges that broke: the smallest
# positive float64, subnormal and smallest-normal float32, and the largest.
temperatures = st.one_of(st.sampled_from([5e-324, 1e-45, 1e-40, 1.17549435e-38, 1e-38, 1e-30, 1e-7, 100.0]),
                         st.floats(min_value=5e-324, max_value=100.0, allow_nan=False, allow_infinity=False))
penalties = st.one_of(st.sampled_from([5e-324, 1e-300, 1e-38, 1.0, 10.0]),
                      st.floats(min_value=5e-324, max_value=10.0, allow_nan=False))
# Scores a model could hand over: ordinary, huge, -inf (masked), +inf and NaN (broken).
scores = st.one_of(st.floats(-30.0, 30.0, width=32), st.sampled_from([np.nan, np.inf, -np.inf, 3e38, -3e38]))


@st.composite
def rows(draw):
    """One row's logits and settings, across every kind of choice and control."""
    style = draw(st.sampled_from(["normal", "normal", "all_banned", "one_left", "adversarial", "ties"]))
    logits = np.asarray(draw(st.lists(st.floats(-30.0, 30.0, width=32), min_size=V, max_size=V)), np.float32)
    if style == "all_banned":
        logits[:] = -np.inf
    elif style == "one_left":
        logits[:] = -np.inf
        logits[draw(st.integers(0, V - 1))] = draw(st.floats(-30.0, 30.0, width=32))
    elif style == "adversarial":
        for at in draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=8)):
            logits[at] = draw(scores)
    elif style == "ties":
        logits[:] = draw(st.floats(-30.0, 30.0, width=32))
    kind = draw(st.sampled_from([GREEDY, SAMPLE, BEAM]))
    s = dict(kind=kind, forced=-1, scored=draw(st.booleans()), temperature=1.0, top_k=0, top_p=1.0,
             noise=draw(st.floats(0.0, 1.0, exclude_max=True)), beam=0,
             penalty=draw(st.one_of(st.just(1.0), penalties)), no_repeat=draw(st.integers(0, 10)),
             ban_unk=draw(st.booleans()), ban_eos=draw(st.booleans()), rank=0)
    if kind == SAMPLE:
        s.update(temperature=draw(temperatures), top_k=draw(st.integers(0, V + 10)),
                 top_p=draw(st.one_of(st.sampled_from([0.0, 1e-9, 1.0]), st.floats(0.0, 1.0))))
    elif kind == BEAM:
        s["beam"] = draw(st.integers(1, MAX_BEAM))
    elif draw(st.booleans()):
        s["rank"] = draw(st.integers(0, 8))
    if draw(st.integers(0, 9)) == 0:
        s["forced"] = draw(st.integers(0, V - 1))
    history = draw(st.lists(st.integers(0, 12), max_size=12))
    return logits, s, history


def batch_of(drawn):
    b = len(drawn)
    c = RowControls.greedy(b)
    history, lengths = np.zeros((b, 12), np.int64), np.zeros(b, np.int64)
    for i, (_, s, h) in enumerate(drawn):
        for name, value in s.items():
            getattr(c, name)[i] = value
        history[i, :len(h)], lengths[i] = h, len(h)
    return np.stack([r[0] for r in drawn]), c, history, lengths


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(rows(), min_size=1, max_size=10))
def test_every_accepted_setting_and_any_scores_give_every_row_a_token(drawn):
    logits, c, history, lengths = batch_of(drawn)
    raw = logits.copy()
    chooser = TokenChooser(SUPPRESS, eos_id=EOS, unk_id=UNK)
    out = chooser.choose(logits.copy(), c, history, lengths)  # must not raise
    broken = np.isnan(raw).any(axis=1) | np.isposinf(raw).any(axis=1)
    failed = out.failed if out.failed is not None else np.zeros(len(raw), bool)
    assert failed.tolist() == broken.tolist()
    for i in range(len(raw)):
        if c.kind[i] == BEAM:
            assert 0 <= out.beam_ids[i, 0] < V and np.isfinite(out.beam_logp[i, 0])
            assert not np.isnan(out.beam_logp[i]).any()
            continue
        token = int(out.token[i])
        assert 0 <= token < V
        if c.scored[i]:
            assert not np.isnan(out.logprob[i])
        if c.forced[i] >= 0:
            assert token == c.forced[i]
            continue
        # Never a suppressed or banned unknown token while the row has any other left.
        usable = raw[i].copy()
        usable[np.isnan(usable)] = -np.inf
        usable[list(SUPPRESS)] = -np.inf
        if c.ban_unk[i]:
            usable[UNK] = -np.inf
        if token in SUPPRESS or (c.ban_unk[i] and token == UNK):
            assert token == EOS or not (usable > -np.inf).any(), (i, token)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(rows(), min_size=2, max_size=8))
def test_a_row_chooses_the_same_alone_as_in_any_batch(drawn):
    logits, c, history, lengths = batch_of(drawn)
    chooser = TokenChooser(SUPPRESS, eos_id=EOS, unk_id=UNK)
    together = chooser.choose(logits.copy(), c, history, lengths)
    for i in range(len(logits)):
        one = slice(i, i + 1)
        alone = chooser.choose(logits[one].copy(), c.take(one), history[one], lengths[one])
        assert alone.token[0] == together.token[i]
        assert alone.logprob[0] == together.logprob[i] or (np.isnan(alone.logprob[0]) and
                                                           np.isnan(together.logprob[i]))
        failed_alone = alone.failed is not None and alone.failed[0]
        assert failed_alone == (together.failed is not None and together.failed[i])
        if c.kind[i] == BEAM:
            w = 2 * int(c.beam[i])
            assert (alone.beam_ids[0, :w] == together.beam_ids[i, :w]).all()
            assert np.array_equal(alone.beam_logp[0, :w], together.beam_logp[i, :w])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(rows(), min_size=1, max_size=10), st.sampled_from([(), SUPPRESS, (0, 5, 9)]))
def test_the_plain_greedy_fast_lane_chooses_what_choose_does_or_hands_the_step_back(drawn, suppress):
    """The greedy lane without controls (server/core/greedy.py; every row plain greedy, the engine's common
    step) gives exactly `choose`'s choices over the same scores with RowControls.greedy, or None: exactly
    when some row's raw best is not finite (NaN, +inf, no finite score) or is suppressed; it never changes
    the logits."""
    logits = np.stack([r[0] for r in drawn])
    if drawn[0][1]["scored"]:  # the lane's own case: a suppressed token on top of a row
        logits[0, suppress[-1] if suppress else 0] = 31.0
    chooser = TokenChooser(suppress, eos_id=EOS)
    before = logits.copy()
    fast = choose_greedy(logits, None, suppress)
    assert np.array_equal(logits, before, equal_nan=True)
    best = before.argmax(axis=-1)
    top = before[np.arange(len(best)), best]
    handed_back = not np.isfinite(top).all() or bool(set(best.tolist()) & set(suppress))
    assert (fast is None) == handed_back
    if fast is not None:
        full = chooser.choose(before.copy(), RowControls.greedy(len(before)))
        assert fast.token.dtype == full.token.dtype and np.array_equal(fast.token, full.token)
        assert np.array_equal(fast.logprob, full.logprob) and full.failed is None
        assert fast.beam_ids.shape == full.beam_ids.shape and fast.beam_logp.shape == full.beam_logp.shape


def test_the_smallest_temperatures_sample_the_best_token():
    """T -> 0 is greedy: 1e-45 (the soak's case), the smallest float64 and float32's edges."""
    logits = np.random.default_rng(0).standard_normal((6, V)).astype(np.float32)
    c = RowControls.greedy(6)
    c.kind[:] = SAMPLE
    c.temperature[:] = [5e-324, 1e-45, 1e-40, 1.17549435e-38, 1e-38, 1e-30]
    c.noise[:] = np.linspace(0.0, 0.999, 6)
    out = TokenChooser(eos_id=EOS).choose(logits.copy(), c)
    assert out.token.tolist() == logits.argmax(axis=1).tolist() and out.failed is None


def test_rows_with_no_token_left_end_with_eos():
    logits = np.full((3, V), -np.inf, np.float32)
    c = RowControls.greedy(3)
    c.kind[:] = [GREEDY, SAMPLE, BEAM]
    c.beam[2] = 4
    out = TokenChooser(eos_id=EOS).choose(logits, c)
    assert out.token[:2].tolist() == [EOS, EOS] and out.beam_ids[2, 0] == EOS and out.failed is None


def test_a_choice_that_raises_for_one_row_fails_that_row_alone(monkeypatch):
    """Containment when choice itself has a bug: every row is chosen alone, the guilty one fails."""
    import server.core.chooser as choose
    real = choose.sample

    def broken(scores, temperature, *rest):
        if (temperature == 0.123).any():
            raise FloatingPointError("a bug in sampling")
        return real(scores, temperature, *rest)
    monkeypatch.setattr(choose, "sample", broken)
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((4, V)).astype(np.float32)
    c = RowControls.greedy(4)
    c.kind[1:3], c.temperature[1:3], c.noise[1:3] = SAMPLE, [0.123, 0.7], [0.2, 0.4]
    c.penalty[3] = 1.7  # penalised in place by the failed batch: must be undone before row 3's retry
    history, lengths = np.array([[5, 6]] * 4), np.array([2] * 4)
    keep = [0, 2, 3]
    want = TokenChooser(eos_id=EOS).choose(logits[keep], c.take(keep), history[keep], lengths[keep])
    out = TokenChooser(eos_id=EOS).choose(logits.copy(), c, history, lengths)
    assert out.failed.tolist() == [False, True, False, False]
    assert out.token[[0, 2, 3]].tolist() == want.token.tolist()


# -- the engine core: one request never fails another -------------------------------------------------
EXTREME = [dict(temperature=1e-45, seed=1), dict(temperature=5e-324, seed=2), dict(temperature=100.0, seed=3),
           dict(temperature=1.0, top_p=1e-9, seed=4), dict(temperature=0.5, top_k=1000, seed=5),
           dict(repetition_penalty=5e-324), dict(repetition_penalty=10.0, no_repeat_ngram_size=10),
           dict(min_output_tokens=20, no_unknown_token=True), dict(beam_size=4, repetition_penalty=1e-300),
           dict(alternatives=3), dict(beam_size=4, num_hypotheses=4, min_output_tokens=20)]


def ordinary_outputs(extreme: bool) -> list[list[int]]:
    bench = Bench(slots=48)
    plain = [bench.job((20 + i, 30 + i, 40 + i)) for i in range(4)]
    if extreme:
        bench.submit(*[bench.job((50 + i, 51, 52), max_len=25, **kw) for i, kw in enumerate(EXTREME)])
    bench.submit(*plain)
    if extreme:
        bench.submit(*[bench.job((60 + i, 61), max_len=25, **kw) for i, kw in enumerate(EXTREME)])
    bench.run()
    for job_id, events in bench.events.items():  # every request, extreme or not, finished
        assert isinstance(events[-1], FinishEvent), (job_id, events[-1])
    return [bench.tokens(job) for job in plain]


def test_extreme_but_accepted_settings_leave_other_requests_unchanged():
    assert ordinary_outputs(extreme=True) == ordinary_outputs(extreme=False)


def test_a_row_with_nan_scores_fails_alone_and_the_batch_goes_on():
    def nan_after_two(src, inputs):
        return {t: float("nan") for t in range(V)} if len(inputs) > 2 else {7: 8.0}
    bench = Bench(ScriptedRuntime({(66,): nan_after_two}, default=says(11, 12, 13)))
    broken, fine, other = bench.submit(bench.job((66,)), bench.job((1, 2)), bench.job((3, 4), beam_size=2))
    bench.run()
    assert isinstance(bench.end(broken), Internal) and "NaN or infinite" in str(bench.end(broken))
    assert bench.tokens(fine) == [11, 12, 13] and bench.tokens(other) == [11, 12, 13]
    assert bench.metrics.registry.get_sample_value("nmt_engine_failed_rows_total", {"model": "m"}) == 1
