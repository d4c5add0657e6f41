"""Per-key rate limits: token buckets for requests and tokens per minute.

Each limit of a key (rpm, tpm, input_tpm, output_tpm; see keys.py) is one bucket that
holds up to one minute's budget and refills continuously at budget/60 per second, so a
key may burst up to its per-minute figure and then runs at the steady rate.

Tokens are charged before admission, from an estimate, because the real counts exist
only after the tokeniser and the decoder ran, and a request must be refused before it
costs anything:

    input  = per text, ceil(UTF-8 bytes / 4) + 1   (~4 bytes per subword in European text, +1 for EOS)
    output = per text, the input estimate x hypotheses, capped by max_output_tokens when set
    Embed: input only; ListModels: no tokens

When the RPC reports its real counts (Translate's per-text counts, the final stream
message, Embed's per-vector counts), `settle` corrects the buckets by the difference:
an overestimate is refunded, an underestimate is taken as debt that delays the key's
next requests. A call that fails before reporting counts keeps the estimate.

A request bigger than a whole bucket is admitted when that bucket is full and leaves
it in debt; otherwise it could never pass. A refused request is charged nothing, and
its RESOURCE_EXHAUSTED carries the wait after which the same request fits.

Everything runs on the server's event loop thread, so there is no lock. The clock is
injectable: tests run on a fake clock and get exact retry delays.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Optional

from server.security.keys import ApiKey, Limits


@dataclass(frozen=True)
class Cost:
    requests: int = 1
    input_tokens: int = 0
    output_tokens: int = 0

    def amount(self, limit: str) -> int:
        """What this cost draws from the bucket of `limit`."""
        if limit == "rpm":
            return self.requests
        if limit == "input_tpm":
            return self.input_tokens
        if limit == "output_tpm":
            return self.output_tokens
        return self.input_tokens + self.output_tokens  # tpm


class TokenBucket:
    __slots__ = ("capacity", "rate", "level", "stamp")

    def __init__(self, per_minute: int, now: float):
        self.capacity = float(per_minute)
        self.rate = per_minute / 60.0
        self.level = self.capacity  # a new (or newly reloaded) key starts with a full minute
        self.stamp = now

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
            self.stamp = now

    def wait(self, amount: float) -> float:
        """Seconds until `amount` fits (capped at the capacity); 0 when it fits now."""
        short = min(amount, self.capacity) - self.level
        return 0.0 if short <= 0 else short / self.rate

    def add(self, amount: float) -> None:
        """Take (amount > 0) or refund (amount < 0); the level may go negative: debt."""
        self.level = min(self.capacity, self.level - amount)


@dataclass(frozen=True)
class Refusal:
    limit: str  # the limit that binds longest: rpm, tpm, input_tpm or output_tpm
    per_minute: int
    retry_after: float  # seconds, > 0


class RateLimiter:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._buckets: dict[str, tuple[Limits, dict[str, TokenBucket]]] = {}

    def _buckets_of(self, key: ApiKey, now: float) -> dict[str, TokenBucket]:
        held = self._buckets.get(key.key_id)
        if held is None or held[0] != key.limits:  # new key, or its limits changed in a reload
            buckets = {name: TokenBucket(getattr(key.limits, name), now)
                       for name in ("rpm", "tpm", "input_tpm", "output_tpm") if getattr(key.limits, name) > 0}
            held = self._buckets[key.key_id] = (key.limits, buckets)
        return held[1]

    def admit(self, key: ApiKey, cost: Cost) -> Optional[Refusal]:
        """Charge `cost` and return None, or charge nothing and say how long to wait."""
        if not key.limits.any:
            return None
        now = self.clock()
        buckets = self._buckets_of(key, now)
        worst: Optional[Refusal] = None
        for name, bucket in buckets.items():
            bucket.refill(now)
            wait = bucket.wait(cost.amount(name))
            if wait > 0 and (worst is None or wait > worst.retry_after):
                worst = Refusal(name, int(bucket.capacity), wait)
        if worst is not None:
            # Whole milliseconds, rounded up: a client that waits exactly this long then fits.
            return Refusal(worst.limit, worst.per_minute, max(math.ceil(worst.retry_after * 1000) / 1000, 0.001))
        for name, bucket in buckets.items():
            bucket.add(cost.amount(name))
        return None

    def settle(self, key: ApiKey, estimated: Cost, actual: Cost) -> None:
        """Correct the token buckets once the real counts are known (the request count stands)."""
        held = self._buckets.get(key.key_id)
        if held is None or held[0] != key.limits:
            return  # reloaded with new limits meanwhile: the fresh buckets owe nothing
        now = self.clock()
        for name, bucket in held[1].items():
            if name != "rpm":
                bucket.refill(now)
                bucket.add(actual.amount(name) - estimated.amount(name))

    def retain(self, key_ids) -> None:
        """Forget the buckets of keys that a reload removed."""
        for key_id in [k for k in self._buckets if k not in key_ids]:
            del self._buckets[key_id]


# -- what a request is estimated to cost, and what it reports it cost ------------------------

def text_tokens(text: str) -> int:
    return -(-len(text.encode("utf-8")) // 4) + 1


def _output_estimate(inputs: int, options) -> int:
    hypotheses = max(getattr(options, "num_hypotheses", 0), 1)
    cap = getattr(options, "max_output_tokens", 0)
    return min(inputs, cap) * hypotheses if cap else inputs * hypotheses


def estimate(method: str, request) -> Cost:
    """The charge before admission; `method` is the Translator RPC's name."""
    if method == "Translate":
        per_text = [text_tokens(t) for t in request.texts]
        return Cost(1, sum(per_text), sum(_output_estimate(n, request.options) for n in per_text))
    if method == "TranslateStream":
        n = text_tokens(request.text)
        return Cost(1, n, _output_estimate(n, request.options))
    if method == "Embed":
        return Cost(1, sum(text_tokens(t) for t in request.texts), 0)
    return Cost(1)


def reported(method: str, message) -> Optional[Cost]:
    """The real cost from a reply (for streams: the final message), or None if this message has none."""
    if method == "Translate":
        return Cost(1, sum(t.input_tokens for t in message.translations),
                    sum(t.output_tokens for t in message.translations))
    if method == "TranslateStream":
        return Cost(1, message.input_tokens, message.output_tokens) if message.final else None
    if method == "Embed":
        return Cost(1, sum(e.tokens for e in message.embeddings), 0)
    return None
