"""A place for a glossary term the model never began: the row goes back to where the model found it likeliest.

Measured problem (issue 37, docs/glossaries.md): a greedy row that chooses to end its sentence with a
term still pending wrote the term right there, before the full stop ("Un homme nu dort sur sa chaise
dehors moitié."). Every such term is a word in the wrong place; on the test split that cost en-fr
greedy 0.33 BLEU against no glossary, where the terms are the reference's own words.

The design: while a term is pending, each step also reports the model's log-probability of the term's
first token before its bonus (server/core/choose.py `Choices.boost_logp`), and the scheduler keeps it
per output position. When the row chooses to end with the term pending, it goes back to the word
boundary where that log-probability was highest (`best_place`), writes the term there and decodes on
from it with the model's own choices: the slot's cache already holds every earlier position, so going
back is setting the row's length (models/core/kv_cache.py `SlotCache.rewind`); only the positions after
the place are decoded again. Where the best place is the end itself, the term is written before the
ending as before. Each row decides from its own scores alone, so the answer is the same in any batch.
Only greedy rows go back (a sampling row's later draws would be other draws; a beam already ranks its
candidates, server/glossary/enforce.py). A stream whose terms are not all written yet holds its text
(server/core/scheduler.py `_holds`): streamed and unary answers stay the same tokens.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from server.glossary.enforce import Progress, TermSet


def prefixes(terms: TermSet, base: Sequence[int]) -> list[Progress]:
    """The row's progress after each prefix of `base`: [after 0 tokens, after 1, ..., after all]."""
    out = [terms.start()]
    for token in base:
        out.append(terms.advance(out[-1], token))
    return out


def logp_of(token: int, seen: Optional[tuple]) -> Optional[float]:
    """`token`'s recorded log p at one position (seen: that step's boosted ids and their log p), or None."""
    if seen is None:
        return None
    ids, logp = seen
    hit = (ids == token).nonzero()[0]
    return float(logp[hit[0]]) if len(hit) else None


def best_place(base: Sequence[int], starts_word: Callable[[int], bool], logp: Sequence[Optional[float]],
               progress: Sequence[Progress], within: float = float("inf")) -> int:
    """The place (0 .. len(base)) where the term goes: a word boundary, not inside another term being
    written, with the highest log-probability recorded for its first token there (the later on a tie);
    len(base), the end, when no earlier place has one, or none within `within` of the model's choice
    (logp holds each place's distance from it)."""
    best, place = None, len(base)
    for t in range(len(base)):
        score = logp[t] if t < len(logp) else None
        if score is None or not starts_word(base[t]) or progress[t].seq:
            continue
        if best is None or score >= best:
            best, place = score, t
    end = logp[len(base)] if len(base) < len(logp) else None
    if best is None or best < -within or (end is not None and end >= best):
        return len(base)
    return place


def placed(terms: TermSet, at: Progress, constraint: int) -> Progress:
    """`at` with the constraint's first spelling as written begun: its tokens are forced next."""
    spelled = terms.terms[constraint][0][0]
    return Progress(tuple(c for c in at.pending if c != constraint), spelled, 0, -1, at.text)
