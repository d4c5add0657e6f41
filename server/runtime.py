"""ONNX Runtime sessions for one bundle: `encode` and `decode_step` on numpy arrays.

Execution providers: CUDA when asked for and available (package
onnxruntime-gpu), CPU otherwise. Thread counts are explicit because the
defaults (one intra-op thread per core, spinning) fight with the gRPC and
scheduler threads of the server around them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import onnxruntime as ort

from server.bundle import Bundle


@dataclass(frozen=True)
class RuntimeOptions:
    variant: str = "fp32"
    provider: str = "auto"  # auto | cpu | cuda
    intra_op_threads: int = 0  # 0 = ONNX Runtime's default (one per physical core)
    inter_op_threads: int = 1
    allow_spinning: bool = True


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


def session_options(opts: RuntimeOptions) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = opts.intra_op_threads
    so.inter_op_num_threads = opts.inter_op_threads
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if not opts.allow_spinning:
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return so


class OnnxModel:
    """The encoder and decoder-step sessions of one bundle variant."""

    def __init__(self, bundle: Bundle, opts: Optional[RuntimeOptions] = None):
        self.bundle = bundle
        self.spec = bundle.spec
        self.opts = opts or RuntimeOptions()
        self.providers = resolve_providers(self.opts.provider)
        so = session_options(self.opts)
        self.encoder = ort.InferenceSession(str(bundle.graph_path(self.opts.variant, "encoder")), so,
                                            providers=self.providers)
        self.decoder = ort.InferenceSession(str(bundle.graph_path(self.opts.variant, "decoder_step")), so,
                                            providers=self.providers)

    @property
    def on_device(self) -> bool:
        """True when the sessions run on CUDA: cross keys/values then stay there as OrtValues."""
        return self.providers[0] == "CUDAExecutionProvider"

    def encode(self, src_ids: np.ndarray, src_mask: np.ndarray):
        """src_ids (B, S) int64, src_mask (B, S) bool -> memory (B, S, D), cross_k, cross_v (L, B, H, S, Dh).

        On CUDA, cross_k and cross_v come back as device-resident OrtValues
        (IO binding): they are the largest per-request state and are read by
        every decode step, so they never cross the PCIe bus again.
        """
        if not self.on_device:
            memory, cross_k, cross_v = self.encoder.run(None, {"src_ids": src_ids, "src_mask": src_mask})
            return memory, cross_k, cross_v
        binding = self.encoder.io_binding()
        binding.bind_cpu_input("src_ids", src_ids)
        binding.bind_cpu_input("src_mask", src_mask)
        binding.bind_output("memory")  # small, wanted on the host (Embed)
        binding.bind_output("cross_k", "cuda")
        binding.bind_output("cross_v", "cuda")
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
