"""ONNX Runtime sessions for one bundle: `encode` and `decode_step` on numpy arrays.

Execution providers: CUDA when asked for and available (package
onnxruntime-gpu), CPU otherwise.

Threads: every session of the process shares one intra-op pool. By default
each ONNX Runtime session owns a pool with a spinning worker per core, so an
encoder and a decoder session (and each further model) bring their own
workers, which then spin against each other and against the gRPC threads for
the same cores. One engine thread runs one session at a time, so one pool is
enough; on the 2-core benchmark machine sharing it raised serving throughput
by ~15-30% (`git show ba30137:docs/benchmarks/serving_load.md`).
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import _pybind_state as ort_c

from models.core.bundle import Bundle
from models.core.device_arrays import device_arrays_available
from models.core.heap import release_free_heap

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RuntimeOptions:
    variant: str = "fp32"
    provider: str = "auto"  # auto | cpu | cuda
    intra_op_threads: int = 0  # 0 = ONNX Runtime's default (one per physical core)
    inter_op_threads: int = 1
    allow_spinning: bool = True  # per-session pools only; the shared pool always may spin
    shared_pool: bool = True  # one intra-op pool for all sessions of the process (see above)
    # ONNX Runtime's CPU arena (its default): keeps the largest step's intermediates for the next
    # step, apart from numpy's and gRPC's malloc heaps. Off: the same RSS, slower steps (docs/memory.md).
    cpu_mem_arena: bool = True
    # Memory patterns (ONNX Runtime's default: on) plan one block per input shape, and the decode
    # step's shape changes every step (past length, rows). With them, replaying 200 steps of 64 rows
    # grew RSS by ~120 MB more, no faster (docs/memory.md). Off for every provider.
    mem_pattern: bool = False
    # decoder graph: "auto" = an in-place graph where the bundle has one the provider runs (OnnxModel.
    # _inplace_graph), else decoder_step.onnx; "inplace" / "standard" / "copy" force one.
    decoder: str = "auto"  # auto | inplace | standard | copy
    device_id: int = 0  # the CUDA device (an engine replica per device: server --device)
    # variant "int8" on the CPU: "auto" serves the bundle's int8-vnni graphs (8-bit weights) on a CPU with
    # VNNI or AMX, its 7-bit int8 graphs elsewhere; "7" the 7-bit ones everywhere (the same tokens on every
    # x86 CPU); "8" the 8-bit ones (wrong products without VNNI: export/quantize.py).
    int8_weights: str = "auto"  # auto | 7 | 8
    # variant "int8" on the CPU: "auto" serves the bundle's int8-static graphs (activation ranges calibrated at
    # export, export/quantize_static.py: the fastest int8 measured, docs/export.md) where it has them and 8-bit
    # weights were not asked for, else the row-wise graphs above; "static" insists on them; "row" never.
    int8_activations: str = "auto"  # auto | static | row
    # On CUDA, the in-place standard-op step replayed as captured CUDA graphs, one per bucket of running rows
    # (models/core/inplace_step.py). Not for GQA's graph (fp16) yet: it reads total_len on the host, and replays
    # with it changing per step gave other tokens on an H200 (docs/benchmarks/gpu/README.md); held at the
    # capacity, as the bucketed step now binds it, the CPU gives the same logits, the device is unmeasured
    # (benchmarks/studies/cuda_graph_step.py asks). The server asks for graphs by default.
    cuda_graphs: bool = False


def resolve_providers(provider: str) -> list[str]:
    available = ort.get_available_providers()
    if provider == "cpu":
        return ["CPUExecutionProvider"]
    if provider == "cuda":
        if "CUDAExecutionProvider" not in available:
            raise RuntimeError(f"CUDA execution provider requested but not available (have {available}); "
                               "install onnxruntime-gpu and run on a machine with a CUDA device")
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if provider == "auto":
        if "CUDAExecutionProvider" in available:
            return ["CUDAExecutionProvider", "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]
    raise ValueError(f"unknown provider {provider!r} (auto, cpu or cuda)")


def with_device(providers: list[str], device_id: int) -> list:
    """ONNX Runtime's providers argument: the CUDA provider with its device (an engine replica per GPU)."""
    return [(p, {"device_id": str(device_id)}) if p == "CUDAExecutionProvider" else p for p in providers]


# Size of the process-wide pool once created; "per-session" when ONNX Runtime had already
# started without one (something created a session first), which cannot be changed later.
_shared_pool: dict[str, object] = {}


def use_shared_pool(threads: int) -> bool:
    """Create the process-wide intra-op pool on first use; True if sessions may share it."""
    if "threads" not in _shared_pool:
        try:
            ort_c.set_global_thread_pool_sizes(threads, 1)
            _shared_pool["threads"] = threads
        except Exception as e:  # noqa: BLE001 (already created: keep what exists)
            log.warning("could not create the shared ONNX Runtime thread pool: %s", e)
            _shared_pool["threads"] = "per-session"
    current = _shared_pool["threads"]
    if current != "per-session" and current != threads:
        log.warning("the shared ONNX Runtime pool already has %s intra-op threads; %s asked for later is ignored",
                    current or "default", threads or "default")
    return current != "per-session"


def session_options(opts: RuntimeOptions, shared: bool = False) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.use_per_session_threads = not shared
    so.enable_cpu_mem_arena = opts.cpu_mem_arena
    so.enable_mem_pattern = opts.mem_pattern
    if not shared:  # the shared pool's size was fixed when it was created
        so.intra_op_num_threads = opts.intra_op_threads
        so.inter_op_num_threads = opts.inter_op_threads
        if not opts.allow_spinning:
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


@functools.lru_cache(maxsize=1)
def cpu_has_vnni() -> Optional[bool]:
    """Whether the CPU multiplies bytes into 32-bit sums (VNNI or AMX); None where /proc/cpuinfo
    says nothing (not Linux, not x86). Read once per process: every int8 model load asks."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), None)
    except OSError:
        return None
    if flags is None:
        return None
    return bool({"avx512_vnni", "avx_vnni", "amx_int8"} & set(flags))


def int8_problem(bundle: Bundle, variant: str, vnni: Optional[bool]) -> Optional[str]:
    """Why this bundle's graphs of `variant` (int8 or int8-vnni) would compute wrong products on this CPU,
    or None."""
    # int8-vnni is 8-bit by definition; int8 is 8-bit in bundles from before export/quantize.py's 7 bits
    bits = 8 if variant == "int8-vnni" else 7 if variant == "int8-static" else bundle.config.get("int8_weight_bits", 8)
    if bits <= 7 or vnni is not False:
        return None
    return (f"{bundle.name}: its {variant} graphs have {bits}-bit weights, and this CPU has no VNNI: ONNX "
            "Runtime's uint8 x int8 product saturates here (docs/export.md), so int8 outputs will be worse than "
            "the card says; serve `int8` with 7-bit weights (`--int8-weights 7`, re-exporting older bundles with "
            "`python -m export ... --int8`) or fp32")


def served_variant(bundle: Bundle, opts: RuntimeOptions, provider: str) -> str:
    """The bundle variant whose graphs run: `opts.variant`, except that int8 on the CPU takes the statically
    calibrated graphs (int8-static) or the 8-bit weights (int8-vnni) where `opts.int8_activations` and
    `opts.int8_weights` say so and the bundle has them."""
    if opts.int8_weights not in ("auto", "7", "8"):
        raise ValueError(f"int8_weights {opts.int8_weights!r}: auto, 7 or 8")
    if opts.int8_activations not in ("auto", "static", "row"):
        raise ValueError(f"int8_activations {opts.int8_activations!r}: auto, static or row")
    if opts.variant != "int8" or provider != "CPUExecutionProvider":
        return opts.variant
    if opts.int8_activations == "static" or (opts.int8_activations == "auto" and opts.int8_weights != "8"):
        if "int8-static" in bundle.variants:
            return "int8-static"
        if opts.int8_activations == "static":
            raise RuntimeError(f"{bundle.name}/{bundle.version} has no statically calibrated int8 graphs "
                               "(int8-static): re-export it with `python -m export ... --int8` and calibration "
                               "text (--calibration-text)")
    if opts.int8_weights == "7":
        return "int8"
    if "int8-vnni" not in bundle.variants:
        if opts.int8_weights == "8":
            raise RuntimeError(f"{bundle.name}/{bundle.version} has no 8-bit int8 graphs (int8-vnni): re-export "
                               "it with `python -m export ... --int8`")
        return "int8"
    return "int8-vnni" if opts.int8_weights == "8" or cpu_has_vnni() else "int8"


# An encoder pass at least this large (batch x source length squared: its attention scores are B x H x S x S)
# gives its arena growth back at its end, under load too: measured on en-fr, a 16 x 256-token pass grows
# the process by ~58 MB, and kept, every replica's encoders sat at the largest pass since they last went
# idle (the soak's peak). Giving it back costs such a pass a trim (~6 ms) and the next one its page faults,
# a few percent of a pass that takes ~200 ms; ordinary passes (64 sentences of ~25 tokens: 40,000 cells)
# never reach it and keep their arena.
LARGE_ENCODE_CELLS = 64 * 64 * 64
_SHRINK_ARENA = ort.RunOptions()
_SHRINK_ARENA.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")


class OnnxModel:
    """The encoder and decoder-step sessions of one bundle variant."""

    def __init__(self, bundle: Bundle, opts: Optional[RuntimeOptions] = None):
        self.bundle = bundle
        self.spec = bundle.spec
        self.opts = opts or RuntimeOptions()
        self.providers = resolve_providers(self.opts.provider)
        self._ort_providers = with_device(self.providers, self.opts.device_id)
        self.variant = served_variant(bundle, self.opts, self.providers[0])
        if self.variant.startswith("int8") and self.providers[0] == "CPUExecutionProvider":
            problem = int8_problem(bundle, self.variant, cpu_has_vnni())
            if problem:
                log.warning(problem)
        self.encoder = self._session("encoder")
        graph = self._inplace_graph()
        self.cuda_graphs = bool(self.opts.cuda_graphs and self.on_device and graph == "decoder_inplace_std")
        if self.opts.cuda_graphs and self.on_device and not self.cuda_graphs:
            log.info("CUDA graphs are for the fp32 standard-op in-place step (this is %s); not used",
                        graph or "the copying step")
        self.inplace = self._session(graph, cuda_graph=self.cuda_graphs) if graph else None
        # decoder_step.onnx is loaded when first used (the copying engine path, the static decoders):
        # a server stepping in place never holds a second copy of the decoder's weights.
        self._decoder: Optional[ort.InferenceSession] = None if self.inplace is not None else self._session(
            "decoder_step")

    def release_idle_memory(self) -> None:
        """Shrink the encoder's memory arena to its first block and trim the heap: for an engine that has
        gone idle (server/core/engine.py give_back_idle), never between steps.

        Measured problem (docs/memory.md): ONNX Runtime's CPU arena keeps every block it ever grew, and the
        encoder's intermediates grow with batch x source length (attention scores alone are B x H x S x S),
        so one burst of long texts left a replica ~100 MB larger for good. The arena only shrinks at the end
        of a run that asks (run option memory.enable_memory_arena_shrinkage), so this runs the encoder once
        on a one-token source that asks, then malloc_trim gives the freed blocks back. Measured, both shipped
        models after long-text batches, idle: 301 MB -> 190 MB (start: 140). The in-place decoder writes its
        outputs into the slot cache and keeps only small per-step scratch in its arena, so it is left alone;
        the next burst pays a few ms of page faults to grow the encoder's arena again."""
        if self.on_device:  # the device's arena was never measured here: leave it as it is
            return
        self.encode(np.full((1, 1), self.spec.eos_id, dtype=np.int64), np.ones((1, 1), dtype=bool), give_back=True)

    @property
    def decoder(self) -> ort.InferenceSession:
        if self._decoder is None:
            self._decoder = self._session("decoder_step")
        return self._decoder

    def _inplace_graph(self) -> Optional[str]:
        """Which in-place graph to run, or None for the copying step.

        decoder_inplace (GroupQueryAttention) on the CPU, and on CUDA in fp16 (its CUDA kernels are fp16
        only); decoder_inplace_std (standard opset-24 ops) where GQA has no kernel: CUDA in fp32. On CUDA the
        cache lives on the device, which needs CuPy; without it, the copying step."""
        graphs = self.bundle.variants.get(self.variant, {})
        asked = {"inplace": "decoder_inplace", "standard": "decoder_inplace_std"}.get(self.opts.decoder)
        if self.opts.decoder == "copy":
            return None
        if asked is not None:
            if asked not in graphs:
                raise RuntimeError(f"{self.bundle.name}: variant {self.variant} has no {asked} graph "
                                   "(re-export the bundle, or use the copy decoder)")
            return asked
        if self.opts.decoder != "auto":
            raise ValueError(f"unknown decoder {self.opts.decoder!r} (auto, inplace, standard or copy)")
        if not self.on_device:
            return "decoder_inplace" if "decoder_inplace" in graphs else None
        if not device_arrays_available():
            return None
        wanted = "decoder_inplace" if self.variant == "fp16" else "decoder_inplace_std"
        return wanted if wanted in graphs else None

    @property
    def cache_dtype(self) -> type:
        """The slot cache's element type: what decoder_inplace reads and writes in place (fp16 for the
        fp16 variant's graph); float32 for the copying step, whose inputs stay fp32 (keep_io_types)."""
        if self.inplace is None:
            return np.float32
        past = next(i for i in self.inplace.get_inputs() if i.name.startswith("past_key"))
        return np.float16 if past.type == "tensor(float16)" else np.float32

    @property
    def cache_device(self) -> str:
        """Where the slot cache lives: on the device when the in-place step runs there."""
        return f"cuda:{self.opts.device_id}" if self.on_device and self.inplace is not None else "cpu"

    def _session(self, graph: str, cuda_graph: bool = False) -> ort.InferenceSession:
        path = str(self.bundle.graph_path(self.variant, graph))
        # the CUDA provider is the (name, options) entry; CUDA graphs are its option, asked per session
        providers = [(p[0], {**p[1], "enable_cuda_graph": "1"}) if cuda_graph and isinstance(p, tuple) else p
                     for p in self._ort_providers]
        if self.opts.shared_pool and use_shared_pool(self.opts.intra_op_threads):
            try:
                return ort.InferenceSession(path, session_options(self.opts, shared=True), providers=providers)
            except Exception as e:  # noqa: BLE001 (ONNX Runtime started earlier without the shared pool)
                if "GlobalThreadPools" not in str(e):
                    raise
                log.warning("ONNX Runtime was started without a shared thread pool; using per-session pools")
                _shared_pool["threads"] = "per-session"
        return ort.InferenceSession(path, session_options(self.opts), providers=providers)

    @property
    def on_device(self) -> bool:
        """True when the sessions run on CUDA: cross keys/values then stay there as OrtValues."""
        return self.providers[0] == "CUDAExecutionProvider"

    def encode(self, src_ids: np.ndarray, src_mask: np.ndarray, give_back: bool = False):
        """src_ids (B, S) int64, src_mask (B, S) bool -> memory (B, S, D), cross_k, cross_v (L, B, H, S, Dh).
        `give_back`: the arena's growth and the heap's free pages go back after this pass, as after a
        large one (LARGE_ENCODE_CELLS; CPU).

        On CUDA, cross_k and cross_v come back as device-resident OrtValues
        (IO binding): they are the largest per-request state and are read by
        every decode step, so they never cross the PCIe bus again.
        """
        if not self.on_device:
            large = give_back or src_ids.shape[0] * src_ids.shape[1] ** 2 >= LARGE_ENCODE_CELLS
            memory, cross_k, cross_v = self.encoder.run(None, {"src_ids": src_ids, "src_mask": src_mask},
                                                        _SHRINK_ARENA if large else None)
            if large:
                release_free_heap()
            return memory, cross_k, cross_v
        binding = self.encoder.io_binding()
        binding.bind_cpu_input("src_ids", src_ids)
        binding.bind_cpu_input("src_mask", src_mask)
        binding.bind_output("memory")  # small, wanted on the host (Embed)
        binding.bind_output("cross_k", "cuda", self.opts.device_id)
        binding.bind_output("cross_v", "cuda", self.opts.device_id)
        self.encoder.run_with_iobinding(binding)
        memory, cross_k, cross_v = binding.get_outputs()
        return memory.numpy(), cross_k, cross_v

    def decode_step(self, tokens: np.ndarray, positions: np.ndarray, past_k: np.ndarray, past_v: np.ndarray,
                    past_mask: np.ndarray, cross_k, cross_v,
                    src_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One step: logits (B, T, V) and the step's new keys/values (L, B, H, T, Dh)."""
        feeds = {"tokens": tokens, "positions": positions, "past_k": past_k, "past_v": past_v,
                 "past_mask": past_mask, "cross_k": cross_k, "cross_v": cross_v, "src_mask": src_mask}
        if not isinstance(cross_k, ort.OrtValue):
            logits, new_k, new_v = self.decoder.run(None, feeds)
            return logits, new_k, new_v
        binding = self.decoder.io_binding()
        for name, value in feeds.items():
            if isinstance(value, ort.OrtValue):
                binding.bind_ortvalue_input(name, value)
            else:
                binding.bind_cpu_input(name, np.ascontiguousarray(value))
        for name in ("logits", "new_k", "new_v"):
            binding.bind_output(name)  # host: the sampler and the slot cache live there
        self.decoder.run_with_iobinding(binding)
        logits, new_k, new_v = (v.numpy() for v in binding.get_outputs())
        return logits, new_k, new_v
