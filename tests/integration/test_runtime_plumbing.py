"""The serving runtime's plumbing: the engine->asyncio event relay and the shared ONNX Runtime pool."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from server.core.relay import EventRelay

ROOT = Path(__file__).resolve().parents[2]


def test_relay_keeps_order_and_coalesces_wakeups():
    async def main():
        loop = asyncio.get_running_loop()
        relay = EventRelay(loop)
        got: list[int] = []
        done = asyncio.Event()

        def receive(value: int) -> None:
            got.append(value)
            if value == 999:
                done.set()

        sink = relay.sink(receive)

        def engine() -> None:  # one "step" posts many events while the loop is busy elsewhere
            for i in range(1000):
                sink(i)
        t = threading.Thread(target=engine)
        t.start()
        t.join()  # nothing was delivered yet: the loop has not run since
        await asyncio.wait_for(done.wait(), 5)
        return got, relay.wakeups
    got, wakeups = asyncio.run(main())
    assert got == list(range(1000))
    assert wakeups == 1  # all 1000 events rode on one wake-up of the loop


def test_engine_thread_wakes_the_loop_once_per_step():
    from server.core import relay as relay_mod

    async def main():
        relay = EventRelay(asyncio.get_running_loop())
        got: list[int] = []
        sink = relay.sink(got.append)
        wakeups_before_flush = []

        def engine() -> None:
            relay_mod.hold_wakeups()
            for step in range(3):
                for i in range(10):
                    sink(10 * step + i)
                wakeups_before_flush.append(relay.wakeups)
                relay_mod.flush()
                # The next step starts once the loop has drained this one (waiting for that state,
                # not for a time: a busy machine may take any while to run the loop).
                end = time.monotonic() + 10
                while len(got) < 10 * (step + 1) and time.monotonic() < end:
                    time.sleep(0.001)
        t = threading.Thread(target=engine)
        t.start()
        while t.is_alive():
            await asyncio.sleep(0.01)
        return got, relay.wakeups, wakeups_before_flush
    got, wakeups, before = asyncio.run(main())
    assert got == list(range(30))
    assert before == [0, 1, 2]  # nothing wakes the loop until the step flushes
    assert wakeups == 3  # one per step


def test_relay_survives_a_failing_consumer():
    async def main():
        relay = EventRelay(asyncio.get_running_loop())
        got: list[str] = []

        def broken(_):
            raise ValueError("consumer bug")
        relay.post(broken, None)
        relay.post(got.append, "after")
        for _ in range(500):  # until the relay delivered (a state to wait for, not a time)
            if got:
                break
            await asyncio.sleep(0.01)
        return got
    assert asyncio.run(main()) == ["after"]


def test_sessions_share_one_process_wide_pool():
    # A fresh interpreter: the pool can only be created before ONNX Runtime starts.
    code = """
import os
import numpy as np
from models.core.bundle import discover
from models.core.runtime import OnnxModel, RuntimeOptions
bundle = discover("model_repository")[0]
threads = lambda: len(os.listdir("/proc/self/task"))  # noqa: E731
before = threads()
a = OnnxModel(bundle, RuntimeOptions(provider="cpu", intra_op_threads=2))
b = OnnxModel(bundle, RuntimeOptions(provider="cpu", intra_op_threads=2))
# Four sessions, one pool: one worker thread in all (per-session pools would start four).
assert threads() - before == 1, threads() - before
ids, mask = np.array([[5, 6, 7]]), np.ones((1, 3), bool)
assert np.array_equal(a.encode(ids, mask)[0], b.encode(ids, mask)[0])
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_ort_spinning_false_gives_each_session_its_own_sleeping_pool():
    # `--ort-spinning false` (NMT_ORT_SPINNING): per-session pools whose workers do not spin; a fresh
    # interpreter, as the process-wide pool can only be chosen before ONNX Runtime starts.
    code = """
import os
import models.core.runtime  # ONNX Runtime loaded first (the model imports it on demand): its own threads
from models.core.bundle import discover
from server.config import ServerConfig
from server.frontend.hosted import HostedModel
from server.observability.metrics import Metrics
cfg = ServerConfig.from_args(["--model-repository", "model_repository", "--intra-op-threads", "2"])
assert cfg.spinning is False, cfg.ort_spinning
threads = lambda: len(os.listdir("/proc/self/task"))  # noqa: E731
before = threads()
model = HostedModel(discover("model_repository")[0], cfg, Metrics())
opts = model.here.runtime.opts
assert (opts.shared_pool, opts.allow_spinning) == (False, False)
# Two sessions (encoder, in-place step), a one-worker pool each: two threads, not the shared pool's one.
assert threads() - before == 2, threads() - before
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "NMT_ORT_SPINNING": "false"})
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_encoder_groups_bound_padding_and_keep_every_text():
    import random

    from server.core.engine import length_groups
    rng = random.Random(0)
    for _ in range(200):
        lengths = [rng.randint(1, 60) for _ in range(rng.randint(1, 40))]
        groups = length_groups(lengths, 0.15)
        assert sorted(i for g in groups for i in g) == list(range(len(lengths)))
        for g in groups:
            longest, real = max(lengths[i] for i in g), sum(lengths[i] for i in g)
            assert len(g) == 1 or real >= 0.85 * longest * len(g)
    assert length_groups([7, 7, 7, 7], 0.0) == [[0, 1, 2, 3]]  # equal lengths: one pass
