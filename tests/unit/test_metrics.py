"""server/observability/metrics.py's BatchHistogram exposes exactly what prometheus_client's Histogram would."""
import random

import pytest

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.exposition import generate_latest

from server.observability.metrics import STEP_BUCKETS, BatchHistogram

pytestmark = pytest.mark.unit  # the fast layer: `make test-fast`


def samples(registry) -> dict:
    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if not s.name.endswith("_created"):
                out[(s.name, tuple(sorted((k, float(v) if k == "le" else v) for k, v in s.labels.items())))] = s.value
    return out


def test_batch_observations_expose_the_same_histogram():
    rng = random.Random(0)
    values = [rng.choice(STEP_BUCKETS) for _ in range(50)] + [rng.uniform(0, 2) for _ in range(500)] + [5.0, 0.0]
    reference, batched = CollectorRegistry(), CollectorRegistry()
    ref = Histogram("gap_seconds", "gaps", ["model"], buckets=STEP_BUCKETS, registry=reference)
    ours = BatchHistogram("gap_seconds", "gaps", "model", STEP_BUCKETS, registry=batched)
    for v in values:
        ref.labels("m").observe(v)
    ours.labels("m").observe_many(values[:300])  # a step's worth at once, then one by one
    for v in values[300:]:
        ours.labels("m").observe(v)
    ours.labels("m").observe_many([])
    want, got = samples(reference), samples(batched)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert abs(got[key] - value) < 1e-9, key


def test_held_observations_are_counted_when_read_and_when_many_pile_up(monkeypatch):
    """Observations wait in a list until a scrape or FOLD_AT of them: none lost, none counted twice, and
    the same histogram as prometheus_client's across folds, scrapes between observations included."""
    monkeypatch.setattr(BatchHistogram, "FOLD_AT", 7)
    rng = random.Random(1)
    values = [rng.uniform(0, 1.5) for _ in range(200)]
    reference, batched = CollectorRegistry(), CollectorRegistry()
    ref = Histogram("step_seconds", "steps", ["model"], buckets=STEP_BUCKETS, registry=reference)
    ours = BatchHistogram("step_seconds", "steps", "model", STEP_BUCKETS, registry=batched).labels("m")
    for i, v in enumerate(values):
        ref.labels("m").observe(v)
        ours.observe(v)
        if i % 13 == 0:
            samples(batched)  # a scrape between observations
            assert len(ours.pending) == 0
        assert len(ours.pending) < 7
    want, got = samples(reference), samples(batched)
    assert got == pytest.approx(want)
    assert samples(batched) == pytest.approx(want)  # reading again adds nothing


def test_observations_from_several_threads_while_scraped_are_all_counted():
    import threading
    registry = CollectorRegistry()
    child = BatchHistogram("rows", "rows", "model", (1, 2, 4), registry=registry).labels("m")
    start = threading.Barrier(5)

    def observe():
        start.wait()
        for _ in range(20_000):
            child.observe(1)

    threads = [threading.Thread(target=observe) for _ in range(4)]
    for t in threads:
        t.start()
    start.wait()
    while any(t.is_alive() for t in threads):
        samples(registry)  # scrapes racing the observers' appends and folds
    for t in threads:
        t.join()
    assert samples(registry)[("rows_count", (("model", "m"),))] == 80_000
