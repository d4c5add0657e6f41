"""Scheduler -> engine, once per step: what each running row needs from the token choice.

The scheduler's per-request state (server/core/scheduler.py's `Running`) becomes one `RowControls`
(server/core/chooser.py) in slot order: the kind of choice, a sampling row's settings and its own draw
from its seeded generator (one per step, so a request samples the same in any batch), a forced
token (a language token, a target prefix, EOS at the length limit), whether the log-probability
is read, a beam's width, an alternative's rank, and the decoding controls' settings (the histories
they read are the slot cache's: each row's inputs so far). Plain greedy requests (`Running.plain`) cost nothing here: the defaults are theirs.
"""
from __future__ import annotations

import numpy as np

from server.core.chooser import BEAM, SAMPLE, RowControls
from server.core.request import GenerationRules
from server.core.terms import SETTINGS as TERMS


def step_controls(running: list, rows: int, rules: GenerationRules) -> RowControls:
    """What the engine must do for each of `rows` running rows this step: kind of choice, sampling
    settings and the row's draw, a forced token, whether its log-probability is read, controls."""
    c = RowControls.greedy(rows)
    force_eos, eos_id = rules.force_eos_at_limit, rules.eos_id
    ctl: list[tuple] = []  # (slot, penalty, n-gram size, no unk, no EOS yet): set in one pass at the end
    boosts: list[tuple[int, list[int], float]] = []  # glossary terms pending: (slot, their first tokens, bonus)
    for state in running:
        if state.plain:
            continue
        job, p = state.job, state.job.params
        n_forced = len(job.forced)
        if state.beam is not None:
            slots = [r.slot for r in state.rows]
            c.kind[slots], c.beam[slots] = BEAM, p.beam_size
            n_prefix = len(job.prefix)
            if state.step < n_forced + n_prefix:
                c.forced[slots] = (job.forced + job.prefix)[state.step]
            elif force_eos and state.step == job.max_len - 1 + n_forced:
                c.forced[slots] = eos_id
            elif state.terms is not None:  # each beam row writes, or may begin, its pending terms
                for slot, progress in zip(slots, state.progress):
                    tok = state.terms.forced(progress)
                    if tok >= 0:
                        c.forced[slot] = tok
                    elif progress.pending:
                        produced = state.step - n_forced - n_prefix
                        boosts.append((slot, state.terms.boosted(progress),
                                       TERMS.bonus_after(produced, len(job.src_ids))))
            if p.controlled:  # the histories are the slot cache's (each row's inputs so far)
                row = (p.repetition_penalty, p.no_repeat_ngram_size, p.no_unknown_token,
                       state.step - n_forced - n_prefix < p.min_output_tokens)
                ctl.extend((slot, *row) for slot in slots)
            continue
        for i, live in enumerate(state.live):
            if not live:
                continue
            slot = state.rows[i].slot
            if state.step < n_forced:  # a language token: fed back, never an output
                c.forced[slot] = job.forced[state.step]
                continue
            c.scored[slot] = state.scored
            produced = len(state.tokens[i]) - len(job.prefix)  # generated after the target prefix
            if p.controlled:
                ctl.append((slot, p.repetition_penalty, p.no_repeat_ngram_size, p.no_unknown_token,
                            produced < p.min_output_tokens))
            if produced < 0:  # the target prefix: forced, and part of the output
                c.forced[slot] = job.prefix[len(state.tokens[i])]
            elif produced == 0 and p.alternatives:  # the first free position: row i takes the i-th best
                c.rank[slot] = i
            elif force_eos and len(state.tokens[i]) == job.max_len - 1:
                c.forced[slot] = eos_id
            elif state.terms is not None and (term_token := state.terms.forced(state.progress[i])) >= 0:
                c.forced[slot] = term_token  # a glossary term begun: its next token
            elif p.sampling:
                c.kind[slot], c.temperature[slot], c.top_k[slot], c.top_p[slot] = \
                    SAMPLE, p.temperature, p.top_k, p.top_p
                c.noise[slot] = state.rngs[i].random()  # one draw per row and step: batch-invariant
            if state.terms is not None and c.forced[slot] < 0 and state.progress[i].pending:
                boosts.append((slot, state.terms.boosted(state.progress[i]),
                               TERMS.bonus_after(produced, len(job.src_ids))))
    if ctl:
        slots, penalty, ngram, unk, eos = zip(*ctl)
        slots = list(slots)
        c.penalty[slots], c.no_repeat[slots], c.ban_unk[slots], c.ban_eos[slots] = penalty, ngram, unk, eos
    if boosts:
        c.boost = np.full((rows, max(len(t) for _, t, _ in boosts)), -1, np.int64)
        for slot, tokens, bonus in boosts:
            c.boost[slot, :len(tokens)] = tokens
            c.boost_value[slot] = bonus
    return c
