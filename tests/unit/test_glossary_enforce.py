"""Glossary terms in decoding: the per-row bookkeeping (server/core/terms.py), the bonus in token
choice (server/core/chooser.py), and whole jobs through the real scheduler, engine and chooser around
the scripted runtime of tests/unit/test_engine_core_scripted.py (greedy, beam, sampling; untouched
rows; batch invariance)."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from server.core.chooser import RowControls, TokenChooser
from server.core.request import GenerationRules
from server.core import terms as enforce
from server.core import term_placement as placement
from server.core.terms import TermSet, vocabulary
from tests.unit.test_engine_core_scripted import BOS, EOS, Bench, ScriptedRuntime, follows, says

# Token texts for the scripted model's 100 ids: "▁w<i>" unless named here.
NAMED = {40: "\u2581Dr", 41: "aht", 42: "esel", 43: "esel.", 44: ".", 45: "\u2581Drahtesel", 46: "\u2581Gasse",
         47: "\u2581Gasse.", 48: "\u2581weg", 49: "\u2581weg.", 90: "\u2581Rad", 91: "ler"}
PIECES = tuple(NAMED.get(i, f"\u2581w{i}") for i in range(100))
DRAHTESEL = (((40, 41, 42), (40, 41, 43)), (), ("Drahtesel",))
GASSE = (((46,), (47,)), (), ("Gasse",))
RADLER = (((90, 91),), (), ("Radler",))


@pytest.fixture(autouse=True)
def settings():
    saved = dataclasses.replace(enforce.SETTINGS)
    yield enforce.SETTINGS
    enforce.SETTINGS.restore(saved)


def text(tokens) -> str:
    return "".join(PIECES[t] for t in tokens).replace("\u2581", " ").strip()


# -- bookkeeping ---------------------------------------------------------------------------------
def test_a_begun_term_is_forced_to_its_end_and_text_counts_however_spelled():
    terms = TermSet((DRAHTESEL, GASSE), vocabulary(PIECES))
    p = terms.start()
    assert terms.boosted(p) == [40, 46, 47] and terms.forced(p) == -1
    p = terms.advance(p, 40)  # the model began "Drahtesel": the rest is forced
    assert (terms.forced(p), terms.boosted(p)) == (41, [])
    p = terms.advance(terms.advance(p, 41), 42)
    assert p.pending == (1,) and terms.forced(p) == -1
    q = terms.advance(terms.advance(terms.start(), 45), 48)  # written as one token of its own: counted as text
    assert q.pending == (1,)
    assert terms.advance(q, 47).pending == ()  # "Gasse." spelled with its full stop


def test_endings_write_the_pending_terms_first():
    terms = TermSet((DRAHTESEL,), vocabulary(PIECES))
    p = terms.advance(terms.start(), 48)
    token, held = terms.instead_of_end(p, EOS, EOS)  # end of sequence: the term, then EOS
    assert token == 40 and held.end == EOS
    p = held
    for t in (40, 41, 42):
        p = terms.advance(p, t)
    assert terms.forced(p) == EOS
    token, held = terms.instead_of_end(terms.advance(terms.start(), 48), 44, EOS)  # ".": the term, then "."
    assert (token, held.end) == (40, 44)
    token, same = terms.instead_of_end(terms.start(), 49, EOS)  # "▁weg." -> "▁weg", the term, then "."
    assert token == 48 and same.end == 44
    fresh = terms.advance(terms.start(), 48)
    assert terms.instead_of_end(fresh, EOS, EOS, room=4)[0] == EOS  # no room for the term and the ending
    assert terms.instead_of_end(fresh, EOS, EOS, room=5)[0] == 40
    written = terms.advance(terms.start(), 45)
    assert terms.instead_of_end(written, EOS, EOS)[0] == EOS  # nothing pending: ends as chosen
    enforce.SETTINGS.at_eos = "off"
    assert terms.instead_of_end(terms.start(), EOS, EOS) == (EOS, terms.start())


def test_text_at_the_end_is_whole_only_when_the_row_ends():
    terms = TermSet((GASSE,), vocabulary(PIECES))
    p = terms.advance(terms.start(), 46)  # "▁Gasse" begins and ends the term: written by its tokens
    assert p.pending == ()
    drahtesel = TermSet((DRAHTESEL,), vocabulary(PIECES))
    p = drahtesel.advance(drahtesel.start(), 45)  # "Drahtesel" as text, at the end: could still grow ...
    assert p.pending == (0,)
    assert drahtesel.instead_of_end(p, EOS, EOS)[0] == EOS  # ... but the row ends here: it is written


# -- token choice --------------------------------------------------------------------------------
def test_the_bonus_is_per_row_and_batch_invariant():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, 100)).astype(np.float32)
    logits[:, 7] += 3.0  # every row's favourite
    c = RowControls.greedy(4)
    c.boost = np.array([[11, -1], [-1, -1], [12, 13], [-1, -1]])
    c.boost_value[[0, 2]] = 20.0
    chooser = TokenChooser(eos_id=EOS)
    together = chooser.choose(logits.copy(), c).token
    assert together.tolist()[1] == 7 and together[0] == 11 and together[2] in (12, 13) and together[3] == 7
    alone = [chooser.choose(logits[i:i + 1].copy(), c.take(slice(i, i + 1))).token[0] for i in range(4)]
    assert alone == together.tolist()


# -- whole jobs ----------------------------------------------------------------------------------
def bench(**kw) -> Bench:
    return Bench(rules=GenerationRules(EOS, start_id=BOS, pieces=PIECES), **kw)


def test_the_bonus_ramp_grows_with_the_row_past_its_start(settings):
    """Off by default (measured on val, docs/glossaries.md); set, a row's bonus grows per token written
    past ramp_from x its source length, and nothing before."""
    assert settings.ramp == 0.0 and settings.bonus_after(40, 10) == settings.bonus
    settings.bonus, settings.ramp, settings.ramp_from = 1.0, 0.25, 0.8
    assert settings.bonus_after(8, 10) == 1.0 and settings.bonus_after(12, 10) == pytest.approx(2.0)


def test_greedy_beam_and_sampling_write_the_terms(settings):
    b = bench()
    jobs = [b.job((10, 11, 12), terms=(DRAHTESEL,)), b.job((10, 11, 12), terms=(DRAHTESEL,), beam_size=2),
            b.job((10, 11, 12), terms=(DRAHTESEL,), temperature=0.5, seed=1), b.job((10, 11, 12))]
    b.submit(*jobs)
    b.run()
    for job in jobs[:3]:
        assert text(b.tokens(job)) == "w10 w11 w12 Drahtesel", job.params
    assert b.tokens(jobs[3]) == [10, 11, 12]
    settings.bonus = 3.0  # the runner-up "▁Rad" (6.0 against 8.0) now wins: the term begins there
    b = bench()
    job = b.submit(b.job((10, 11, 12), terms=(RADLER,)))
    b.run()
    assert text(b.tokens(job)) == "Radler w12"


def test_rows_without_terms_decode_as_without_and_batches_change_nothing():
    def run(*specs):
        b = bench(runtime=ScriptedRuntime({(20, 21): says(30, 31, 32, 33)}), slots=12)
        jobs = [b.job(src, **kw) for src, kw in specs]
        b.submit(*jobs)
        b.run()
        return [b.tokens(j) for j in jobs]
    specs = [((10, 11, 12), {"terms": (DRAHTESEL, GASSE)}), ((20, 21), {}), ((20, 21), {"terms": ()}),
             ((10, 11), {"terms": (GASSE,), "beam_size": 3}), ((14, 15, 16), {"terms": (RADLER,)})]
    together = run(*specs)
    assert together == [run(spec)[0] for spec in specs]
    assert together[1] == together[2] == [30, 31, 32, 33]
    assert text(together[0]) == "w10 w11 w12 Drahtesel Gasse"


# -- a term the model never began: the row goes back to its likeliest place (placement.py) ------------
# After "w10" the model gives "Gasse" 0.15 against "w11" 0.6 (1.39 nats behind: more than the bonus of 1,
# so it does not begin it), and less everywhere else; then it ends. Going back writes it after "w10".
GASSE_LATE = follows({(): {10: 0.6, 46: 0.05}, (10,): {11: 0.6, 46: 0.15}, (10, 11): {EOS: 0.9, 46: 0.02},
                      (10, 46): {12: 0.9}, (10, 46, 12): {EOS: 0.9}, (10, 11, 46): {EOS: 0.9}})


def test_best_place_is_a_word_boundary_nearest_the_models_choice():
    starts = lambda t: PIECES[t].startswith("\u2581")  # noqa: E731
    terms = TermSet((GASSE,), vocabulary(PIECES))
    base = [10, 40, 41, 12]  # "w10 Dr|aht w12": 41 continues a word
    inside = placement.Replay(terms, base).inside_term
    assert placement.best_place(base, starts, [-2.0, -3.0, -0.5, -2.5, -4.0], inside) == 0  # 2 is inside a word
    assert placement.best_place(base, starts, [-2.0, -3.0, -0.5, -1.0, -4.0], inside) == 3
    assert placement.best_place(base, starts, [-2.0, None, None, None, -1.0], inside) == 4  # the end is best: no rewind
    assert placement.best_place(base, starts, [-6.0, None, None, -7.0, None], inside, within=5.0) == 4  # too unlikely
    assert placement.best_place(base, starts, [-2.0, None, None, -2.0, None], inside) == 3  # a tie: the later
    # A word boundary inside a term being written (the two-word "Gasse weg", begun at 1) is no place.
    two_words = TermSet(((((46, 48),), (), ("Gasse weg",)), GASSE), vocabulary(PIECES))
    base = [10, 46, 48, 12]
    replay = placement.Replay(two_words, base)
    assert replay.inside_term(2) and not replay.inside_term(3)
    assert placement.best_place(base, starts, [-3.0, -2.5, -0.5, -2.0, -4.0], replay.inside_term) == 3


def test_a_greedy_row_goes_back_for_a_term_it_never_began(settings):
    def run(rewind: bool, inplace: bool, **kw):
        settings.rewind = rewind
        b = bench(runtime=ScriptedRuntime({(70, 71): GASSE_LATE}, inplace=inplace))
        job = b.submit(b.job((70, 71), terms=(GASSE,), **kw))
        b.run()
        return b, job
    for inplace in (False, True):  # the copying step and the in-place step: the cache goes back the same
        b, job = run(False, inplace)
        assert text(b.tokens(job)) == "w10 w11 Gasse"  # written before the ending
        b, job = run(True, inplace)
        assert text(b.tokens(job)) == "w10 Gasse w12"  # after "w10", where the model found it likeliest
        assert b.metrics.glossary_rewinds.labels("m")._value.get() == 1
    b, job = run(True, False, scores=True)  # the score: the model's log p of what was returned, nothing undone
    expected = math.log(0.6 / 0.65) + math.log(0.15 / 0.75)  # each position's named tokens are its whole mass
    assert b.end(job).hypotheses[0].score == pytest.approx(expected, abs=1e-4)


def test_going_back_is_the_same_streamed_batched_and_alone(settings):
    def run(*specs):
        b = bench(runtime=ScriptedRuntime({(70, 71): GASSE_LATE, (20, 21): says(30, 31, 32, 33)}), slots=12)
        jobs = [b.job(src, **kw) for src, kw in specs]
        b.submit(*jobs)
        b.run()
        return b, jobs
    specs = [((70, 71), {"terms": (GASSE,)}), ((20, 21), {}), ((70, 71), {"terms": (GASSE,), "stream": True}),
             ((20, 21), {"terms": (DRAHTESEL,)})]
    b, jobs = run(*specs)
    together = [b.tokens(j) for j in jobs]
    assert together == [b2.tokens(j2[0]) for b2, j2 in (run(spec) for spec in specs)]
    assert together[0] == together[2] == [10, 46, 12]
    # The stream held its text while it might still go back ("w11" was never sent); once it has gone back
    # (once is all), what precedes the place is final and goes out, then each token as it comes.
    assert b.streamed(jobs[2]) == [[10], [46], [12]]
