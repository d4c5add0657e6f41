"""Several decode steps per visit of the engine's host work (issue 58: server/core/loop.py steps_per_visit,
Engine.decode_visit, Scheduler.update_visit) against the scripted runtime's in-place step.

The backbone is exactness: the same requests served with one step per visit and with visits of up to 8
steps give the same tokens, finish reasons and streamed text, whatever ends a row inside a visit (EOS, its
length limit, the runaway guard, a row the model gives no usable scores). The rest checks the rules that
keep latency where it was: a new row's first token goes out alone, work waiting for a free slot gets one,
a visit ends when a row ends while work waits, and anything that is not plain greedy takes one step.
"""
from __future__ import annotations

import pytest

from server.core import loop as loop_module
from server.core.errors import Internal
from server.core.request import FinishEvent, FinishReason, TokenEvent
from tests.unit.test_engine_core_scripted import EOS, Bench, ScriptedRuntime, history_hash, loops

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def short_steps(monkeypatch):
    """Every scripted step counts as short (VISIT_S far above it): how many steps a visit takes is then
    --visit-steps and the rules below, never the test machine's speed."""
    monkeypatch.setattr(loop_module, "VISIT_S", 3600.0)


def counted(bench: Bench) -> list[int]:
    """The number of decode steps of each loop iteration that decoded (the in-place session's runs)."""
    steps, real = [], bench.loop.iteration

    def iteration(now):
        before = bench.rt.inplace.runs
        out = real(now)
        if bench.rt.inplace.runs > before:
            steps.append(bench.rt.inplace.runs - before)
        return out
    bench.loop.iteration = iteration
    return steps


def serve(visit_steps: int, jobs: list[dict], slots: int = 32, guard: bool = False, scripts=None, default=None,
          max_target: int = 40) -> tuple[Bench, list, list[int]]:
    """Serve `jobs` (Bench.job keywords, `src` the source) at once; (bench, the jobs, steps per iteration)."""
    runtime = ScriptedRuntime(scripts, inplace=True, **({"default": default} if default else {}))
    bench = Bench(runtime, slots=slots, guard=guard, visit_steps=visit_steps, max_target=max_target, max_queue=64,
                  max_encode_tokens=4096)
    made = [bench.job(spec["src"], **{k: v for k, v in spec.items() if k != "src"}) for spec in jobs]
    bench.submit(*made)
    steps = counted(bench)
    bench.run(limit=2000)
    return bench, made, steps


def outcome(bench: Bench, job) -> tuple:
    """What a caller sees: tokens, finish reason, and the streamed tokens joined."""
    done = bench.end(job)
    if not isinstance(done, FinishEvent):
        return ("failed", type(done).__name__)
    streamed = [t for msg in bench.streamed(job) for t in msg]
    return tuple(done.hypotheses[0].tokens), done.reason, tuple(streamed)


def mixed_jobs(n: int = 28) -> list[dict]:
    """Different sources and length limits: rows end by EOS and by their limit at different steps."""
    return [{"src": [10 + (i * 7 + j) % 80 for j in range(3 + i % 11)], "max_len": 4 + (i * 5) % 17,
             "stream": i % 2 == 0} for i in range(n)]


def test_visits_give_every_request_the_tokens_of_one_step_per_visit():
    one, jobs_one, steps_one = serve(1, mixed_jobs(), scripts=None, default=history_hash)
    many, jobs_many, steps_many = serve(8, mixed_jobs(), scripts=None, default=history_hash)
    assert [outcome(one, j) for j in jobs_one] == [outcome(many, j) for j in jobs_many]
    reasons = {outcome(many, j)[1] for j in jobs_many}
    assert reasons == {FinishReason.EOS, FinishReason.LENGTH}  # both ends happened inside the batch
    assert set(steps_one) == {1}
    assert max(steps_many) > 1 and len(steps_many) < len(steps_one)  # fewer visits for the same work
    assert many.cache.used == 0


def test_a_new_rows_first_token_goes_out_alone_and_later_messages_carry_a_visits_tokens():
    """The iteration that admits rows runs one step: their first tokens go out at its end, alone."""
    bench, jobs, steps = serve(8, [{"src": list(range(10, 30)), "max_len": 24, "stream": True}
                                   for _ in range(24)], default=history_hash)
    for job in jobs:
        messages = bench.streamed(job)
        assert len(messages[0]) == 1  # the first token at once: time to first token as before
        assert max(len(m) for m in messages) > 1  # then several tokens a message
        assert [t for m in messages for t in m] == list(bench.tokens(job))


def test_the_runaway_guard_stops_a_row_inside_a_visit_where_one_step_at_a_time_does():
    jobs = [{"src": [10 + i, 11 + i] * 12, "max_len": 36, "stream": True} for i in range(20)]
    one, jobs_one, _ = serve(1, jobs, guard=True, default=loops(40, 41, 42))
    many, jobs_many, steps = serve(8, jobs, guard=True, default=loops(40, 41, 42))
    assert [outcome(one, j) for j in jobs_one] == [outcome(many, j) for j in jobs_many]
    assert {outcome(many, j)[1] for j in jobs_many} == {FinishReason.RUNAWAY} and max(steps) > 1


def test_a_row_without_usable_scores_fails_alone_and_ends_the_visit():
    def poisoned(src, inputs):  # source 77: a NaN at its fifth output position; others copy their source
        if src[0] == 77 and len(inputs) == 5:
            return {5: float("nan")}
        p = len(inputs) - 1
        return {src[p] if p < len(src) else EOS: 8.0}
    jobs = [{"src": [77] + list(range(20, 30))}] + [{"src": list(range(30 + i, 42 + i))} for i in range(19)]
    one, jobs_one, _ = serve(1, jobs, default=poisoned)
    many, jobs_many, steps = serve(8, jobs, default=poisoned)
    assert isinstance(many.end(jobs_many[0]), Internal) and isinstance(one.end(jobs_one[0]), Internal)
    assert [outcome(one, j) for j in jobs_one[1:]] == [outcome(many, j) for j in jobs_many[1:]]
    assert max(steps) > 1 and many.cache.used == 0


def test_a_visit_ends_at_the_step_a_row_ends_so_its_answer_is_not_held():
    """Two rows, one ending after 3 tokens and one after 12, nothing waiting: the visit stops at the short
    row's last step (its answer goes out then), and the long row goes on in visits of its own."""
    bench, jobs, steps = serve(8, [{"src": list(range(10, 30)), "max_len": 3}, {"src": list(range(10, 30)),
                                                                                 "max_len": 12}],
                               default=history_hash)
    assert steps == [1, 2, 8, 1]  # admitting; cut at the short row's end; then 8 and the last one
    assert [len(bench.tokens(j)) for j in jobs] == [3, 12]


def test_a_step_as_long_as_a_visit_is_a_visit_of_its_own_and_short_steps_share_one(monkeypatch):
    """Steps per visit = how many fit in VISIT_S at the recent step time, up to --visit-steps: a step that
    long (the shipped model on a CPU at many rows) keeps one per visit, so its streams read as before."""
    specs = [{"src": list(range(10, 30)), "max_len": 20} for _ in range(4)]
    monkeypatch.setattr(loop_module, "VISIT_S", 0.0)  # every step "as long as a visit"
    _, _, slow = serve(8, specs, default=history_hash)
    assert set(slow) == {1}
    monkeypatch.setattr(loop_module, "VISIT_S", 3600.0)  # every step short (as everywhere here): the cap decides
    _, _, fast = serve(5, specs, default=history_hash)
    assert fast[0] == 1 and max(fast) == 5  # the admitting iteration's step alone, then visits of 5


def test_work_waiting_for_a_free_slot_is_admitted_at_the_step_a_row_ends():
    """32 rows fill the cache and a 33rd text waits: after the admitting iteration's one step, the visit
    (up to 8 steps) ends at the step the short row writes its last token, and the waiting text starts in the
    next iteration, as with one step at a time."""
    specs = [{"src": list(range(10, 15)), "max_len": 20} for _ in range(31)] + [{"src": [50, 51, 52], "max_len": 3},
                                                                                 {"src": [60, 61, 62, 63]}]
    one, jobs_one, _ = serve(1, specs, slots=32, default=history_hash)
    many, jobs_many, steps = serve(8, specs, slots=32, default=history_hash)
    assert [outcome(one, j) for j in jobs_one] == [outcome(many, j) for j in jobs_many]
    assert steps[:3] == [1, 2, 1]  # admitting; a visit cut at the short row's end; admitting the waiting text
    assert many.rt.encoded[-1] == [(60, 61, 62, 63)]  # the waiting text: the last encoder pass


@pytest.mark.parametrize("kw", [{"temperature": 0.8, "seed": 3}, {"scores": True}, {"beam_size": 2}])
def test_a_request_that_is_not_plain_greedy_keeps_every_visit_to_one_step(kw):
    specs = [{"src": list(range(10, 30)), "max_len": 12} for _ in range(20)] + [{"src": [40, 41, 42], **kw}]
    _, jobs, steps = serve(8, specs, default=history_hash)
    assert set(steps[:3]) == {1}  # while the odd request runs, nothing runs ahead
    assert all(isinstance(e, (TokenEvent, FinishEvent)) for j in jobs for e in _.events[j.id])
