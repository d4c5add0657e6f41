"""Beam-search bookkeeping for one sentence, independent of how its rows are batched.

The static decoder (static_decode.py) and the continuous-batching engine both
call `BeamState.advance` once per decode step with the sentence's K rows of
log-probabilities; the state answers which parent row each surviving beam
continues and with which token. The rules match models/search.py exactly:
rank the top 2K continuations; an EOS among the first K finishes a
hypothesis; the best K non-EOS continuations live on; the sentence is done
with K finished hypotheses or at its length limit. That is Hugging Face's
`early_stopping=True`; with `early_stopping=False` (its default, which
imported models keep) the search goes on after K hypotheses while the best
live beam, scored as if it ended now, could still beat the worst of them, and
better ones replace worse ones (transformers' `_beam_search` rules).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Hypothesis:
    tokens: list[int]
    score: float  # log-probability / length^alpha, length counting EOS
    finished_by_eos: bool = True


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float32) - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def logsumexp(x: np.ndarray) -> np.ndarray:
    """(..., V) -> (...): log of the softmax denominator, so log p(t) = x[t] - logsumexp(x)."""
    x = np.asarray(x, dtype=np.float32)  # no copy when it already is
    top = x.max(axis=-1)
    return top + np.log(np.exp(x - top[..., None]).sum(axis=-1))


@dataclass
class BeamState:
    beam: int
    eos_id: int
    alpha: float = 1.0
    early_stopping: bool = True
    # Tokens given as the decoder's prompt (a target prefix, with any language token before it): like
    # transformers, the length a score is normalised by counts only what was generated after them.
    prompt: int = 0
    scores: np.ndarray = field(init=False)  # (K,) cumulative log-prob of live beams
    history: list[list[int]] = field(init=False)  # (K, t) tokens of live beams
    done: list[Hypothesis] = field(default_factory=list)
    finished: bool = False

    def __post_init__(self) -> None:
        self.scores = np.full(self.beam, -np.inf, dtype=np.float32)
        self.scores[0] = 0.0  # one live beam at the start, so no duplicates
        self.history = [[] for _ in range(self.beam)]

    def _length(self, step: int) -> int:
        return max(step + 1 - self.prompt, 1)

    def advance(self, logp: np.ndarray, step: int, last: bool) -> tuple[np.ndarray, np.ndarray]:
        """logp (K, V) for this step -> (parents (K,), next tokens (K,)): each row's best 2K
        continuations hold the sentence's best 2K, so only those are ranked."""
        width = 2 * self.beam
        top = np.argpartition(-logp, width - 1, axis=-1)[:, :width]
        return self.advance_candidates(top, np.take_along_axis(logp, top, axis=-1), step, last)

    def advance_candidates(self, ids: np.ndarray, logp: np.ndarray, step: int,
                           last: bool) -> tuple[np.ndarray, np.ndarray]:
        """ids, logp (K, C >= 2K): each row's candidate continuations (any order; -inf = none)
        -> (parents (K,), next tokens (K,)).

        Dead beams (score -inf) get parent 0 and token eos_id; their rows are
        masked out by their -inf score in later steps.
        """
        k, width = ids.shape
        cand = (self.scores[:, None] + logp.astype(np.float32)).reshape(-1)  # (K*C,)
        top = np.argsort(-cand, kind="stable")[: 2 * k]
        next_scores = np.full(k, -np.inf, dtype=np.float32)
        parents = np.zeros(k, dtype=np.int64)
        tokens = np.full(k, self.eos_id, dtype=np.int64)
        filled = 0
        for rank, idx in enumerate(top.tolist()):
            sc = float(cand[idx])
            if sc == -np.inf:
                break
            parent, j = divmod(idx, width)
            tok = int(ids[parent, j])
            if tok == self.eos_id or last:
                if rank < k and (len(self.done) < k or not self.early_stopping):
                    eos = tok == self.eos_id
                    seq = self.history[parent] + ([] if eos else [tok])
                    self.done.append(Hypothesis(seq, sc / self._length(step) ** self.alpha, eos))
                continue
            if filled < k:
                next_scores[filled], parents[filled], tokens[filled] = sc, parent, tok
                filled += 1
        if len(self.done) > k:  # early_stopping=False: the best K so far
            self.done = sorted(self.done, key=lambda h: -h.score)[:k]
        if last or (len(self.done) >= k and (self.early_stopping or next_scores[0] == -np.inf or float(
                next_scores[0]) / self._length(step) ** self.alpha <= min(h.score for h in self.done))):
            self.finished = True
        self.history = [self.history[p] + [int(t)] for p, t in zip(parents.tolist(), tokens.tolist())]
        self.scores = next_scores
        return parents, tokens

    def stop(self, step: int) -> None:
        """End now (the runaway guard): live beams join the finished ones, scored as if they ended here."""
        for seq, score in zip(self.history, self.scores.tolist()):
            if score > -np.inf:
                self.done.append(Hypothesis(list(seq), score / self._length(step) ** self.alpha, False))
        self.done = sorted(self.done, key=lambda h: -h.score)[:self.beam]
        self.finished = True

    def best(self, n: int = 1) -> list[Hypothesis]:
        return sorted(self.done, key=lambda h: -h.score)[:n]
