"""glibc's heap settings for every server process (frontends and engine cores), set before threads start.

Measured problem (the soak, docs/memory.md): a frontend's resident memory rose by ~45 MB between
start and the end of a 240 s soak (158 -> 203 MB) with nothing leaking. glibc gives each thread that
allocates concurrently its own heap ("arena"), up to 8 per core, and a heap keeps the pages its
fragments pin. The frontend has many such threads: gRPC's completion-queue and executor threads,
asyncio's default executor, uvicorn's, the core link's socket thread. Capped at two arenas, the same
soak ended at 193 MB (the engine core's step memory is bounded separately: models/core/runtime.py
keep_freed_memory). Two, not one: the event loop's thread and the busiest worker thread then do not
queue on one lock; with two cores more would not run at once anyway.

The setting is MALLOPT(M_ARENA_MAX); MALLOC_ARENA_MAX in the environment, when set, wins (glibc
reads it at start-up and this module leaves it alone), so an operator can still choose. A no-op
where libc is not glibc.
"""
from __future__ import annotations

import ctypes
import os

ARENAS = 2
_M_ARENA_MAX = -8  # glibc malloc.h


def limit_malloc_arenas(arenas: int = ARENAS) -> bool:
    """Cap glibc's per-thread heaps at `arenas`; True if it did (False: not glibc, or the operator set
    MALLOC_ARENA_MAX)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(_M_ARENA_MAX, arenas))
    except (OSError, AttributeError):
        return False
