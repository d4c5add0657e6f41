"""The scheduler's per-row bookkeeping for a job's glossary terms: token ids and text, no logits.

A job carries its terms as `Job.terms`: one constraint per target term its sentence calls for,
each (its spellings as written, its other forms' spellings, its text forms). A spelling is a
token sequence; "as written" covers the tokenizer's own spelling of the term and the same with
punctuation merged into its last token (the shipped German tokenizer writes "Straße." as one
token); the other forms are the sentence-initial variant (first letter upper-cased) and the
term glued to what precedes it ("T-shirt", "d'hommes": its first piece without the word mark).
Each decode row keeps a `Progress`: the constraints still pending, the spelling being written
and how far, and the row's text so far. Per step (server/core/row_controls.py reads it, the
scheduler advances it with the chosen token):

  * the model chooses freely; when its token is the first token of a pending term's spelling,
    the term has begun at a place the model chose, and its remaining tokens are forced
    (RowControls.forced) until it is complete;
  * a term is written as soon as the row's text shows one of its forms as whole words, however
    the model spelled it (so a term the model writes in its own way is never written twice);
  * while terms are pending, the first tokens of the spellings as written get a bonus on the
    row's scores (RowControls.boost / boost_value, server/core/chooser.py), so the model starts a
    term where it is already plausible rather than never;
  * a greedy or sampling row that chooses to end its sentence (end-of-sequence, or a token that
    is only closing punctuation: "." "?" "!") with terms still pending writes the pending terms
    there instead (the scheduler swaps the chosen token for the first term's first token; the
    rest is forced), then the ending it chose. A word with the full stop merged into its token
    ("▁Straße.") is written without it ("▁Straße"), then the pending terms, then the full stop.
    A beam row does the same with its candidates: each ending among a pending row's best
    continuations stands for the first pending term (at the ending's log-probability), so no
    hypothesis finishes with a term missing, and the beam ranks where terms went as it ranks
    anything else.

Every rule reads the row alone, so a row decodes the same in any batch; a row without terms is
not touched at all (its controls stay the defaults). docs/glossaries.md measures the choices;
`SETTINGS` holds the two constants it chose (server/glossary/evaluate.py varies them).
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Optional, Sequence

import numpy as np

WORD_MARK = "\u2581"
CLOSING = frozenset(".!?…。！？")
Sequences = tuple[tuple[int, ...], ...]
# One target term: (its spellings as written, its other forms' spellings, its text forms).
Constraint = tuple[Sequences, Sequences, tuple[str, ...]]


@dataclass
class Settings:
    bonus: float = 1.0  # added to the score of a pending term's first token (logits; log-probs for beam)
    # With terms pending at the end: "on" (greedy/sampling rows write the pending terms before the ending
    # they chose; beam rows may not end), or "off" (the row ends; the terms are missed).
    at_eos: str = "on"
    # The bonus grows by `ramp` for each token the row writes past `ramp_from` x its source's length while
    # terms are pending: the nearer the sentence is to its end, the more a pending term is pushed into a
    # place the model still finds plausible, before the end insertion would put it before the full stop.
    ramp: float = 0.0
    ramp_from: float = 0.5
    # A greedy row ending with a term it never began goes back to where the model found the term likeliest
    # (server/core/term_placement.py); False: the term is written before the ending (the rule above).
    rewind: bool = True
    # ... only to a place where the term's first token was within this many nats of the model's choice
    # (a term the model never found plausible anywhere costs a rewind and gains no place: the end will do).
    rewind_within: float = 3.0

    def restore(self, saved: "Settings") -> None:
        """Every field back to `saved`'s, in this object: the engine reads the module's SETTINGS by name."""
        for f in fields(saved):
            setattr(self, f.name, getattr(saved, f.name))

    def bonus_after(self, produced: int, source_len: int) -> float:
        """The bonus for a row with terms pending that has written `produced` tokens of a source of
        `source_len`."""
        return self.bonus + self.ramp * max(0.0, produced - self.ramp_from * source_len)


SETTINGS = Settings()


def written(text: str, form: str, final: bool) -> bool:
    """Whether `text` shows `form` as whole words: not inside a longer word on either side. The text
    may still grow, so an occurrence at its very end counts only when `final` (the row ends here)."""
    start = 0
    while True:
        at = text.find(form, start)
        if at < 0:
            return False
        end = at + len(form)
        before_ok = at == 0 or not (text[at - 1].isalnum() and form[:1].isalnum())
        if end == len(text):
            after_ok = final or not form[-1:].isalnum()
        else:
            after_ok = not (text[end].isalnum() and form[-1:].isalnum())
        if before_ok and after_ok:
            return True
        start = at + 1


class Vocabulary:
    """What the bookkeeping reads of a model's tokenizer: each token's text, and the tokens that end a
    sentence: token -> (-1, token) for closing punctuation, token -> (stem, its punctuation's token) for
    a word with the punctuation merged in ("▁Straße." -> "▁Straße", "."). Built once per model."""

    def __init__(self, pieces: Sequence[str]):
        self.text = [p.replace(WORD_MARK, " ") for p in pieces]
        index = {p: i for i, p in enumerate(pieces)}
        self.ends: dict[int, tuple[int, int]] = {}
        for i, piece in enumerate(pieces):
            bare = piece.replace(WORD_MARK, "").strip()
            if not bare:
                continue
            if set(bare) <= CLOSING:
                self.ends[i] = (-1, i)
            elif piece[-1] in CLOSING:
                word = piece.rstrip("".join(CLOSING))
                stem, closer = index.get(word), index.get(piece[len(word):])
                if stem is not None and closer is not None and stem != i:
                    self.ends[i] = (stem, closer)

    def piece_text(self, token: int) -> str:
        return self.text[token] if 0 <= token < len(self.text) else ""


_vocabularies: dict[int, tuple[Sequence[str], Vocabulary]] = {}


def vocabulary(pieces: Sequence[str]) -> Vocabulary:
    found = _vocabularies.get(id(pieces))
    if found is None or found[0] is not pieces:
        found = _vocabularies[id(pieces)] = (pieces, Vocabulary(pieces))
    return found[1]


@dataclass(frozen=True)
class Progress:
    pending: tuple[int, ...]  # constraints not yet written (indices into the job's terms)
    seq: tuple[int, ...] = ()  # the spelling being written, () when none
    pos: int = 0  # its next position
    end: int = -1  # the ending the model chose (EOS or closing punctuation), held back while terms are written
    text: str = ""  # the row's output so far

    @property
    def done(self) -> bool:
        return not self.pending and not self.seq


class TermSet:
    """A job's constraints, indexed by first token (longer spellings first, then constraint order)."""

    def __init__(self, terms: tuple[Constraint, ...], vocab: Vocabulary):
        self.terms, self.vocab = terms, vocab
        starts: dict[int, list[tuple[int, tuple[int, ...]]]] = {}
        for c, (as_written, other, _) in enumerate(terms):
            for seq in as_written + other:
                starts.setdefault(seq[0], []).append((c, seq))
        for options in starts.values():
            options.sort(key=lambda o: (-len(o[1]), o[0]))
        self.starts = starts
        self._boosted: dict[tuple[int, ...], list[int]] = {}

    def start(self) -> Progress:
        return Progress(tuple(range(len(self.terms))))

    def unwritten(self, pending: tuple[int, ...], text: str, final: bool = False) -> tuple[int, ...]:
        """The constraints of `pending` whose text forms `text` does not show (`written`)."""
        # `form in text` first: a substring test in C rules out most forms at every step for a fraction of
        # written()'s cost (the bookkeeping is per row and step: issue 37's throughput target).
        return tuple(c for c in pending
                     if not any(form in text and written(text, form, final) for form in self.terms[c][2]))

    def advance(self, p: Progress, token: int) -> Progress:
        """The row's progress once `token` is its next output token."""
        text = p.text + self.vocab.piece_text(token)
        pending, seq, pos, end = p.pending, (), 0, p.end
        if p.seq and token == p.seq[p.pos]:
            if p.pos + 1 < len(p.seq):
                seq, pos = p.seq, p.pos + 1
        else:
            # (Something else where a term was forced, EOS at the length limit: the term stays pending.)
            if end >= 0 and token == end and not pending:
                end = -1
            for c, spelled in self.starts.get(token, ()):
                if c in pending:
                    pending = tuple(x for x in pending if x != c)
                    if len(spelled) > 1:
                        seq, pos = spelled, 1
                    break
        # While an ending is held back the text's last word is whole: terms are written right after it.
        return Progress(self.unwritten(pending, text, final=end >= 0 and not seq), seq, pos, end, text)

    def forced(self, p: Progress) -> int:
        """The token the row must write next, or -1: a begun term's next token; after an ending the model
        chose with terms pending, the next pending term's first token, then that ending."""
        if p.seq:
            return p.seq[p.pos]
        if p.end >= 0:
            return self.terms[p.pending[0]][0][0][0] if p.pending else p.end
        return -1

    def boosted(self, p: Progress) -> list[int]:
        """The tokens whose scores get the bonus: each pending term's first tokens, as written."""
        if p.seq:
            return []
        found = self._boosted.get(p.pending)
        if found is None:  # a row's pending set changes a few times in its life: computed once each
            found = self._boosted[p.pending] = sorted({seq[0] for c in p.pending for seq in self.terms[c][0]})
        return found

    def instead_of_end(self, p: Progress, token: int, eos_id: int, room: int = 1 << 30) -> tuple[int, Progress]:
        """(the token a greedy or sampling row writes, its progress before writing it): `token`, unless it
        would end the sentence with terms pending (SETTINGS.at_eos "on") and the row has room (`room`
        tokens left, this one included) for the first of them and the ending: then, for EOS or closing
        punctuation, that term's first token, the ending held back until the terms are written; for a
        word with its full stop merged in, the word alone."""
        if p.seq or not p.pending or p.end >= 0 or SETTINGS.at_eos == "off" \
                or room <= len(self.terms[p.pending[0]][0][0]) + 1:
            return token, p
        found = (-1, token) if token == eos_id else self.vocab.ends.get(token)
        if found is None:
            return token, p
        stem, closer = found
        if stem >= 0:  # the word is written either way; the pending terms follow it, then the punctuation
            if self.advance(p, token).done:
                return token, p
            return stem, Progress(p.pending, (), 0, closer, p.text)
        pending = self.unwritten(p.pending, p.text, final=True)  # the text ends here: its last word is whole
        if not pending:
            return token, Progress((), (), 0, -1, p.text)
        return self.terms[pending[0]][0][0][0], Progress(pending, (), 0, token, p.text)


def end_candidates(terms: TermSet, rows: Sequence[Progress], ids: np.ndarray, logp: np.ndarray, eos_id: int,
                   room: int = 1 << 30) -> tuple[np.ndarray, np.ndarray, dict]:
    """A beam's candidates (ids, logp: (K, C)) with each pending row's endings swapped as a greedy row's
    choice would be (`TermSet.instead_of_end`): returns new arrays and {(row, token): the progress that
    token continues from} for the swapped ones. Where the row has the swapped token among its candidates
    already, the two are one candidate, with the better log-probability, and the row may go on after
    the term as the model likes (no ending held back)."""
    held: dict[tuple[int, int], Progress] = {}
    if SETTINGS.at_eos == "off":
        return ids, logp, held
    ids, logp = ids.copy(), logp.copy()
    for k, p in enumerate(rows):
        if p.seq or not p.pending or p.end >= 0:
            continue
        for j in range(ids.shape[1]):
            if not logp[k, j] > -np.inf:
                continue
            token = int(ids[k, j])
            swapped, q = terms.instead_of_end(p, token, eos_id, room)
            if swapped == token:
                continue
            twin = np.flatnonzero(ids[k] == swapped)
            if len(twin):  # the row may begin the term anyway: one candidate, free to go on after the term
                logp[k, twin[0]] = max(logp[k, twin[0]], logp[k, j])
                logp[k, j] = -np.inf
            else:
                ids[k, j] = swapped
                held[(k, swapped)] = q
    return ids, logp, held


def pieces_of(tok, size: int) -> tuple[str, ...]:
    """The pieces of token ids 0 .. size - 1 ("" for an id the tokenizer does not know)."""
    def piece(i: int) -> str:
        try:
            return tok.piece(i) or ""
        except (IndexError, KeyError, ValueError):
            return ""
    return tuple(piece(i) for i in range(size))


def term_set(terms: tuple[Constraint, ...], pieces: Sequence[str]) -> Optional[TermSet]:
    return TermSet(terms, vocabulary(pieces)) if terms else None
