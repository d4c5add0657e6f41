"""The engine core without ONNX: the real scheduler, engine, slot cache, token choice and loop, driven
step by step against a scripted model whose every output is known in advance. Milliseconds per test.

`CopyModel` stands in for models/core/runtime.py's OnnxModel: its encoder writes each text's source
ids into the cross-attention keys, and its decoder step reads them back, so a row's logits at
position p put the most weight on source id p (then EOS past the end) and the next most on the id
after it. Greedy decoding therefore returns the source, which makes batching, beams, budgets,
controls, cancellation and failures checkable token by token.
"""
from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest

from models.core.bundle import discover
from models.core.kv_cache import SlotCache
from server.core.chooser import TokenChooser
from server.core.engine import ENCODE_ROWS, Engine, length_groups
from server.core.errors import Cancelled, DeadlineExceeded, Internal, InvalidArgument, ResourceExhausted, Unavailable
from server.core.loop import EngineLoop
from server.observability.metrics import Metrics
from server.core.relay import EventRelay, flush, hold_wakeups
from server.core.request import (DecodingParams, EmbedJob, ErrorEvent, FinishEvent, FinishReason, GenerationRules, Job,
                            TokenEvent)
from server.core.runaway import RunawayGuard
from server.core.scheduler import Scheduler
from tests.serving import REPOSITORY

pytestmark = pytest.mark.unit
SPEC = discover(REPOSITORY)[0].spec
EOS, BOS = SPEC.eos_id, SPEC.bos_id
MARGIN = 8.0  # the best token's logit; the runner-up gets MARGIN - 1, everything else 0


class CopyModel:
    """The scripted model (see the module docstring). `fail` makes the next decode step raise."""

    def __init__(self) -> None:
        self.spec, self.inplace, self.providers = SPEC, None, ["scripted"]
        self.fail = False
        self.steps = 0

    def encode(self, ids: np.ndarray, mask: np.ndarray, give_back: bool = False):  # give_back: memory only
        b, s = ids.shape
        layers, heads, dh = SPEC.n_dec_layers, SPEC.n_heads, SPEC.d_model // SPEC.n_heads
        memory = np.zeros((b, s, SPEC.d_model), np.float32)
        memory[..., 0] = ids
        cross = np.zeros((layers, b, heads, s, dh), np.float32)
        cross[:, :, 0, :, 0] = ids
        return memory, cross, cross.copy()

    def decode_step(self, tokens, positions, past_k, past_v, past_mask, cross_k, cross_v, src_mask):
        if self.fail:
            self.fail = False
            raise RuntimeError("scripted failure")
        self.steps += 1
        b = tokens.shape[0]
        src = cross_k[0, :, 0, :, 0].astype(np.int64)  # (B, S)
        lengths = src_mask.sum(axis=1)
        pos = positions[:, 0]
        best = np.where(pos < lengths, src[np.arange(b), np.minimum(pos, src.shape[1] - 1)], EOS)
        logits = np.zeros((b, 1, SPEC.out_vocab_size), np.float32)
        logits[np.arange(b), 0, best] = MARGIN
        logits[np.arange(b), 0, (best + 1) % SPEC.out_vocab_size] = MARGIN - 1
        layers, heads, dh = SPEC.n_dec_layers, SPEC.n_heads, SPEC.d_model // SPEC.n_heads
        new = np.zeros((layers, b, heads, 1, dh), np.float32)
        return logits, new, new.copy()


class Core:
    """Scheduler + Engine + EngineLoop over the CopyModel, driven on the test's thread."""

    def __init__(self, slots: int = 8, max_queue: int = 16, stream_interval: int = 1, guard: bool = False):
        self.model = CopyModel()
        self.metrics = Metrics()
        self.cache = SlotCache(SPEC, slots, 32, 40)
        rules = GenerationRules(EOS, (), start_id=BOS)
        self.scheduler = Scheduler("m", self.cache, self.metrics, EOS, max_queue=max_queue, max_encode_tokens=256,
                                   max_encode_batch=slots, stream_interval=stream_interval, rules=rules,
                                   guard=RunawayGuard(guard, min_span=12, length_ratio=3.0))
        self.engine = Engine("m", self.model, self.cache, self.metrics, 0.15, TokenChooser((), False, EOS, SPEC.unk_id))
        self.loop = EngineLoop(self.scheduler, self.engine, 0.0)
        self.events: dict[int, list] = {}

    def job(self, src: list[int], params: DecodingParams = DecodingParams(), max_len: int = 30, **kw) -> Job:
        job = Job("m", src, params, max_len, None, **kw)
        self.events[job.id] = []
        job.sink = self.events[job.id].append
        return job

    def submit(self, *jobs: Job) -> list[Job]:
        self.scheduler.submit(list(jobs))
        return list(jobs)

    def run(self, limit: int = 500) -> int:
        """Iterate until nothing is left; the number of iterations."""
        for n in range(limit):
            if self.scheduler.idle:
                return n
            self.loop.iteration(time.monotonic())
        raise AssertionError("the scheduler never went idle")

    def finish(self, job: Job) -> FinishEvent:
        (event,) = [e for e in self.events[job.id] if not isinstance(e, TokenEvent)]
        assert isinstance(event, FinishEvent), event
        return event

    def error(self, job: Job) -> Exception:
        (event,) = [e for e in self.events[job.id] if not isinstance(e, TokenEvent)]
        assert isinstance(event, ErrorEvent), event
        return event.error

    def tokens(self, job: Job, hypothesis: int = 0) -> list[int]:
        return list(self.finish(job).hypotheses[hypothesis].tokens)


SRC = [10, 11, 12, 13, 14]


# -- greedy decoding, batching, budgets ---------------------------------------------------------
def test_greedy_copies_the_source_and_ends_with_eos():
    core = Core()
    (job,) = core.submit(core.job(SRC))
    core.run()
    done = core.finish(job)
    assert done.reason == FinishReason.EOS and core.tokens(job) == SRC
    assert done.input_tokens == len(SRC) and core.cache.used == 0


def test_continuous_batching_admits_work_while_others_decode():
    core = Core()
    first = core.submit(core.job(list(range(10, 30))))[0]
    core.loop.iteration(time.monotonic())
    core.loop.iteration(time.monotonic())
    assert core.cache.used == 1
    late = core.submit(core.job([40, 41]), core.job([50, 51, 52]))
    core.loop.iteration(time.monotonic())
    assert core.cache.used == 3  # the late arrivals joined the running row
    core.run()
    assert core.tokens(first) == list(range(10, 30))
    assert [core.tokens(j) for j in late] == [[40, 41], [50, 51, 52]]


def test_the_output_budget_ends_a_decode_with_length():
    core = Core()
    (job,) = core.submit(core.job(list(range(10, 30)), max_len=4))
    core.run()
    assert core.finish(job).reason == FinishReason.LENGTH and core.tokens(job) == [10, 11, 12, 13]


def test_streams_send_the_first_token_at_once_then_every_interval():
    core = Core(stream_interval=3)
    (job,) = core.submit(core.job(SRC, stream=True))
    core.run()
    tokens = [e.token_ids for e in core.events[job.id] if isinstance(e, TokenEvent)]
    assert tokens[0] == [10] and sum(tokens, []) == SRC[:sum(map(len, tokens))]
    assert len(tokens) <= 3 and isinstance(core.events[job.id][-1], FinishEvent)


def test_a_full_queue_refuses_the_whole_request_and_a_closed_one_everything():
    core = Core(max_queue=3)
    core.submit(core.job(SRC), core.job(SRC))
    with pytest.raises(ResourceExhausted):
        core.submit(core.job(SRC), core.job(SRC))
    assert len(core.scheduler.waiting) == 2  # all or nothing
    with pytest.raises(InvalidArgument):
        core.submit(*[core.job(SRC) for _ in range(4)])  # could never fit
    core.scheduler.close()
    with pytest.raises(Unavailable):
        core.submit(core.job(SRC))


def test_slots_limit_admission_first_come_first_served():
    core = Core(slots=2)
    jobs = core.submit(core.job(SRC), core.job(SRC), core.job([20, 21]))
    core.loop.iteration(time.monotonic())
    assert core.cache.used == 2 and core.scheduler.waiting[0] is jobs[2]
    core.run()
    assert core.tokens(jobs[2]) == [20, 21]


def test_length_groups_keep_padding_under_the_budget():
    groups = length_groups([5, 50, 6, 48, 7], 0.15)
    assert sorted(sum(groups, [])) == [0, 1, 2, 3, 4]
    assert {tuple(sorted(g)) for g in groups} == {(0, 2, 4), (1, 3)}


def test_length_groups_cap_a_pass_at_max_rows():
    groups = length_groups([9] * 70, 0.15, max_rows=32)  # no padding at all: only the width cuts
    assert [len(g) for g in groups] == [32, 32, 6]
    assert sorted(sum(groups, [])) == list(range(70))


def test_encoder_passes_are_at_most_encode_rows_wide_and_rows_keep_their_sources():
    """A wide admission is encoded in passes of <= ENCODE_ROWS sources (the arena's high-water mark is
    the widest pass), and each request's rows still get its own source's cross keys/values."""
    core = Core(slots=80, max_queue=80)
    core.scheduler.max_encode_batch = 80
    widths = []
    encode = core.model.encode
    core.model.encode = lambda ids, mask, give_back=False: (widths.append(ids.shape[0]), encode(ids, mask))[1]
    jobs = core.submit(*(core.job([10 + i % 40, 11 + i % 40, 12]) for i in range(70)))
    core.run()
    assert max(widths) == ENCODE_ROWS < 70 and sum(widths) == 70  # several passes, none wider
    for i, job in enumerate(jobs):
        assert list(core.finish(job).hypotheses[0].tokens) == [10 + i % 40, 11 + i % 40, 12]


# -- cancellation, deadlines, failures ------------------------------------------------------------
def test_cancel_frees_the_slot_at_the_next_step():
    core = Core()
    (job,) = core.submit(core.job(list(range(10, 30))))
    core.loop.iteration(time.monotonic())
    assert core.cache.used == 1
    job.cancel()
    core.loop.iteration(time.monotonic())
    assert core.cache.used == 0 and isinstance(core.error(job), Cancelled)


def test_deadlines_fail_queued_and_running_work():
    core = Core(slots=1)
    running, queued = core.submit(core.job(list(range(10, 30)), deadline=time.monotonic() + 60),
                                  core.job(SRC, deadline=time.monotonic() + 60))
    core.loop.iteration(time.monotonic())
    later = time.monotonic() + 120  # both deadlines are past by then
    core.loop.iteration(later)
    assert isinstance(core.error(running), DeadlineExceeded) and isinstance(core.error(queued), DeadlineExceeded)
    assert core.cache.used == 0 and core.scheduler.idle


def test_fail_everything_and_abort_all_answer_every_request():
    core = Core(slots=1)
    running, queued = core.submit(core.job(list(range(10, 30))), core.job(SRC))
    core.loop.iteration(time.monotonic())
    assert core.scheduler.fail_everything(Unavailable("engine failed")) == 2
    assert all(isinstance(core.error(j), Unavailable) for j in (running, queued))
    with pytest.raises(Unavailable):  # a failed engine takes no new work
        core.submit(core.job(SRC))
    other = Core(slots=1)
    jobs = other.submit(other.job(list(range(10, 30))), other.job(SRC))
    other.loop.iteration(time.monotonic())
    other.scheduler.abort_all(Unavailable("shutting down"))
    assert other.scheduler.idle and all(isinstance(other.error(j), Unavailable) for j in jobs)


def test_an_engine_failure_fails_the_running_requests_and_the_loop_keeps_serving():
    core = Core()
    core.loop.start()
    try:
        done = threading.Event()
        core.model.fail = True
        first = core.job(SRC)
        first.sink = lambda e, box=core.events.setdefault(first.id, []): (box.append(e), done.set())
        core.submit(first)
        assert done.wait(10) and isinstance(core.error(first), Internal)
        second = core.job([30, 31])
        finished = threading.Event()
        second.sink = lambda e, box=core.events[second.id]: (box.append(e), isinstance(e, FinishEvent)
                                                              and finished.set())
        core.submit(second)
        assert finished.wait(10) and core.tokens(second) == [30, 31]
    finally:
        core.loop.stop(5)


def test_stop_drains_running_work_within_the_grace_period():
    core = Core()
    (job,) = core.submit(core.job(list(range(10, 30))))
    core.loop.start()
    core.loop.stop(10)
    assert core.tokens(job) == list(range(10, 30)) and not core.loop.is_alive()
    with pytest.raises(Unavailable):
        core.submit(core.job(SRC))


def test_stop_without_grace_fails_what_is_left():
    core = Core()
    gate = threading.Event()
    real = core.model.decode_step
    core.model.decode_step = lambda *a, **k: (gate.wait(10), real(*a, **k))[1]  # hold the loop mid-step
    (job,) = core.submit(core.job(list(range(10, 30))))
    core.loop.start()
    stopper = threading.Thread(target=core.loop.stop, args=(0.0,))
    stopper.start()
    time.sleep(0.05)
    gate.set()
    stopper.join(10)
    assert isinstance(core.error(job), Unavailable)


def test_embedding_jobs_are_the_mean_of_the_encoder_states():
    core = Core()
    vectors = []
    job = EmbedJob("m", [10, 20, 30], vectors.append)
    core.submit(job)
    core.run()
    assert vectors[0].shape == (SPEC.d_model,) and vectors[0][0] == pytest.approx(20.0)


# -- search, sampling and the decoding controls ----------------------------------------------------
def test_beam_search_returns_ranked_hypotheses_with_scores():
    core = Core()
    (job,) = core.submit(core.job(SRC, DecodingParams(beam_size=3, num_hypotheses=3)))
    core.run()
    done = core.finish(job)
    scores = [h.score for h in done.hypotheses]
    assert len(done.hypotheses) == 3 and list(done.hypotheses[0].tokens) == SRC
    assert scores == sorted(scores, reverse=True) and core.cache.used == 0


def test_beam_rows_share_a_step_with_greedy_rows():
    core = Core()
    beam, greedy = core.submit(core.job(SRC, DecodingParams(beam_size=4)), core.job([40, 41, 42]))
    core.run()
    assert core.tokens(beam) == SRC and core.tokens(greedy) == [40, 41, 42]


def test_seeded_sampling_is_reproducible_and_batch_invariant():
    params = DecodingParams(temperature=1.5, seed=7, num_hypotheses=2)
    alone = Core()
    (a,) = alone.submit(alone.job(SRC, params))
    alone.run()
    crowd = Core()
    jobs = crowd.submit(crowd.job([40, 41]), crowd.job(SRC, params), crowd.job([50, 51, 52, 53]))
    crowd.run()
    assert [list(h.tokens) for h in alone.finish(a).hypotheses] == \
        [list(h.tokens) for h in crowd.finish(jobs[1]).hypotheses]
    assert len(alone.finish(a).hypotheses) == 2


def test_alternatives_start_with_different_tokens():
    core = Core()
    (job,) = core.submit(core.job(SRC, DecodingParams(alternatives=3)))
    core.run()
    hyps = core.finish(job).hypotheses
    assert len(hyps) == 3 and list(hyps[0].tokens) == SRC
    assert len({h.tokens[0] for h in hyps}) == 3 and hyps[1].tokens[0] == SRC[0] + 1


def test_a_target_prefix_leads_the_output_after_the_forced_token():
    core = Core()
    (job,) = core.submit(core.job(SRC, forced=(77,), prefix=(88, 89)))
    core.run()
    tokens = core.tokens(job)
    # The forced (language) token is fed to the decoder but is not output; the prefix is.
    assert tokens[:2] == [88, 89] and 77 not in tokens and tokens[2] == SRC[3]


def test_min_output_tokens_bans_eos_until_the_minimum():
    core = Core()
    (job,) = core.submit(core.job([10, 11], DecodingParams(min_output_tokens=5), max_len=8))
    core.run()
    tokens = core.tokens(job)
    assert len(tokens) >= 5 and EOS not in tokens[:5] and tokens[:2] == [10, 11]


def test_no_repeat_ngram_and_repetition_penalty_change_a_repeating_output():
    source = [10, 11] * 6
    plain, banned, penalised = Core(), Core(), Core()
    (p,) = plain.submit(plain.job(source))
    (b,) = banned.submit(banned.job(source, DecodingParams(no_repeat_ngram_size=2)))
    (r,) = penalised.submit(penalised.job(source, DecodingParams(repetition_penalty=10.0)))
    for core in (plain, banned, penalised):
        core.run()
    assert plain.tokens(p) == source
    out = banned.tokens(b)
    bigrams = list(zip(out, out[1:]))
    assert len(bigrams) == len(set(bigrams))  # no 2-gram twice
    assert penalised.tokens(r) != source


def test_the_runaway_guard_stops_a_loop_and_keeps_one_occurrence():
    core = Core(guard=True)
    (job,) = core.submit(core.job([10, 11] * 15, max_len=40))
    core.run()
    done = core.finish(job)
    assert done.reason == FinishReason.RUNAWAY
    assert len(done.hypotheses[0].tokens) < 30


# -- the relay: engine thread -> event loop ----------------------------------------------------------
def test_the_relay_delivers_in_order_with_one_wakeup_per_step():
    async def main():
        relay = EventRelay(asyncio.get_running_loop())
        got = []

        def engine_step():
            hold_wakeups()
            for i in range(50):
                relay.post(got.append, i)
            flush()
        thread = threading.Thread(target=engine_step)
        thread.start()
        thread.join()
        for _ in range(100):
            if len(got) == 50:
                break
            await asyncio.sleep(0.01)
        sink = relay.sink(got.append)
        sink("direct")  # from the loop's own thread: woken at once
        await asyncio.sleep(0.01)
        return got, relay.wakeups
    got, wakeups = asyncio.run(main())
    assert got == list(range(50)) + ["direct"] and wakeups == 2


def test_a_failed_step_fails_its_rows_and_leaves_the_queue_to_run():
    """One bad decode step answers the requests that were in it (INTERNAL) and frees their slots; the
    requests still queued behind them never reached the engine and are served afterwards."""
    core = Core(slots=1)
    core.loop.start()
    try:
        started, finished = threading.Event(), threading.Event()
        running = core.job(list(range(10, 30)))
        queued = core.job([40, 41])
        running.sink = lambda e, box=core.events[running.id]: (box.append(e), started.set())
        queued.sink = lambda e, box=core.events[queued.id]: (box.append(e), finished.set())
        gate = threading.Event()
        real = core.model.decode_step

        def held_then_failing(*args, **kwargs):
            gate.wait(10)  # both requests are submitted (one running, one queued) before the step fails
            core.model.decode_step = real
            raise RuntimeError("scripted step failure")
        core.model.decode_step = held_then_failing
        core.submit(running, queued)
        gate.set()
        assert started.wait(10) and isinstance(core.error(running), Internal)
        assert finished.wait(10) and core.tokens(queued) == [40, 41]
    finally:
        core.loop.stop(5)
