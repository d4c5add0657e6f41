"""ONNX export: graph checks, parity with PyTorch, the bundle the server loads."""
import json

import numpy as np
import onnx
import pytest
import torch

from export import inplace
from export import onnx as graphs
from export.__main__ import INT8_LOGIT_TOLERANCE, check_graph
from export.__main__ import main as export_main
from export.parity import graph_parity, inplace_parity, token_parity
from models.core.bundle import BundleError, discover, load_bundle
from models.core.runtime import OnnxModel, RuntimeOptions, cpu_has_vnni
from models.core.tokenizer import train_tokenizer
from tests.tiny_models import reverser, varied

VOCAB_TEXTS = ["a b c d e f g h i j k l m n o p q r s t u v w x y z"] * 5


INT8_BOUND = 0.25  # max |int8 - fp32| logit on the trained tiny model: ~0.08 measured, 1.35 with a scale 10% off


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    """A tiny model trained for seconds (tests/tiny_models.py: a random one decodes one repeated token),
    saved as a checkpoint and exported with its int8 and fp16 variants."""
    root = tmp_path_factory.mktemp("export")
    tok = train_tokenizer(VOCAB_TEXTS, vocab_size=60, min_frequency=1)
    ckpt_dir = root / "tiny-xx-yy"
    ckpt_dir.mkdir()
    tok.save(ckpt_dir / "tokenizer.json")
    model = reverser(tok.vocab_size)
    torch.save({"config": model.cfg.to_dict(), "model": model.state_dict(),
                "meta": {"src_lang": "xx", "tgt_lang": "yy"}}, ckpt_dir / "model.pt")
    (ckpt_dir / "MODEL_CARD.md").write_text("# tiny\n")
    out = root / "repository"
    calibration = root / "calibration.txt"  # letter sentences like the ones the tiny model is tested on
    rng = np.random.default_rng(7)
    calibration.write_text("".join(" ".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), rng.integers(2, 12)))
                                   + "\n" for _ in range(300)))
    assert export_main(["--checkpoint", str(ckpt_dir / "model.pt"), "--out", str(out), "--int8", "--fp16",
                        "--calibration-text", str(calibration)]) == 0
    return model, out


def test_bundle_layout_and_config(repo):
    model, out = repo
    (bundle,) = discover(out)
    assert bundle.path == out / "tiny-xx-yy" / "1"
    assert (bundle.name, bundle.version, bundle.source_language, bundle.target_language) == ("tiny-xx-yy", 1, "xx", "yy")
    assert set(bundle.variants) == {"fp32", "int8", "int8-vnni", "int8-static", "fp16"}
    for name in ("encoder.onnx", "decoder_step.onnx", "encoder.int8.onnx", "decoder_step.int8.onnx",
                 "decoder_inplace.onnx", "decoder_inplace.int8.onnx", "encoder.int8-vnni.onnx",
                 "decoder_step.int8-vnni.onnx", "decoder_inplace.int8-vnni.onnx", "weights.int8.bin",
                 "encoder.int8-static.onnx", "decoder_step.int8-static.onnx", "decoder_inplace.int8-static.onnx",
                 "tokenizer.json", "config.json", "MODEL_CARD.md", "README.md"):
        assert (bundle.path / name).exists(), name
    config = json.loads((bundle.path / "config.json").read_text())
    assert config["model"] == model.cfg.to_dict() and config["opset"] == graphs.OPSET
    dec_inputs = config["signatures"]["decoder_step"]["inputs"]
    assert [i["name"] for i in dec_inputs] == graphs.DECODER_INPUTS
    past_k = next(i for i in dec_inputs if i["name"] == "past_k")
    assert past_k["shape"][1] == "batch" and past_k["shape"][3] == "past_len"
    step_inputs = config["signatures"]["decoder_inplace"]["inputs"]
    assert [i["name"] for i in step_inputs] == inplace.io_names(model.cfg.n_dec_layers)[0]
    cache = next(i for i in step_inputs if i["name"] == "past_key_0")
    assert cache["shape"][0] == "batch" and cache["shape"][2] == "capacity"
    # the same step in standard opset-24 ops (TensorScatter + Attention), for CUDA in fp32
    assert config["variants"]["fp32"]["decoder_inplace_std"] == "decoder_inplace.std.onnx"
    assert "decoder_inplace_std" in config["signatures"]
    # Every graph declares an IR version ONNX Runtime 1.31 reads (at most 13; seen on an H200: the onnx
    # library's newest, 14, made onnxruntime-gpu refuse the standard-op graph at load).
    for graph in bundle.path.glob("*.onnx"):
        assert onnx.load(graph, load_external_data=False).ir_version <= 13, graph.name
    # the int8 variants' matrices in one file; their fp32 tensors are fp32's own bytes
    assert {config["variants"][v]["weights"] for v in ("int8", "int8-vnni", "int8-static")} == {"weights.int8.bin"}
    int8_graph = onnx.load(bundle.path / "decoder_inplace.int8.onnx", load_external_data=False)
    places = {e.value for i in int8_graph.graph.initializer for e in i.external_data if e.key == "location"}
    assert places == {"weights.bin", "weights.int8.bin"}
    # fp16 in place throughout (GQA's CUDA kernels are fp16): the cache it binds is fp16 too
    assert config["variants"]["fp16"]["decoder_inplace"] == "decoder_inplace.fp16.onnx"


def test_each_variant_stores_its_tensors_once(repo):
    """The graphs of a variant keep only structure; identical tensors share bytes of one weights file."""
    model, out = repo
    bundle = load_bundle(out / "tiny-xx-yy" / "1")
    params = sum(p.numel() for p in model.parameters()) * 4
    for variant, files in bundle.variants.items():
        weights = bundle.path / files["weights"]
        graphs = [bundle.path / f for kind, f in files.items() if kind != "weights"]
        assert all(g.stat().st_size < weights.stat().st_size for g in graphs), variant
        if variant == "fp32":
            assert all(g.stat().st_size < weights.stat().st_size / 4 for g in graphs)  # three graphs, yet about one copy of the parameters (plus alignment)
            assert weights.stat().st_size < 1.3 * params


def test_inplace_graph_matches_pytorch(repo):
    """decoder_inplace.onnx on ragged slot buffers = the model's decode_step on each row alone."""
    model, out = repo
    onnx_model = OnnxModel(load_bundle(out / "tiny-xx-yy" / "1"), RuntimeOptions(provider="cpu"))
    assert onnx_model.inplace is not None
    diffs = inplace_parity(model, onnx_model.inplace)
    assert {d.output for d in diffs} == {"logits", "present_key", "present_value"}
    assert max(d.max_abs_diff for d in diffs) <= 1e-4
    for weights in ("7", "static"):
        int8 = int8_model(out, weights)
        logits = [d.max_abs_diff for d in inplace_parity(model, int8.inplace) if d.output == "logits"]
        assert 0 < max(logits) < INT8_BOUND, weights


def test_fp32_graphs_match_pytorch(repo):
    model, out = repo
    onnx_model = OnnxModel(load_bundle(out / "tiny-xx-yy" / "1"), RuntimeOptions(provider="cpu"))
    diffs = graph_parity(model, onnx_model)
    assert {d.output for d in diffs} == {"memory", "cross_k", "cross_v", "logits", "new_k", "new_v"}
    assert max(d.max_abs_diff for d in diffs) <= 1e-4


@pytest.mark.parametrize("weights", ["7", "static"])
def test_int8_graphs_stay_close(repo, weights):
    model, out = repo
    onnx_model = int8_model(out, weights)
    logits = [d.max_abs_diff for d in graph_parity(model, onnx_model) if d.output == "logits"]
    # Quantised (not identical): the trained tiny model's logits move by ~0.08; the exporter's own
    # sanity bound (INT8_LOGIT_TOLERANCE) is far looser, for any model.
    assert 0 < max(logits) < INT8_BOUND < INT8_LOGIT_TOLERANCE


SERVED = {"7": "int8", "8": "int8-vnni", "static": "int8-static"}


def int8_model(out, weights: str) -> OnnxModel:
    """The int8 variant with rows quantised while serving and 7- or 8-bit weights (8: int8-vnni, exact on a CPU
    with VNNI only), or with activation ranges calibrated at export ("static": int8-static, 7-bit weights)."""
    if weights == "8" and not cpu_has_vnni():
        pytest.skip("8-bit weights are served only on a CPU with VNNI, and this one has none")
    options = RuntimeOptions(variant="int8", provider="cpu", int8_activations="static") if weights == "static" \
        else RuntimeOptions(variant="int8", provider="cpu", int8_weights=weights, int8_activations="row")
    model = OnnxModel(load_bundle(out / "tiny-xx-yy" / "1"), options)
    assert model.variant == SERVED[weights]
    return model


@pytest.mark.parametrize("weights", ["7", "8", "static"])
def test_int8_decodes_the_fp32_tokens(repo, weights):
    """int8 greedy = PyTorch greedy on nearly every row of varied decodes (188/200 measured; a weight
    scale stored 10% off gave 131/200 and logits off by 1.35)."""
    model, out = repo
    int8 = int8_model(out, weights)
    rng = np.random.default_rng(0)
    sources = [list(rng.integers(4, model.cfg.vocab_size, rng.integers(1, 12))) + [2] for _ in range(200)]
    result = token_parity(model, int8, sources)
    assert varied(result.torch_ids) and result.identical >= 0.9 * result.sentences, result.identical


@pytest.mark.parametrize("weights", ["7", "8", "static"])
def test_int8_rows_do_not_depend_on_their_batch(repo, weights):
    """Activations are quantised per row, or by a constant range (int8-static): a row's logits alone equal
    its logits among others.

    (ONNX Runtime's quantize_dynamic scales a whole batch's activations together: its rows'
    logits moved by ~1e-2 with the company they kept, and tokens changed with it.)"""
    model, out = repo
    int8 = int8_model(out, weights)
    names = inplace.io_names(model.cfg.n_dec_layers)[0]
    feeds = [x.numpy() for x in inplace.example_inputs(model, batch=5, capacity=9, src_capacity=7, seed=3)]
    together = int8.inplace.run(["logits"], dict(zip(names, feeds)))[0]
    for r in range(5):
        alone = [x[r:r + 1] if x.ndim else np.array(feeds[1][r, 0] + 1, np.int32) for x in feeds]
        logits = int8.inplace.run(["logits"], dict(zip(names, alone)))[0]
        assert np.abs(logits[0] - together[r]).max() < 1e-5, r
    # the encoder too: a sentence's cross keys alone = among longer, padded ones
    src = np.array([[5, 6, 7, 2, 0, 0], [8, 9, 10, 11, 12, 2]], np.int64)
    _, ck_both, _ = int8.encode(src, src != 0)
    _, ck_one, _ = int8.encode(src[:1, :4], src[:1, :4] != 0)
    assert np.abs(ck_both[:, 0, :, :4] - ck_one[:, 0]).max() < 1e-5


def test_fp16_graphs_stay_close(repo):
    """The fp16 variant is for CUDA, but ONNX Runtime's CPU provider runs it too: check it here."""
    model, out = repo
    onnx_model = OnnxModel(load_bundle(out / "tiny-xx-yy" / "1"), RuntimeOptions(variant="fp16", provider="cpu"))
    logits = [d.max_abs_diff for d in graph_parity(model, onnx_model) if d.output == "logits"]
    assert 0 < max(logits) < 0.05


@pytest.mark.parametrize("beam", [1, 3])
def test_numpy_decoder_gives_pytorch_tokens(repo, beam):
    model, out = repo
    onnx_model = OnnxModel(load_bundle(out / "tiny-xx-yy" / "1"), RuntimeOptions(provider="cpu"))
    rng = np.random.default_rng(0)
    sources = [list(rng.integers(4, model.cfg.vocab_size, rng.integers(1, 12))) + [2] for _ in range(40)]
    result = token_parity(model, onnx_model, sources, beam=beam, batch_size=16)
    assert result.identical == result.sentences, [
        (a, b) for a, b in zip(result.torch_ids, result.onnx_ids) if a != b][:3]
    assert varied(result.torch_ids)  # every row a real decode: varied tokens, lengths and orders


def test_a_large_logit_bias_stays_within_the_export_parity(tmp_path):
    """Marian's final_logits_bias holds -1e4 where a checkpoint rules tokens out (benchmarks/hf_compare.py's
    model: EOS and pad). With that bias Add fused into the output Gemm, the logits there moved by one float
    step (1e-3 at 1e4) and the exporter refused the model; both decoder graphs add it after the product."""
    from models.core.config import preset
    from models.transformer import Transformer
    tok = train_tokenizer(VOCAB_TEXTS, vocab_size=60, min_frequency=1)
    torch.manual_seed(0)
    # Marian's width: the product that rounds against the 1e4 is d_model long
    model = Transformer(preset("tiny", vocab_size=tok.vocab_size, output_bias=True, d_model=512, n_heads=8,
                               d_ff=512)).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_()
        model.final_logits_bias[[0, 2]] = -1e4
    ckpt_dir = tmp_path / "biased-xx-yy"
    ckpt_dir.mkdir()
    tok.save(ckpt_dir / "tokenizer.json")
    torch.save({"config": model.cfg.to_dict(), "model": model.state_dict(),
                "meta": {"src_lang": "xx", "tgt_lang": "yy"}}, ckpt_dir / "model.pt")
    (ckpt_dir / "MODEL_CARD.md").write_text("# biased\n")
    assert export_main(["--checkpoint", str(ckpt_dir / "model.pt"), "--out", str(tmp_path / "repository")]) == 0


def test_existing_version_is_not_overwritten(repo, capsys):
    model, out = repo
    ckpt = out.parent / "tiny-xx-yy" / "model.pt"
    assert export_main(["--checkpoint", str(ckpt), "--out", str(out)]) == 2
    assert "exists" in capsys.readouterr().err


def test_graph_checks_report_every_problem(repo):
    _, out = repo
    path = out / "tiny-xx-yy" / "1" / "decoder_step.onnx"
    problems = check_graph(path, ["tokens"], ["logits"], {"tokens": {0: "rows"}}, opset=13)
    assert any("opset" in p for p in problems)
    assert any("inputs" in p for p in problems) and any("outputs" in p for p in problems)
    assert any("dynamic 'rows'" in p for p in problems)
    assert check_graph(path, graphs.DECODER_INPUTS, graphs.DECODER_OUTPUTS, graphs.DECODER_AXES, graphs.OPSET) == []


def test_broken_bundle_lists_all_problems(repo, tmp_path):
    _, out = repo
    src = out / "tiny-xx-yy" / "1"
    broken = tmp_path / "m" / "1"
    broken.mkdir(parents=True)
    config = json.loads((src / "config.json").read_text())
    config["format"] = "something-else"
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(BundleError) as err:
        load_bundle(broken)
    msg = str(err.value)
    assert "format" in msg and "encoder.onnx missing" in msg and "tokenizer.json missing" in msg


def test_forced_length_decoding_matches(repo):
    """min_len = max_len (the benchmark's forced mode) agrees between PyTorch and ONNX Runtime."""
    from models.core.static_decode import greedy as onnx_greedy
    from models.core.static_decode import pad_batch
    from models.search import greedy as torch_greedy
    model, out = repo
    onnx_model = OnnxModel(load_bundle(out / "tiny-xx-yy" / "1"), RuntimeOptions(provider="cpu"))
    ids, mask = pad_batch([list(range(5, 17)) + [2], list(range(20, 30)) + [2]], 0)  # longer than 9: no EOS wanted
    ours = onnx_greedy(onnx_model, ids, mask, max_len=9, min_len=9)
    assert ours == torch_greedy(model, torch.from_numpy(ids), max_len=9, min_len=9)
    assert [len(x) for x in ours] == [9, 9] and all(2 not in x for x in ours)


def test_int8_graph_uses_one_quantize_per_activation(repo):
    """Products sharing an input share its quantisation; no elementwise passes remain around them. (The
    encoder's: the tiny model's decoder products are all below DECODER_MIN_WEIGHTS and stay fp32.)"""
    import onnx
    _, out = repo
    graph = onnx.load(str(out / "tiny-xx-yy" / "1" / "encoder.int8.onnx"), load_external_data=False)
    ops = [n.op_type for n in graph.graph.node]
    assert "MatMulInteger" not in ops and "Round" not in ops
    products = [n for n in graph.graph.node if n.op_type == "MatMulIntegerToFloat"]
    quantized = [n for n in graph.graph.node if n.op_type == "QuantizeLinear"]
    assert products and len({n.input[0] for n in products}) == len(quantized) <= len(products)
    assert next(o.version for o in graph.opset_import if o.domain in ("", "ai.onnx")) == 21


def test_int8_refuses_a_graph_whose_operators_change_meaning_at_opset_21(tmp_path):
    """Moving to opset 21 would silently reinterpret ReduceMean's `axes` attribute (an input since 18):
    every such operator is named, and nothing is written."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from export.quantize import quantize_rowwise
    w = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1], keepdims=1),
             helper.make_node("Sub", ["x", "m"], ["c"]),
             helper.make_node("Split", ["c"], ["c1", "c2"], axis=-1),
             helper.make_node("Concat", ["c1", "c2"], ["c3"], axis=-1),
             helper.make_node("MatMul", ["c3", "w"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])], [w])
    src = tmp_path / "old.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(src))
    with pytest.raises(ValueError, match="ReduceMean, Split"):
        quantize_rowwise(src, tmp_path / "new.onnx")
    assert not (tmp_path / "new.onnx").exists()


@pytest.mark.parametrize("variant, levels", [("int8", 63), ("int8-vnni", 127)])
def test_int8_weights_use_seven_bits_and_eight_for_vnni(repo, variant, levels):
    """Every weight of every int8 graph lies in -63..63: with 8-bit weights a CPU without VNNI (AVX2's
    vpmaddubsw adds product pairs into a saturating int16) computed wrong products. The int8-vnni graphs,
    for CPUs that sum them in int32, use the whole -127..127 (each column reaches its end)."""
    import onnx
    from onnx import numpy_helper
    _, out = repo
    bundle = out / "tiny-xx-yy" / "1"
    graphs = sorted(bundle.glob(f"*.{variant}.onnx"))
    assert [g.name for g in graphs if g.name.startswith("encoder.")]
    for graph in graphs:
        model = onnx.load(str(graph))  # external data too: weights.int8.bin
        weights = [numpy_helper.to_array(i) for i in model.graph.initializer if i.data_type == onnx.TensorProto.INT8]
        assert weights or not graph.name.startswith("encoder."), graph.name  # the tiny decoders' stay fp32
        if weights:
            assert max(int(np.abs(w.astype(np.int32)).max()) for w in weights) == levels, graph.name


def test_decoder_step_quantises_only_the_products_that_pay(tmp_path):
    """With DECODER_MIN_WEIGHTS (as export applies it to the decoder graphs) a product of fewer weights
    keeps its fp32 MatMul and its exact result; the large one becomes int8."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from export.quantize import DECODER_MIN_WEIGHTS, quantize_rowwise
    from models.core.runtime import RuntimeOptions, session_options, use_shared_pool
    rng = np.random.default_rng(0)
    small = rng.standard_normal((64, 64)).astype(np.float32)
    large = rng.standard_normal((64, DECODER_MIN_WEIGHTS // 64)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "small"], ["h"]), helper.make_node("MatMul", ["h", "large"], ["y"])],
        "two", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", large.shape[1]]),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, ["B", 64])],
        initializer=[numpy_helper.from_array(small, "small"), numpy_helper.from_array(large, "large")])
    src, dst = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(src))
    assert quantize_rowwise(src, dst, 8, DECODER_MIN_WEIGHTS) == 1
    ops = [n.op_type for n in onnx.load(str(dst)).graph.node]
    assert ops.count("MatMul") == 1 and ops.count("MatMulIntegerToFloat") == 1
    x = rng.standard_normal((3, 64)).astype(np.float32)
    options = session_options(RuntimeOptions(), shared=use_shared_pool(0))  # as every session of the suite
    run = lambda path: ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]).run(
        ["h"], {"x": x})[0]
    np.testing.assert_array_equal(run(dst), run(src))


@pytest.mark.parametrize("bits", [7, 8])
def test_int8_product_is_exact_at_the_extremes(tmp_path, bits):
    """One quantised product at its largest pairs (every activation at the top of its row's range,
    every weight at its column's): ONNX Runtime's result equals the same quantisation done exactly in
    numpy, on whatever CPU runs this for 7-bit weights (8-bit saturated on AVX2: off by thousands here),
    and for 8-bit on a CPU with VNNI, the only kind int8-vnni is served on."""
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    from export.quantize import quantize_rowwise, weight_levels
    from models.core.runtime import RuntimeOptions, cpu_has_vnni, session_options, use_shared_pool
    if bits == 8 and not cpu_has_vnni():
        pytest.skip("8-bit weights are exact only with VNNI, and this CPU has none")
    k, n = 256, 16
    w = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)[None, :].repeat(k, 0).astype(np.float32)  # (K, N) at +-max
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "one",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", n])],
                              initializer=[numpy_helper.from_array(w, "w")])
    src, dst = tmp_path / "fp32.onnx", tmp_path / "int8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(src))
    assert quantize_rowwise(src, dst, bits) == 1
    x = np.full((3, k), 2.5, np.float32)
    x[1] = -x[1]
    x[2, ::2] = -2.5  # a row whose pairs cancel: saturation shows as a non-zero sum
    options = session_options(RuntimeOptions(), shared=use_shared_pool(0))  # as every session of the suite
    got = ort.InferenceSession(str(dst), options, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    s = np.abs(x).max(axis=1, keepdims=True) / 127.0
    q = np.round(x / s).astype(np.int64)  # the activation minus its zero point, -127..127
    w_scale = np.abs(w).max(axis=0) / weight_levels(bits)
    w_q = np.round(w / w_scale).astype(np.int64)
    want = (q @ w_q) * w_scale * s
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("graph", ["encoder", "decoder_step", "decoder_inplace"])
def test_static_int8_is_two_nodes_per_product(repo, graph):
    """int8-static: every product with a constant weight is int8, each activation quantised once by a
    constant scale (no per-row chain), a bias that followed a product folded into it, nothing left
    computing for nothing (the tied projection's transposed embedding)."""
    from export.calibrate import products
    _, out = repo
    model = onnx.load(str(out / "tiny-xx-yy" / "1" / f"{graph}.int8-static.onnx"))
    nodes = model.graph.node
    ops = [n.op_type for n in nodes]
    assert not products(model) and not {"Abs", "ReduceMax", "DynamicQuantizeLinear", "MatMulInteger"} & set(ops)
    int8 = [n for n in nodes if n.op_type == "MatMulIntegerToFloat"]
    quantize = [n for n in nodes if n.op_type == "QuantizeLinear"]
    assert int8 and len(quantize) == len({n.input[0] for n in int8})
    constants = {i.name for i in model.graph.initializer}
    assert all(q.input[1] in constants and q.input[2] in constants for q in quantize)
    made_by = {o: n.op_type for n in nodes for o in n.output}
    assert not [n for n in nodes if n.op_type == "Add" and any(made_by.get(i) == "MatMulIntegerToFloat"
                                                                for i in n.input)
                and any(i in constants for i in n.input)]
    read = {i for n in nodes for i in n.input} | {o.name for o in model.graph.output}
    assert all(any(o in read for o in n.output) for n in nodes)


def test_static_int8_needs_calibration_text(repo, tmp_path, capsys):
    """Without calibration text (an imported model, a checkpoint whose corpus is not here) the export says so
    and writes the other variants; a calibration file that does not exist, or holds no sentence, is a problem,
    and nothing is written."""
    _, out = repo
    ckpt = str(out.parent / "tiny-xx-yy" / "model.pt")
    assert export_main(["--checkpoint", ckpt, "--out", str(tmp_path / "a"), "--int8"]) == 0
    assert "int8-static not written: no calibration text" in capsys.readouterr().err
    assert set(load_bundle(tmp_path / "a" / "tiny-xx-yy" / "1").variants) == {"fp32", "int8", "int8-vnni"}
    assert export_main(["--checkpoint", ckpt, "--out", str(tmp_path / "b"), "--int8",
                        "--calibration-text", str(tmp_path / "missing.txt")]) == 1
    assert "missing.txt: no such file" in capsys.readouterr().err
    assert not (tmp_path / "b" / "tiny-xx-yy").exists()
    (tmp_path / "blank.txt").write_text("\n  \n")  # nothing to decode: no range could be measured
    assert export_main(["--checkpoint", ckpt, "--out", str(tmp_path / "c"), "--int8",
                        "--calibration-text", str(tmp_path / "blank.txt")]) == 1
    assert "has no sentence" in capsys.readouterr().err and not (tmp_path / "c" / "tiny-xx-yy").exists()
