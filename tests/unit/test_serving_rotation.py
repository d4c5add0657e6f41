"""serving_compare's rotation (also hf_compare's): every contender up at once, each load served to each in
turn. These check what the tables are computed from: the medians per contender, the peer's best setting per
load with its per-repeat figures, the per-repeat ratio range, and that a failed start stops what was started."""
from __future__ import annotations

import pytest

from benchmarks.serving_compare import best_ct2, median_of, paired_range, start_all


def stream_cell(tps: float, ttft: float = 5.0) -> dict:
    return {"tokens": int(tps * 10), "tokens_per_s": tps, "errors": 0, "ttft_p50_ms": ttft, "e2e_p90_ms": 20.0,
            "cpu_us_per_token": 1e6 / tps}


def unary_cell(tps: float) -> dict:
    return {"tokens": int(tps * 10), "seconds": 10.0, "tokens_per_s": tps, "errors": 1, "cpu_us_per_token": 100.0}


def raw(streams: dict[int, list[float]], unary: list[float]) -> dict:
    return {"idle_cpu_percent": 1.0, "levels": {**{c: [stream_cell(t) for t in tps] for c, tps in streams.items()},
                                                "unary": [unary_cell(t) for t in unary]}}


def test_medians_per_contender_keep_each_repeat():
    res = median_of(raw({8: [100.0, 300.0, 200.0]}, [1000.0, 3000.0, 2000.0]))
    cell = res["streams"][8]
    assert cell["tokens_per_s"] == 200.0 and cell["range"] == [100.0, 300.0]
    assert cell["per_repeat"] == [100.0, 300.0, 200.0] and cell["errors"] == 0
    assert res["unary_tokens_per_s"] == 2000.0 and res["unary_per_repeat"] == [1000.0, 3000.0, 2000.0]
    assert res["unary_errors"] == 3 and res["unary_cpu_us_per_token"] == 100.0


def test_the_peer_is_its_best_setting_per_load_by_median_and_ratios_pair_by_repeat():
    res = {"ours": median_of(raw({8: [120.0, 110.0]}, [900.0, 1000.0])),
           "ct2:2x1": median_of(raw({8: [100.0, 100.0]}, [1000.0, 800.0])),
           "ct2:1x2": median_of(raw({8: [90.0, 95.0]}, [1200.0, 1000.0]))}
    best = best_ct2(res)
    assert best["streams"][8]["setting"] == "2x1" and best["streams"][8]["per_repeat"] == [100.0, 100.0]
    assert best["unary_setting"] == "1x2" and best["unary_per_repeat"] == [1200.0, 1000.0]
    # Each repeat's own ratio (its two figures measured back to back), lowest and highest.
    assert paired_range(res["ours"]["streams"][8]["per_repeat"], best["streams"][8]["per_repeat"]) == "1.10-1.20"
    assert paired_range(res["ours"]["unary_per_repeat"], best["unary_per_repeat"]) == "0.75-1.00"


def test_a_contender_that_fails_to_start_stops_those_already_started():
    stopped = []

    def launch(kind: str):
        if kind == "broken":
            raise RuntimeError("no such model")
        return (lambda: stopped.append(kind)), 0, f"127.0.0.1:{len(kind)}"
    with pytest.raises(RuntimeError, match="no such model"):
        start_all(["ours", "ct2:2x1", "broken", "ct2:1x2"], launch)
    assert stopped == ["ours", "ct2:2x1"]
    servers = start_all(["ours", "ct2:2x1"], launch)
    assert list(servers) == ["ours", "ct2:2x1"] and stopped == ["ours", "ct2:2x1"]


def test_marian_int8_vs_ct2_reports_both_of_our_int8s_against_the_peer():
    """hf_compare --precision int8: the peer's int8 at its best, our served int8 (int8-static) against it, and
    our two int8s side by side with their per-repeat ratios; the int8-vs-fp32 agreement is stated."""
    from argparse import Namespace

    from benchmarks.hf_compare import render
    res = {"ours": median_of(raw({8: [300.0, 330.0]}, [1200.0, 1300.0])),
           "ours:row": median_of(raw({8: [200.0, 300.0]}, [1000.0, 1000.0])),
           "ct2:2x1": median_of(raw({8: [150.0, 150.0]}, [600.0, 650.0]))}
    args = Namespace(precision="int8", seconds=10.0, repeats=2, ct2_configs=["2x1"], unary_texts=32, unary_clients=2)
    page = render(res, args, ["--precision", "int8"], 41, 50, to_fp32=37)
    assert "int8 on both sides" in page and "41/50 texts identical between the two servers (int8)" in page
    assert "Our int8 against our fp32 graphs: 37/50" in page
    assert "| 8 streams | 315 | 150 (`2x1`) | **2.10** |" in page  # medians: 315 against 150
    assert "| 8 streams | 315 | 250 | 1.26 | 1.10-1.50 |" in page  # static / row, each repeat's own ratio
    assert "| unary | 1,250 | 1,000 | 1.25 | 1.20-1.30 |" in page
