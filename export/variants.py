"""Derived graph variants: int8 (CPU) and fp16 (GPU).

int8 and int8-vnni: export/quantize.py: 7-bit (int8, exact on every x86 CPU) or 8-bit (int8-vnni, exact
where VNNI sums byte products in int32) weights per output channel, activations
quantised per row (token) on the fly, integer GEMM; batch-invariant, unlike
ONNX Runtime's `quantize_dynamic`, whose activation scale spans the whole batch.
The attention products between two activations (QK^T, weights x V) stay fp32
because neither side is a constant; the embedding Gather stays fp32.

fp16: weights and activations in half precision with fp32 inputs/outputs
(keep_io_types), so the engine's cache and the sampler keep one dtype per
variant boundary; decoder_inplace in fp16 throughout (its cache is bound in
place, so the engine keeps an fp16 cache for it). Meant for the CUDA provider
(GroupQueryAttention's CUDA kernels are fp16/bf16 only); the CPU provider runs
them too, for tests, with slow casts.
"""
from __future__ import annotations

from pathlib import Path

import onnx

from export.quantize import WEIGHT_BITS, quantize_rowwise


def quantize_int8(src: Path, dst: Path, weight_bits: int = WEIGHT_BITS, min_weights: int = 0) -> Path:
    quantize_rowwise(src, dst, weight_bits, min_weights)
    return dst


def convert_fp16(src: Path, dst: Path, keep_io_types: bool = True) -> Path:
    """`keep_io_types=False` for decoder_inplace: its cache inputs and outputs are bound to the same
    memory, so they must be fp16 themselves (an fp32 cache behind casts would be copied, not written in
    place); its logits come out fp16 too."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(src))
    # Softmax over masked scores fills with float32's most negative value; in fp16
    # that constant would overflow to -inf, so the attention ops keep fp32.
    half = convert_float_to_float16(model, keep_io_types=keep_io_types, op_block_list=["Softmax"])
    onnx.save(half, str(dst))
    return dst


def fp16_graphs(folder: Path, fp32_files: dict[str, str]) -> dict[str, str]:
    """The fp16 variant's graphs beside the fp32 ones in `folder` -> its files by graph kind: the encoder
    and the copying step with fp32 inputs/outputs, the in-place step fp16 throughout. Not the weights
    file (each fp16 graph holds its converted weights until the bundle writer shares them) and not the
    standard-op in-place graph (CUDA runs GQA's in fp16)."""
    files = {}
    for graph in ("encoder", "decoder_step", "decoder_inplace"):
        name = fp32_files.get(graph)
        if name is not None:
            files[graph] = name.replace(".onnx", ".fp16.onnx")
            convert_fp16(folder / name, folder / files[graph], keep_io_types=graph != "decoder_inplace")
    return files
