"""Calls: per-target clients, round-robin, retries with back-off."""
from __future__ import annotations

import asyncio
import time
from typing import Optional

import grpc

from client import client as library
from client.client import AsyncTranslatorClient, _backoff

from .settings import Settings

# Retried here, on the next target when there is one; every other code fails the lines concerned.
RETRY_CODES = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED)


class Targets:
    """One AsyncTranslatorClient (one channel) per target, taken round-robin. A target that answered
    UNAVAILABLE or RESOURCE_EXHAUSTED is passed over for a back-off that doubles with each failure
    in a row, while another one is available; the client library's own retries are off (retries=0)
    so that a retry can go to another target."""

    def __init__(self, s: Settings):
        self.s = s
        self.clients = [AsyncTranslatorClient(t, timeout=s.timeout, retries=0, **s.channel) for t in s.targets]
        self.names = list(s.targets)
        self.turn = 0
        self.down_until = [0.0] * len(self.clients)
        self.failures = [0] * len(self.clients)
        self.retries = 0
        self.calls = [0] * len(self.clients)

    def pause(self, attempt: int) -> float:
        """The client library's back-off (base x 2^attempt x U(0.5, 1)), capped at --max-backoff."""
        attempt = min(attempt, 60)
        if self.s.backoff * 2 ** attempt <= self.s.max_backoff:
            return _backoff(attempt, self.s.backoff)
        return _backoff(0, self.s.max_backoff)

    @staticmethod
    def advised(err) -> Optional[float]:
        """The wait a RESOURCE_EXHAUSTED's google.rpc.RetryInfo asks for, read by the client library
        where it can (client.client.retry_delay); None without one (a full queue gives none)."""
        read = getattr(library, "retry_delay", None)
        if read is None or err.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
            return None
        try:
            return read(err)
        except Exception:  # noqa: BLE001 (malformed details: no advice, the back-off still applies)
            return None

    def pick(self) -> int:
        now = time.monotonic()
        n = len(self.clients)
        for k in range(n):
            i = (self.turn + k) % n
            if self.down_until[i] <= now:
                break
        else:
            i = min(range(n), key=self.down_until.__getitem__)
        self.turn = (i + 1) % n
        return i

    async def translate(self, texts: list[str], mime_type: str = ""):
        s = self.s
        attempt = 0
        while True:
            i = self.pick()
            self.calls[i] += 1
            try:
                resp = await self.clients[i].translate(
                    texts, model=s.model, timeout=s.timeout, source_language=s.source_language,
                    target_language=s.target_language, beam_size=s.beam, mime_type=mime_type)
                self.failures[i] = 0
                return resp
            except grpc.aio.AioRpcError as e:
                if e.code() not in RETRY_CODES or attempt >= s.retries:
                    raise
                self.down_until[i] = time.monotonic() + self.pause(self.failures[i])
                self.failures[i] += 1
                self.retries += 1
                attempt += 1
                advised = self.advised(e)  # a rate limit's RetryInfo: its wait is the least we wait
                if advised or all(t > time.monotonic() for t in self.down_until):
                    await asyncio.sleep(max(self.pause(attempt - 1), advised or 0.0))

    async def close(self) -> None:
        for c in self.clients:
            await c.close()
