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
        guard."""
        return self.check(tokens, source_len, start)[0]

    def check(self, tokens: list[int], source_len: int, start: int = 0) -> tuple[bool, int]:
        """(trips the guard, the repeated tail): checked after every appended token, so it is O(1)
        unless the newest token repeats one n back. The tail is how many of the last tokens repeat,
        back to back, the token n before each (the longest such run over n <= max_ngram; a partial
        cycle counts): what a stopped loop loses, keeping one occurrence, and what a stream holds
        back until the repetition breaks (so a stream never sends what the unary answer would not
        contain)."""
        if not self.enabled:
            return False, 0
        size = len(tokens) - start
        tripped = size > self.length_ratio * source_len + self.length_slack
        last = tokens[-1] if size > 0 else None
        end, first, tail = len(tokens), len(tokens) - size, 0
        for n, k in enumerate(self._repeats, 1):
            if size <= n or tokens[-1 - n] != last:
                continue
            # How many of the last tokens each repeat the token n before them, back to back: the part of
            # a period-n loop after its first occurrence, a partial repeat included (so a loop cut mid-
            # cycle keeps exactly one occurrence, as the beam's cut at its stop does).
            j = end - 1
            while j - n >= first and tokens[j] == tokens[j - n]:
                j -= 1
            run = end - 1 - j
            tail = max(tail, run)
            tripped = tripped or 1 + run // n >= k  # the last n-gram, back to back this many times
        return tripped, tail


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
