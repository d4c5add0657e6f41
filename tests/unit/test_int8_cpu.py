"""models/core/runtime.py's int8 choices: a bundle whose int8 graphs have 8-bit weights is named at load on
a CPU without VNNI, where ONNX Runtime's uint8 x int8 product saturates (docs/export.md); `int8` serves the
bundle's 8-bit graphs (int8-vnni) where the CPU sums byte products exactly, unless told otherwise."""
from pathlib import Path

import pytest

from models.core import runtime
from models.core.bundle import Bundle
from models.core.runtime import RuntimeOptions, cpu_has_vnni, int8_problem, served_variant

CPU = "CPUExecutionProvider"


def _bundle(config: dict, variants=("fp32", "int8")) -> Bundle:
    return Bundle(path=Path("/nonexistent"), name="m", version=1, source_language="en", target_language="de",
                  spec=None, variants={v: {} for v in variants}, tokenizer_file=Path("/nonexistent/tokenizer.json"),
                  config=config)


def test_eight_bit_weights_are_named_on_a_cpu_without_vnni():
    old = _bundle({})  # exported before int8_weight_bits was recorded: 8-bit weights
    problem = int8_problem(old, "int8", vnni=False)
    assert problem and "m:" in problem and "8-bit" in problem and "re-export" in problem
    vnni = int8_problem(_bundle({"int8_weight_bits": 7}), "int8-vnni", vnni=False)  # 8-bit by definition
    assert vnni and "int8-vnni" in vnni and "--int8-weights 7" in vnni


def test_seven_bit_weights_or_a_vnni_cpu_or_an_unknown_cpu_pass():
    assert int8_problem(_bundle({"int8_weight_bits": 7}), "int8", vnni=False) is None
    assert int8_problem(_bundle({}), "int8", vnni=True) is None
    assert int8_problem(_bundle({}), "int8-vnni", vnni=True) is None
    assert int8_problem(_bundle({}), "int8", vnni=None) is None  # cannot tell: no warning on a guess


@pytest.mark.parametrize("vnni, weights, want", [
    (True, "auto", "int8-vnni"), (False, "auto", "int8"), (None, "auto", "int8"),  # unknown CPU: the safe one
    (True, "7", "int8"), (False, "8", "int8-vnni"),
])
def test_int8_takes_the_weights_the_cpu_sums_exactly(monkeypatch, vnni, weights, want):
    monkeypatch.setattr(runtime, "cpu_has_vnni", lambda: vnni)
    both = _bundle({"int8_weight_bits": 7}, ("fp32", "int8", "int8-vnni"))
    assert served_variant(both, RuntimeOptions(variant="int8", int8_weights=weights), CPU) == want


def test_other_variants_providers_and_older_bundles_are_left_alone(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_has_vnni", lambda: True)
    both = _bundle({"int8_weight_bits": 7}, ("fp32", "int8", "int8-vnni"))
    assert served_variant(both, RuntimeOptions(variant="fp32"), CPU) == "fp32"
    assert served_variant(both, RuntimeOptions(variant="int8"), "CUDAExecutionProvider") == "int8"
    older = _bundle({"int8_weight_bits": 7})  # exported before int8-vnni
    assert served_variant(older, RuntimeOptions(variant="int8"), CPU) == "int8"
    with pytest.raises(RuntimeError, match="no 8-bit int8 graphs"):
        served_variant(older, RuntimeOptions(variant="int8", int8_weights="8"), CPU)
    with pytest.raises(ValueError, match="auto, 7 or 8"):
        served_variant(both, RuntimeOptions(variant="int8", int8_weights="9"), CPU)


def test_this_cpu_is_read():
    assert cpu_has_vnni() in (True, False, None)


@pytest.mark.parametrize("activations, weights, want", [
    ("auto", "auto", "int8-static"), ("auto", "7", "int8-static"), ("static", "auto", "int8-static"),
    ("auto", "8", "int8-vnni"),  # 8-bit weights asked for: only the row-wise graphs have them
    ("row", "auto", "int8-vnni"), ("row", "7", "int8"),
])
def test_int8_serves_the_calibrated_graphs_where_the_bundle_has_them(monkeypatch, activations, weights, want):
    monkeypatch.setattr(runtime, "cpu_has_vnni", lambda: True)
    every = _bundle({"int8_weight_bits": 7}, ("fp32", "int8", "int8-vnni", "int8-static"))
    options = RuntimeOptions(variant="int8", int8_weights=weights, int8_activations=activations)
    assert served_variant(every, options, CPU) == want
    assert int8_problem(every, "int8-static", vnni=False) is None  # seven-bit weights: exact on every x86 CPU


def test_static_int8_asked_of_a_bundle_without_it_is_refused(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_has_vnni", lambda: False)
    older = _bundle({"int8_weight_bits": 7}, ("fp32", "int8", "int8-vnni"))
    assert served_variant(older, RuntimeOptions(variant="int8"), CPU) == "int8"  # auto: the row-wise graphs
    with pytest.raises(RuntimeError, match="no statically calibrated int8 graphs"):
        served_variant(older, RuntimeOptions(variant="int8", int8_activations="static"), CPU)
    with pytest.raises(ValueError, match="auto, static or row"):
        served_variant(older, RuntimeOptions(variant="int8", int8_activations="dynamic"), CPU)
