"""Greedy and beam search on ONNX Runtime and numpy alone (no torch).

Static batches: every row starts together. This is the decoder the parity
tests hold against models/search.py token for token (same candidate rules,
same length penalty), and the ONNX side of the throughput benchmark.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from models.core.beam import BeamState, Hypothesis, log_softmax
from models.core.config import max_output_len
from models.core.device_arrays import as_device_array, host_float32
from models.core.inplace_step import InPlaceStep
from models.core.kv_cache import SlotCache
from models.core.runtime import OnnxModel


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad -> ids (B, S) int64 and mask (B, S) bool."""
    width = max(len(s) for s in seqs)
    ids = np.full((len(seqs), width), pad_id, dtype=np.int64)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = s
    return ids, ids != pad_id


class StepCache:
    """Preallocated self-attention cache (L, B, H, capacity, Dh) for rows that advance together."""

    def __init__(self, model: OnnxModel, rows: int, capacity: int):
        s = model.spec
        shape = (s.n_dec_layers, rows, s.n_heads, capacity, s.head_dim)
        self.k = np.zeros(shape, dtype=np.float32)
        self.v = np.zeros(shape, dtype=np.float32)
        self.length = 0

    def past(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The whole buffers and a mask over the filled part: (L, B, H, capacity, Dh) x2, (B, capacity).

        ONNX Runtime wants C-contiguous inputs, and a slice along the time axis
        is not one; handing over the full buffer with the unfilled tail masked
        (exactly zero attention weight) saves copying the past every step.
        """
        mask = np.broadcast_to(np.arange(self.k.shape[3]) < self.length, (self.k.shape[1], self.k.shape[3]))
        return self.k, self.v, np.ascontiguousarray(mask)

    def append(self, new_k: np.ndarray, new_v: np.ndarray) -> None:
        self.k[:, :, :, self.length] = new_k[:, :, :, 0]
        self.v[:, :, :, self.length] = new_v[:, :, :, 0]
        self.length += 1

    def reorder(self, rows: np.ndarray) -> None:
        self.k = self.k[:, rows]
        self.v = self.v[:, rows]


def greedy(model: OnnxModel, src_ids: np.ndarray, src_mask: np.ndarray, max_len: int | None = None,
           min_len: int = 0) -> list[list[int]]:
    """Batched greedy decoding; returns ids without BOS/EOS.

    EOS is suppressed for the first `min_len` steps; min_len = max_len forces
    exact lengths (benchmarks: every engine does the same work).
    """
    s = model.spec
    b, src_len = src_ids.shape
    max_len = max_len or max_output_len(src_len, s.max_positions - 1)
    _, cross_k, cross_v = model.encode(src_ids, src_mask)
    if model.inplace is not None:
        next_logits = _inplace_steps(model, cross_k, cross_v, src_mask, max_len)
    else:
        next_logits = _copy_steps(model, cross_k, cross_v, src_mask, max_len)
    out = np.full((b, max_len), s.pad_id, dtype=np.int64)
    finished = np.zeros(b, dtype=bool)
    tokens = np.full(b, s.bos_id, dtype=np.int64)
    for step in range(max_len):
        last = next_logits(tokens).copy()  # (B, V)
        if step < min_len:
            last[:, s.eos_id] = -np.inf
        nxt = np.where(finished, s.pad_id, last.argmax(-1))
        finished |= nxt == s.eos_id
        out[:, step] = nxt
        tokens = nxt.astype(np.int64)
        if finished.all():
            break
    return [_strip(r, s.eos_id, s.pad_id) for r in out.tolist()]


def _copy_steps(model: OnnxModel, cross_k, cross_v, src_mask: np.ndarray, max_len: int):
    """Steps through decoder_step.onnx: tokens (B,) -> next logits (B, V)."""
    b = src_mask.shape[0]
    cache = StepCache(model, b, max_len)

    def step(tokens: np.ndarray) -> np.ndarray:
        past_k, past_v, past_mask = cache.past()
        logits, new_k, new_v = model.decode_step(tokens[:, None], np.full((b, 1), cache.length, dtype=np.int64),
                                                 past_k, past_v, past_mask, cross_k, cross_v, src_mask)
        cache.append(new_k, new_v)
        return logits[:, -1]
    return step


def _inplace_steps(model: OnnxModel, cross_k: np.ndarray, cross_v: np.ndarray, src_mask: np.ndarray,
                   max_len: int):
    """Steps through decoder_inplace.onnx over a slot cache, as the server runs them: the step's
    cost does not grow with the capacity or the past (the copying step attends over max_len)."""
    b, src_len = src_mask.shape
    cross_k, cross_v = as_device_array(cross_k), as_device_array(cross_v)  # device outputs stay there
    cache = SlotCache(model.spec, b, src_len, max_len, model.cache_dtype, model.cache_device)
    rows = [cache.allocate(cross_k[:, i], cross_v[:, i], src_mask[i], 1, model.spec.bos_id)[0] for i in range(b)]
    runner = InPlaceStep(model.inplace, cache, model.spec.out_vocab_size)

    def step(tokens: np.ndarray) -> np.ndarray:
        for row, tok in zip(rows, tokens.tolist()):
            row.token = tok
        return host_float32(runner.run())  # a device cache's logits come to the host here
    return step


def _strip(ids: list[int], eos: int, pad: int) -> list[int]:
    for i, t in enumerate(ids):
        if t == eos or t == pad:
            return ids[:i]
    return ids


def beam_search(model: OnnxModel, src_ids: np.ndarray, src_mask: np.ndarray, beam: int = 5, alpha: float = 1.0,
                max_len: int | None = None, n_best: int = 1) -> list[list[Hypothesis]]:
    """Batched beam search with the rules of models/search.py:beam_search (see models/core/beam.py)."""
    s = model.spec
    b, src_len = src_ids.shape
    k = beam
    max_len = max_len or max_output_len(src_len, s.max_positions - 1)
    rows = np.repeat(np.arange(b), k)  # (B*K,)
    mask = src_mask[rows]
    if model.on_device:
        # Device-resident OrtValues cannot be row-indexed from numpy: encode the repeated batch.
        _, cross_k, cross_v = model.encode(src_ids[rows], mask)
    else:
        _, cross_k, cross_v = model.encode(src_ids, src_mask)
        cross_k, cross_v = cross_k[:, rows], cross_v[:, rows]
    cache = StepCache(model, b * k, max_len)
    states = [BeamState(k, s.eos_id, alpha) for _ in range(b)]
    tokens = np.full(b * k, s.bos_id, dtype=np.int64)
    for step in range(max_len):
        past_k, past_v, past_mask = cache.past()
        logits, new_k, new_v = model.decode_step(tokens[:, None], np.full((b * k, 1), step, dtype=np.int64),
                                                 past_k, past_v, past_mask, cross_k, cross_v, mask)
        cache.append(new_k, new_v)
        logp = log_softmax(logits[:, -1]).reshape(b, k, -1)
        flat = np.arange(b * k)
        for i, state in enumerate(states):
            if state.finished:
                continue
            parents, next_tokens = state.advance(logp[i], step, step == max_len - 1)
            flat[i * k:(i + 1) * k] = i * k + parents
            tokens[i * k:(i + 1) * k] = next_tokens
        if all(state.finished for state in states):
            break
        cache.reorder(flat)
    return [state.best(n_best) for state in states]
