"""server/frontend/cores/placement.py: the decode step's cost per row, measured through a real engine loop over
the shipped model, and the line that decides whether a model's calls pack one replica or spread."""
from __future__ import annotations

import pytest

from models.core.bundle import load_bundle, newest_version
from server.config import ServerConfig
from server.frontend.cores import placement
from server.frontend.hosted import HostedModel
from server.observability.metrics import Metrics
from tests.serving import REPOSITORY

BUNDLE = newest_version(REPOSITORY / "multi30k-en-de-small")


@pytest.fixture
def hosted(request):
    """The engine (ModelEngine) of a HostedModel of the shipped en-de model, its loop running, `request.param` slots."""
    # the shared thread pool, as the other tests of this process made it (ONNX Runtime has one per process)
    cfg = ServerConfig(model_repository=str(REPOSITORY), provider="cpu", max_batch_size=request.param,
                       warmup=False, runaway_guard=False, ort_spinning="true")
    model = HostedModel(load_bundle(BUNDLE), cfg, Metrics())
    model.here.start()
    yield model.here
    model.here.stop(5)


@pytest.mark.parametrize("hosted", [4], indirect=True)
def test_the_step_is_timed_with_exactly_the_rows_asked_for_and_leaves_the_cache_empty(hosted):
    steps, widths = [], []
    decode = hosted.engine.decode_step

    def counted(*args, **kwargs):  # the loop's own step, watched: how many rows each one ran
        widths.append(hosted.cache.used)
        steps.append(1)
        return decode(*args, **kwargs)
    hosted.engine.decode_step = counted
    seconds = placement._step_seconds(hosted, 3, 5)
    assert seconds > 0.0
    assert widths == [3] * 5  # three jobs, each forced to exactly five tokens: five steps of three rows
    assert hosted.cache.used == 0 and hosted.scheduler.idle
    cost = placement.measure_row_cost(hosted, rows=4, steps=4, tries=1)
    assert isinstance(cost, float) and cost >= 0.0
    assert widths[5:] == [1] * 4 + [4] * 4  # then one row, then the batch's width (at most `rows`)


@pytest.mark.parametrize("hosted", [1], indirect=True)
def test_a_batch_of_one_row_has_nothing_to_spread_and_runs_nothing(hosted):
    submitted = []
    hosted.scheduler.submit = submitted.append
    assert placement.measure_row_cost(hosted) == 0.0
    assert submitted == []
