"""glibc's heap, set and trimmed for every server process (frontends and engine cores). No ONNX Runtime
here: a frontend over engine cores imports this and never loads it.

keep_freed_memory: an engine's heap keeps what its steps free (below); limit_malloc_arenas, called
before threads start:

Measured problem (the soak, docs/memory.md): a frontend's resident memory kept rising after warm-up,
190 -> 203 MB over a 240 s soak, with nothing leaking. glibc gives each thread that allocates
concurrently its own heap ("arena"), up to 8 per core, and each heap keeps the pages its fragments
pin. The frontend has many such threads: gRPC's, asyncio's default executor, uvicorn's, the core
link's socket thread. With two arenas (MALLOC_ARENA_MAX=2, same soak) it went 187 -> 193 MB. Two,
not one: the event loop's thread and the busiest worker thread then do not queue on one lock; with
two cores more would not run at once anyway.

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


def release_free_heap() -> bool:
    """Hand the free pages of every glibc heap back to the kernel (malloc_trim(0)); True if it did. For
    moments after a burst: an idle engine (models/core/runtime.py OnnxModel.release_idle_memory; its
    keep_freed_memory keeps them while it runs steps) and the language identifier's one-off load
    (server/frontend/language_id.py). A no-op where libc is not glibc."""
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


# glibc keeps up to this much free memory at the top of each heap (see keep_freed_memory).
KEEP_FREED_BYTES = 64 << 20


def keep_freed_memory() -> bool:
    """Stop glibc from handing freed heap memory back to the kernel after every step.

    A decode step allocates a few MB (ORT outputs, numpy temporaries) and frees
    them; by default glibc trims the heap top or uses fresh mmaps for such sizes,
    so the next step page-faults all of it in again: ~7 ms per step for four
    3 MB arrays on the benchmark machine, against ~0.4 ms with the memory kept.
    Blocks under 32 MB therefore come from the heap, and up to 64 MB free at a
    heap's top stays there. It was 512 MB when each step also malloc'ed its
    gathered keys/values (tens of MB); the slot cache now reuses buffers for
    those, so 64 MB covers a step's churn while bounding what each of glibc's
    per-thread heaps may hold (docs/memory.md).
    Process-wide, like the thread pool; a no-op where libc is not glibc.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3
        return bool(libc.mallopt(m_mmap_threshold, 32 << 20) and libc.mallopt(m_trim_threshold, KEEP_FREED_BYTES))
    except (OSError, AttributeError):
        return False

