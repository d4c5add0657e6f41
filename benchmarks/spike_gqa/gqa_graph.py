"""Question 1: GroupQueryAttention over a preallocated slot cache, updated in place (CPU EP).

    .venv/bin/python benchmarks/spike_gqa/gqa_graph.py

Prints one line per check; exits non-zero if a check that must hold fails.
The cache is one (N, H, C, Dh) numpy array (or OrtValue); a step binds the view
of its first b slots by pointer as past_key *and* present_key.
"""
from __future__ import annotations

import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from graphs import bind_view, gqa_self_graph, reference_attention, session  # noqa: E402

H, DH = 4, 64
D = H * DH
FAILED: list[str] = []


def check(name: str, ok: bool, detail: str = "") -> None:
    print(f"[{'ok' if ok else 'FAIL'}] {name}" + (f"  ({detail})" if detail else ""))
    if not ok:
        FAILED.append(name)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    """Bitwise equality (NaN payloads included)."""
    return a.tobytes() == b.tobytes()


def make_cache(n: int, cap: int, ages, rng, stale=np.nan):
    """Two (N, H, C, Dh) buffers: random below each row's age, `stale` from the age on and in free slots."""
    k = np.full((n, H, cap, DH), stale, np.float32)
    v = np.full_like(k, stale)
    for i, a in enumerate(ages):
        k[i, :, :a] = rng.standard_normal((H, a, DH))
        v[i, :, :a] = rng.standard_normal((H, a, DH))
    return k, v


def step(sess, big_k, big_v, ages, q, k, v, total, layer=0):
    """One GQA step over slots [0, b): binds views of big_k/big_v as past and present."""
    b = len(ages)
    binding = sess.io_binding()
    for name, arr in (("query", q), ("key", k), ("value", v)):
        bind_view(binding, name, arr)
    seqlens = np.asarray(ages, np.int32)
    bind_view(binding, "seqlens_k", seqlens)
    tot = np.array(total, np.int32)
    if total is not None:
        bind_view(binding, "total_sequence_length", tot)
    binding.bind_output(f"output_{layer}")  # get_outputs() follows the order of bind_output calls
    pk, pv = big_k[:b], big_v[:b]
    bind_view(binding, f"past_key_{layer}", pk)
    bind_view(binding, f"past_value_{layer}", pv)
    bind_view(binding, f"present_key_{layer}", pk, output=True)
    bind_view(binding, f"present_value_{layer}", pv, output=True)
    sess.run_with_iobinding(binding)
    outs = binding.get_outputs()
    return outs[0].numpy(), outs


def new_qkv(b, rng):
    return tuple(rng.standard_normal((b, 1, D)).astype(np.float32) for _ in range(3))


def expect_after(before_k, before_v, ages, k, v):
    """What the buffers must hold after the step: the new entry at each row's own age, nothing else."""
    ek, ev = before_k.copy(), before_v.copy()
    for i, a in enumerate(ages):
        ek[i, :, a] = k[i, 0].reshape(H, DH)
        ev[i, :, a] = v[i, 0].reshape(H, DH)
    return ek, ev


def ragged_step(sess, ages, cap, total, n=6, seed=0, stale=np.nan):
    """Run one step; return (writes correct, max |out - ref|, output finite, error string)."""
    rng = np.random.default_rng(seed)
    big_k, big_v = make_cache(n, cap, ages, rng, stale)
    q, k, v = new_qkv(len(ages), rng)
    before_k, before_v = big_k.copy(), big_v.copy()
    try:
        out, _ = step(sess, big_k, big_v, ages, q, k, v, total)
    except Exception as e:  # noqa: BLE001
        return None, None, None, str(e).splitlines()[0][:160]
    ek, ev = expect_after(before_k, before_v, ages, k, v)
    writes_ok = same(big_k, ek) and same(big_v, ev)
    lengths = [a + 1 for a in ages]
    ref = reference_attention(q[:, 0].reshape(-1, H, DH), big_k[:len(ages)], big_v[:len(ages)], lengths)
    err = float(np.abs(out.reshape(-1, H, DH) - ref).max()) if np.isfinite(out).all() else float("nan")
    return writes_ok, err, bool(np.isfinite(out).all()), ""


def main() -> int:
    sess = session(gqa_self_graph(H, DH, layers=1))
    cap, ages = 64, [0, 3, 17, 40]

    # (a) + (b) + (c): rows of different ages in one step, NaN in every position a row must not read
    w, err, finite, e = ragged_step(sess, ages, cap, total=max(ages) + 1)
    check("(a) new K/V lands at seqlens_k[b] of its own slot; every other byte of the (N,H,C,Dh) "
          "buffer unchanged (free slots included)", bool(w), e)
    check("(b) output == numpy reference over each row's first seqlens_k+1 positions, tol 1e-5",
          err is not None and err < 1e-5, f"max abs err {err:.2e}" if err is not None else e)
    check("(c) NaN at positions >= seqlens_k and in free slots never reaches the output", bool(finite))

    # the present outputs ORT hands back are the bound memory itself, not a copy
    rng = np.random.default_rng(1)
    big_k, big_v = make_cache(6, cap, ages, rng, 0.0)
    q, k, v = new_qkv(4, rng)
    _, outs = step(sess, big_k, big_v, ages, q, k, v, max(ages) + 1)
    check("present_key OrtValue returned by get_outputs() points at the bound buffer",
          outs[1].data_ptr() == big_k.ctypes.data and outs[2].data_ptr() == big_v.ctypes.data,
          f"{outs[1].data_ptr():#x} vs {big_k.ctypes.data:#x}")

    # (d) total_sequence_length: what values work for ragged rows
    print("\n(d) total_sequence_length, ages", ages, "capacity", cap)
    for label, total in (("max(seqlens_k)+1", max(ages) + 1), ("max+2", max(ages) + 2), ("capacity", cap),
                         ("2 (< max+1)", 2), ("1 (== sequence_length)", 1), ("capacity+1", cap + 1),
                         ("0", 0)):
        w, err, finite, e = ragged_step(sess, ages, cap, total)
        if e:
            print(f"    total={total:>3} [{label}]: error: {e}")
        else:
            print(f"    total={total:>3} [{label}]: writes correct={w}, max err={err:.1e}")
    young = [0, 0, 0]
    for label, total in (("1 (all rows age 0: first-prompt path)", 1), ("capacity", cap)):
        w, err, finite, e = ragged_step(sess, young, cap, total)
        print(f"    ages {young} total={total:>3} [{label}]: " + (f"error: {e}" if e else
              f"writes correct={w}, max err={err:.1e}"))
    w, err, _, e = ragged_step(sess, ages, cap, cap)
    check("(d) total_sequence_length = capacity is valid for any ragged batch (so it can be a constant)",
          bool(w) and err is not None and err < 1e-5, e)
    w, err, _, e = ragged_step(sess, young, cap, cap)
    check("(d) ... including a batch whose rows are all at age 0", bool(w) and err is not None and err < 1e-5, e)
    w, err, _, e = ragged_step(sess, ages, cap, 1)
    check("(d) total_sequence_length = 1 with older rows is WRONG (first-prompt path: writes at 0)",
          not w, "writes correct=%s" % w)

    # boundary: a row at the last position, then one past capacity
    w, err, _, e = ragged_step(sess, [cap - 1, 5], cap, cap)
    check("row at age capacity-1 (last free position) is written and attended correctly",
          bool(w) and err is not None and err < 1e-5, e)
    rng = np.random.default_rng(2)
    big_k, big_v = make_cache(6, cap, [5, 5], rng, 0.0)
    before = big_k.copy()
    q, k, v = new_qkv(2, rng)
    try:
        step(sess, big_k, big_v, [cap, 5], q, k, v, cap)
        spilled = not same(big_k[0, 1], before[0, 1])
        check("seqlens_k = capacity is NOT rejected: the write spills into the next head's memory "
              "(engine must keep length < capacity)", spilled, f"head 1 of row 0 changed: {spilled}")
    except Exception as e:  # noqa: BLE001
        check("seqlens_k = capacity is rejected by the op", True, str(e).splitlines()[0][:120])

    # several steps with rows of different ages, an engine-style slot move in between
    rng = np.random.default_rng(3)
    ages = [0, 7, 30, 2, 55]
    big_k, big_v = make_cache(8, cap, ages, rng, np.nan)
    worst, ok = 0.0, True
    for t in range(6):
        if t == 3:  # row 1 finishes: the last row moves into slot 1 (copy up to its length), b shrinks
            last = len(ages) - 1
            big_k[1, :, :ages[last]] = big_k[last, :, :ages[last]]
            big_v[1, :, :ages[last]] = big_v[last, :, :ages[last]]
            big_k[1, :, ages[last]:] = np.nan  # stale tail of the old row
            big_v[1, :, ages[last]:] = np.nan
            ages[1] = ages[last]
            ages.pop()
        q, k, v = new_qkv(len(ages), rng)
        before_k, before_v = big_k.copy(), big_v.copy()
        out, _ = step(sess, big_k, big_v, ages, q, k, v, cap)
        ek, ev = expect_after(before_k, before_v, ages, k, v)
        ok &= same(big_k, ek) and same(big_v, ev)
        ref = reference_attention(q[:, 0].reshape(-1, H, DH), big_k[:len(ages)], big_v[:len(ages)],
                                  [a + 1 for a in ages])
        worst = max(worst, float(np.abs(out.reshape(-1, H, DH) - ref).max()))
        ages = [a + 1 for a in ages]
    check("6 consecutive steps, ragged ages, a finished row replaced by the last slot mid-way",
          ok and worst < 1e-5, f"max err {worst:.1e}")

    # one allocation for all layers: (L, N, H, C, Dh), layer i bound at base + i * N*H*C*Dh*4 bytes,
    # owned by an OrtValue (the same code path a CUDA buffer would take, with 'cuda' as device)
    import onnxruntime as ort
    L, N = 3, 6
    sess3 = session(gqa_self_graph(H, DH, layers=L, total_from_shape=True))
    ages = [4, 0, 9]
    b = len(ages)
    rng = np.random.default_rng(4)
    host_k = rng.standard_normal((L, N, H, cap, DH)).astype(np.float32)
    host_v = rng.standard_normal((L, N, H, cap, DH)).astype(np.float32)
    ov_k = ort.OrtValue.ortvalue_from_numpy(host_k)  # its own copy, on 'cpu'
    ov_v = ort.OrtValue.ortvalue_from_numpy(host_v)
    layer_bytes = N * H * cap * DH * 4
    q, k, v = new_qkv(b, rng)
    binding = sess3.io_binding()
    for name, arr in (("query", q), ("key", k), ("value", v)):
        bind_view(binding, name, arr)
    seqlens = np.asarray(ages, np.int32)
    bind_view(binding, "seqlens_k", seqlens)
    shape = [b, H, cap, DH]
    for i in range(L):
        binding.bind_output(f"output_{i}")
    for i in range(L):
        for kind, ov in (("key", ov_k), ("value", ov_v)):
            ptr = ov.data_ptr() + i * layer_bytes
            binding.bind_input(f"past_{kind}_{i}", "cpu", 0, np.float32, shape, ptr)
            binding.bind_output(f"present_{kind}_{i}", "cpu", 0, np.float32, shape, ptr)
    sess3.run_with_iobinding(binding)
    outs = binding.get_outputs()
    after_k, after_v = ov_k.numpy(), ov_v.numpy()
    ek, ev = host_k.copy(), host_v.copy()
    for i in range(L):
        for r, a in enumerate(ages):
            ek[i, r, :, a] = k[r, 0].reshape(H, DH)
            ev[i, r, :, a] = v[r, 0].reshape(H, DH)
    worst = 0.0
    for i in range(L):
        ref = reference_attention(q[:, 0].reshape(-1, H, DH), ek[i, :b], ev[i, :b], [a + 1 for a in ages])
        worst = max(worst, float(np.abs(outs[i].numpy().reshape(-1, H, DH) - ref).max()))
    check(f"{L} layers in one OrtValue (L,N,H,C,Dh), per-layer pointers data_ptr()+i*{layer_bytes}, "
          "total_sequence_length computed in-graph from past_key_0's shape",
          same(after_k, ek) and same(after_v, ev) and worst < 1e-5, f"max err {worst:.1e}")

    # without aliasing (present not bound to the past): the op copies the whole past into a fresh present
    rng = np.random.default_rng(5)
    ages = [3, 10]
    big_k, big_v = make_cache(4, cap, ages, rng, 0.0)
    q, k, v = new_qkv(2, rng)
    binding = sess.io_binding()
    for name, arr in (("query", q), ("key", k), ("value", v)):
        bind_view(binding, name, arr)
    seqlens = np.asarray(ages, np.int32)
    tot = np.array(cap, np.int32)
    bind_view(binding, "seqlens_k", seqlens)
    bind_view(binding, "total_sequence_length", tot)
    bind_view(binding, "past_key_0", big_k[:2])
    bind_view(binding, "past_value_0", big_v[:2])
    for name in ("output_0", "present_key_0", "present_value_0"):
        binding.bind_output(name)
    before = big_k.copy()
    sess.run_with_iobinding(binding)
    present = binding.get_outputs()[1].numpy()
    check("unshared present: input untouched, present = past[:len] + new entry, zeros after "
          "(a full (B,H,C,Dh) copy every step: aliasing is what makes it in place)",
          same(big_k, before) and present.shape == (2, H, cap, DH)
          and all(np.array_equal(present[r, :, :a], before[r, :, :a]) and not present[r, :, a + 1:].any()
                  for r, a in enumerate(ages)))

    print("\nFAILED:" if FAILED else "\nall checks passed", *FAILED, sep="\n  " if FAILED else "")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
