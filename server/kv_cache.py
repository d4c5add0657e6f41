"""Preallocated KV cache slots for the running batch.

Slot i *is* row i of the next decode step: running rows are kept compact in
slots [0, n), so the step's inputs are plain slices of the buffers rather than
gathers. A finishing row is replaced by the last one (one row copy), which is
why the scheduler refers to rows through `Row` objects whose `slot` moves.

Per slot: self-attention keys/values up to `max_target` steps, the
cross-attention keys/values of its source (computed once by the encoder and
copied into each of the request's rows), the source mask, and the number of
self-attention entries written so far (= the row's next position).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from server.bundle import ModelSpec


@dataclass(eq=False)
class Row:
    """Handle to one decode row; `slot` is kept current by SlotCache.

    `token` is the row's last token: the input of its next decode step.
    """
    slot: int = -1
    token: int = 0


class SlotCache:
    def __init__(self, spec: ModelSpec, slots: int, max_source: int, max_target: int):
        L, H, Dh = spec.n_dec_layers, spec.n_heads, spec.head_dim
        self.capacity = slots
        self.max_source, self.max_target = max_source, max_target
        self.k = np.zeros((L, slots, H, max_target, Dh), dtype=np.float32)  # (L, N, H, T, Dh)
        self.v = np.zeros_like(self.k)
        self.cross_k = np.zeros((L, slots, H, max_source, Dh), dtype=np.float32)  # (L, N, H, S, Dh)
        self.cross_v = np.zeros_like(self.cross_k)
        self.src_mask = np.zeros((slots, max_source), dtype=bool)
        self.src_len = np.zeros(slots, dtype=np.int64)
        self.length = np.zeros(slots, dtype=np.int64)
        self.rows: list[Row] = []  # rows[i].slot == i

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
        out = []
        for _ in range(copies):
            slot = len(self.rows)
            self.cross_k[:, slot, :, :s] = cross_k[:, :, :s]
            self.cross_v[:, slot, :, :s] = cross_v[:, :, :s]
            self.src_mask[slot] = False
            self.src_mask[slot, :s] = True
            self.src_len[slot] = s
            self.length[slot] = 0
            row = Row(slot, token)
            self.rows.append(row)
            out.append(row)
        return out

    def release(self, rows: list[Row]) -> None:
        """Free rows; the last running rows move into the holes."""
        for row in sorted(rows, key=lambda r: -r.slot):
            hole, last = row.slot, len(self.rows) - 1
            if hole != last:
                self._copy_slot(last, hole)
                moved = self.rows[last]
                moved.slot = hole
                self.rows[hole] = moved
            self.rows.pop()
            row.slot = -1

    def _copy_slot(self, src: int, dst: int) -> None:
        n, s = self.length[src], self.src_len[src]
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self.cross_k[:, dst, :, :s] = self.cross_k[:, src, :, :s]
        self.cross_v[:, dst, :, :s] = self.cross_v[:, src, :, :s]
        self.src_mask[dst] = self.src_mask[src]
        self.src_len[dst], self.length[dst] = s, n

    def reorder(self, rows: list[Row], parents: list[int]) -> None:
        """Beam search: rows[i] continues the self-attention history of rows[parents[i]]."""
        slots = np.array([r.slot for r in rows])
        src = slots[np.asarray(parents)]
        n = int(self.length[slots].max())
        self.k[:, slots, :, :n] = self.k[:, src, :, :n]  # fancy indexing reads before writing
        self.v[:, slots, :, :n] = self.v[:, src, :, :n]

    # -- one decode step ------------------------------------------------------
    def step_inputs(self) -> dict[str, np.ndarray]:
        """Inputs for decoding every running row once (B = running rows)."""
        b = len(self.rows)
        lengths = self.length[:b]
        p = int(lengths.max()) if b else 0
        s = int(self.src_len[:b].max()) if b else 0
        return {
            "tokens": np.array([[r.token] for r in self.rows], dtype=np.int64).reshape(b, 1),
            "positions": lengths[:, None].copy(),
            "past_k": np.ascontiguousarray(self.k[:, :b, :, :p]),
            "past_v": np.ascontiguousarray(self.v[:, :b, :, :p]),
            "past_mask": np.arange(p)[None, :] < lengths[:, None],
            "cross_k": np.ascontiguousarray(self.cross_k[:, :b, :, :s]),
            "cross_v": np.ascontiguousarray(self.cross_v[:, :b, :, :s]),
            "src_mask": np.ascontiguousarray(self.src_mask[:b, :s]),
        }

    def append(self, new_k: np.ndarray, new_v: np.ndarray) -> None:
        """new_k, new_v (L, B, H, 1, Dh): each row's entry goes at its own position."""
        b = new_k.shape[1]
        slots, pos = np.arange(b), self.length[:b]
        # Advanced indices on axes 1 and 3 put the row axis first: (B, L, H, Dh).
        self.k[:, slots, :, pos] = new_k[:, :, :, 0].transpose(1, 0, 2, 3)
        self.v[:, slots, :, pos] = new_v[:, :, :, 0].transpose(1, 0, 2, 3)
        self.length[:b] += 1
