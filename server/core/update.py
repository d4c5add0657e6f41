"""The update phase: one decode step's choices (or one visit's steps) applied to every running request.

The scheduler's third phase (schedule -> execute -> update; server/core/loop.py): beam steps, streamed
tokens, the runaway guard, glossary terms written or placed, finished rows and jobs, freed slots. A
request's failure here is its own. Plain data in (Choices: token ids, log-probabilities), events out; no
logits. `StepUpdates` is the part of the Scheduler (server/core/scheduler.py) that does it: it reads and
writes the scheduler's running state, on the engine loop's thread only.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

import numpy as np

from models.core.kv_cache import Row
from server.core.errors import Internal
from server.core.request import FinishEvent, FinishReason, Hypothesis, Job, TokenEvent
from server.core.chooser import Choices
from server.core import term_placement as placement
from server.core.terms import SETTINGS as TERMS, end_candidates

if TYPE_CHECKING:  # the state it updates is the scheduler's
    from server.core.scheduler import Running

log = logging.getLogger(__name__)


class StepUpdates:
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
