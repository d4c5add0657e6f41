"""One request never fails another, through a real server and the shipped model (issue 33).

Before the fix, a `temperature` of 1e-45 (accepted by admission) made token choice raise and the
engine failed every request in the batch with INTERNAL. Here requests with every extreme-but-accepted
setting are held in the queue together with ordinary ones (the engine gated, so they are admitted
into one batch, not by timing luck), then decoded side by side: every call succeeds and each
ordinary output equals its output at rest. The same in the engine-core process layout
(tests/system/test_engine_core.py runs these requests there).
"""
from __future__ import annotations

import threading

import pytest

from client.client import TranslatorClient
from tests.serving import EngineGate, flickr_sentences, wait_for

MODEL = "multi30k-en-de-small"
# Every decoding setting at the edges of what admission accepts (docs/api.md), alone and mixed.
EXTREME = [dict(temperature=1e-45, seed=1), dict(temperature=5e-324, seed=2), dict(temperature=1e-38, seed=3),
           dict(temperature=100.0, seed=4), dict(temperature=1.0, top_p=1e-9, seed=5),
           dict(temperature=0.7, top_k=1_000_000, top_p=1.0, seed=6),
           dict(repetition_penalty=5e-324), dict(repetition_penalty=10.0, no_repeat_ngram_size=10),
           dict(min_output_tokens=60, max_output_tokens=60, no_unknown_token=True),
           dict(beam_size=4, repetition_penalty=1e-300, no_repeat_ngram_size=1),
           dict(beam_size=4, num_hypotheses=4, min_output_tokens=40, length_penalty=10.0),
           dict(alternatives=4), dict(temperature=1e-45, num_hypotheses=4, seed=7),
           dict(temperature=50.0, repetition_penalty=1e-300, no_repeat_ngram_size=1, min_output_tokens=30, seed=8)]


def extreme_calls(client: TranslatorClient, text: str) -> list:
    """Each extreme request's response (raises on any failure)."""
    return [client.translate([text], model=MODEL, timeout=120, **kw) for kw in EXTREME]


@pytest.fixture(scope="module")
def srv(shipped_server):
    return shipped_server


def test_extreme_settings_in_the_batch_leave_ordinary_outputs_unchanged(srv):
    ordinary = flickr_sentences(8)
    with TranslatorClient(srv.target, retries=0) as client:
        at_rest = [t.hypotheses[0].text for t in client.translate(ordinary, model=MODEL, timeout=120).translations]
        model = srv.app.models[MODEL]
        results: dict = {}
        errors: list = []

        def run(name, fn):
            try:
                results[name] = fn()
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append((name, e))

        with EngineGate(model) as gate:
            callers = [threading.Thread(target=run, args=(f"extreme-{i}", lambda kw=kw: client.translate(
                ["A little girl climbs into a wooden playhouse."], model=MODEL, timeout=120, **kw)))
                for i, kw in enumerate(EXTREME)]
            callers.append(threading.Thread(target=run, args=("ordinary", lambda: client.translate(
                ordinary, model=MODEL, timeout=120))))
            for t in callers:
                t.start()
            # Everything queued before the engine may take any of it: one admission, one batch.
            texts = len(EXTREME) + len(ordinary)
            assert wait_for(lambda: len(model.here.scheduler.waiting) == texts or errors, timeout=60), errors
            gate.open()
            for t in callers:
                t.join(120)
    assert not errors, errors
    assert [t.hypotheses[0].text for t in results["ordinary"].translations] == at_rest
    for i, kw in enumerate(EXTREME):
        hyps = results[f"extreme-{i}"].translations[0].hypotheses
        assert hyps and all(h.text is not None for h in hyps), kw
