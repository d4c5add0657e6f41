"""Alternating repeated timing: every variant runs once per round, in a rotating order,
so slow phases of a shared machine hit all variants alike; medians and quartiles per call."""
from __future__ import annotations

import time
from typing import Callable

import numpy as np


def alternate(variants: dict[str, Callable[[], object]], rounds: int = 15, inner: int = 20,
              warmup: int = 3) -> dict[str, dict[str, float]]:
    names = list(variants)
    for name in names:
        for _ in range(warmup):
            variants[name]()
    samples: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            fn = variants[name]
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples[name].append((time.perf_counter() - t0) / inner)
    out = {}
    for name, s in samples.items():
        a = np.array(s) * 1e3
        out[name] = {"median_ms": float(np.median(a)), "p25_ms": float(np.percentile(a, 25)),
                     "p75_ms": float(np.percentile(a, 75)), "rounds": len(a), "inner": inner}
    return out


def fmt(stats: dict[str, float]) -> str:
    return f"{stats['median_ms']:8.3f} ms [{stats['p25_ms']:.3f}-{stats['p75_ms']:.3f}]"
