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
    (server/core/chooser.py) and returns plain arrays.
  * update() applies them (server/core/update.py): beam steps, streamed tokens,
    finished rows and jobs, freed slots. The scheduler never sees logits.
"""
from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Optional, TYPE_CHECKING


from models.core.beam import BeamState
from models.core.kv_cache import Row, SlotCache
from server.core.errors import Cancelled, DeadlineExceeded, InvalidArgument, ResourceExhausted, Unavailable
from server.core.request import EmbedJob, GenerationRules, Job
from server.core.chooser import RowControls, make_rng
from server.core.row_controls import step_controls
from server.core.runaway import RunawayGuard
from server.core.terms import Progress, TermSet, term_set
from server.core.update import StepUpdates

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
    split: that is server/texts/plan.py's Plan.)"""
    encode: list[Job] = field(default_factory=list)
    embed: list[EmbedJob] = field(default_factory=list)


class Scheduler(StepUpdates):  # the update phase: server/core/update.py
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
        """What the engine must do for each running row this step (server/core/row_controls.py). No logits here.
        None when every running request is plain greedy (`Running.plain`: RowControls.greedy's defaults for
        each row), the engine's greedy lane (server/core/greedy.py)."""
        if all(state.plain for state in self.running):
            self._controls = None
        else:
            self._controls = step_controls(self.running, self.cache.used, self.rules)
        return self._controls

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
