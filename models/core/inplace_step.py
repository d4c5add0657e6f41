"""One decode step over the slot cache in place: decoder_inplace.onnx bound by pointer.

The graph (export/inplace.py) takes each layer's cache view `k[l, :B]` as an
input and gives it back as an output; binding both to the same memory makes
ONNX Runtime append each row's new key/value at the row's own position inside
the slot buffers. Nothing is gathered, concatenated or scattered: per step the
engine writes B token ids and one scalar, and reads B rows of logits, however
long the rows' pasts are.

One binding per number of running rows, built the first time that count
runs and kept: every bound array keeps its address for the cache's life
(tokens, the cache's `length` and `src_len`, the scalar, the logits buffer,
the slot buffers' views), so the values written into them in place are what
the next run reads. Building one costs about as much as a small step
(~0.05-0.6 ms, docs/design/inplace-cache.md), and under steady traffic the
row count changes almost every step (py-spy put rebuilding at ~3% of the
engine thread at 64 streams when only the last binding was kept); at most
`capacity` bindings exist.

CUDA graphs (`bucketed`). On a device the step is launch-bound: ~180 small
kernels took 1.2-1.9 ms whatever the rows, and ONNX Runtime replaying them as
one captured CUDA graph took 0.39 ms at 1 row and 0.84 ms at 256 with the same
tokens (an H200, benchmarks/studies/cuda_graph_step.py). A capture fixes every
shape and address, so the rows run in buckets (1, 2, 4, 8, 16, then multiples
of 16): the rows past the running ones up to the bucket are free slots, fed
token 0 at position 0 over one source position, and write only into their own
free slot's first position, which a row given that slot later overwrites
before it reads it. The per-step inputs live in one (3, capacity) device array
at a fixed address, refreshed by one copy per step; each bucket is its own
graph (run option gpu_graph_id), captured at warm-up on the engine thread
(server/frontend/hosted.py warm_buckets). On the CPU the same padding runs without
graphs, which is how CI checks it.
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort

from models.core.device_arrays import address, device_of, device_zeros, settle
from models.core.kv_cache import SlotCache, lazy_zeros


def buckets(capacity: int) -> list[int]:
    """Row counts the bucketed step runs at: 1, 2, 4, 8, 16, then multiples of 16, and the capacity."""
    sizes = [n for n in (1, 2, 4, 8) if n < capacity] + list(range(16, capacity, 16))
    return sizes + [capacity]


def _bind(binding: ort.IOBinding, name: str, array, output: bool = False) -> None:
    """Bind a C-contiguous array by address, host (numpy) or device (CuPy): ONNX Runtime reads or
    writes that memory itself."""
    assert array.flags.c_contiguous, name
    bind = binding.bind_output if output else binding.bind_input
    device, device_id = device_of(array)
    bind(name, device, device_id, np.dtype(array.dtype), list(array.shape), address(array))


class InPlaceStep:
    """Runs decoder_inplace.onnx for the running rows of one SlotCache."""

    def __init__(self, session: ort.InferenceSession, cache: SlotCache, vocab_size: int, bucketed: bool = False):
        self.session, self.cache = session, cache
        n = cache.capacity
        self.tokens = np.zeros((n, 1), dtype=np.int64)
        self.total = np.zeros((), dtype=np.int32)
        # The graph's logits have its cache's type (fp16 for the fp16 variant, converted whole), and stay where
        # the cache is: on a device, greedy rows are chosen there (server/core/greedy.py). The buffer has the
        # graph's declared shape, which is what gets bound: (B, V), or (B, 1, V) in graphs exported before
        # 2026-11-29 (through an Unsqueeze that copied them once more every step); `rows` is it as (B, V).
        self.outputs = {o.name: o for o in session.get_outputs()}
        shape = (n, 1, vocab_size) if len(self.outputs["logits"].shape) == 3 else (n, vocab_size)
        dtype = np.dtype(cache.k.dtype)
        self.logits = lazy_zeros(shape, dtype) if cache.device == "cpu" else \
            device_zeros(shape, dtype, device_of(cache.k)[1])
        self.rows = self.logits.reshape(n, vocab_size)  # a view of the same memory
        self.layers = cache.k.shape[0]
        self.on_device = cache.device != "cpu"
        # decoder_inplace.std.onnx only reads the cross buffers: it has no present_cross_* to bind
        self.inputs = {i.name for i in session.get_inputs()}
        self._bindings: dict[int, ort.IOBinding] = {}  # running rows (bucketed: the bucket) -> their binding
        self.bucketed = bucketed
        if bucketed:
            self.sizes = buckets(n)
            self._bucket_of = np.searchsorted(self.sizes, np.arange(n + 1))  # rows -> index into sizes
            # tokens, positions and src_len of every slot; on a device the graph reads the device copy
            self._staged = np.zeros((3, n), dtype=np.int64)
            self._inputs = device_zeros((3, n), np.int64, device_of(cache.k)[1]) if self.on_device else self._staged
            self._graph_runs: dict[int, ort.RunOptions] = {}
            # A replay keeps the host values of the step it captured. GroupQueryAttention reads total_len on the
            # host; its attention is bounded by each row's own length, so the capacity gives the same logits as
            # longest + 1 (checked on the CPU, tests/integration/test_inplace.py) and never changes. (The
            # standard-op graph does not read it.)
            self.total[()] = cache.max_target

    def _bind_step_inputs(self, binding: ort.IOBinding, b: int) -> None:
        """tokens, positions, total_len and src_len. Bucketed, they are the staged rows, at fixed addresses
        (device memory on a device). Otherwise they live on the host: a session on a device copies a host input
        to the device when it is bound, not when it runs (IOBinding::BindInput), so on a device they are bound
        again every step; on the host the bound memory is read as it is at each run."""
        c = self.cache
        if self.bucketed:
            tokens, positions, src_len = self._inputs[0, :b], self._inputs[1, :b], self._inputs[2, :b]
        else:
            tokens, positions, src_len = self.tokens[:b, 0], c.length[:b], c.src_len[:b]
        _bind(binding, "tokens", tokens.reshape(b, 1))
        _bind(binding, "positions", positions.reshape(b, 1))
        _bind(binding, "total_len", self.total)
        _bind(binding, "src_len", src_len)

    def _bind_rows(self, b: int) -> ort.IOBinding:
        c = self.cache
        binding = self.session.io_binding()
        self._bind_step_inputs(binding, b)
        for layer in range(self.layers):
            for name, out, buffer in (("past_key", "present_key", c.k), ("past_value", "present_value", c.v),
                                      ("cross_key", "present_cross_key", c.cross_k),
                                      ("cross_value", "present_cross_value", c.cross_v)):
                view = buffer[layer, :b]  # (B, H, capacity, Dh): contiguous, at the slot buffer's own address
                _bind(binding, f"{name}_{layer}", view)
                if f"{out}_{layer}" in self.outputs:
                    _bind(binding, f"{out}_{layer}", view, output=True)
            # Graphs exported before the rows' last source entries were inputs gather them themselves.
            for name, buffer in (("cross_last_key", c.cross_last_k), ("cross_last_value", c.cross_last_v)):
                if f"{name}_{layer}" in self.inputs:
                    _bind(binding, f"{name}_{layer}", buffer[layer, :b])  # (B, 1, H*Dh)
        _bind(binding, "logits", self.logits[:b], output=True)
        return binding

    def run(self, tokens=None):
        """Decode every running row once -> logits (B, V) where the cache is, in the graph's type (host_float32
        gives the host chooser's), a view valid until the next run. `tokens` (B,): the rows' inputs, when the
        caller has them as an array (the steps of a visit after its first, Engine.decode_visit); None: each
        row's own `token`."""
        c = self.cache
        b = c.used
        self.tokens[:b, 0] = [r.token for r in c.rows] if tokens is None else tokens
        longest = int(c.length[:b].max())
        if longest >= c.max_target:
            raise RuntimeError(f"a row reached the cache's {c.max_target} positions")
        if self.bucketed:
            return self._run_bucket(b)
        self.total[()] = longest + 1
        binding = self._bindings.get(b)
        if binding is None:
            binding = self._bindings[b] = self._bind_rows(b)
        elif self.on_device:
            self._bind_step_inputs(binding, b)
        settle(c.k)  # a device cache: the rows' writes (new rows, compaction, reorder) are done first
        self.session.run_with_iobinding(binding)
        c.advance(self.tokens[:b, 0])
        return self.rows[:b]

    def _run_bucket(self, b: int):
        """The step over the rows padded to their bucket; on a device, that bucket's CUDA graph."""
        c, staged = self.cache, self._staged
        g = self.sizes[self._bucket_of[b]]
        staged[0, :b], staged[1, :b], staged[2, :b] = self.tokens[:b, 0], c.length[:b], c.src_len[:b]
        staged[0, b:g], staged[1, b:g], staged[2, b:g] = 0, 0, 1  # free slots: token 0, position 0, 1 source
        binding = self._bindings.get(g)
        if binding is None:
            binding = self._bindings[g] = self._bind_rows(g)
        run = None
        if self.on_device:
            self._inputs.set(staged)  # one copy to the fixed address the graph reads
            run = self._graph_runs.get(g)
            if run is None:
                run = self._graph_runs[g] = ort.RunOptions()
                run.add_run_config_entry("gpu_graph_id", str(g))  # one captured graph per bucket
        settle(c.k)
        self.session.run_with_iobinding(binding, run)
        c.advance(self.tokens[:b, 0])
        return self.rows[:b]
