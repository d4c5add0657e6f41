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
        back to back, the n-gram just before them (the longest such run over n <= max_ngram): what
        a stopped loop loses, keeping one occurrence, and what a stream holds back until the
        repetition breaks (so a stream never sends what the unary answer would not contain)."""
        if not self.enabled:
            return False, 0
        size = len(tokens) - start
        tripped = size > self.length_ratio * source_len + self.length_slack
        last = tokens[-1] if size > 0 else None
        end, tail = len(tokens), 0
        for n, k in enumerate(self._repeats, 1):
            if size < 2 * n or tokens[-1 - n] != last:
                continue
            gram = tokens[end - n:]
            if tokens[end - 2 * n:end - n] != gram:
                continue
            reps = 2
            while size >= (reps + 1) * n and tokens[end - (reps + 1) * n:end - reps * n] == gram:
                reps += 1
            tail = max(tail, (reps - 1) * n)
            tripped = tripped or reps >= k
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
