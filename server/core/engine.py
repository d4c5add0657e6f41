"""The engine: encoder passes into fresh slots, and one decode step over every running row.

It never sees a queue or a request: the scheduler hands it jobs to encode and,
each step, what every row needs (server/core/chooser.py's RowControls); the engine
runs the step, chooses the tokens and returns plain arrays. Logits never leave
it. Rows are decoded in slot order.
"""
from __future__ import annotations

import time
from typing import Callable, Optional, TYPE_CHECKING

import numpy as np
import onnxruntime as ort

from models.core.device_arrays import as_device_array, host_float32, settle
from models.core.heap import release_free_heap
from models.core.inplace_step import InPlaceStep
from models.core.kv_cache import IDLE_S, Row, SlotCache
from models.core.runtime import OnnxModel
from models.core.static_decode import pad_batch
from server.core.chooser import Choices, RowControls, TokenChooser
from server.core.greedy import choose_greedy, plain
from server.core.request import EmbedJob, Job

if TYPE_CHECKING:  # the server hands its metrics in (server/observability/metrics.py); the core only names their type
    from server.observability.metrics import Metrics


def _for_cache(x, cache: SlotCache):
    """On CUDA the encoder leaves cross K/V on the device: a device cache takes them where they are (no
    copy), a host cache (the copying step) from the host."""
    if not isinstance(x, ort.OrtValue):
        return x
    return as_device_array(x) if cache.device != "cpu" else x.numpy()


# The most sources one encoder pass takes. ONNX Runtime's CPU arena keeps the largest pass's
# intermediates for as long as the engine works (they grow with sources x length), so wide passes set
# every replica's working memory: both shipped models in one process, 160 passes of 8-64 sources of
# 10-45 tokens, grew 74 MB past loading with passes of up to 64, 43 MB with 32, 27 MB with 16, for
# 2.36 / 2.40 / 2.55 s of encoding (two runs each; the encoder is ~15% of a replica's time). 32 keeps
# nearly all of the width's speed for 31 MB less in each replica (the soak's peak is two replicas
# under load).
ENCODE_ROWS = 32


def length_groups(lengths: list[int], max_padding: float, max_rows: int = ENCODE_ROWS) -> list[list[int]]:
    """Indices in groups of similar length: each group's padding share stays <= max_padding, and no
    group has more than max_rows sources.

    An encoder pass costs (texts x longest text); on CPU a batch of mixed lengths
    costs more per text than encoding them one by one (test sentences: 0.97 ms
    per text at 32 padded together vs 0.53 ms alone), so admitted texts are
    sorted by length and cut wherever padding would exceed the budget.
    """
    groups, group, real = [], [], 0
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        n = lengths[i]  # ascending: the longest of the group if added
        if group and (len(group) >= max_rows or real + n < (1.0 - max_padding) * n * (len(group) + 1)):
            groups.append(group)
            group, real = [], 0
        group.append(i)
        real += n
    return groups + [group] if group else groups


HEAP_TRIM_S = 5.0  # trim_heap's period while the engine works


class Engine:
    def __init__(self, name: str, runtime: OnnxModel, cache: SlotCache, metrics: Metrics, max_padding: float,
                 chooser: TokenChooser):
        self.name, self.runtime, self.cache, self.m = name, runtime, cache, metrics.for_model(name)
        self.spec = runtime.spec
        self.max_padding = max_padding
        self.chooser = chooser
        # decoder_inplace.onnx writes the slot cache itself; decoder_step.onnx needs gathered copies.
        self.inplace = InPlaceStep(runtime.inplace, cache, self.spec.out_vocab_size,
                                   bucketed=runtime.cuda_graphs) if runtime.inplace else None
        self._encoded_at: Optional[float] = None  # the last encoder run since the arena was given back
        self._trimmed_at = time.monotonic()  # trim_heap's last trim
        self._give_back_next_encode = False  # set by trim_heap: the next pass gives its arena growth back
        self.step_seconds = 0.0  # recent decode steps' time, a moving average (EngineLoop.steps_per_visit)

    def give_back_idle(self, now: float) -> None:
        """With no work for IDLE_S: the cache's pages (SlotCache.give_back_idle), and the encoder's arena and
        the heap's free pages if it has run since (OnnxModel.release_idle_memory; Embed calls use only the
        encoder, so the cache alone cannot tell)."""
        self.cache.give_back_idle(now)
        if self._encoded_at is not None and now - self._encoded_at >= IDLE_S and self.cache.used == 0:
            self._encoded_at = None
            self.runtime.release_idle_memory()

    def trim_heap(self, now: float) -> None:
        """Every HEAP_TRIM_S while the engine works: the heap's free pages back to the kernel (malloc_trim),
        and the next encoder pass gives its arena's growth back too. keep_freed_memory lets glibc keep what
        steps free, and the arena keeps its blocks, so both find their memory faulted in next time; without
        this it stayed resident as long as the load lasted, at the size of its busiest moment (the soak: a
        replica ~60 MB above quiet; its load's median 605 -> 580 MB with the trim alone). A trim costs
        ~1-6 ms and the next steps one re-fault of their scratch: once per HEAP_TRIM_S, not per step."""
        if now - self._trimmed_at >= HEAP_TRIM_S:
            self._trimmed_at = now
            self._give_back_next_encode = True
            release_free_heap()

    def _encode(self, seqs: list[list[int]]):
        ids, mask = pad_batch(seqs, self.spec.pad_id)
        t0 = time.perf_counter()
        memory, cross_k, cross_v = self.runtime.encode(ids, mask, give_back=self._give_back_next_encode)
        self._give_back_next_encode = False
        self.m.encode_time.observe(time.perf_counter() - t0)
        self._encoded_at = time.monotonic()
        self.m.encode_batch.observe(len(seqs))
        self.m.padding.observe(1.0 - mask.sum() / mask.size)
        return memory, _for_cache(cross_k, self.cache), _for_cache(cross_v, self.cache), mask

    def encode(self, jobs: list[Job]) -> list[list[Row]]:
        """Encode jobs (padding-masked, in groups of similar length) and give each its decode rows,
        primed with BOS; rows come back in the order of `jobs`."""
        rows: list[list[Row]] = [[] for _ in jobs]
        try:
            for group in length_groups([len(j.src_ids) for j in jobs], self.max_padding):
                _, cross_k, cross_v, mask = self._encode([jobs[i].src_ids for i in group])
                for g, i in enumerate(group):
                    rows[i] = self.cache.allocate(cross_k[:, g], cross_v[:, g], mask[g], jobs[i].params.rows,
                                                  self.spec.bos_id)
                # A device cache's copies run on CuPy's stream: done before the encoder's output memory, which
                # ONNX Runtime reuses for its next pass, is let go.
                settle(self.cache.k)
        except BaseException:
            # A later group's pass failed: the rows given to earlier groups belong to no request yet, and
            # would be decoded in every later step (found by tests/unit/test_engine_core_loop.py).
            self.cache.release([r for job_rows in rows for r in job_rows])
            raise
        return rows

    def embed(self, jobs: list[EmbedJob]) -> np.ndarray:
        """Mean of the encoder states over real (unpadded) positions: (n, D)."""
        means = []
        for start in range(0, len(jobs), ENCODE_ROWS):  # as wide as an encode's passes, no wider
            memory, _, _, mask = self._encode([j.src_ids for j in jobs[start:start + ENCODE_ROWS]])
            weights = mask[:, :, None].astype(np.float32)  # (B, S, 1)
            means.append((memory * weights).sum(1) / np.maximum(weights.sum(1), 1.0))
        return np.concatenate(means) if len(means) > 1 else means[0]

    def decode_step(self, controls: Optional[RowControls]) -> Choices:
        """One step for every running row -> each row's choice; the rows' caches grow by one. `controls` None:
        every row plain greedy (Scheduler.controls). Those steps, and on a device every plain greedy step,
        take the greedy lane where the logits are (server/core/greedy.py); anything it hands back, and every
        other step, the full chooser on the host."""
        logits = self._step()
        if controls is None or (not isinstance(logits, np.ndarray) and plain(controls)):
            chosen = choose_greedy(logits, controls, self.chooser.suppress)
            if chosen is not None:
                return chosen
            if controls is None:
                controls = RowControls.greedy(len(logits))
        return self.chooser.choose(host_float32(logits), controls, self.cache.inputs, self.cache.length)

    def decode_visit(self, steps: int, remaining: np.ndarray, end_early: Callable[[bool], bool]) -> list[Choices]:
        """Up to `steps` decode steps for rows that are all plain greedy (Scheduler.controls None), each step's
        chosen ids fed to the next as an array: one visit of the host for several tokens per row (issue 58).
        Returns each step's choices, in order; the scheduler applies them as one update (Scheduler.update_visit).

        `remaining` (B,): each row's output tokens left before its length limit. After each step
        `end_early(a row ended in it: EOS or its limit)` may end the visit (EngineLoop.end_visit). A row that
        ends where the engine cannot see it (the runaway guard) is decoded on with the rest until the visit
        ends and its later tokens are dropped by the update: rows are batch-invariant, so the others' tokens
        are those of one step per visit. A step the greedy lane hands back (a non-finite or suppressed best) is the full chooser's
        and ends the visit there. The visit never takes a row past the cache's last position."""
        c = self.cache
        b = c.used
        steps = max(1, min(steps, c.max_target - 1 - int(c.length[:b].max())))
        eos = self.spec.eos_id
        ended = np.zeros(b, bool)
        out: list[Choices] = []
        token = None
        for i in range(steps):
            logits = self._step(token)
            chosen = choose_greedy(logits, None, self.chooser.suppress)
            if chosen is None:
                out.append(self.chooser.choose(host_float32(logits), RowControls.greedy(b), c.inputs, c.length))
                break
            out.append(chosen)
            token = chosen.token
            now_ended = ~ended & ((token == eos) | (remaining <= i + 1))
            ended |= now_ended
            if end_early(bool(now_ended.any())):
                break
        return out

    def _step(self, tokens: Optional[np.ndarray] = None):
        """One step for every running row -> logits (B, V) where the step left them. `tokens` (B,): the rows'
        inputs as an array (in-place step only; None: each row's own token)."""
        b = self.cache.used
        if self.inplace is not None:
            t0 = time.perf_counter()
            logits = self.inplace.run(tokens)
            step_time = time.perf_counter() - t0
        else:
            inputs = self.cache.step_inputs()
            t0 = time.perf_counter()
            out, new_k, new_v = self.runtime.decode_step(**inputs)
            step_time = time.perf_counter() - t0
            self.cache.append(new_k, new_v, inputs["tokens"][:, 0])
            logits = out[:, -1]
        self.m.step_time.observe(step_time)
        self.m.decode_batch.observe(b)
        self.step_seconds += 0.2 * (step_time - self.step_seconds)  # a moving average: the loop's visits read it
        return logits
