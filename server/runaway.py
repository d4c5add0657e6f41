"""The runaway guard: stop a row that loops instead of translating.

Small models loop on out-of-domain input ("spricht dabei dabei dabei ...",
"Ein OOOIINININ...") until the length cap, which costs the whole output budget and
returns garbage. A row is stopped, with its own finish reason, when its output ends
in the same n-gram repeated back to back past a bound, or grows past a bound relative
to its source. The defaults are set so they change no output of the shipped model on
the full test set (greedy and beam; `python -m benchmarks.runaway` checks it and
writes docs/runaway.md) while stopping the loops above within a few words.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RunawayGuard:
    enabled: bool = True
    max_ngram: int = 6  # n-gram sizes checked: 1..max_ngram tokens
    min_span: int = 12  # a loop must cover this many tokens ...
    min_repeats: int = 3  # ... and repeat its n-gram at least this often
    length_ratio: float = 3.0  # output tokens beyond length_ratio * source tokens + length_slack
    length_slack: int = 16

    def __post_init__(self) -> None:
        # Per n-gram size, the back-to-back repeats that make a loop: asked for every row at every step.
        object.__setattr__(self, "_repeats", tuple(self.repeats_needed(n) for n in range(1, self.max_ngram + 1)))

    def repeats_needed(self, n: int) -> int:
        return max(self.min_repeats, math.ceil(self.min_span / n))

    def tripped(self, tokens: list[int], source_len: int, start: int = 0) -> bool:
        """Whether tokens[start:] (the output; forced tokens before `start` do not count) trips the
        guard. Checked after every appended token, so it is O(1) unless the newest token repeats one
        n back: no slice of the output is taken."""
        if not self.enabled:
            return False
        size = len(tokens) - start
        if size > self.length_ratio * source_len + self.length_slack:
            return True
        last = tokens[-1] if size > 0 else None
        for n, k in enumerate(self._repeats, 1):
            if size < n * k or tokens[-1 - n] != last:
                continue
            end = len(tokens)
            tail = tokens[end - n:]
            if all(tokens[end - (j + 1) * n:end - j * n] == tail for j in range(1, k)):
                return True
        return False


def longest_loop(tokens: list[int], max_ngram: int = 6) -> dict[int, int]:
    """For each n, the most back-to-back repeats of one n-gram anywhere in `tokens` (for
    choosing the guard's bounds from real outputs)."""
    best = {}
    for n in range(1, max_ngram + 1):
        top = 1
        for start in range(n):  # every phase of the n-gram grid
            run, prev = 1, None
            for i in range(start, len(tokens) - n + 1, n):
                gram = tokens[i:i + n]
                run = run + 1 if gram == prev else 1
                prev = gram
                top = max(top, run)
        best[n] = top
    return best
