"""server/metrics.py's BatchHistogram exposes exactly what prometheus_client's Histogram would."""
import random

import pytest

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.exposition import generate_latest

from server.metrics import STEP_BUCKETS, BatchHistogram

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
