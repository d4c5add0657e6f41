"""Queues, admission and per-request decoding state. Never touches tensors beyond token ids.

Each engine-loop iteration is  schedule() -> engine work -> update():
  * schedule() drops cancelled and expired work, then admits waiting jobs
    (first come, first served; background jobs after every interactive one) while KV
    slots and the encoder's token budget allow; the result, `Scheduled`, lists the
    jobs to encode and to embed this step.
  * the engine encodes the admitted jobs into fresh slots and runs one decode
    step over every running row (old and new together: continuous batching).
  * controls() says what each running row needs this step (greedy, sampling with
    the row's draw, a forced token, a beam width); the engine chooses the tokens
    (server/core/choose.py) and returns plain arrays.
  * update() applies them: beam steps, streamed tokens, finished rows and jobs,
    freed slots. The scheduler never sees logits.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Optional, TYPE_CHECKING

import numpy as np

from models.core.beam import BeamState
from models.core.kv_cache import Row, SlotCache
from server.core.errors import Cancelled, DeadlineExceeded, Internal, InvalidArgument, ResourceExhausted, Unavailable
from server.core.request import EmbedJob, FinishEvent, FinishReason, GenerationRules, Hypothesis, Job, TokenEvent
from server.core.choose import Choices, RowControls, make_rng
from server.core.controls import step_controls
from server.core.runaway import RunawayGuard
from server.core import term_placement as placement
from server.core.terms import SETTINGS as TERMS, Progress, TermSet, end_candidates, term_set

if TYPE_CHECKING:  # the server hands its metrics in (server/observability/metrics.py); the core only names their type
    from server.observability.metrics import Metrics

log = logging.getLogger(__name__)
# Queued work behind a job that cannot start yet is looked at for cancellations and deadlines this often,
# not every step: a step looked at the whole queue (0.15 s of a 2.3 s decode with 1,000 texts queued,
# cProfile, 2026-11-27), where admission needs only its head.
SWEEP_S = 0.02


@dataclass(eq=False)  # identity: `running.remove(state)` must not compare every field of every state
class Running:
    job: Job
    rows: list[Row]
    beam: Optional[BeamState] = None
    tokens: list[list[int]] = field(default_factory=list)  # per hypothesis (non-beam)
    logprob: list[float] = field(default_factory=list)
    live: list[bool] = field(default_factory=list)
    ended_by_eos: list[bool] = field(default_factory=list)
    guarded: list[bool] = field(default_factory=list)  # stopped by the runaway guard
    # Per hypothesis: how much of the output is settled (can no longer be cut as a loop's repeats): a
    # stream sends no further, a stopped loop is trimmed back to it (never below what was sent).
    kept: list[int] = field(default_factory=list)
    rngs: list = field(default_factory=list)
    unsent: list[int] = field(default_factory=list)  # streamed tokens held for the next TokenEvent
    step: int = 0
    plain: bool = False  # greedy, unscored, nothing forced: the engine's default choice, no controls to set
    scored: bool = False  # track log-probabilities: asked for, or needed to rank several hypotheses
    # Glossary terms the job must write (server/core/terms.py), and each row's progress on them
    # (per hypothesis, or per beam row: reordered with the beam).
    terms: Optional[TermSet] = None
    progress: list[Progress] = field(default_factory=list)
    # A greedy row with terms (placement.py): per output position, the step's boosted tokens and the model's
    # log p of each less its best (the step's two arrays, or None, and the row's slot that step; each
    # step's arrays are new); and each output token's own log p, when scored.
    term_logp: list[list[Optional[tuple]]] = field(default_factory=list)
    token_logp: list[list[float]] = field(default_factory=list)
    rewound: bool = False  # it went back once: later pending terms are written before the ending

    def __post_init__(self) -> None:
        self.scored = self.job.scores or len(self.rows) > 1


@dataclass
class Scheduled:
    """What one schedule() admitted: jobs to encode into fresh slots, and embedding jobs. (Not a document's
    split: that is server/documents/plan.py's Plan.)"""
    encode: list[Job] = field(default_factory=list)
    embed: list[EmbedJob] = field(default_factory=list)


class Scheduler:
    def __init__(self, model: str, cache: SlotCache, metrics: Metrics, eos_id: int,
                 max_queue: int = 256, max_encode_tokens: int = 4096, max_encode_batch: int = 64,
                 stream_interval: int = 1, rules: Optional[GenerationRules] = None,
                 guard: Optional[RunawayGuard] = None):
        self.model, self.cache, self.m = model, cache, metrics.for_model(model)
        self.eos_id = eos_id
        self.rules = rules or GenerationRules(eos_id)
        self.guard = guard or RunawayGuard()
        # Each stream message costs ~100 us of gRPC CPU on both ends (git show ba30137:docs/benchmarks/serving_load.md);
        # under load, sending every N tokens buys that CPU back for decoding.
        self.stream_interval = max(1, stream_interval)
        self.max_queue, self.max_encode_tokens, self.max_encode_batch = max_queue, max_encode_tokens, max_encode_batch
        self.waiting: collections.deque[Job | EmbedJob] = collections.deque()
        self.background = False  # some waiting job is background work (Job.background)
        self.running: list[Running] = []
        self.lock = threading.Lock()
        self.wakeup = threading.Condition(self.lock)
        self.closed = False
        self._unsorted = False  # jobs were queued since the last sort (background work goes last)
        self._controls: Optional[RowControls] = None  # this step's (update() reads the boosted tokens)
        self._boosted: Optional[tuple] = None
        self._swept = -float("inf")  # when schedule() last looked at the whole queue
        self._shown = (-1, -1)  # (running requests, used slots) the gauges last showed (_show_occupancy)

    # -- service side (any thread) ----------------------------------------------
    def submit(self, jobs: list[Job | EmbedJob]) -> None:
        """Queue jobs atomically: all of a request's texts, or none (RESOURCE_EXHAUSTED)."""
        with self.lock:
            if self.closed:
                raise Unavailable("the server is shutting down and accepts no new work")
            if len(jobs) > self.max_queue:  # could never fit, however long the client waits
                raise InvalidArgument(f"{len(jobs)} texts in one request exceed the queue size {self.max_queue}")
            if len(self.waiting) + len(jobs) > self.max_queue:
                raise ResourceExhausted(f"queue full: {len(self.waiting)} texts waiting, limit {self.max_queue}; "
                                        "retry later")
            background = any(job.background for job in jobs)
            # Background work never holds more than half the queue: interactive calls find room behind it.
            if background and self.waiting and len(self.waiting) + len(jobs) > self.max_queue // 2:
                raise ResourceExhausted(f"queue half full ({len(self.waiting)} texts waiting): background work "
                                        "waits; retry later")
            self.background |= background
            self._unsorted = True
            self.waiting.extend(jobs)
            self.m.waiting.set(len(self.waiting))
            self.wakeup.notify()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.wakeup.notify()

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    # -- engine loop side ---------------------------------------------------------
    def wait_for_work(self, timeout: float, stalled: bool = False) -> None:
        """Sleep until a submit (or close), at most `timeout`: when idle, or when `stalled`
        (waiting work that cannot be admitted and nothing running: never spin on it)."""
        with self.lock:
            # Closed or not: a loop that returned at once would spin (draining work it cannot admit, or
            # idle after fail_everything); the loop checks for its exit before it waits.
            if self.idle or stalled:
                self.wakeup.wait(timeout)

    def oldest_wait(self, now: float) -> float:
        with self.lock:
            return now - self.waiting[0].timing.arrival if self.waiting else 0.0

    def schedule(self, now: float) -> Scheduled:
        self._drop_stale_running(now)
        scheduled = Scheduled()
        free = self.cache.free
        tokens = 0
        with self.lock:
            queued = len(self.waiting)
            kept: collections.deque = collections.deque()
            if self.background and self._unsorted:  # interactive jobs first; each kind in arrival order
                self.waiting = collections.deque(sorted(self.waiting, key=lambda j: j.background))
            self._unsorted = False
            sweep = now - self._swept >= SWEEP_S
            if sweep:
                self._swept = now
            while self.waiting:
                job = self.waiting.popleft()
                if job.cancelled or job.expired(now):
                    self._fail(job, Cancelled("cancelled by the client") if job.cancelled
                               else DeadlineExceeded("deadline exceeded while queued"))
                    continue
                rows = job.params.rows if isinstance(job, Job) else 0
                size = len(job.src_ids)
                batch = len(scheduled.encode) + len(scheduled.embed)
                # A text over the encoder budget is encoded alone rather than never (start-up refuses
                # a budget below --max-source-tokens; this keeps the queue moving whatever the limits).
                fits = rows <= free and batch < self.max_encode_batch \
                    and (tokens + size <= self.max_encode_tokens or batch == 0)
                if not fits or kept:  # FIFO: nobody overtakes a job that did not fit
                    kept.append(job)
                    if not sweep:
                        break  # the rest stays as it is until the next sweep
                    continue
                free -= rows
                tokens += size
                job.timing.scheduled = now
                self.m.queue_time.observe(now - job.timing.arrival)
                (scheduled.encode if isinstance(job, Job) else scheduled.embed).append(job)
            kept.extend(self.waiting)
            self.waiting = kept
            if sweep or not kept:
                self.background = self.background and any(j.background for j in kept)
            if len(self.waiting) != queued:  # submit() sets it for what it adds
                self.m.waiting.set(len(self.waiting))
        return scheduled

    def start(self, job: Job, rows: list[Row]) -> None:
        """The engine encoded `job` into `rows`; it decodes from the next step on."""
        p = job.params
        state = Running(job, rows)
        if p.beam_size > 1:
            # A target prefix is the decoder's prompt in transformers' terms (a forced language token then
            # counts as part of it); the language token alone is generated there (forced_bos_token_id).
            prompt = len(job.forced) + len(job.prefix) if job.prefix else 0
            state.beam = BeamState(p.beam_size, self.eos_id, p.length_penalty, self.rules.early_stopping, prompt)
        else:
            n = len(rows)
            state.tokens, state.logprob = [[] for _ in range(n)], [0.0] * n
            state.live, state.ended_by_eos, state.guarded = [True] * n, [False] * n, [False] * n
            state.kept = [0] * n
            state.rngs = [make_rng(p.seed, i) if p.sampling else None for i in range(n)]
        state.terms = term_set(job.terms, self.rules.pieces)
        if state.terms is not None:
            state.progress = [state.terms.start()] * len(rows)
            state.term_logp, state.token_logp = [[] for _ in rows], [[] for _ in rows]
        state.plain = state.beam is None and not (p.sampling or state.scored or job.forced or job.prefix
                                                   or p.controlled or self.rules.force_eos_at_limit or job.terms)
        self.running.append(state)
        self.m.input_tokens.inc(len(job.src_ids))
        self._show_occupancy()

    def controls(self) -> Optional[RowControls]:
        """What the engine must do for each running row this step (server/core/controls.py). No logits here.
        None when every running request is plain greedy (`Running.plain`: RowControls.greedy's defaults for
        each row), the engine's greedy lane (server/core/greedy.py)."""
        if all(state.plain for state in self.running):
            self._controls = None
        else:
            self._controls = step_controls(self.running, self.cache.used, self.rules)
        return self._controls

    def update(self, choices: Choices, now: float) -> None:
        """The engine's choices for the rows in slot order, from one decode step."""
        tokens, logprobs = choices.token.tolist(), choices.logprob.tolist()
        # Glossary rows: the boosted tokens and the model's log p of each, by slot (placement.py).
        self._boosted = (self._controls.boost, choices.boost_logp) \
            if choices.boost_logp is not None and self._controls is not None else None

        def take(state: Running) -> None:
            if state.beam is not None:
                self._beam_update(state, choices, now)
            else:
                self._row_update(state, tokens, logprobs, now)
        self._apply(take, choices.failed, 1)

    def remaining(self) -> np.ndarray:
        """(B,) by slot: the output tokens each row may still write (a visit's rows are all plain: one row each)."""
        out = np.zeros(self.cache.used, np.int64)
        for state in self.running:
            out[state.rows[0].slot] = state.job.max_len - len(state.tokens[0])
        return out

    def update_visit(self, steps: list[Choices], now: float) -> None:
        """The choices of one visit's decode steps (Engine.decode_visit), every running request plain greedy:
        one update for all of them. Each row takes its tokens in order until it ends (EOS, its length limit or
        the runaway guard, checked after every token as one step at a time would), and what its stream holds
        goes out once, in one message. Only the last step can have failed rows (the visit ends there)."""
        if len(steps) == 1:
            self.update(steps[0], now)
            return
        columns = np.stack([c.token for c in steps], axis=1).tolist()  # (B, steps): each slot's tokens in order
        self._boosted = None
        self._apply(lambda state: self._plain_update(state, state.rows[0], columns[state.rows[0].slot], now),
                    steps[-1].failed, len(steps))

    def _apply(self, take, failed, steps: int) -> None:
        """`take(state)` for every running request after `steps` decode steps, unless its rows are among the
        last step's `failed` ones; then the slots of ended rows are released (slots must not move while the
        choices are read by slot)."""
        self._to_release: list[Row] = []
        self._gaps: list[float] = []
        for state in list(self.running):
            # One request's failure is its own (issue 33): rows the engine could not choose for, or a
            # bug in this request's bookkeeping, end this request alone; the others go on unchanged.
            if failed is not None and failed[[r.slot for r in state.rows]].any():
                self._fail_state(state, Internal(f"the model gave request {state.job.id} no usable scores "
                                                 f"at decode step {state.step + steps - 1} (NaN or infinite "
                                                 "logits)"))
                continue
            try:
                take(state)
            except Exception as e:  # noqa: BLE001
                log.exception("request %s: its step update failed; it alone fails", state.job.id)
                self._fail_state(state, Internal(f"internal error updating request {state.job.id}: {e}"))
                continue
            state.step += steps
        self.m.inter_token.observe_many(self._gaps)
        self.cache.release(self._to_release)
        self._show_occupancy()

    # -- internals ------------------------------------------------------------------
    def _plain_update(self, state: Running, row: Row, tokens: list[int], now: float) -> None:
        """_row_update's rules for a plain request (one greedy row, nothing forced, scored or pending) over
        several tokens: the same outputs, ends and stream cuts as taking them one step at a time."""
        job, out = state.job, state.tokens[0]
        for tok in tokens:
            if tok == self.eos_id:
                state.live[0], state.ended_by_eos[0] = False, True
                break
            out.append(tok)
            if job.stream:
                state.unsent.append(tok)
            tripped, tail = self.guard.check(out, len(job.src_ids))
            state.kept[0] = max(state.kept[0], len(out) - tail)
            if tripped:  # the loop's repeats go; one occurrence stays (docs/runaway.md)
                state.live[0], state.guarded[0] = False, True
                self.m.guarded_rows.inc()
                cut = len(out) - state.kept[0]
                if cut:
                    del out[state.kept[0]:]
                    if job.stream:
                        del state.unsent[len(state.unsent) - cut:]
                break
            if len(out) >= job.max_len:
                state.live[0] = False
                break
        else:
            row.token = tokens[-1]  # still live: the visit's last token is its next input
        self._after_tokens(state, [] if state.live[0] else [row], now)

    def _row_update(self, state: Running, tokens: list[int], logprobs: list[float], now: float) -> None:
        job = state.job
        finished_rows = []
        forced = state.step < len(job.forced)
        rewinds = state.terms is not None and self._rewinds(state)
        for i in [i for i, live in enumerate(state.live) if live]:
            row = state.rows[i]
            tok = tokens[row.slot]
            if forced:  # not an output token: fed back, never returned or streamed
                row.token = tok
                continue
            if state.scored:
                state.logprob[i] += logprobs[row.slot]
            if state.terms is not None:  # ending with glossary terms pending: the first one is written instead
                if rewinds:  # this output position's record, read only if the row goes back (placement.py)
                    state.term_logp[i].append((self._boosted, row.slot))
                    if state.scored:
                        state.token_logp[i].append(logprobs[row.slot])
                swapped, progress = state.terms.instead_of_end(state.progress[i], tok, self.eos_id,
                                                               job.max_len - len(state.tokens[i]))
                if swapped != tok and rewinds and self._rewind(state, i, tok, swapped):
                    continue  # ... or, greedy, the row goes back to the likeliest place of it (placement.py)
                tok, state.progress[i] = swapped, progress
            if tok == self.eos_id:
                state.live[i], state.ended_by_eos[i] = False, True
            else:
                state.tokens[i].append(tok)
                row.token = tok
                if state.terms is not None:
                    state.progress[i] = state.terms.advance(state.progress[i], tok)
                if i == 0 and job.stream:
                    state.unsent.append(tok)
                out = state.tokens[i]
                tripped, tail = self.guard.check(out, len(job.src_ids))
                state.kept[i] = max(state.kept[i], len(out) - tail)
                if tripped:  # the loop's repeats go; one occurrence stays (docs/runaway.md)
                    state.live[i], state.guarded[i] = False, True
                    self.m.guarded_rows.inc()
                    cut = len(out) - state.kept[i]
                    if cut:
                        del out[state.kept[i]:]
                        if i == 0 and job.stream:
                            del state.unsent[len(state.unsent) - cut:]
                elif len(out) >= job.max_len:
                    state.live[i] = False
            if not state.live[i]:
                finished_rows.append(row)
        if forced:
            return
        self._after_tokens(state, finished_rows, now)

    def _after_tokens(self, state: Running, finished_rows: list[Row], now: float) -> None:
        """A non-beam request took this update's tokens: its stream's message, its ended rows, its answer."""
        job = state.job
        self._observe_token(job, now)
        # Streams follow hypothesis 0: its first token at once, then every stream_interval tokens,
        # and whatever is held when it ends (before the FinishEvent). Tokens repeating the n-gram
        # before them wait (they may turn out to be a loop the guard cuts) until the repeat breaks.
        if state.unsent and not (state.live[0] and self._holds(state)):
            ready = len(state.unsent) - (len(state.tokens[0]) - state.kept[0]) if state.live[0] else len(state.unsent)
            if ready > 0 and (len(state.tokens[0]) == 1 or ready >= self.stream_interval or not state.live[0]):
                job.sink(TokenEvent(state.unsent[:ready]))
                del state.unsent[:ready]
        self._to_release.extend(finished_rows)
        if not any(state.live):
            hyps = [Hypothesis(t, lp, eos) for t, lp, eos in zip(state.tokens, state.logprob, state.ended_by_eos)]
            # Alternatives stay in the order of their first token's rank; several samples rank by score.
            order = list(range(len(hyps))) if job.params.alternatives or len(hyps) == 1 else \
                sorted(range(len(hyps)), key=lambda i: -hyps[i].score)
            first = order[0]
            reason = FinishReason.EOS if state.ended_by_eos[first] else \
                FinishReason.RUNAWAY if state.guarded[first] else FinishReason.LENGTH
            self._finish(state, [hyps[i] for i in order], reason, now)

    def _beam_update(self, state: Running, choices: Choices, now: float) -> None:
        job = state.job
        slots = [r.slot for r in state.rows]
        n_forced = len(job.forced)
        last = state.step == job.max_len - 1 + n_forced
        ids, logp, held = choices.beam_ids[slots], choices.beam_logp[slots], {}
        if state.terms is not None and state.step >= n_forced:  # no hypothesis ends with a term missing
            ids, logp, held = end_candidates(state.terms, state.progress, ids, logp, self.eos_id,
                                             job.max_len + n_forced - state.step)
        parents, tokens = state.beam.advance_candidates(ids, logp, state.step, last)
        if state.step >= n_forced:
            self._observe_token(job, now)
            if state.terms is not None:  # each new beam row continues its parent's progress
                state.progress = [state.terms.advance(held.get((p, t), state.progress[p]), t)
                                  for p, t in zip(parents.tolist(), tokens.tolist())]
        guarded = not state.beam.finished and self.guard.tripped(state.beam.history[0], len(job.src_ids), n_forced)
        if guarded:  # the best live beam loops: end with what the beam has
            state.beam.stop(state.step)
            self.m.guarded_rows.inc()
        if state.beam.finished:
            best = [dataclasses.replace(h, tokens=h.tokens[n_forced:])
                    for h in state.beam.best(job.params.num_hypotheses)]
            if guarded:  # the loop's repeats go, one occurrence stays (beam streams only at its end)
                best = [dataclasses.replace(h, tokens=h.tokens[:len(h.tokens) - self.guard.check(
                    h.tokens, len(job.src_ids))[1]]) for h in best]
            if job.stream:
                job.sink(TokenEvent(best[0].tokens))
            reason = FinishReason.EOS if best[0].finished_by_eos else \
                FinishReason.RUNAWAY if guarded else FinishReason.LENGTH
            self._to_release.extend(state.rows)
            self._finish(state, best, reason, now)
            return
        self.cache.reorder(state.rows, parents.tolist())
        for row, tok in zip(state.rows, tokens.tolist()):
            row.token = tok

    # -- glossary terms a greedy row never began (server/core/term_placement.py) ---------------------
    def _rewinds(self, state: Running) -> bool:
        """Whether the job's row may go back for a term it never began: greedy, one row, once (each time
        decodes the positions after the place again: once bounds what a sentence with many terms costs)."""
        return TERMS.rewind and not state.rewound and len(state.rows) == 1 and not state.job.params.sampling

    def _holds(self, state: Running) -> bool:
        """A stream whose terms are not all written yet sends nothing: going back may still change its text."""
        return state.terms is not None and self._rewinds(state) and \
            bool(state.progress[0].pending or state.progress[0].seq)

    def _rewind(self, state: Running, i: int, tok: int, swapped: int) -> bool:
        """Row i chose to end (`tok`) with a term pending: back to the place where the model found the term's
        first token likeliest, the term forced from there. False where that place is the end: the term
        is then written before the ending."""
        terms, job = state.terms, state.job
        base = state.tokens[i]
        if tok != self.eos_id and terms.vocab.ends.get(tok, (-1,))[0] == swapped:  # "▁Straße." -> "▁Straße"
            base = base + [swapped]
        text = "".join(terms.vocab.piece_text(t) for t in base)
        pending = terms.unwritten(state.progress[i].pending, text, final=True)
        if not pending:
            return False
        first = terms.terms[pending[0]][0][0][0]
        replay = placement.Replay(terms, base)
        t = placement.best_place(base, lambda x: terms.vocab.piece_text(x).startswith(" "),
                                 [placement.logp_of(first, seen) for seen in state.term_logp[i]], replay.inside_term,
                                 TERMS.rewind_within)
        if t >= len(state.tokens[i]):
            return False
        n_forced = len(job.forced)
        fed = base[t - 1] if t else job.forced[-1] if n_forced else self.rules.start_id
        self.cache.rewind(state.rows[i], n_forced + t, fed)
        state.step = n_forced + t - 1  # update() counts the step that just ran: the next is n_forced + t
        del state.tokens[i][t:], state.term_logp[i][t:]
        state.kept[i] = min(state.kept[i], t)
        if state.scored:
            del state.token_logp[i][t:]
            state.logprob[i] = float(sum(state.token_logp[i]))
        if job.stream:  # it held everything while the term was pending
            state.unsent = list(state.tokens[i])
        state.progress[i] = placement.placed(terms, replay.at(t), pending[0])
        state.rewound = True
        self.m.glossary_rewinds.inc()
        return True

    def _observe_token(self, job: Job, now: float) -> None:
        t = job.timing
        if t.first_token is None:
            t.first_token = now
            self.m.ttft.observe(now - t.arrival)
        else:
            self._gaps.append(now - t.last_token)  # observed once per step (metrics.BatchHistogram)
        t.last_token = now

    def _finish(self, state: Running, hyps: list[Hypothesis], reason: FinishReason, now: float) -> None:
        job = state.job
        self.running.remove(state)
        if job.answered:
            return
        job.answered = True
        job.timing.finished = now
        produced = sum(len(h.tokens) for h in hyps[:1])
        self.m.output_tokens.inc(produced)
        self.m.output_length.observe(produced)
        self.m.e2e.observe(now - job.timing.arrival)
        job.sink(FinishEvent(hyps, reason, len(job.src_ids), job.timing))

    def _fail(self, job: Job | EmbedJob, error: Exception) -> None:
        if job.answered:  # fail_everything answered it from another thread; the loop only drops it now
            return
        job.answered = True
        job.timing.finished = time.monotonic()
        job.sink(job.failure(error))

    def fail_unstarted(self, jobs: list, error: Exception) -> None:
        """Jobs schedule() admitted whose encoder pass failed before they started: answer each once."""
        started = {id(state.job) for state in self.running}
        for job in jobs:
            if id(job) not in started and not job.answered and job.timing.finished is None:
                self._fail(job, error)

    def _fail_state(self, state: Running, error: Exception) -> None:
        """Fail one running request inside update(): its rows are released with the step's others."""
        if state in self.running:
            self.running.remove(state)
        queued = {id(r) for r in self._to_release}
        self._to_release.extend(r for r in state.rows if r.slot >= 0 and id(r) not in queued)
        self.m.failed_rows.inc(len(state.rows))
        self._fail(state.job, error)

    def _drop_stale_running(self, now: float) -> None:
        for state in list(self.running):
            job = state.job
            if job.cancelled or job.expired(now):
                self.cache.release([r for r in state.rows if r.slot >= 0])
                self.running.remove(state)
                self._fail(job, Cancelled("cancelled by the client") if job.cancelled
                           else DeadlineExceeded(f"deadline exceeded after {state.step} decode steps"))
        self._show_occupancy()

    def _show_occupancy(self) -> None:
        """The running-requests and KV-usage gauges, set only when they changed: a gauge's set takes a lock,
        and every step setting both was a few per cent of the engine's Python at one row."""
        shown = (len(self.running), self.cache.used)
        if shown != self._shown:
            self._shown = shown
            self.m.running.set(shown[0])
            self.m.kv_usage.set(self.cache.usage())

    def fail_everything(self, error: Exception) -> int:
        """From any thread, when the engine loop is dead or stuck: close the queue and fail every
        waiting and running job at once. Running state is left to the engine thread (it may be
        stuck inside it); the jobs are only marked cancelled, so a loop that wakes up drops them.
        Returns how many jobs were failed."""
        with self.lock:
            self.closed = True
            waiting, self.waiting = list(self.waiting), collections.deque()
            running = [st.job for st in list(self.running)]
        for job in waiting + running:
            job.cancel()
            self._fail(job, error)
        self.m.waiting.set(0)
        return len(waiting) + len(running)

    def abort_all(self, error: Exception) -> None:
        """Shutdown after the grace period: fail whatever is left."""
        with self.lock:
            waiting, self.waiting = list(self.waiting), collections.deque()
        for job in waiting:
            self._fail(job, error)
        self.m.waiting.set(0)
        self.fail_running(error)

    def fail_running(self, error: Exception) -> None:
        """A step failed: fail the rows that were in it and free their slots. The queue is left alone:
        its requests never reached the engine, and get their own chance."""
        for state in list(self.running):
            self.cache.release([r for r in state.rows if r.slot >= 0])
            self.running.remove(state)
            self._fail(state.job, error)
        self._show_occupancy()
