"""Characters translated per API key, and the key's character quota (DeepL's /v2/usage and its 456).

Every Translate and TranslateStream call that passes its checks is charged the characters of its
texts (what DeepL bills: the source characters), whichever API it came through, before it is
queued; a call that would take a key past its `characters=N` quota (the key file) is refused
with RESOURCE_EXHAUSTED and the reason "quota", which the DeepL endpoint answers with 456.

The counts live in this process: they start at zero when the server starts and are not shared
between replicas. That is a per-replica allowance, not a billing record; a deployment that bills
must count at its gateway or from the access log (which names the key id of every call).
"""
from __future__ import annotations

import threading
from typing import Optional

from server.core.errors import ServiceError

QUOTA_REASON = "the character quota of API key"  # the start of the refusal's message (the DeepL edge reads it)


class QuotaExceeded(ServiceError):
    code = "RESOURCE_EXHAUSTED"


class CharacterUsage:
    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def charge(self, key_id: str, characters: int, limit: int) -> None:
        """Count `characters` for `key_id` ("" without auth), or refuse them all past `limit` (0: none)."""
        with self._lock:
            used = self._counts.get(key_id, 0)
            if limit and used + characters > limit:
                raise QuotaExceeded(f"{QUOTA_REASON} {key_id!r} is used up: {used} of {limit} characters "
                                    f"translated, this request has {characters}")
            self._counts[key_id] = used + characters

    def count(self, key_id: str) -> int:
        with self._lock:
            return self._counts.get(key_id, 0)

    def report(self, key_id: str, limit: Optional[int] = None) -> tuple[int, int]:
        """(characters counted, the key's limit or 0)."""
        return self.count(key_id), limit or 0
