"""The fp16 in-place decoder step, the device path's graph, run on the CPU provider.

On a CUDA device the engine decodes with decoder_inplace.fp16.onnx over an fp16 slot cache on the
device (GroupQueryAttention's CUDA kernels are fp16 only; docs/benchmarks/gpu/README.md). The same
graph and the same cache code run here on the host, so CI checks the export, the fp16 cache binding
and the engine's plumbing; tests/integration/test_gpu.py checks the device itself.
"""
from __future__ import annotations

import numpy as np
import pytest

from export.parity import near_ties
from models.core import static_decode
from models.core.runtime import OnnxModel, RuntimeOptions
from tests.tiny_models import reverser, reverser_bundle, varied


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return reverser_bundle(tmp_path_factory.mktemp("fp16"), "tiny-fp16")


def sources(vocab: int):
    rng = np.random.default_rng(1)
    return static_decode.pad_batch([list(rng.integers(4, vocab, rng.integers(2, 10))) + [2] for _ in range(24)], 0)


def test_the_fp16_variant_carries_an_inplace_graph_with_an_fp16_cache(bundle):
    assert bundle.variants["fp16"]["decoder_inplace"] == "decoder_inplace.fp16.onnx"
    half = OnnxModel(bundle, RuntimeOptions(provider="cpu", variant="fp16"))
    assert half.inplace is not None and half.cache_dtype is np.float16 and half.cache_device == "cpu"
    fp32 = OnnxModel(bundle, RuntimeOptions(provider="cpu"))
    assert fp32.cache_dtype is np.float32
    copy = OnnxModel(bundle, RuntimeOptions(provider="cpu", variant="fp16", decoder="copy"))
    assert copy.inplace is None and copy.cache_dtype is np.float32  # decoder_step keeps fp32 inputs


def test_fp16_inplace_greedy_tracks_fp32(bundle):
    ids, mask = sources(bundle.spec.vocab_size)
    fp32 = static_decode.greedy(OnnxModel(bundle, RuntimeOptions(provider="cpu")), ids, mask)
    half = static_decode.greedy(OnnxModel(bundle, RuntimeOptions(provider="cpu", variant="fp16")), ids, mask)
    # fp16 may part from fp32 only where fp32's two best logits nearly tie (fp16 rounding: ~1e-2).
    model = reverser(bundle.spec.vocab_size)
    srcs = [[int(t) for t, m in zip(row, keep) if m] for row, keep in zip(ids, mask)]
    ties = near_ties(model, srcs, fp32, half)
    assert varied(fp32) and all(d.gap < 0.05 for d in ties), ties


def test_fp16_inplace_batched_equals_alone(bundle):
    """The fp16 cache written in place keeps rows apart: each sentence decodes the same in the batch."""
    model = OnnxModel(bundle, RuntimeOptions(provider="cpu", variant="fp16"))
    ids, mask = sources(bundle.spec.vocab_size)
    batched = static_decode.greedy(model, ids, mask)
    alone = [static_decode.greedy(model, ids[i:i + 1, :mask[i].sum()], mask[i:i + 1, :mask[i].sum()])[0]
             for i in range(len(ids))]
    assert varied(batched) and batched == alone
