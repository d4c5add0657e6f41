"""CTranslate2's GEMM library as part of the peer's tuning (benchmarks/ct2_server.py GEMM_BACKENDS).

decode_throughput --ct2-backends runs each CTranslate2 engine under each setting and takes every ratio
against the fastest at that batch size; serving_compare's and hf_compare's peer settings name one with
'@GEMM', and the peer's process runs with that setting's environment and no inherited override."""
from __future__ import annotations

import argparse

import pytest

from benchmarks.ct2_server import GEMM_BACKENDS, backend_env
from benchmarks.decode_throughput import BACKENDS, best_ct2, cells_of, split_backend, worker_env
from benchmarks.serving_compare import check_ct2_configs, ct2_config


def test_only_ctranslate2_engines_multiply_by_backend():
    cells = cells_of(["ort-fp32", "ct2-float32", "ct2-int8"], ["default", "mkl"])
    assert cells == ["ort-fp32", "ct2-float32", "ct2-float32@mkl", "ct2-int8", "ct2-int8@mkl"]
    assert [split_backend(c) for c in cells[1:3]] == [("ct2-float32", "default"), ("ct2-float32", "mkl")]


def test_the_ratio_takes_the_fastest_backend_of_that_engine_and_batch():
    results = {("ct2-int8", 1): {"tokens_per_s": 300.0, "backend": "default"},
               ("ct2-int8@mkl", 1): {"tokens_per_s": 900.0, "backend": "mkl"},
               ("ct2-int8", 32): {"tokens_per_s": 5000.0, "backend": "default"},
               ("ct2-int8@mkl", 32): {"tokens_per_s": 4000.0, "backend": "mkl"},
               ("ct2-float32@mkl", 32): {"tokens_per_s": 9999.0, "backend": "mkl"}}  # another engine: not taken
    assert best_ct2(results, "ct2-int8", 1)["backend"] == "mkl"
    assert best_ct2(results, "ct2-int8", 32)["tokens_per_s"] == 5000.0
    assert best_ct2(results, "ct2-int8", 8) is None


def test_a_worker_runs_under_its_cells_setting_and_no_inherited_one():
    inherited = {"PATH": "/bin", "CT2_USE_MKL": "1", "CT2_USE_EXPERIMENTAL_PACKED_GEMM": "1"}
    default = worker_env(1, "default", inherited)
    assert default == {"PATH": "/bin", "OMP_NUM_THREADS": "1"}  # CTranslate2 chooses for this CPU itself
    assert worker_env(2, "onednn", inherited) == {"PATH": "/bin", "OMP_NUM_THREADS": "2", "CT2_USE_MKL": "0"}
    packed = worker_env(1, "mkl-packed", {})
    assert packed["CT2_USE_MKL"] == "1" and packed["CT2_USE_EXPERIMENTAL_PACKED_GEMM"] == "1"
    assert set(BACKENDS) >= {"default", "mkl", "mkl-packed", "onednn"}


def test_a_served_peer_setting_names_its_gemm_library():
    assert ct2_config("2x1-b32@mkl", 64) == {"replicas": 2, "threads": 1, "batch": 32, "delay_ms": 2.0,
                                             "backend": "mkl"}
    assert ct2_config("1x2", 64)["backend"] == "default"
    with pytest.raises(ValueError, match="unknown CTranslate2 GEMM setting"):
        ct2_config("2x1@blas", 64)


def test_the_peers_environment_carries_its_setting_alone():
    inherited = {"HOME": "/root", "CT2_USE_MKL": "0"}
    assert backend_env("default", inherited) == {"HOME": "/root"}
    assert backend_env("mkl-packed", inherited) == {"HOME": "/root", "CT2_USE_MKL": "1",
                                                     "CT2_USE_EXPERIMENTAL_PACKED_GEMM": "1"}
    assert BACKENDS is GEMM_BACKENDS  # one list of settings for the static and the served comparisons


def test_a_malformed_peer_setting_stops_at_the_command_line():
    parser = argparse.ArgumentParser()
    check_ct2_configs(parser, ["2x1@mkl", "1x2-b16-d4"], 64)  # well formed: nothing happens
    for bad in ("2x1@blas", "2x1-z3", "2xq"):  # unknown GEMM setting, unknown part, not a number
        with pytest.raises(SystemExit):
            check_ct2_configs(parser, ["2x1", bad], 64)
