"""Token choice for one decode step, over every row at once: logits in, plain arrays out.

The engine owns this step; the scheduler never sees logits. It describes each row once per
step in a `RowControls` (kind of choice, sampling settings and the row's draw, a forced token,
whether its log-probability is read, its beam width, the decoding controls) and gets back a
`Choices`: the chosen token and its log-probability for every greedy or sampling row, and the
best 2K continuations of every beam row (the top 2K over a request's K rows x vocabulary are
always among its rows' own top 2K, so beam bookkeeping never needs the whole vocabulary).

Measured before this file (python -m benchmarks.engine_overhead, 2-core AMD EPYC, shipped
model): the per-row loops around the logits were 53% of an engine step for sampling streams
(each row copied its vocabulary to float64, exponentiated and summed it alone) and 48% for
beam 4 (a log_softmax and a partition of K x V per request). Here each pass is one numpy call
over all the rows that need it (docs/benchmarks/engine_overhead.md). Greedy, forced and beam
choices are the per-row code's; sampling sums the distribution in float32 blocks (a two-level
inverse-CDF search), so a seeded draw that sits within float32 rounding of a boundary of the
cumulative distribution may pick the neighbouring token the float64 code picked: a row's draw
is its own seeded generator's, so a request samples the same alone or in any batch.

The decoding controls (repetition penalty, no repeated n-gram, no unknown token, minimum
length) act where transformers' logits processors do, in their order: on the logits of greedy
and sampling rows, on the log-probabilities of beam rows (renormalised after them where the
model renormalises). `rank` picks a greedy row's k-th best token (CTranslate2's alternatives).

Total (issue 33: one request's temperature of 1e-45 made the sampler raise, and the failed step
failed every request in the batch). Whatever a row's settings and scores, it gets a token:
  * a NaN score counts as a banned token (-inf) and +inf as the largest float32, and the row is
    marked `failed`: the model gave it no usable distribution, so its request ends (INTERNAL) while
    every other row goes on;
  * a row with no token left (every score -inf: all banned, or all NaN) chooses EOS (greedy,
    sampling, and each beam row's one continuation, at NO_CHOICE_LOGP); an alternative whose rank
    has no token left takes the row's best; sampling's own rules are server/core/sample.py's;
  * should the batched choice still raise, every row is chosen alone and only the rows whose own
    choice raises are `failed` (the repetition penalty, the one change made to the logits that is
    not idempotent, is undone first).
Every rule reads the row alone, so choice stays batch-invariant.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, fields
from typing import Optional

import numpy as np

from models.core.beam import logsumexp
from server.core.sample import sample

log = logging.getLogger(__name__)

GREEDY, SAMPLE, BEAM = 0, 1, 2
NO_CHOICE_LOGP = np.float32(-1e4)  # a beam row with no token left: its EOS continuation's log-probability
_FMAX = np.finfo(np.float32).max


def make_rng(seed: Optional[int], hypothesis: int) -> np.random.Generator:
    """A sampling row's own noise source: seeded from (request seed, hypothesis index), one draw per
    step, so a seeded request gives the same output whatever else shares its batch."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng([seed, hypothesis])


@dataclass
class RowControls:
    """One step's instructions, per slot (row i of the logits). Defaults: greedy, nothing read."""
    kind: np.ndarray  # (B,) GREEDY / SAMPLE / BEAM
    forced: np.ndarray  # (B,) int64: a token that must come next (language token, EOS at the limit), -1 = none
    scored: np.ndarray  # (B,) bool: the chosen token's log-probability is read
    temperature: np.ndarray  # (B,) float64, sampling rows
    top_k: np.ndarray  # (B,) int64, sampling rows (0 = off)
    top_p: np.ndarray  # (B,) float64, sampling rows (1 = off)
    noise: np.ndarray  # (B,) float64 in [0, 1): the row's uniform draw, sampling rows
    beam: np.ndarray  # (B,) int64: K for beam rows
    # Decoding controls (transformers' logits processors, in their order): repetition penalty, no
    # repeated n-gram, no unknown token, no EOS before the minimum length.
    penalty: np.ndarray  # (B,) float64, 1 = off
    no_repeat: np.ndarray  # (B,) int64, 0 = off
    ban_unk: np.ndarray  # (B,) bool
    ban_eos: np.ndarray  # (B,) bool
    rank: np.ndarray  # (B,) int64: greedy rows take their rank-th best token (alternatives), 0 = the best
    # Glossary terms (server/core/terms.py): tokens whose score gets the row's bonus (-1 = none; K is
    # the most any row has this step, 0 when none has): on the logits of greedy and sampling rows, on the
    # log-probabilities of beam rows (a beam's score then carries it).
    boost: np.ndarray = None  # (B, K) int64
    boost_value: np.ndarray = None  # (B,) float32

    def take(self, index) -> "RowControls":
        """The controls of the rows `index` (a slice or index array), in that order."""
        return RowControls(*(getattr(self, f.name)[index] for f in fields(self)))

    def __post_init__(self) -> None:
        b = len(self.kind)
        if self.boost is None:
            self.boost = np.full((b, 0), -1, np.int64)
        if self.boost_value is None:
            self.boost_value = np.zeros(b, np.float32)

    @classmethod
    def greedy(cls, b: int) -> "RowControls":
        return cls(np.full(b, GREEDY, np.int8), np.full(b, -1, np.int64), np.zeros(b, bool), np.ones(b),
                   np.zeros(b, np.int64), np.ones(b), np.zeros(b), np.zeros(b, np.int64), np.ones(b),
                   np.zeros(b, np.int64), np.zeros(b, bool), np.zeros(b, bool), np.zeros(b, np.int64))


@dataclass
class Choices:
    token: np.ndarray  # (B,) int64: greedy / sampled / forced token (beam rows: unused)
    logprob: np.ndarray  # (B,) float32: log p(token), for scored rows (0 elsewhere)
    beam_ids: np.ndarray  # (B, C) int64: beam rows' best continuations, best first (C = 2 x widest beam)
    beam_logp: np.ndarray  # (B, C) float32: their log-probabilities (-inf past a row's own 2K)
    # (B,) bool: rows the model gave no usable scores (NaN, +inf) or whose own choice raised; their
    # tokens are placeholders (EOS) and their requests must end. None: no row failed.
    failed: Optional[np.ndarray] = field(default=None)
    # (B, K) float32: greedy rows' log p of each boosted token (RowControls.boost) before its bonus, less
    # their best token's (sampling rows never go back, so theirs is not computed): where the model found a pending glossary term plausible
    # (server/core/term_placement.py). None when no row has boosts.
    boost_logp: Optional[np.ndarray] = field(default=None)


def _rows(x: np.ndarray, index: np.ndarray) -> np.ndarray:
    """x[index], without the copy when the index is every row in order (the common case: one kind
    of request; a copy of 256 x 58k logits would cost more than the choice)."""
    return x if len(index) == len(x) else x[index]


def ngram_bans(history: np.ndarray, lengths: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """transformers' NoRepeatNGramLogitsProcessor over many rows at once: (row index, token) pairs of
    every token that would complete an n-gram already in the row's history. history (R, T) holds each
    row's tokens in its first lengths[r] positions; nothing is banned before a row has n tokens. One
    comparison of (R, windows) per token of the prefix, instead of a Python dict per row."""
    t = int(lengths.max()) if len(lengths) else 0
    windows = t - n + 1
    if windows <= 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    h = history[:, :t]
    match = np.arange(windows)[None, :] <= (lengths - n)[:, None]  # the n-gram at j lies in the history
    for k in range(n - 1):  # ... and its first n - 1 tokens are the row's last n - 1
        last = np.take_along_axis(h, np.maximum(lengths - n + 1 + k, 0)[:, None], axis=1)
        match &= h[:, k:k + windows] == last
    r, j = np.nonzero(match)
    return r, h[r, j + n - 1]


def sanitise(logits: np.ndarray) -> Optional[np.ndarray]:
    """Rows holding NaN or +inf -> their indices (None when there are none, the common case: one max
    per row finds them, and NaN propagates through it); those rows are rewritten in place, NaN as
    -inf (no score) and +inf as the largest float32, so every later pass sees finite or -inf scores."""
    top = logits.max(axis=-1)
    suspect = np.flatnonzero(~(top < np.inf))  # NaN or +inf
    if not len(suspect):
        return None
    rows = logits[suspect]
    rows[np.isnan(rows)] = -np.inf
    rows[rows == np.inf] = _FMAX
    logits[suspect] = rows
    return suspect


class TokenChooser:
    def __init__(self, suppress_ids: tuple[int, ...] = (), renormalize: bool = False, eos_id: int = 2,
                 unk_id: Optional[int] = None):
        self.suppress = list(suppress_ids)
        self.eos_id, self.unk_id = eos_id, unk_id
        # Beam log-probs after suppression: renormalised over what is left (Hugging Face's renormalize_logits),
        # or against the full vocabulary's normaliser (its processors applied after log_softmax).
        self.renormalize = renormalize

    def choose(self, logits: np.ndarray, c: RowControls, history: Optional[np.ndarray] = None,
               lengths: Optional[np.ndarray] = None) -> Choices:
        """logits (B, V), this step's buffer: suppressed ids are set to -inf in place. history (>= B, T) and
        lengths (>= B,): each row's tokens so far (start, forced, output: what the step has fed it), by
        slot, which the repetition penalty and the n-gram ban read (the slot cache keeps them).
        Never raises for a row's sake: see the module docstring's rules and `Choices.failed`."""
        b = len(logits)
        invalid = sanitise(logits)
        pen = np.flatnonzero((c.penalty != 1.0) & (c.kind != BEAM))  # penalised in place: kept to undo
        saved = logits[pen] if len(pen) else None
        try:
            with np.errstate(all="ignore"):
                out = self._choose(logits, c, history, lengths)
        except Exception:  # noqa: BLE001 (a bug here must cost only the rows it concerns)
            log.exception("token choice failed for a batch of %d rows; choosing each row alone", b)
            if saved is not None:
                logits[pen] = saved
            out = self._choose_each(logits, c, history, lengths)
        if invalid is not None:
            out.failed = np.zeros(b, bool) if out.failed is None else out.failed
            out.failed[invalid] = True
        return out

    def _choose_each(self, logits: np.ndarray, c: RowControls, history: Optional[np.ndarray],
                     lengths: Optional[np.ndarray]) -> Choices:
        """Every row chosen alone; a row whose own choice raises is failed (its token a placeholder)."""
        b = len(logits)
        beams = c.beam[c.kind == BEAM]
        width = 2 * int(beams.max()) if len(beams) else 0
        out = Choices(np.full(b, self.eos_id, np.int64), np.zeros(b, np.float32), np.zeros((b, width), np.int64),
                      np.full((b, width), -np.inf, np.float32), np.zeros(b, bool))
        for i in range(b):
            one = slice(i, i + 1)
            try:
                with np.errstate(all="ignore"):
                    got = self._choose(logits[one], c.take(one), None if history is None else history[one],
                                       None if lengths is None else lengths[one])
            except Exception:  # noqa: BLE001
                log.exception("token choice failed for row %d alone: its request fails", i)
                out.failed[i] = True
                continue
            out.token[i], out.logprob[i] = got.token[0], got.logprob[0]
            if got.boost_logp is not None:
                if out.boost_logp is None:
                    out.boost_logp = np.full(c.boost.shape, -np.inf, np.float32)
                out.boost_logp[i] = got.boost_logp[0]
            w = got.beam_ids.shape[1]
            out.beam_ids[i, :w], out.beam_logp[i, :w] = got.beam_ids[0], got.beam_logp[0]
        return out

    def _choose(self, logits: np.ndarray, c: RowControls, history: Optional[np.ndarray],
                lengths: Optional[np.ndarray]) -> Choices:
        """The batched choice over finite or -inf scores (sanitised)."""
        b, vocab = logits.shape
        token = np.zeros(b, np.int64)
        logprob = np.zeros(b, np.float32)
        scored = np.flatnonzero(c.scored & (c.kind != BEAM))
        controlled = (c.penalty != 1.0) | (c.no_repeat > 0) | c.ban_unk | c.ban_eos
        # The log p reported for a token is what the model gave it: the unsuppressed, unprocessed logits.
        raw_scored = logits[scored] if len(scored) else None  # a copy (fancy indexing)
        lse = logsumexp(raw_scored) if len(scored) else None
        boost_logp = _boosted_logp(logits, c) if c.boost.shape[1] else None
        beam_rows = np.flatnonzero((c.kind == BEAM) & ~controlled)
        beam_norm = None
        if self.suppress and len(beam_rows) and not self.renormalize:
            full = _rows(logits, beam_rows)
            beam_norm = np.logaddexp(logsumexp(full), logsumexp(full[:, self.suppress]))
        # Controlled beam rows: transformers applies its processors to log_softmax of the raw logits.
        beam_ctl = np.flatnonzero((c.kind == BEAM) & controlled)
        ctl_logp = _no_nan(logits[beam_ctl] - logsumexp(logits[beam_ctl])[:, None]) if len(beam_ctl) else None
        if self.suppress:
            logits[:, self.suppress] = -np.inf
            if ctl_logp is not None:
                ctl_logp[:, self.suppress] = -np.inf
        rows_ctl = np.flatnonzero(controlled & (c.kind != BEAM))
        if len(rows_ctl):  # greedy and sampling rows: the processors act on the logits, in place
            self._process(logits, rows_ctl, rows_ctl, c, history, lengths)
            sanitise(logits)  # a penalty near 0 can divide a positive logit into +inf
        if ctl_logp is not None:
            self._process(ctl_logp, np.arange(len(beam_ctl)), beam_ctl, c, history, lengths)
            if self.renormalize:  # transformers' LogitNormalization, after every processor
                ctl_logp = _no_nan(ctl_logp - logsumexp(ctl_logp)[:, None])
        if c.boost.shape[1]:  # glossary terms' first tokens, greedy and sampling rows: on the logits
            rows = np.flatnonzero(c.kind != BEAM)
            _boost(logits, rows, rows, c)
        greedy = np.flatnonzero(c.kind == GREEDY)
        if len(greedy):
            g = _rows(logits, greedy)
            best = g.argmax(axis=-1)
            # No token left (all -inf): EOS.
            token[greedy] = np.where(g[np.arange(len(greedy)), best] > -np.inf, best, self.eos_id)
        ranked = np.flatnonzero((c.kind == GREEDY) & (c.rank > 0))
        if len(ranked):  # alternatives: the rank-th best token, ties in vocabulary order as argmax breaks them
            order = np.argsort(-logits[ranked], axis=-1, kind="stable")
            pick = order[np.arange(len(ranked)), np.minimum(c.rank[ranked], vocab - 1)]
            # A rank with no token left takes the row's best (already in token[ranked]).
            token[ranked] = np.where(logits[ranked, pick] > -np.inf, pick, token[ranked])
        sampled = np.flatnonzero(c.kind == SAMPLE)
        if len(sampled):
            token[sampled] = sample(_rows(logits, sampled), c.temperature[sampled], c.top_k[sampled],
                                    c.top_p[sampled], c.noise[sampled], self.eos_id)
        forced = np.flatnonzero((c.forced >= 0) & (c.kind != BEAM))
        token[forced] = c.forced[forced]
        if len(scored):  # a row with no finite score: -inf, not NaN
            logprob[scored] = _no_nan(raw_scored[np.arange(len(scored)), token[scored]] - lse)
        all_beam = np.flatnonzero(c.kind == BEAM)
        width = 2 * int(c.beam[all_beam].max()) if len(all_beam) else 0
        beam_ids = np.zeros((b, width), np.int64)
        beam_logp = np.full((b, width), -np.inf, np.float32)
        if len(beam_rows):
            x = _rows(logits, beam_rows)
            # Renormalised, or nothing suppressed: the normaliser of what is left.
            norm = beam_norm if beam_norm is not None else logsumexp(x)
            if c.boost.shape[1]:  # after the normaliser: a bonus on the log-probabilities
                _boost(x, np.arange(len(beam_rows)), beam_rows, c)
            self._beam(x, norm, c, beam_rows, beam_ids, beam_logp)
        if len(beam_ctl):
            if c.boost.shape[1]:
                _boost(ctl_logp, np.arange(len(beam_ctl)), beam_ctl, c)
            self._beam(ctl_logp, np.zeros(len(beam_ctl), np.float32), c, beam_ctl, beam_ids, beam_logp)
        if len(all_beam):  # a beam row with no continuation left ends: EOS, at a log-probability no live one has
            empty = all_beam[~(beam_logp[all_beam, 0] > -np.inf)]
            beam_ids[empty, 0], beam_logp[empty, 0] = self.eos_id, NO_CHOICE_LOGP
        return Choices(token, logprob, beam_ids, beam_logp, boost_logp=boost_logp)

    def _process(self, x: np.ndarray, at: np.ndarray, rows: np.ndarray, c: RowControls,
                 history: Optional[np.ndarray], lengths: Optional[np.ndarray]) -> np.ndarray:
        """The decoding controls on rows' scores (logits, or log-probabilities for beam search), in
        transformers' order: repetition penalty, no repeated n-gram, bad words (unk), minimum length.
        x[at[j]] holds the scores of slot rows[j]; changed in place (and returned)."""
        # One gather/scatter over every (row, token) pair, not one per row; rows picked with masks
        # (a numpy scalar read per row costs more than the arithmetic).
        pen = np.flatnonzero(c.penalty[rows] != 1.0)
        if len(pen) and history is not None:
            # Every token of each row's history, repeats included: gathered once, written back once per
            # position, so a repeated token is penalised once (as transformers' gather/scatter does).
            slots = rows[pen]
            n = lengths[slots]
            t = int(n.max())
            cols = history[slots, :t][np.arange(t)[None, :] < n[:, None]]
            where = np.repeat(at[pen], n)
            factor = np.repeat(c.penalty[slots], n)
            v = x[where, cols]
            x[where, cols] = np.where(v < 0, v * factor, v / factor)
        sizes = c.no_repeat[rows]
        for n in np.unique(sizes[sizes > 0]) if history is not None else ():
            group = np.flatnonzero(sizes == n)
            r, tokens = ngram_bans(history[rows[group]], lengths[rows[group]], int(n))
            x[at[group][r], tokens] = -np.inf
        if self.unk_id is not None:
            x[at[c.ban_unk[rows]], self.unk_id] = -np.inf
        x[at[c.ban_eos[rows]], self.eos_id] = -np.inf
        return x

    @staticmethod
    def _beam(x: np.ndarray, norm: np.ndarray, c: RowControls, rows: np.ndarray, ids: np.ndarray,
              logp_out: np.ndarray) -> None:
        """Each beam row's best 2K tokens and their log-probabilities (x - norm): a partition of the
        row's scores x, (len(rows), V) (the whole log_softmax is never formed)."""
        vocab = x.shape[1]
        forced = c.forced[rows]
        for k in np.unique(c.beam[rows]):
            group = np.flatnonzero(c.beam[rows] == k)
            width = 2 * int(k)
            xg = _rows(x, group)
            top = np.argpartition(xg, vocab - width, axis=-1)[:, vocab - width:]
            vals = np.take_along_axis(xg, top, axis=-1)
            order = np.argsort(-vals, axis=-1, kind="stable")
            ids[rows[group], :width] = np.take_along_axis(top, order, axis=-1)
            logp_out[rows[group], :width] = _no_nan(np.take_along_axis(vals, order, axis=-1) - norm[group, None])
        # Hugging Face's forced-token processors: every other token -inf, the forced one log-prob 0.
        pinned = np.flatnonzero(forced >= 0)
        if len(pinned):
            ids[rows[pinned], 0], logp_out[rows[pinned], 0] = forced[pinned], 0.0
            logp_out[rows[pinned], 1:] = -np.inf


def _boosted_logp(logits: np.ndarray, c: RowControls) -> np.ndarray:
    """(B, K): each greedy row's boosted tokens' log p less the row's best token's (-inf where none): how
    far each is from being chosen. (The best's log p cancels: a max over the row, not the
    logsumexp a log p would need, which cost ~10% of a glossary benchmark's step.)"""
    out = np.full(c.boost.shape, -np.inf, np.float32)
    rows = np.flatnonzero((c.boost >= 0).any(axis=1) & (c.kind == GREEDY))
    if len(rows):
        ids = c.boost[rows]
        got = logits[rows[:, None], np.maximum(ids, 0)] - _rows(logits, rows).max(axis=1)[:, None]
        out[rows] = np.where(ids >= 0, got, -np.inf)
    return out


def _boost(x: np.ndarray, at: np.ndarray, rows: np.ndarray, c: RowControls) -> None:
    """Each row's glossary bonus on its boosted tokens' scores, in place: x[at[j]] holds slot rows[j]. A
    token with no score left (-inf: banned) stays banned."""
    r, k = np.nonzero(c.boost[rows] >= 0)
    if len(r):
        x[at[r], c.boost[rows[r], k]] += c.boost_value[rows[r]]


def _no_nan(x: np.ndarray) -> np.ndarray:
    """-inf where a log-probability came out NaN (-inf - -inf: a row with no finite score), in place."""
    x[np.isnan(x)] = -np.inf
    return x
