"""Derived graph variants: int8 (dynamic quantisation, CPU) and fp16 (GPU).

int8: `onnxruntime.quantization.quantize_dynamic` turns MatMul/Gemm weights
into int8 with per-tensor scales and quantises activations on the fly; the
attention matmuls between two activations (QK^T, weights x V) stay fp32
because their weights are not constants. Only MatMul ops are quantised: the
embedding Gather stays fp32, which keeps the tied output projection exact
enough for greedy decoding to track fp32 closely.

fp16: weights and activations in half precision with fp32 inputs/outputs
(keep_io_types), so the engine's cache and the sampler keep one dtype per
variant boundary. Meant for the CUDA provider; the CPU provider lacks fp16
kernels for several ops and would fall back to slow casts.
"""
from __future__ import annotations

from pathlib import Path

import onnx


def quantize_int8(src: Path, dst: Path, per_channel: bool = False) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), op_types_to_quantize=["MatMul"], per_channel=per_channel,
                     weight_type=QuantType.QInt8)
    return dst


def convert_fp16(src: Path, dst: Path) -> Path:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    # Softmax over masked scores fills with float32's most negative value; in fp16
    # that constant would overflow to -inf, so the attention ops keep fp32.
    half = convert_float_to_float16(model, keep_io_types=True, op_block_list=["Softmax"])
    onnx.save(half, str(dst))
    return dst
