"""models/core/runtime.py's int8 check: a bundle whose int8 graphs have 8-bit weights is named at load on a
CPU without VNNI, where ONNX Runtime's uint8 x int8 product saturates (docs/export.md)."""
from pathlib import Path

from models.core.bundle import Bundle
from models.core.runtime import cpu_has_vnni, int8_problem


def _bundle(config: dict) -> Bundle:
    return Bundle(path=Path("/nonexistent"), name="m", version=1, source_language="en", target_language="de",
                  spec=None, variants={}, tokenizer_file=Path("/nonexistent/tokenizer.json"), config=config)


def test_eight_bit_weights_are_named_on_a_cpu_without_vnni():
    old = _bundle({})  # exported before int8_weight_bits was recorded: 8-bit weights
    problem = int8_problem(old, vnni=False)
    assert problem and "m:" in problem and "8-bit" in problem and "re-export" in problem


def test_seven_bit_weights_or_a_vnni_cpu_or_an_unknown_cpu_pass():
    assert int8_problem(_bundle({"int8_weight_bits": 7}), vnni=False) is None
    assert int8_problem(_bundle({}), vnni=True) is None
    assert int8_problem(_bundle({}), vnni=None) is None  # cannot tell: no warning on a guess


def test_this_cpu_is_read():
    assert cpu_has_vnni() in (True, False, None)
