"""Question 3: per-step self-attention cost, GQA in place vs gather + Concat graph + scatter (CPU EP).

    .venv/bin/python benchmarks/spike_gqa/gqa_timing.py [--threads 1] [--layers 3] [--ages 5,60]

Both variants own the same kind of cache, (L, N, H, C, Dh) per kind with N = 64
slots and C = 257, and do everything a decode step needs for the attention part:

  gqa      fresh IO binding; q/k/v and seqlens_k bound by pointer; per layer the
           views cache[l, :B] bound as past_key_l AND present_key_l (in place);
           run. Nothing is copied by the engine.
  gqa_bound  the same with one binding kept across steps (valid while B does not change)
  current  what models/core/kv_cache.py does today: copy cache[:, :B, :, :P] into a
           reused contiguous buffer (P = longest row), build past_mask, run the
           Concat/MatMul/Softmax/MatMul graph with session.run, then scatter
           new_k/new_v back at each row's own position.

Rows keep fixed ages (each step re-writes the same position), so every round
measures the same work. Projections, FFN and logits are left out on purpose:
they cost the same in both schemes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from graphs import bind_view, concat_self_graph, gqa_self_graph, session  # noqa: E402
from timing import alternate, fmt  # noqa: E402

H, DH = 4, 64
D = H * DH


class Setup:
    def __init__(self, batch: int, layers: int, slots: int, cap: int, ages: np.ndarray, threads: int, seed: int):
        rng = np.random.default_rng(seed)
        self.b, self.layers, self.cap = batch, layers, cap
        self.k = np.zeros((layers, slots, H, cap, DH), np.float32)
        self.v = np.zeros_like(self.k)
        self.length = np.zeros(slots, np.int64)
        self.length[:batch] = ages
        for i in range(batch):
            self.k[:, i, :, :ages[i]] = rng.standard_normal((layers, H, ages[i], DH))
            self.v[:, i, :, :ages[i]] = rng.standard_normal((layers, H, ages[i], DH))
        self.q, self.kn, self.vn = (rng.standard_normal((batch, 1, D)).astype(np.float32) for _ in range(3))
        self.gqa = session(gqa_self_graph(H, DH, layers, total_from_shape=True), threads)
        self.cat = session(concat_self_graph(H, DH, layers), threads)
        self.step_k = np.empty(self.k.size, np.float32)  # reused gather buffers, as in kv_cache.py
        self.step_v = np.empty(self.v.size, np.float32)
        self.phase = {"gather": [], "run": [], "scatter": []}

    # -- (i) GQA, in place ---------------------------------------------------
    def gqa_step(self):
        b = self.b
        binding = self.gqa.io_binding()
        for name, arr in (("query", self.q), ("key", self.kn), ("value", self.vn)):
            bind_view(binding, name, arr)
        seqlens = self.length[:b].astype(np.int32)  # = positions: entries written so far
        bind_view(binding, "seqlens_k", seqlens)
        for i in range(self.layers):
            binding.bind_output(f"output_{i}")
        for i in range(self.layers):
            for kind, cache in (("key", self.k), ("value", self.v)):
                view = cache[i, :b]
                bind_view(binding, f"past_{kind}_{i}", view)
                bind_view(binding, f"present_{kind}_{i}", view, output=True)
        self.gqa.run_with_iobinding(binding)
        return binding.get_outputs()[0]

    def gqa_bound_step(self):
        """Same as gqa_step with the binding kept from step to step: valid while the running rows
        (hence B) do not change; seqlens_k lives in a persistent array the engine updates in place."""
        if not hasattr(self, "_binding"):
            b = self.b
            binding = self.gqa.io_binding()
            for name, arr in (("query", self.q), ("key", self.kn), ("value", self.vn)):
                bind_view(binding, name, arr)
            self._seqlens = self.length[:b].astype(np.int32)
            bind_view(binding, "seqlens_k", self._seqlens)
            for i in range(self.layers):
                binding.bind_output(f"output_{i}")
            for i in range(self.layers):
                for kind, cache in (("key", self.k), ("value", self.v)):
                    view = cache[i, :b]
                    bind_view(binding, f"past_{kind}_{i}", view)
                    bind_view(binding, f"present_{kind}_{i}", view, output=True)
            self._binding = binding
        self._seqlens[:] = self.length[:self.b]  # what the engine does after each step
        self.gqa.run_with_iobinding(self._binding)
        return self._binding.get_outputs()[0]

    # -- (ii) gather, Concat graph, scatter ----------------------------------
    def _gather(self, flat, cache, b, p):
        part = cache[:, :b, :, :p]
        out = flat[:part.size].reshape(part.shape)
        np.copyto(out, part)
        return out

    def current_step(self, record: bool = False):
        b = self.b
        t0 = time.perf_counter()
        lengths = self.length[:b]
        p = int(lengths.max())
        feeds = {"query": self.q, "key": self.kn, "value": self.vn,
                 "past_k": self._gather(self.step_k, self.k, b, p),
                 "past_v": self._gather(self.step_v, self.v, b, p),
                 "past_mask": np.arange(p)[None, :] < lengths[:, None]}
        t1 = time.perf_counter()
        outs = self.cat.run(None, feeds)
        t2 = time.perf_counter()
        new_k, new_v = outs[-2], outs[-1]
        slots, pos = np.arange(b), lengths
        self.k[:, slots, :, pos] = new_k[:, :, :, 0].transpose(1, 0, 2, 3)
        self.v[:, slots, :, pos] = new_v[:, :, :, 0].transpose(1, 0, 2, 3)
        t3 = time.perf_counter()
        if record:
            for name, dt in (("gather", t1 - t0), ("run", t2 - t1), ("scatter", t3 - t2)):
                self.phase[name].append(dt * 1e3)
        return outs[0]


def agree(s: Setup) -> float:
    """Both variants give the same attention output (same cache, same q/k/v)."""
    a = s.gqa_step().numpy()
    b = s.current_step()
    return float(np.abs(a - b).max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--ages", default="5,60")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--inner", type=int, default=10)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    lo, hi = (int(x) for x in args.ages.split(","))
    slots, cap = 64, 257
    results = []
    print(f"self-attention, {args.layers} layers, H={H} Dh={DH}, cache ({slots} slots, capacity {cap}), "
          f"ages {lo}..{hi}, intra-op threads {args.threads}; median [p25-p75] per step over "
          f"{args.rounds} alternating rounds of {args.inner} steps")
    for batch in (int(x) for x in args.batches.split(",")):
        ages = np.random.default_rng(batch).integers(lo, hi + 1, batch)
        s = Setup(batch, args.layers, slots, cap, ages, args.threads, seed=batch)
        err = agree(s)
        variants = {"gqa": s.gqa_step, "gqa_bound": s.gqa_bound_step, "current": s.current_step}
        stats = alternate(variants, rounds=args.rounds, inner=args.inner)
        for _ in range(args.rounds * 2):
            s.current_step(record=True)
        phases = {k: float(np.median(v)) for k, v in s.phase.items()}
        ratio = stats["current"]["median_ms"] / stats["gqa"]["median_ms"]
        print(f"B={batch:>3} (max age {ages.max():>3}, |gqa-current| {err:.1e})  gqa {fmt(stats['gqa'])}   "
              f"gqa kept binding {fmt(stats['gqa_bound'])}   current {fmt(stats['current'])}   "
              f"current/gqa {ratio:5.2f}x   current phases: " + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()))
        results.append({"batch": batch, "max_age": int(ages.max()), "ages": ages.tolist(), "max_abs_diff": err,
                        "gqa": stats["gqa"], "gqa_bound": stats["gqa_bound"], "current": stats["current"],
                        "current_phases_median_ms": phases})
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    main()
