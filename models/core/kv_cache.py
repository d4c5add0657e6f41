"""Preallocated KV cache slots for the running batch.

Slot i *is* row i of the next decode step: running rows are kept compact in
slots [0, n), so the step's inputs are plain slices of the buffers rather than
gathers. A finishing row is replaced by the last one (one row copy), which is
why the scheduler refers to rows through `Row` objects whose `slot` moves.

Per slot: self-attention keys/values up to `max_target` steps, the
cross-attention keys/values of its source (computed once by the encoder and
copied into each of the request's rows), the source mask, and the number of
self-attention entries written so far (= the row's next position).

Step inputs go into buffers that are reused from step to step. A decode step
needs every running row's past and cross keys/values as contiguous arrays;
fresh ones each step (up to ~100 MB with 64 rows near 200 positions) went
through malloc every time, and glibc either kept them or mapped them anew
(page faults every step). The reused buffers are sized for every slot at full
length, but like the cache they are mapped lazily (`lazy_zeros`), so only the
largest step so far is resident (docs/memory.md). The cross keys/values only
change when rows join, leave or move, so they are gathered again only then.
"""
from __future__ import annotations

import ctypes
import functools
import mmap
import sys
import time
from dataclasses import dataclass

import numpy as np

from models.core.bundle import ModelSpec
from models.core.device_arrays import device_zeros, same_device


def lazy_zeros(shape: tuple[int, ...], dtype=np.float32) -> np.ndarray:
    """Zeros in a private anonymous mapping: a 4 KB page becomes resident when first written.

    np.zeros_like writes every byte (the cache's v and cross_v were fully resident from the
    start, 96 MB), and numpy marks arrays of 4 MB and more MADV_HUGEPAGE: with transparent
    huge pages in "madvise" mode (the usual setting) one write then makes a whole 2 MB
    resident. The slot cache is written sparsely (a row fills only the first positions of
    each head), so a cross-attention array with 40 of 256 source positions in use was
    46 of 48 MB resident that way, 9 MB this way (docs/memory.md).
    """
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    if size == 0 or not hasattr(mmap, "MAP_PRIVATE"):  # not a POSIX system
        return np.zeros(shape, dtype)
    return np.frombuffer(mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE), dtype).reshape(shape)


_madvise = ctypes.CDLL(None, use_errno=True).madvise if sys.platform == "linux" else None
_DONTNEED = 4  # MADV_DONTNEED: a private anonymous page reads as zeros again, as lazy_zeros made it
KEEP_POSITIONS = 64  # positions of every slot kept resident (release); most sentences fit in them
IDLE_S = 2.0  # an empty cache gives everything back after this long (give_back_idle)


def give_back(region: np.ndarray) -> None:
    """Return the whole pages inside `region` (a contiguous part of a lazy_zeros array) to the kernel:
    RSS falls, and they read as zeros again (what they held was past any running row's length)."""
    if _madvise is None or region.size == 0 or not isinstance(region, np.ndarray):  # device memory: the pool's
        return
    start = region.ctypes.data
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE  # pages wholly inside: never a neighbour's data
    last = (start + region.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if last > first:
        _madvise(ctypes.c_void_p(first), ctypes.c_size_t(last - first), _DONTNEED)


@dataclass(eq=False)
class Row:
    """Handle to one decode row; `slot` is kept current by SlotCache.

    `token` is the row's last token: the input of its next decode step.
    """
    slot: int = -1
    token: int = 0


class SlotCache:
    """`dtype`: the keys/values' element type (the in-place graph's: fp16 for the fp16 variant).
    `device`: "cpu" (lazily mapped host memory) or "cuda:N" (CuPy arrays on device N, written by the same
    slicing; models/core/device_arrays.py). The bookkeeping (lengths, masks, inputs) stays on the host."""

    def __init__(self, spec: ModelSpec, slots: int, max_source: int, max_target: int, dtype=np.float32,
                 device: str = "cpu"):
        L, H, Dh = spec.n_dec_layers, spec.n_heads, spec.head_dim
        self.capacity = slots
        self.max_source, self.max_target = max_source, max_target
        self.device = device
        zeros = functools.partial(lazy_zeros, dtype=dtype) if device == "cpu" else \
            functools.partial(device_zeros, dtype=dtype, device_id=int(device.partition(":")[2] or 0))
        self.k = zeros((L, slots, H, max_target, Dh))  # (L, N, H, T, Dh)
        self.v = zeros(self.k.shape)
        self.cross_k = zeros((L, slots, H, max_source, Dh))  # (L, N, H, S, Dh)
        self.cross_v = zeros(self.cross_k.shape)
        # Each row's last real source key/value, heads side by side: the in-place step's cross-attention takes
        # it as the "new" entry it rewrites (export/inplace.py); kept here, not gathered by the graph each step.
        self.cross_last_k = zeros((L, slots, 1, H * Dh))  # (L, N, 1, H*Dh)
        self.cross_last_v = zeros(self.cross_last_k.shape)
        self.src_mask = np.zeros((slots, max_source), dtype=bool)
        self.src_len = np.zeros(slots, dtype=np.int64)
        self.length = np.zeros(slots, dtype=np.int64)
        # Positions (self-attention) and source positions (cross) written in each slot since its memory was
        # last given back (release): what a trim must cover.
        self.extent = np.zeros(slots, dtype=np.int64)
        self.src_extent = np.zeros(slots, dtype=np.int64)
        self.empty_since: float | None = None  # when the last row left (give_back_idle)
        # The token each step fed each row, by position: the row's history as the decoding controls read it
        # (start token, forced tokens, prefix, output), kept per slot, so it moves with the slot's cache.
        self.inputs = np.zeros((slots, max_target), dtype=np.int64)  # (N, T)
        self.rows: list[Row] = []  # rows[i].slot == i
        # Flat step-input buffers (see the module docstring); views of their heads are the step's inputs.
        self._step = {name: lazy_zeros((a.size,), dtype) for name, a in
                      (("past_k", self.k), ("past_v", self.v), ("cross_k", self.cross_k), ("cross_v", self.cross_v))}
        self._cross_key: tuple = ()  # (rows, source length, changes) the gathered cross inputs hold
        self._changes = 0  # bumped whenever a slot's cross keys/values are written

    # -- occupancy ------------------------------------------------------------
    @property
    def used(self) -> int:
        return len(self.rows)

    @property
    def free(self) -> int:
        return self.capacity - len(self.rows)

    def usage(self) -> float:
        """Fraction of slots holding a running row."""
        return len(self.rows) / self.capacity

    def allocate(self, cross_k: np.ndarray, cross_v: np.ndarray, src_mask: np.ndarray, copies: int,
                 token: int) -> list[Row]:
        """New rows for one source: cross_k/v (L, H, S, Dh), src_mask (S,), repeated `copies` times."""
        if copies > self.free:
            raise RuntimeError(f"asked for {copies} slots with {self.free} free")
        s = int(src_mask.sum())  # right-padded: the real positions come first
        if s > self.max_source:
            raise RuntimeError(f"source of {s} tokens exceeds the cache's {self.max_source}")
        cross_k, cross_v = same_device(self.k, cross_k), same_device(self.k, cross_v)
        out = []
        for _ in range(copies):
            slot = len(self.rows)
            self.cross_k[:, slot, :, :s] = cross_k[:, :, :s]
            self.cross_v[:, slot, :, :s] = cross_v[:, :, :s]
            self.cross_last_k[:, slot, 0] = cross_k[:, :, s - 1].reshape(len(cross_k), -1)  # (L, H*Dh)
            self.cross_last_v[:, slot, 0] = cross_v[:, :, s - 1].reshape(len(cross_v), -1)
            self.src_mask[slot] = False
            self.src_mask[slot, :s] = True
            self.src_len[slot] = s
            self.length[slot] = 0
            self._changes += 1
            row = Row(slot, token)
            self.rows.append(row)
            out.append(row)
        return out

    def release(self, rows: list[Row]) -> None:
        """Free rows; the last running rows move into the holes.

        Memory: a slot's pages stay resident once written, so without giving any back RSS grew with the
        longest texts a server had seen, towards the whole cache per model and replica (docs/memory.md).
        Positions past KEEP_POSITIONS that a departed row wrote go back to the kernel when nothing in
        the slot needs them (long rows are rare: a few syscalls each), and everything goes back once the
        cache has stayed empty for IDLE_S (`give_back_idle`). The first KEEP_POSITIONS of every slot stay:
        short rows, the common case, come and go without a syscall or a page fault."""
        for row in sorted(rows, key=lambda r: -r.slot):
            hole, last = row.slot, len(self.rows) - 1
            for slot in {hole, last}:  # what the rows leaving or moving out wrote
                self.extent[slot] = max(self.extent[slot], self.length[slot])
                self.src_extent[slot] = max(self.src_extent[slot], self.src_len[slot])
            if hole != last:
                self._copy_slot(last, hole)
                moved = self.rows[last]
                moved.slot = hole
                self.rows[hole] = moved
                self._trim(hole, self.length[hole], self.src_len[hole])
            self.rows.pop()
            row.slot = -1
            self._trim(last, 0, 0)
        if not self.rows:
            self.empty_since = time.monotonic()

    def give_back_idle(self, now: float) -> bool:
        """Everything back to the kernel once the cache has held no row for IDLE_S (the engine loop asks
        while it waits for work); True if it did. Not at every drain: unary batches drain a replica's cache
        between calls, and faulting its pages back in each time cost them 4-8% of their tokens/s (measured,
        2 cores, 32 texts x 4 clients)."""
        if self.rows or self.empty_since is None or now - self.empty_since < IDLE_S:
            return False
        self.empty_since = None
        if not (self.extent.any() or self.src_extent.any()):
            return False
        for cache in (self.k, self.v, self.cross_k, self.cross_v):
            give_back(cache)
        self.extent[:] = self.src_extent[:] = 0
        return True

    def _trim(self, slot: int, length: int, src_len: int) -> None:
        """Give back what departed rows wrote in `slot` past max(KEEP_POSITIONS, what its row now uses)."""
        for caches, extent, used in (((self.k, self.v), self.extent, length),
                                     ((self.cross_k, self.cross_v), self.src_extent, src_len)):
            keep = max(KEEP_POSITIONS, int(used))
            if extent[slot] > keep:
                for cache in caches:
                    for layer in cache:  # (N, H, T, Dh)
                        for head in layer[slot]:  # (T, Dh): contiguous
                            give_back(head[keep:extent[slot]])
                extent[slot] = keep

    def _copy_slot(self, src: int, dst: int) -> None:
        n, s = self.length[src], self.src_len[src]
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.cross_k[:, dst, :, :s] = self.cross_k[:, src, :, :s]
        self.cross_v[:, dst, :, :s] = self.cross_v[:, src, :, :s]
        self.cross_last_k[:, dst] = self.cross_last_k[:, src]
        self.cross_last_v[:, dst] = self.cross_last_v[:, src]
        self.src_mask[dst] = self.src_mask[src]
        self.src_len[dst], self.length[dst] = s, n
        self.inputs[dst, :n] = self.inputs[src, :n]
        self._changes += 1

    def rewind(self, row: Row, length: int, token: int) -> None:
        """The row goes back to its first `length` positions (its next step writes position `length`, fed
        `token`): what it wrote past them is masked out by its length, then overwritten."""
        if not 0 <= length <= self.length[row.slot]:
            raise ValueError(f"cannot rewind a row of {self.length[row.slot]} positions to {length}")
        self.length[row.slot] = length
        row.token = token

    def reorder(self, rows: list[Row], parents: list[int]) -> None:
        """Beam search: rows[i] continues the self-attention history of rows[parents[i]]."""
        slots = np.array([r.slot for r in rows])
        src = slots[np.asarray(parents)]
        n = int(self.length[slots].max())
        at, take = same_device(self.k, slots), same_device(self.k, src)
        self.k[:, at, :, :n] = self.k[:, take, :, :n]  # fancy indexing reads before writing
        self.v[:, at, :, :n] = self.v[:, take, :, :n]
        self.inputs[slots, :n] = self.inputs[src, :n]

    # -- one decode step ------------------------------------------------------
    def _gather(self, name: str, cache: np.ndarray, b: int, n: int) -> np.ndarray:
        """cache[:, :b, :, :n] as a contiguous array in the reused buffer `name`."""
        part = cache[:, :b, :, :n]
        out = self._step[name][:part.size].reshape(part.shape)
        np.copyto(out, part)
        return out

    def step_inputs(self) -> dict[str, np.ndarray]:
        """Inputs for decoding every running row once (B = running rows).

        past_k/v and cross_k/v are views of reused buffers: read them before the
        next call, and never write to them.
        """
        b = len(self.rows)
        lengths = self.length[:b]
        p = int(lengths.max()) if b else 0
        s = int(self.src_len[:b].max()) if b else 0
        key = (b, s, self._changes)
        if key != self._cross_key:
            self._gather("cross_k", self.cross_k, b, s)
            self._gather("cross_v", self.cross_v, b, s)
            self._cross_key = key
        shape = self.cross_k[:, :b, :, :s].shape
        size = int(np.prod(shape))
        return {
            "tokens": np.array([[r.token] for r in self.rows], dtype=np.int64).reshape(b, 1),
            "positions": lengths[:, None].copy(),
            "past_k": self._gather("past_k", self.k, b, p),
            "past_v": self._gather("past_v", self.v, b, p),
            "past_mask": np.arange(p)[None, :] < lengths[:, None],
            "cross_k": self._step["cross_k"][:size].reshape(shape),
            "cross_v": self._step["cross_v"][:size].reshape(shape),
            "src_mask": np.ascontiguousarray(self.src_mask[:b, :s]),
        }

    def append(self, new_k: np.ndarray, new_v: np.ndarray, tokens: np.ndarray | None = None) -> None:
        """new_k, new_v (L, B, H, 1, Dh): each row's entry goes at its own position; `tokens` (B,) the
        step's inputs (recorded in `inputs`)."""
        b = new_k.shape[1]
        slots, pos = np.arange(b), self.length[:b]
        # Advanced indices on axes 1 and 3 put the row axis first: (B, L, H, Dh).
        self.k[:, slots, :, pos] = new_k[:, :, :, 0].transpose(1, 0, 2, 3)
        self.v[:, slots, :, pos] = new_v[:, :, :, 0].transpose(1, 0, 2, 3)
        self.advance(tokens)

    def advance(self, tokens: np.ndarray | None = None) -> None:
        """Every running row's cache grew by one entry (written by `append` or in place by the graph);
        `tokens` (B,): the inputs the step fed them, recorded at their positions."""
        b = len(self.rows)
        if tokens is not None:
            self.inputs[np.arange(b), self.length[:b]] = tokens
        self.length[:b] += 1
