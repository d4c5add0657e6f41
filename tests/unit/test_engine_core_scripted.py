"""The engine core against a scripted runtime whose every next-token distribution is a table.

`ScriptedRuntime` stands in for models/core/runtime.py's OnnxModel (`encode`, `decode_step`, and an
`inplace` session for decoder_inplace.onnx) so that the real Engine, SlotCache, TokenChooser,
Scheduler and EngineLoop run unchanged. It carries its state through the real cache:

  * encode() writes each text's source ids into channel 0 of the memory and of the cross keys;
  * each decode step writes its input token into channel 0 of the row's new self-attention key, so the
    past keys hold the row's decoder inputs so far (start token, forced tokens, output);
  * a step reads both back per row and asks the row's script, `script(source, inputs)`, for the
    next-token logits ({token: logit}, every other token FLOOR).

A row's tokens are thus fixed in advance by (source, history). A slot move, a beam reorder or a layer
copy that corrupted the cache would change what the script is asked, and with it the output; a
forced or prefix token that was not fed back shows up as the `WRONG` token. Everything runs on the
test's thread, one loop iteration at a time: milliseconds per test.

tests/unit/test_engine_core.py covers the basic paths with its copy model; this file adds the paths
it leaves (beam with forced tokens, prefix, controls, force-EOS, early stopping, the runaway guard in
beams and streams, the in-place step, queue ordering, embedding padding) and checks exact values
(hand-computed beam scores, sampling log-probabilities, stream message sizes).
"""
from __future__ import annotations

from types import SimpleNamespace

import ctypes
import math
import threading
import time
from typing import Callable

import numpy as np
import pytest

from models.core.bundle import ModelSpec
from models.core.kv_cache import SlotCache, lazy_zeros
from server.core.chooser import TokenChooser
from server.core.engine import Engine
from server.core.errors import Cancelled, DeadlineExceeded, ResourceExhausted
from server.core.loop import EngineLoop
from server.observability.metrics import Metrics
from server.core.request import (DecodingParams, EmbedJob, ErrorEvent, FinishEvent, FinishReason, GenerationRules, Job,
                            Timing, TokenEvent)
from server.core.runaway import RunawayGuard
from server.core.scheduler import Scheduler

pytestmark = pytest.mark.unit

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPEC = ModelSpec(vocab_size=100, d_model=8, n_heads=2, n_enc_layers=1, n_dec_layers=2, pad_id=PAD, bos_id=BOS,
                 eos_id=EOS, max_positions=64, unk_id=UNK)  # V = 100: not a multiple of the sampler's 64 block
V = SPEC.out_vocab_size
FLOOR = -30.0  # every token a script does not name: probability ~1e-13
WRONG = 99  # what `follows` says for a history it does not know (a forced token not fed back, a corrupt cache)
Script = Callable[[tuple, tuple], dict]  # (source ids, decoder inputs: start token first) -> {token: logit}


# -- scripts -----------------------------------------------------------------------------------------
def copy_source(src: tuple, inputs: tuple) -> dict:
    """The default: output position p is source token p, then EOS; runner-ups 90 and 91."""
    p = len(inputs) - 1
    return {src[p] if p < len(src) else EOS: 8.0, 90: 6.0, 91: 5.0}


def says(*tokens: int) -> Script:
    """These tokens, by output position, then EOS (whatever was chosen before)."""
    return lambda src, inputs: {tokens[len(inputs) - 1] if len(inputs) <= len(tokens) else EOS: 8.0,
                                90: 6.0, 91: 5.0}


def follows(table: dict[tuple, dict]) -> Script:
    """Keyed by the decoder inputs after the start token; values are probabilities (logits = log p)."""
    def script(src, inputs):
        dist = table.get(tuple(inputs[1:]))
        return {WRONG: 8.0} if dist is None else {t: math.log(p) for t, p in dist.items()}
    return script


def positional(dists: list[dict]) -> Script:
    """Output position p draws from dists[p] (probabilities), then EOS."""
    def script(src, inputs):
        p = len(inputs) - 1
        return {t: math.log(q) for t, q in dists[p].items()} if p < len(dists) else {EOS: 0.0}
    return script


def loops(*gram: int) -> Script:
    """Repeats `gram` forever (never EOS): what the runaway guard is for."""
    return lambda src, inputs: {gram[(len(inputs) - 1) % len(gram)]: 8.0, 90: 6.0}


# -- the fake runtime --------------------------------------------------------------------------------
class ScriptedRuntime:
    """OnnxModel's interface as Engine uses it (spec, inplace, encode, decode_step); see the module doc.
    `fail_encode` / `fail_decode`: 1-based call numbers that raise."""

    def __init__(self, scripts: dict[tuple, Script] | None = None, default: Script = copy_source,
                 inplace: bool = False):
        self.spec, self.providers = SPEC, ["scripted"]
        self.scripts, self.default = dict(scripts or {}), default
        self.encoded: list[list[tuple]] = []  # per encoder pass, its sources
        self.gave_back: list[bool] = []  # per encoder pass, whether it was asked to give its arena back
        self.rows: list[int] = []  # per decode step, its batch size
        self.fail_encode: set[int] = set()
        self.fail_decode: set[int] = set()
        self.raised = threading.Event()  # set when a scripted failure was raised
        self.inplace = ScriptedInPlace(self) if inplace else None
        self.cuda_graphs = False  # OnnxModel: CUDA graphs only on a device

    def logits(self, src, inputs) -> np.ndarray:
        src, inputs = tuple(int(t) for t in src), tuple(int(t) for t in inputs)
        row = np.full(V, FLOOR, np.float32)
        for token, logit in self.scripts.get(src, self.default)(src, inputs).items():
            row[token] = logit
        return row

    def encode(self, ids: np.ndarray, mask: np.ndarray, give_back: bool = False):  # give_back: memory only
        self.encoded.append([tuple(int(t) for t in r[m]) for r, m in zip(ids, mask)])
        self.gave_back.append(give_back)
        if len(self.encoded) in self.fail_encode:
            self.raised.set()
            raise RuntimeError("scripted encoder failure")
        b, s = ids.shape
        memory = np.zeros((b, s, SPEC.d_model), np.float32)
        memory[..., 0] = ids
        cross = np.zeros((SPEC.n_dec_layers, b, SPEC.n_heads, s, SPEC.head_dim), np.float32)
        cross[:, :, 0, :, 0] = ids
        return memory, cross, -cross

    def decode_step(self, tokens, positions, past_k, past_v, past_mask, cross_k, cross_v, src_mask):
        self.rows.append(b := tokens.shape[0])
        if len(self.rows) in self.fail_decode:
            self.raised.set()
            raise RuntimeError("scripted decoder failure")
        assert positions.shape == (b, 1) and (positions[:, 0] == past_mask.sum(1)).all()
        assert past_k.shape[1] == cross_k.shape[1] == b and (past_k == past_k[:1]).all()  # every layer alike
        logits = np.stack([self.logits(cross_k[0, i, 0, src_mask[i], 0],
                                       (*past_k[0, i, 0, past_mask[i], 0], tokens[i, 0])) for i in range(b)])
        new = np.zeros((SPEC.n_dec_layers, b, SPEC.n_heads, 1, SPEC.head_dim), np.float32)
        new[:, :, 0, 0, 0] = tokens[:, 0]
        return logits[:, None, :], new, -new


def _at(ptr: int, dtype, shape) -> np.ndarray:
    """The numpy view of memory bound by address (what ONNX Runtime reads and writes)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    return np.frombuffer((ctypes.c_char * size).from_address(ptr), dtype=dtype).reshape(shape)


class _Binding:
    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}

    def bind_input(self, name, device, device_id, dtype, shape, ptr):
        assert device == "cpu"
        self.arrays[name] = _at(ptr, dtype, shape)

    bind_output = bind_input


class ScriptedInPlace:
    """decoder_inplace.onnx's session: reads tokens, positions and the slot buffers by the addresses
    models/core/inplace_step.py binds, writes each row's new key at its position and the logits."""

    def __init__(self, runtime: ScriptedRuntime):
        self.runtime, self.runs = runtime, 0

    def io_binding(self) -> _Binding:
        return _Binding()

    def get_outputs(self) -> list:  # the GQA graph's outputs (the standard-op graph lacks present_cross_*)
        kinds = ("present_key", "present_value", "present_cross_key", "present_cross_value")
        caches = [SimpleNamespace(name=f"{k}_{layer}", shape=["batch", SPEC.n_heads, "capacity", SPEC.head_dim])
                  for layer in range(SPEC.n_dec_layers) for k in kinds]
        return [SimpleNamespace(name="logits", shape=["batch", SPEC.out_vocab_size]), *caches]  # (B, V)

    def get_inputs(self) -> list:  # the graph's (export/inplace.py io_names), each row's last source entry included
        layers = range(SPEC.n_dec_layers)
        caches = [f"{k}_{i}" for i in layers for k in ("past_key", "past_value", "cross_key", "cross_value")]
        lasts = [f"cross_last_{k}_{i}" for i in layers for k in ("key", "value")]
        return [SimpleNamespace(name=n) for n in ["tokens", "positions", "total_len", "src_len", *caches, *lasts]]

    def run_with_iobinding(self, binding: _Binding) -> None:
        a = binding.arrays
        self.runs += 1
        tokens, pos, src_len = a["tokens"][:, 0], a["positions"][:, 0], a["src_len"]
        assert int(a["total_len"]) == pos.max() + 1
        for layer in range(SPEC.n_dec_layers):  # the slot cache kept each row's last source key, through moves
            for i in range(len(tokens)):
                last = a[f"cross_key_{layer}"][i, :, src_len[i] - 1].reshape(-1)
                assert (a[f"cross_last_key_{layer}"][i, 0] == last).all()
        for i in range(len(tokens)):
            inputs = (*a["past_key_0"][i, 0, :pos[i], 0], tokens[i])
            a["logits"][i] = self.runtime.logits(a["cross_key_0"][i, 0, :src_len[i], 0], inputs)
            for layer in range(SPEC.n_dec_layers):
                a[f"present_key_{layer}"][i, 0, pos[i], 0] = tokens[i]


# -- the bench: the real engine core around the fake --------------------------------------------------
class Bench:
    def __init__(self, runtime: ScriptedRuntime | None = None, slots: int = 6, max_queue: int = 32,
                 max_target: int = 40, stream_interval: int = 1, guard: bool = False,
                 rules: GenerationRules | None = None, suppress: tuple = (), renormalize: bool = False,
                 max_encode_tokens: int = 256, max_encode_batch: int = 64, max_queue_delay: float = 0.0,
                 visit_steps: int = 1):
        self.rt = runtime or ScriptedRuntime()
        self.metrics = Metrics()
        self.cache = SlotCache(SPEC, slots, 24, max_target)
        self.rules = rules or GenerationRules(EOS, suppress, start_id=BOS)
        self.sched = Scheduler("m", self.cache, self.metrics, EOS, max_queue=max_queue,
                               max_encode_tokens=max_encode_tokens, max_encode_batch=max_encode_batch,
                               stream_interval=stream_interval, rules=self.rules,
                               guard=RunawayGuard(guard, min_span=12))
        self.engine = Engine("m", self.rt, self.cache, self.metrics, 0.15,
                             TokenChooser(suppress, renormalize, EOS, UNK))
        self.loop = EngineLoop(self.sched, self.engine, max_queue_delay, visit_steps)
        self.events: dict[int, list] = {}

    def job(self, src, max_len: int = 30, **kw) -> Job:
        """A Job; keywords that are DecodingParams fields go there, the rest to Job."""
        fields = DecodingParams.__dataclass_fields__
        params = DecodingParams(**{k: v for k, v in kw.items() if k in fields})
        job = Job("m", list(src), params, max_len, None, **{k: v for k, v in kw.items() if k not in fields})
        self.events[job.id] = box = []
        job.sink = box.append
        return job

    def submit(self, *jobs):
        self.sched.submit(list(jobs))
        return jobs[0] if len(jobs) == 1 else jobs

    def step(self, now: float | None = None) -> bool:
        return self.loop.iteration(time.monotonic() if now is None else now)

    def run(self, limit: int = 300) -> int:
        """Iterate until idle; then no slot may still be held. The number of iterations."""
        for n in range(limit):
            if self.sched.idle:
                assert self.cache.used == 0, "idle with slots still held"
                return n
            self.step()
        raise AssertionError("never went idle")

    def end(self, job: Job):
        """The job's one terminal event: a FinishEvent, or the error of its ErrorEvent."""
        ends = [e for e in self.events[job.id] if not isinstance(e, TokenEvent)]
        assert len(ends) == 1, ends
        return ends[0].error if isinstance(ends[0], ErrorEvent) else ends[0]

    def tokens(self, job: Job, i: int = 0) -> list[int]:
        done = self.end(job)
        assert isinstance(done, FinishEvent), done
        return list(done.hypotheses[i].tokens)

    def streamed(self, job: Job) -> list[list[int]]:
        return [e.token_ids for e in self.events[job.id] if isinstance(e, TokenEvent)]


# -- the cache and the batch -------------------------------------------------------------------------
def history_hash(src: tuple, inputs: tuple) -> dict:
    """A token that depends on the row's whole history: any corruption of its past changes it."""
    if len(inputs) > len(src):
        return {EOS: 8.0}
    return {10 + (sum(inputs) * 7 + len(inputs)) % 80: 8.0}


def test_rows_keep_their_history_through_slot_moves_and_joins():
    src = (11, 12, 13, 14, 15, 16, 17, 18, 19, 20)
    alone = Bench(ScriptedRuntime(default=history_hash))
    job = alone.submit(alone.job(src))
    alone.run()
    crowd = Bench(ScriptedRuntime(default=history_hash))
    short = crowd.submit(crowd.job((40,)), crowd.job((41, 42)), crowd.job((43, 44, 45)))
    crowded = crowd.submit(crowd.job(src))  # slot 3 at first; moves down as the short ones finish
    crowd.step()
    late = crowd.submit(crowd.job((50, 51, 52, 53)))  # joins while the others decode
    crowd.run()
    assert crowd.tokens(crowded) == alone.tokens(job) and len(alone.tokens(job)) == len(src)
    assert crowd.rt.rows[:4] == [4, 5, 4, 3]  # continuous batching: the late text joined at step 2
    assert all(crowd.end(j).reason == FinishReason.EOS for j in (*short, late))


def test_the_in_place_step_decodes_what_the_gathering_step_decodes():
    def outcome(inplace: bool):
        bench = Bench(ScriptedRuntime(default=history_hash, inplace=inplace))
        jobs = bench.submit(bench.job((11, 12, 13)), bench.job((21, 22, 23, 24, 25), beam_size=3),
                            bench.job((31, 32), temperature=1.0, seed=5, num_hypotheses=2))
        bench.run()
        return bench, [[(h.tokens, round(h.score, 4)) for h in bench.end(j).hypotheses] for j in jobs]
    _, expected = outcome(False)
    in_place, got = outcome(True)
    assert got == expected and in_place.rt.inplace.runs > 0 and not in_place.rt.rows


def test_the_slot_cache_refuses_what_it_cannot_hold():
    cache = SlotCache(SPEC, 2, 4, 8)
    k = np.zeros((SPEC.n_dec_layers, SPEC.n_heads, 6, SPEC.head_dim), np.float32)
    with pytest.raises(RuntimeError, match="slots"):
        cache.allocate(k, k, np.ones(3, bool), 3, BOS)
    with pytest.raises(RuntimeError, match="exceeds"):
        cache.allocate(k, k, np.ones(6, bool), 1, BOS)
    assert cache.used == 0 and lazy_zeros((0, 3)).shape == (0, 3)


# -- admission and the queue -------------------------------------------------------------------------
def test_admission_is_first_come_first_served_even_when_a_later_text_would_fit():
    bench = Bench(slots=4)
    first = bench.submit(bench.job((10, 11, 12)))
    bench.step()
    beam, small = bench.submit(bench.job((20, 21), beam_size=4), bench.job((30,)))
    bench.step()  # 3 slots free: the beam needs 4, and the small text may not overtake it
    assert bench.cache.used == 1 and list(bench.sched.waiting) == [beam, small]
    bench.run()
    assert bench.rt.encoded == [[(10, 11, 12)], [(20, 21)], [(30,)]]
    assert bench.tokens(first) == [10, 11, 12] and bench.tokens(beam) == [20, 21] and bench.tokens(small) == [30]


def test_interactive_texts_are_admitted_before_waiting_background_ones():
    bench = Bench(slots=2)
    running = bench.submit(bench.job((10, 11, 12)))
    bench.step()
    docs = bench.submit(*[bench.job((20 + i,), background=True) for i in range(3)])
    chat = bench.submit(bench.job((30, 31)))  # arrives after the document's texts, goes first
    bench.step()  # one slot free: the interactive text takes it
    assert bench.rt.encoded[1] == [(30, 31)] and list(bench.sched.waiting) == list(docs)
    late = bench.submit(bench.job((40,)))
    bench.run()
    order = [src for batch in bench.rt.encoded for src in batch]
    assert order.index((40,)) < order.index((20,))  # the slots stayed full: the later interactive text first
    # Background texts keep their own order, and their results are what they are alone.
    assert [order.index((20 + i,)) for i in range(3)] == sorted(order.index((20 + i,)) for i in range(3))
    assert [bench.tokens(j) for j in (running, *docs, chat, late)] == [[10, 11, 12], [20], [21], [22], [30, 31], [40]]
    assert not bench.sched.background


def test_work_queued_behind_a_job_that_cannot_start_is_swept_for_cancels_and_deadlines():
    """Admission reads the queue's head; what waits behind a job that found no slot is looked at for
    cancellations and deadlines every SWEEP_S (answered that late at most), not at every step."""
    from server.core.scheduler import SWEEP_S
    bench = Bench(slots=1)
    now = time.monotonic()
    bench.submit(bench.job((10, 11, 12, 13)))
    bench.step(now)  # the slot is taken
    blocked, cancelled, expiring = bench.submit(bench.job((20,)), bench.job((21,)), bench.job((22,), deadline=now + 1))
    cancelled.cancel()
    bench.step(now + 2)  # swept (the first look): both answered although the head cannot start
    assert isinstance(bench.end(cancelled), Cancelled) and isinstance(bench.end(expiring), DeadlineExceeded)
    later = bench.submit(bench.job((23,)))
    later.cancel()
    bench.step(now + 2 + SWEEP_S / 2)  # within the interval: not looked at yet
    assert bench.events[later.id] == []
    # Just past the interval: (now + 2 + SWEEP_S) - (now + 2) rounds below SWEEP_S for some clock values.
    bench.step(now + 2 + SWEEP_S * 1.01)
    assert isinstance(bench.end(later), Cancelled)
    assert list(bench.sched.waiting) == [blocked]


def test_background_texts_take_at_most_half_the_queue():
    bench = Bench(max_queue=8)
    bench.submit(*[bench.job((20 + i,), background=True) for i in range(3)])
    with pytest.raises(ResourceExhausted, match="background"):
        bench.submit(*[bench.job((30 + i,), background=True) for i in range(2)])
    bench.submit(*[bench.job((40 + i,)) for i in range(5)])  # interactive texts find the rest
    bench.run()
    lone = Bench(max_queue=8)  # an empty queue takes a background request of any size it could hold
    lone.submit(*[lone.job((20 + i,), background=True) for i in range(6)])
    lone.run()


def test_the_encoder_budget_splits_admission_and_an_oversized_text_goes_alone():
    bench = Bench(max_encode_tokens=10, max_encode_batch=2)
    a, b, c, d, e = bench.submit(*[bench.job(s) for s in ((10,) * 5, (11,) * 5, (12,) * 6, (13,) * 12, (14,))])
    bench.run()
    # 5 + 5 fill the budget; 6 + 12 would not; 12 alone exceeds it but goes alone; 12 + 1 would not.
    assert bench.rt.encoded == [[(10,) * 5, (11,) * 5], [(12,) * 6], [(13,) * 12], [(14,)]]
    assert [bench.end(j).reason for j in (a, b, c, d, e)] == [FinishReason.EOS] * 5


def test_a_busy_engine_trims_its_heap_every_few_seconds_and_the_next_pass_gives_its_arena_back(monkeypatch):
    """Memory a busy engine freed goes back every HEAP_TRIM_S, not only once idle (server/core/engine.py
    trim_heap): the heap at once, the encoder's arena after its next pass; never more often."""
    import server.core.engine as engine_module
    trims = []
    monkeypatch.setattr(engine_module, "release_free_heap", lambda: trims.append(1))
    bench = Bench()
    start = bench.engine._trimmed_at
    bench.submit(bench.job((10, 11)))
    bench.run()
    bench.engine.trim_heap(start + engine_module.HEAP_TRIM_S / 2)
    assert trims == []  # not yet
    bench.engine.trim_heap(start + engine_module.HEAP_TRIM_S)
    assert trims == [1]
    bench.submit(bench.job((12, 13)))
    bench.run()
    bench.submit(bench.job((14, 15)))
    bench.run()
    assert bench.rt.gave_back[-2:] == [True, False]  # the first pass after the trim, and only it


def test_running_work_does_not_count_against_the_queue():
    bench = Bench(max_queue=2)
    bench.submit(bench.job((10, 11, 12)), bench.job((13, 14, 15)))
    bench.step()  # both run: the queue is empty again
    bench.submit(bench.job((16,)), bench.job((17,)))
    with pytest.raises(ResourceExhausted):
        bench.submit(bench.job((18,)))
    bench.run()


def test_a_cancelled_queued_text_is_never_encoded():
    bench = Bench(slots=1)
    running, queued = bench.submit(bench.job((10, 11, 12)), bench.job((20, 21)))
    bench.step()
    queued.cancel()
    bench.run()
    assert isinstance(bench.end(queued), Cancelled) and bench.rt.encoded == [[(10, 11, 12)]]
    assert bench.tokens(running) == [10, 11, 12]


def test_cancel_and_deadline_free_every_row_of_a_beam():
    bench = Bench(slots=8)
    now = time.monotonic()
    cancelled = bench.submit(bench.job(range(10, 30), beam_size=4))
    expiring = bench.submit(bench.job(range(30, 50), beam_size=3, deadline=now + 60))
    bench.step(now)
    bench.step(now)
    assert bench.cache.used == 7
    cancelled.cancel()
    bench.step(now)
    assert bench.cache.used == 3 and isinstance(bench.end(cancelled), Cancelled)
    bench.step(now + 61)
    assert bench.cache.used == 0 and bench.sched.idle and isinstance(bench.end(expiring), DeadlineExceeded)


def test_embedding_means_skip_padding_and_queued_embeddings_honour_cancel_and_deadline():
    bench = Bench()
    got: dict[str, object] = {}
    short = EmbedJob("m", [10, 20], lambda v: got.setdefault("short", v))
    long = EmbedJob("m", [10, 20, 30, 40, 50, 60], lambda v: got.setdefault("long", v))
    gone = EmbedJob("m", [10], lambda v: got.setdefault("gone", v))
    late = EmbedJob("m", [10], lambda v: got.setdefault("late", v), deadline=time.monotonic() - 1)
    translated = bench.job((70, 71))
    bench.submit(short, translated, long, gone, late)
    gone.cancel()
    bench.run()
    assert got["short"][0] == pytest.approx(15.0) and got["long"][0] == pytest.approx(35.0)
    assert isinstance(got["gone"], Cancelled) and isinstance(got["late"], DeadlineExceeded)
    assert bench.tokens(translated) == [70, 71] and len(bench.rt.encoded) == 2  # embeddings: one pass


def test_timing_records_each_stage_in_order():
    bench = Bench()
    job = bench.submit(bench.job((10, 11, 12)))
    bench.run()
    t = bench.end(job).timing
    assert t.arrival <= t.scheduled <= t.first_token <= t.last_token <= t.finished
    s = t.seconds()
    assert 0 <= s["queue"] <= s["first_token"] <= s["total"] == pytest.approx(t.finished - t.arrival)
    pending = Timing(arrival=time.monotonic() - 5).seconds()  # unfinished: measured up to now
    assert pending["queue"] == pending["first_token"] == pending["total"] >= 5


# -- finishing: EOS, length, forced tokens, prefix, Marian's forced EOS -------------------------------
FORCED_TABLE = follows({(77, 20, 21): {30: 0.9, 40: 0.1}, (77, 20, 21, 30): {31: 0.9, 41: 0.1},
                        (77, 20, 21, 30, 31): {EOS: 1.0}})


@pytest.mark.parametrize("beam", [1, 2])
def test_forced_language_token_and_prefix_are_fed_back_and_only_the_prefix_is_output(beam):
    bench = Bench(ScriptedRuntime(default=FORCED_TABLE))
    job = bench.submit(bench.job((5, 6), beam_size=beam, forced=(77,), prefix=(20, 21), stream=True))
    bench.run()
    assert bench.tokens(job) == [20, 21, 30, 31] and bench.end(job).reason == FinishReason.EOS
    assert sum(bench.streamed(job), []) == [20, 21, 30, 31]  # the prefix streams, the language token not


@pytest.mark.parametrize("beam", [1, 2])
def test_force_eos_at_limit_ends_with_eos_at_the_budget(beam):
    forced = Bench(rules=GenerationRules(EOS, force_eos_at_limit=True, start_id=BOS))
    plain = Bench()
    src = range(10, 20)
    f = forced.submit(forced.job(src, max_len=4, beam_size=beam))
    p = plain.submit(plain.job(src, max_len=4, beam_size=beam))
    forced.run()
    plain.run()
    assert forced.tokens(f) == [10, 11, 12] and forced.end(f).reason == FinishReason.EOS
    assert plain.tokens(p) == [10, 11, 12, 13] and plain.end(p).reason == FinishReason.LENGTH


@pytest.mark.parametrize("renormalize", [False, True])
def test_min_output_tokens_holds_eos_back_in_greedy_and_beam_rows(renormalize):
    bench = Bench(ScriptedRuntime(default=says()), renormalize=renormalize)  # EOS at once, unless banned
    free = bench.submit(bench.job((10,)))
    greedy = bench.submit(bench.job((10,), min_output_tokens=3, repetition_penalty=4.0))
    beam = bench.submit(bench.job((10,), min_output_tokens=3, beam_size=2, no_repeat_ngram_size=2))
    bench.run()
    assert bench.tokens(free) == []
    # Greedy by hand: EOS banned; 90 (6.0); 90 penalised to 1.5, so 91 (5.0); 90 (1.5 > 91's 1.25); EOS.
    assert bench.tokens(greedy) == [90, 91, 90] and bench.end(greedy).reason == FinishReason.EOS
    out = bench.tokens(beam)
    assert len(out) >= 3 and bench.end(beam).reason == FinishReason.EOS and set(out) <= {90, 91}


@pytest.mark.parametrize("beam", [1, 2])
def test_suppressed_and_unknown_tokens_are_never_chosen(beam):
    bench = Bench(ScriptedRuntime(default=says(50, UNK, 40)), suppress=(50,))
    banned = bench.submit(bench.job((10,), beam_size=beam, no_unknown_token=True))
    allowed = bench.submit(bench.job((10,), beam_size=beam))
    bench.run()
    assert bench.tokens(banned) == [90, 90, 40] and bench.tokens(allowed) == [90, UNK, 40]


# -- beam search: scores by hand ---------------------------------------------------------------------
A, B, C, D = 10, 11, 12, 13
GARDEN = follows({(): {A: 0.6, B: 0.4}, (A,): {20: 0.34, 21: 0.33, 22: 0.33}, (B,): {C: 0.99, D: 0.01},
                  **{(A, t): {EOS: 1.0} for t in (20, 21, 22)}, (B, C): {EOS: 1.0}, (B, D): {EOS: 1.0}})


def test_beam_search_finds_the_path_greedy_misses_with_exact_scores():
    bench = Bench(ScriptedRuntime(default=GARDEN))
    greedy = bench.submit(bench.job((1,)))
    beam = bench.submit(bench.job((1,), beam_size=2, num_hypotheses=2))
    bench.run()
    assert bench.tokens(greedy) == [A, 20]  # 0.6 x 0.34 = 0.204 < 0.4 x 0.99 = 0.396
    hyps = bench.end(beam).hypotheses
    assert [h.tokens for h in hyps] == [[B, C], [A, 20]]
    # Scores: log-probability / length, the length counting EOS (alpha = 1).
    assert [h.score for h in hyps] == pytest.approx([math.log(0.396) / 3, math.log(0.204) / 3], abs=1e-5)
    assert all(h.finished_by_eos for h in hyps) and bench.end(beam).reason == FinishReason.EOS


EARLY = follows({(): {EOS: 0.40, A: 0.35, B: 0.25}, (A,): {EOS: 0.30, C: 0.70}, (B,): {EOS: 0.90, D: 0.10},
                 (A, C): {EOS: 1.0}, (B, D): {EOS: 1.0}})


@pytest.mark.parametrize("early_stopping, tokens, score", [
    (True, [B], math.log(0.25 * 0.90) / 2),  # done with K = 2 finished: [] and [B]
    (False, [A, C], math.log(0.35 * 0.70) / 3),  # the live A C could still beat them: it does
])
def test_beam_early_stopping_rules(early_stopping, tokens, score):
    bench = Bench(ScriptedRuntime(default=EARLY), rules=GenerationRules(EOS, early_stopping=early_stopping,
                                                                        start_id=BOS))
    job = bench.submit(bench.job((1,), beam_size=2))
    bench.run()
    (best,) = bench.end(job).hypotheses
    assert best.tokens == tokens and best.score == pytest.approx(score, abs=1e-5)


def test_a_beam_stream_sends_the_winner_once_before_it_finishes():
    bench = Bench(ScriptedRuntime(default=GARDEN))
    job = bench.submit(bench.job((1,), beam_size=2, stream=True))
    bench.run()
    assert bench.streamed(job) == [[B, C]] and isinstance(bench.events[job.id][-1], FinishEvent)


# -- sampling ----------------------------------------------------------------------------------------
SPREAD = positional([{10: 0.4, 11: 0.3, 12: 0.2, 13: 0.1}] * 4)


def test_seeded_sampling_is_the_same_in_any_slot_and_differs_by_seed():
    def sample(seed: int, crowd: bool) -> list[int]:
        bench = Bench(ScriptedRuntime({(40,): says(), (41, 42): says(10), (43,): says(10, 11)}, default=SPREAD))
        if crowd:  # earlier texts take the first slots, and finish at different steps (the row moves)
            bench.submit(bench.job((40,), temperature=1.0), bench.job((41, 42)), bench.job((43,), beam_size=2))
        job = bench.submit(bench.job((1,), temperature=1.0, seed=seed))
        bench.run()
        return bench.tokens(job)
    outputs = {seed: sample(seed, False) for seed in range(8)}
    assert all(sample(seed, True) == out for seed, out in list(outputs.items())[:3])
    assert all(len(o) == 4 and set(o) <= {10, 11, 12, 13} for o in outputs.values())
    assert len({tuple(o) for o in outputs.values()}) > 1


def test_sampled_hypotheses_rank_by_their_exact_log_probability():
    bench = Bench(ScriptedRuntime(default=SPREAD))
    job = bench.submit(bench.job((1,), temperature=1.0, seed=3, num_hypotheses=4))
    unseeded = bench.submit(bench.job((1,), temperature=0.7))
    bench.run()
    p = {10: 0.4, 11: 0.3, 12: 0.2, 13: 0.1}
    hyps = bench.end(job).hypotheses
    assert [h.score for h in hyps] == pytest.approx([sum(math.log(p[t]) for t in h.tokens) for h in hyps],
                                                    abs=1e-4)
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True) and len(hyps) == 4
    assert set(bench.tokens(unseeded)) <= set(p)


def test_top_k_one_and_a_tiny_top_p_sample_the_greedy_path():
    bench = Bench(ScriptedRuntime(default=SPREAD))
    top_k = bench.submit(bench.job((1,), temperature=2.0, top_k=1, seed=1))
    top_p = bench.submit(bench.job((1,), temperature=2.0, top_p=0.05, seed=2))
    bench.run()
    assert bench.tokens(top_k) == bench.tokens(top_p) == [10, 10, 10, 10]


def test_alternatives_branch_at_the_first_free_position_after_a_prefix():
    table = follows({(20,): {30: 0.5, 31: 0.3, 32: 0.2}, (20, 30): {EOS: 1.0}, (20, 31): {EOS: 1.0},
                     (20, 32): {EOS: 1.0}})
    bench = Bench(ScriptedRuntime(default=table))
    job = bench.submit(bench.job((1,), alternatives=3, prefix=(20,)))
    bench.run()
    assert [h.tokens for h in bench.end(job).hypotheses] == [[20, 30], [20, 31], [20, 32]]


# -- streams and the runaway guard -------------------------------------------------------------------
@pytest.mark.parametrize("interval, sizes", [(1, [1] * 10), (3, [1, 3, 3, 3]), (4, [1, 4, 4, 1])])
def test_stream_messages_come_first_at_once_then_every_interval_then_the_rest(interval, sizes):
    bench = Bench(stream_interval=interval)
    src = list(range(10, 20))
    job = bench.submit(bench.job(src, stream=True))
    bench.run()
    assert [len(m) for m in bench.streamed(job)] == sizes and sum(bench.streamed(job), []) == src
    assert isinstance(bench.events[job.id][-1], FinishEvent) and bench.tokens(job) == src


@pytest.mark.parametrize("interval", [1, 4])
def test_a_stream_stopped_by_the_guard_sends_exactly_the_unary_answer(interval):
    bench = Bench(ScriptedRuntime(default=loops(10, 11, 12)), guard=True, stream_interval=interval)
    unary = bench.submit(bench.job((5, 6, 7), max_len=60))
    stream = bench.submit(bench.job((5, 6, 7), max_len=60, stream=True))
    bench.run()
    out = bench.tokens(unary)
    assert bench.end(unary).reason == bench.end(stream).reason == FinishReason.RUNAWAY
    assert sum(bench.streamed(stream), []) == bench.tokens(stream) == out
    assert out[:3] == [10, 11, 12] and len(out) < 6  # the loop's repeats are gone


def test_the_guard_stops_a_looping_beam_and_keeps_one_occurrence():
    bench = Bench(ScriptedRuntime(default=loops(10, 11, 12)), guard=True)
    job = bench.submit(bench.job((5, 6, 7), max_len=60, beam_size=2, stream=True))
    bench.run()
    done = bench.end(job)
    assert done.reason == FinishReason.RUNAWAY and not done.hypotheses[0].finished_by_eos
    assert bench.tokens(job) == [10, 11, 12] and bench.streamed(job) == [[10, 11, 12]]
    assert bench.metrics.registry.get_sample_value("nmt_runaway_stopped_total", {"model": "m"}) == 1


def test_greedy_and_beam_cut_the_same_loop_the_same_way():
    """One occurrence of the loop stays whatever the decoding (it was [10, 11, 12, 10, 11] for greedy:
    the second cycle's first tokens were settled before the repeat was visible)."""
    bench = Bench(ScriptedRuntime(default=loops(10, 11, 12)), guard=True)
    greedy = bench.submit(bench.job((5, 6, 7), max_len=60))
    beam = bench.submit(bench.job((5, 6, 7), max_len=60, beam_size=2))
    bench.run()
    assert bench.tokens(greedy) == bench.tokens(beam) == [10, 11, 12]
