"""decoder_inplace.onnx through the engine: the same logits and cache as the copying decoder_step path.

Both engines run the shipped bundle on the CPU provider and go through the same
random life of a continuous batch: rows join (sources of different lengths,
beam copies), finish (the last slot moves into the hole), are reordered as
beams, and reach long ages. The in-place path writes the slot buffers inside
ONNX Runtime through pointer-bound views; any aliasing or binding mistake
shows up as a different logit or cache entry.
"""
from __future__ import annotations

import numpy as np
import pytest
from tests.serving import REPOSITORY, ServerThread, flickr_sentences

from models.core.bundle import load_bundle, newest_version
from models.core.device_arrays import host_float32
from models.core.inplace_step import InPlaceStep, buckets
from models.core.kv_cache import SlotCache
from models.core.runtime import OnnxModel, RuntimeOptions
from models.core.static_decode import pad_batch
from server.core.chooser import TokenChooser
from server.core.engine import Engine
from server.observability.metrics import Metrics

BUNDLE = newest_version(REPOSITORY / "multi30k-en-de-small")
SLOTS, MAX_SOURCE, MAX_TARGET = 8, 40, 48


def step_logits(engine: Engine) -> np.ndarray:
    """One decode step for every running row -> logits (B, V) on the host, before any token choice."""
    return host_float32(engine._step())


@pytest.fixture(scope="module")
def bundle():
    return load_bundle(BUNDLE)


def engine(bundle, decoder: str) -> Engine:
    runtime = OnnxModel(bundle, RuntimeOptions(provider="cpu", decoder=decoder))
    cache = SlotCache(bundle.spec, SLOTS, MAX_SOURCE, MAX_TARGET)
    return Engine("m", runtime, cache, Metrics(), max_padding=0.5, chooser=TokenChooser())


def test_auto_picks_the_inplace_graph_on_cpu(bundle):
    assert "decoder_inplace" in bundle.variants["fp32"], "the shipped bundle should carry decoder_inplace.onnx"
    auto = engine(bundle, "auto").runtime
    assert auto.inplace is not None and auto.inplace._model_path.endswith("decoder_inplace.onnx")
    assert engine(bundle, "copy").inplace is None
    # The standard-op graph is there for CUDA in fp32 (GQA has no fp32 kernel there), not chosen on the CPU
    std = engine(bundle, "standard").runtime
    assert std.inplace._model_path.endswith("decoder_inplace.std.onnx")
    outputs = {o.name for o in std.inplace.get_outputs()}
    assert "present_key_0" in outputs and "present_cross_key_0" not in outputs  # cross buffers: read only


def test_inplace_requested_without_the_graph_is_refused(bundle, tmp_path):
    import json
    import shutil
    for name in ("config.json", "tokenizer.json", "encoder.onnx", "decoder_step.onnx", "weights.bin"):
        shutil.copy(BUNDLE / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    config["variants"] = {"fp32": {"encoder": "encoder.onnx", "decoder_step": "decoder_step.onnx",
                                   "weights": "weights.bin"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    old = load_bundle(tmp_path)
    assert OnnxModel(old, RuntimeOptions(provider="cpu")).inplace is None  # auto falls back
    with pytest.raises(RuntimeError, match="no decoder_inplace graph"):
        OnnxModel(old, RuntimeOptions(provider="cpu", decoder="inplace"))


def test_graphs_exported_with_a_step_axis_on_the_logits_still_serve(bundle, tmp_path):
    """Bundles exported before 2026-11-29 give the in-place step's logits as (B, 1, V) (a last Unsqueeze, since
    dropped: it copied them once more every step); the engine binds whichever the graph declares."""
    import shutil

    import onnx
    from onnx import helper, numpy_helper
    for path in BUNDLE.iterdir():
        shutil.copy(path, tmp_path / path.name)
    graph = onnx.load(str(tmp_path / "decoder_inplace.onnx"), load_external_data=False)
    last = next(n for n in graph.graph.node if "logits" in n.output)
    last.output[list(last.output).index("logits")] = "logits_rows"
    graph.graph.initializer.append(numpy_helper.from_array(np.array([1], np.int64), "step_axis"))
    graph.graph.node.append(helper.make_node("Unsqueeze", ["logits_rows", "step_axis"], ["logits"]))
    out = next(o for o in graph.graph.output if o.name == "logits")
    dims = out.type.tensor_type.shape.dim
    assert len(dims) == 2, "the shipped graph should give (batch, vocab)"
    dims.insert(1, onnx.TensorShapeProto.Dimension(dim_value=1))
    onnx.save(graph, str(tmp_path / "decoder_inplace.onnx"))
    old, new = engine(load_bundle(tmp_path), "inplace"), engine(bundle, "inplace")
    assert old.inplace.logits.ndim == 3 and new.inplace.logits.ndim == 2  # each bound at its graph's shape
    rng = np.random.default_rng(5)
    for _ in range(3):
        _join((old, new), rng, bundle.spec, 2)
    for _ in range(6):
        got, want = step_logits(old).copy(), step_logits(new)
        assert got.shape == want.shape == (6, bundle.spec.out_vocab_size)
        assert np.array_equal(got, want)
        for a, b in zip(old.cache.rows, new.cache.rows):
            a.token = b.token = int(want[b.slot].argmax())


def _join(engines, rng, spec, copies: int):
    """Encode one random source once per engine and give it `copies` rows in each."""
    n = int(rng.integers(1, MAX_SOURCE + 1))
    src = [int(t) for t in rng.integers(4, spec.vocab_size, n - 1)] + [spec.eos_id]
    ids, mask = pad_batch([src], spec.pad_id)
    rows = []
    for e in engines:
        _, ck, cv, m = e._encode([src])
        rows.append(e.cache.allocate(ck[:, 0], cv[:, 0], m[0], copies, spec.bos_id))
    return rows


# GQA's graph; opset-24 TensorScatter + Attention; each also with its rows padded to buckets as CUDA graphs run
# them (the free slots up to the bucket decoded too, writing only their own first position)
@pytest.mark.parametrize("graph,bucketed", [("inplace", False), ("standard", False), ("inplace", True),
                                            ("standard", True)])
def test_inplace_matches_copy_over_a_continuous_batch_life(bundle, graph, bucketed):
    spec = bundle.spec
    inplace, copy = engine(bundle, graph), engine(bundle, "copy")
    if bucketed:
        inplace.inplace = InPlaceStep(inplace.runtime.inplace, inplace.cache, spec.out_vocab_size, bucketed=True)
        assert inplace.inplace.sizes == [1, 2, 4, SLOTS]
    assert inplace.inplace is not None and copy.inplace is None
    rng = np.random.default_rng(0)
    groups: list[tuple[list, list]] = []  # per source: (rows in the in-place engine, rows in the copy engine)
    steps = worst = 0
    while steps < 160:
        free = inplace.cache.free
        if free and rng.random() < 0.5:
            a, b = _join((inplace, copy), rng, spec, int(rng.integers(1, min(free, 3) + 1)))
            groups.append((a, b))
        if not inplace.cache.used:
            continue
        got, want = step_logits(inplace).copy(), step_logits(copy)
        steps += 1
        worst = max(worst, float(np.abs(got - want).max()))
        assert np.array_equal(got.argmax(-1), want.argmax(-1)), f"greedy choice differs at step {steps}"
        for a, b in groups:  # both engines feed the same next token (the copy path's greedy choice)
            for ra, rb in zip(a, b):
                ra.token = rb.token = int(want[rb.slot].argmax())
        for g, (a, b) in enumerate(list(groups)):
            age = int(copy.cache.length[b[0].slot])
            if age >= MAX_TARGET - 1 or rng.random() < 0.06:  # finished (or full): free the group's rows
                inplace.cache.release(a)
                copy.cache.release(b)
                groups.remove((a, b))
            elif len(a) > 1 and rng.random() < 0.3:  # beam step: rows continue random parents
                parents = rng.integers(0, len(a), len(a)).tolist()
                inplace.cache.reorder(a, parents)
                copy.cache.reorder(b, parents)
    assert worst < 1e-4, f"logits differ by {worst}"
    # The self-attention entries the graph wrote in place equal the ones the copy path scattered.
    n = copy.cache.used
    assert inplace.cache.used == n and np.array_equal(inplace.cache.length[:n], copy.cache.length[:n])
    for slot in range(n):
        m = int(copy.cache.length[slot])
        assert np.abs(inplace.cache.k[:, slot, :, :m] - copy.cache.k[:, slot, :, :m]).max() < 1e-4
        assert np.abs(inplace.cache.v[:, slot, :, :m] - copy.cache.v[:, slot, :, :m]).max() < 1e-4


def test_buckets_cover_every_row_count_with_little_padding():
    assert buckets(1) == [1] and buckets(8) == [1, 2, 4, 8] and buckets(20) == [1, 2, 4, 8, 16, 20]
    sizes = buckets(256)
    assert sizes[:6] == [1, 2, 4, 8, 16, 32] and sizes[-1] == 256 and len(sizes) == 20
    # from 16 rows up, a bucket pads at most 15 rows
    assert all(min(g for g in sizes if g >= b) - b < 16 for b in range(16, 257))


def test_a_row_at_the_cache_capacity_is_refused_not_overrun(bundle):
    e = engine(bundle, "inplace")
    rng = np.random.default_rng(1)
    (rows,) = _join((e,), rng, bundle.spec, 1)
    e.cache.length[rows[0].slot] = MAX_TARGET  # as if the scheduler had let it run past the limit
    with pytest.raises(RuntimeError, match="cache's 48 positions"):
        step_logits(e)


def test_int8_server_gives_the_same_tokens_alone_and_in_any_batch():
    """The shipped int8 variant quantises activations per row (export/quantize.py), so a sentence's
    tokens do not depend on what shares its decode steps: checked through a real server."""
    import concurrent.futures as cf

    from client import TranslatorClient
    srv = ServerThread(variant="int8", warmup=False).start()
    try:
        with TranslatorClient(srv.target, timeout=120, retries=0) as client:
            texts = flickr_sentences(120)
            alone = [list(client.translate([t], return_tokens=True).translations[0].hypotheses[0].token_ids)
                     for t in texts]
            with cf.ThreadPoolExecutor(6) as pool:
                parts = list(pool.map(lambda i: client.translate(texts[i:i + 20], return_tokens=True),
                                      range(0, 120, 20)))
            batched = [list(t.hypotheses[0].token_ids) for r in parts for t in r.translations]
            assert srv.metric("nmt_decode_batch_size_sum") > srv.metric("nmt_decode_batch_size_count")  # shared steps
    finally:
        srv.stop()
    assert sum(a != b for a, b in zip(alone, batched)) == 0


def test_attention_ops_benchmark_checks_both_ops_against_a_reference():
    """benchmarks/studies/attention_ops.py (GroupQueryAttention vs opset-24 Attention over a preallocated buffer):
    both ops give each row attention over its own real entries only, on this machine's CPU."""
    from benchmarks.studies.attention_ops import measure

    r = measure(rows=4, cap=32, dtype="fp32", provider="cpu", rng=np.random.default_rng(3))
    assert r["gqa_err"] < 1e-5 and r["attention_err"] < 1e-5, r
    assert r["gqa_us"] > 0 and r["attention_us"] > 0


def test_warm_buckets_runs_the_step_at_every_bucket_before_traffic(bundle):
    """With CUDA graphs each bucket's graph must be captured at warm-up, on the engine thread (ONNX Runtime
    captures in the calling thread's context, in global capture mode): warm_buckets runs the step at
    exactly each bucket's row count. On the CPU the same bucketed step shows which counts ran."""
    from server.config import ServerConfig
    from server.frontend.hosted import HostedModel
    # the shared thread pool, as the other tests of this process made it (a pool is per process)
    cfg = ServerConfig(model_repository=str(REPOSITORY), provider="cpu", max_batch_size=SLOTS, warmup=False,
                       ort_spinning="true")
    model = HostedModel(bundle, cfg, Metrics()).here  # its engine: the ModelEngine built in this process
    step = model.engine.inplace = InPlaceStep(model.runtime.inplace, model.cache, bundle.spec.out_vocab_size,
                                              bucketed=True)
    model.start()
    try:
        model.warm_buckets(step.sizes)
        assert sorted(step._bindings) == step.sizes == [1, 2, 4, SLOTS]
    finally:
        model.stop(5)
