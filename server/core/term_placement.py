"""A place for a glossary term the model never began: the row goes back to where the model found it likeliest.

Measured problem (issue 37, docs/glossaries.md): a greedy row that chooses to end its sentence with a
term still pending wrote the term right there, before the full stop ("Un homme nu dort sur sa chaise
dehors moitié."). Every such term is a word in the wrong place; on the test split that cost en-fr
greedy 0.33 BLEU against no glossary, where the terms are the reference's own words.

The design: while a term is pending, each step also reports the model's log-probability of the term's
first token before its bonus (server/core/chooser.py `Choices.boost_logp`), and the scheduler keeps it
per output position. When the row chooses to end with the term pending, it goes back to the word
boundary where that log-probability was highest (`best_place`), writes the term there and decodes on
from it with the model's own choices: the slot's cache already holds every earlier position, so going
back is setting the row's length (models/core/kv_cache.py `SlotCache.rewind`); only the positions after
the place are decoded again. Where the best place is the end itself, the term is written before the
ending as before. Each row decides from its own scores alone, so the answer is the same in any batch.
Only greedy rows go back (a sampling row's later draws would be other draws; a beam already ranks its
candidates, server/core/terms.py). A stream whose terms are not all written yet holds its text
(server/core/scheduler.py `_holds`): streamed and unary answers stay the same tokens.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from server.core.terms import Progress, TermSet


class Replay:
    """The row's progress after each prefix of `base`, replayed as far as asked (most rows that end with
    a term pending do not go back: the replay is only paid for a place that is a candidate)."""

    def __init__(self, terms: TermSet, base: Sequence[int]):
        self.terms, self.base = terms, base
        self.done = [terms.start()]

    def at(self, t: int) -> Progress:
        """The progress after base[:t]."""
        while len(self.done) <= t:
            self.done.append(self.terms.advance(self.done[-1], self.base[len(self.done) - 1]))
        return self.done[t]

    def inside_term(self, t: int) -> bool:
        """Whether place t falls inside a term being written."""
        return bool(self.at(t).seq)


def logp_of(token: int, seen: tuple) -> Optional[float]:
    """`token`'s recorded log p at one position, or None: seen is ((that step's boosted ids, their log p) or
    None, the row's slot that step)."""
    arrays, slot = seen
    if arrays is None:
        return None
    ids, logp = arrays[0][slot], arrays[1][slot]
    hit = (ids == token).nonzero()[0]
    return float(logp[hit[0]]) if len(hit) else None


def best_place(base: Sequence[int], starts_word: Callable[[int], bool], logp: Sequence[Optional[float]],
               inside_term: Callable[[int], bool], within: float = float("inf")) -> int:
    """The place (0 .. len(base)) where the term goes: a word boundary, not inside another term being
    written, with the highest log-probability recorded for its first token there (the later on a tie);
    len(base), the end, when no earlier place beats the end's, or none is within `within` of the
    model's choice (logp holds each place's distance from it)."""
    end = logp[len(base)] if len(base) < len(logp) else None
    places = sorted((t for t in range(min(len(base), len(logp))) if logp[t] is not None and starts_word(base[t])),
                    key=lambda t: (-logp[t], -t))
    for t in places:
        if logp[t] < -within or (end is not None and end >= logp[t]):
            break
        if not inside_term(t):
            return t
    return len(base)


def placed(terms: TermSet, at: Progress, constraint: int) -> Progress:
    """`at` with the constraint's first spelling as written begun: its tokens are forced next."""
    spelled = terms.terms[constraint][0][0]
    return Progress(tuple(c for c in at.pending if c != constraint), spelled, 0, -1, at.text)
