"""CUDA execution provider paths (IO binding, fp16). Skipped where there is no CUDA device."""
import numpy as np
import onnxruntime as ort
import pytest

from export.parity import near_ties
from models.core import static_decode
from models.core.runtime import OnnxModel, RuntimeOptions
from tests.tiny_models import reverser, reverser_bundle, varied

pytestmark = pytest.mark.skipif("CUDAExecutionProvider" not in ort.get_available_providers(),
                                reason="needs onnxruntime-gpu and a CUDA device")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return reverser_bundle(tmp_path_factory.mktemp("gpu"), "tiny-gpu")


def sources(vocab):
    rng = np.random.default_rng(0)
    return static_decode.pad_batch([list(rng.integers(4, vocab, rng.integers(2, 10))) + [2] for _ in range(16)], 0)


@pytest.mark.parametrize("beam", [1, 3])
def test_cuda_fp32_with_io_binding_matches_cpu(bundle, beam):
    cpu = OnnxModel(bundle, RuntimeOptions(provider="cpu"))
    gpu = OnnxModel(bundle, RuntimeOptions(provider="cuda"))
    assert gpu.on_device
    ids, mask = sources(bundle.spec.vocab_size)
    if beam == 1:
        want = static_decode.greedy(cpu, ids, mask)
        assert varied(want) and static_decode.greedy(gpu, ids, mask) == want
    else:
        want = [h[0].tokens for h in static_decode.beam_search(cpu, ids, mask, beam=beam)]
        assert [h[0].tokens for h in static_decode.beam_search(gpu, ids, mask, beam=beam)] == want


def test_cuda_fp16_tracks_fp32(bundle):
    cpu = OnnxModel(bundle, RuntimeOptions(provider="cpu"))
    half = OnnxModel(bundle, RuntimeOptions(provider="cuda", variant="fp16"))
    ids, mask = sources(bundle.spec.vocab_size)
    a, b = static_decode.greedy(cpu, ids, mask), static_decode.greedy(half, ids, mask)
    # fp16 may part from fp32 only where fp32's two best logits nearly tie (fp16 rounding: ~1e-2).
    model = reverser(bundle.spec.vocab_size)
    srcs = [[int(t) for t, m in zip(row, keep) if m] for row, keep in zip(ids, mask)]
    assert varied(a) and all(d.gap < 0.05 for d in near_ties(model, srcs, a, b)), near_ties(model, srcs, a, b)


def test_cuda_fp16_decodes_in_place_over_a_device_cache(bundle):
    """The device path: decoder_inplace.fp16.onnx bound to an fp16 slot cache in device memory (CuPy),
    nothing but token ids in and logits out per step; rows stay apart in the batch."""
    from models.core.device_arrays import device_arrays_available
    if not device_arrays_available():
        pytest.skip("CuPy is not installed: the fp16 step on CUDA copies a host cache instead")
    half = OnnxModel(bundle, RuntimeOptions(provider="cuda", variant="fp16"))
    assert half.inplace is not None and half.cache_device.startswith("cuda") and half.cache_dtype is np.float16
    ids, mask = sources(bundle.spec.vocab_size)
    batched = static_decode.greedy(half, ids, mask)
    alone = [static_decode.greedy(half, ids[i:i + 1, :mask[i].sum()], mask[i:i + 1, :mask[i].sum()])[0]
             for i in range(len(ids))]
    assert varied(batched) and batched == alone


def test_cuda_fp32_decodes_in_place_with_standard_ops_over_a_device_cache(bundle):
    """fp32 on the device: GQA has no fp32 CUDA kernel, so the standard-op graph (TensorScatter +
    Attention) over an fp32 cache in device memory, with the CPU's tokens."""
    from models.core.device_arrays import device_arrays_available
    if not device_arrays_available():
        pytest.skip("CuPy is not installed: fp32 on CUDA copies a host cache instead")
    gpu = OnnxModel(bundle, RuntimeOptions(provider="cuda"))
    assert gpu.cache_device.startswith("cuda") and gpu.inplace._model_path.endswith("decoder_inplace.std.onnx")
    ids, mask = sources(bundle.spec.vocab_size)
    want = static_decode.greedy(OnnxModel(bundle, RuntimeOptions(provider="cpu")), ids, mask)
    assert varied(want) and static_decode.greedy(gpu, ids, mask) == want


def test_the_engine_chooses_greedy_tokens_on_the_device(bundle):
    """Engine.decode_step with the cache and the logits on the device (fp32: the standard-op graph): plain
    greedy rows are chosen there (server/core/greedy.py), with the host engine's tokens step by
    step. (fp16 takes the same choice code; tests/unit/test_greedy.py checks it on fp16 logits.)"""
    from models.core.device_arrays import device_arrays_available
    from models.core.kv_cache import SlotCache
    from server.core.chooser import RowControls, TokenChooser
    from server.core.engine import Engine
    from server.observability.metrics import Metrics
    if not device_arrays_available():
        pytest.skip("CuPy is not installed: the logits come to the host")

    def engine(provider: str) -> Engine:
        runtime = OnnxModel(bundle, RuntimeOptions(provider=provider))
        cache = SlotCache(bundle.spec, 16, 16, 24, runtime.cache_dtype, runtime.cache_device)
        return Engine("m", runtime, cache, Metrics(), 0.5, TokenChooser())

    ids, mask = sources(bundle.spec.vocab_size)
    runs = []
    for e in (engine("cpu"), engine("cuda")):
        srcs = [[int(t) for t, m in zip(row, keep) if m] for row, keep in zip(ids, mask)]
        _, ck, cv, m = e._encode(srcs)
        rows = [e.cache.allocate(ck[:, i], cv[:, i], m[i], 1, bundle.spec.bos_id)[0] for i in range(len(srcs))]
        out = []
        for _ in range(12):
            choice = e.decode_step(RowControls.greedy(len(rows)))
            for row in rows:
                row.token = int(choice.token[row.slot])
            out.append(choice.token.copy())
        runs.append(np.stack(out))
    assert e.cache.device.startswith("cuda") and np.array_equal(runs[0], runs[1])


def test_cuda_graphs_replay_the_step_with_the_cpu_tokens_as_rows_come_and_go(bundle):
    """--cuda-graphs: the standard-op step replayed as one captured graph per bucket of rows (free slots up to
    the bucket decoded too) gives the CPU engine's greedy tokens while rows join, finish and move slots."""
    from models.core.device_arrays import device_arrays_available
    from models.core.kv_cache import SlotCache
    from server.core.chooser import RowControls, TokenChooser
    from server.core.engine import Engine
    from server.observability.metrics import Metrics
    if not device_arrays_available():
        pytest.skip("CuPy is not installed: no device cache, no graphs")

    def engine(provider: str, graphs: bool) -> Engine:
        runtime = OnnxModel(bundle, RuntimeOptions(provider=provider, cuda_graphs=graphs))
        cache = SlotCache(bundle.spec, 16, 16, 24, runtime.cache_dtype, runtime.cache_device)
        return Engine("m", runtime, cache, Metrics(), 0.5, TokenChooser())

    ids, mask = sources(bundle.spec.vocab_size)
    srcs = [[int(t) for t, m in zip(row, keep) if m] for row, keep in zip(ids, mask)]
    cpu, gpu = engine("cpu", False), engine("cuda", True)
    assert gpu.runtime.cuda_graphs and gpu.inplace.bucketed
    runs = []
    for e in (cpu, gpu):
        _, ck, cv, m = e._encode(srcs)
        rows, out = [], []
        for step in range(18):
            if step in (0, 3, 7):  # 5 rows, then 6 more (bucket 16), then 3 more after two left
                for i in range({0: 5, 3: 6, 7: 3}[step]):
                    k = len(out) + i
                    rows += e.cache.allocate(ck[:, k % 16], cv[:, k % 16], m[k % 16], 1, bundle.spec.bos_id)
            if step == 5:
                gone = [rows[1], rows[6]]
                e.cache.release(gone)
                rows = [r for r in rows if r not in gone]
            choice = e.decode_step(RowControls.greedy(len(rows)))
            for row in rows:
                row.token = int(choice.token[row.slot])
            out.append([int(choice.token[r.slot]) for r in rows])
        runs.append(out)
    assert runs[0] == runs[1]
