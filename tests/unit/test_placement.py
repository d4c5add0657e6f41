"""server/frontend/cores/placement.py's choice of replica: streams pack one replica's batch unless their model's rows
cost more than the line, every other call goes to the least outstanding work, ties to the first."""
from __future__ import annotations

from dataclasses import dataclass, field

from server.frontend.cores.placement import choose, spreads


@dataclass
class Held:
    """What the rule reads of a replica's link: its jobs in flight and their source tokens."""
    name: str
    jobs: dict = field(default_factory=dict)
    source_tokens: int = 0
    background_jobs: int = 0


def replicas(*loads: tuple[int, int]) -> list[Held]:
    """Replicas holding (jobs, source tokens) each, named r0, r1, ..."""
    return [Held(f"r{i}", {j: None for j in range(n)}, tokens) for i, (n, tokens) in enumerate(loads)]


def test_the_line_spreads_only_what_costs_more_than_it():
    assert spreads(0.0006, 0.5) and not spreads(0.0004, 0.5)
    assert not spreads(0.0005, 0.5)  # at the line: packed (the two layouts cost about the same there)
    assert spreads(1e-9, 0.0) and not spreads(0.0, 0.0)  # 0 spreads every measured model


def test_a_cheap_models_stream_fills_the_first_replica_with_room():
    links = replicas((3, 90), (0, 0))
    assert choose(links, 1, True, 0.0001, 0.5, pack_rows=4).name == "r0"  # room for one more row
    assert choose(links, 2, True, 0.0001, 0.5, pack_rows=4).name == "r1"  # not for two
    assert choose(replicas((4, 90), (4, 10)), 1, True, 0.0001, 0.5, pack_rows=4).name == "r1"  # all full: least work


def test_an_expensive_models_stream_goes_to_the_least_outstanding_work():
    assert choose(replicas((1, 20), (0, 0)), 1, True, 0.002, 0.5, pack_rows=64).name == "r1"
    assert choose(replicas((2, 10), (1, 30)), 1, True, 0.002, 0.5, pack_rows=64).name == "r0"  # tokens, not jobs


def test_calls_without_a_stream_go_to_the_least_outstanding_work_whatever_the_model():
    assert choose(replicas((1, 20), (0, 0)), 32, False, 0.0001, 0.5, pack_rows=64).name == "r1"
    assert choose(replicas((0, 0), (1, 20)), 32, False, 0.0, 1e9, pack_rows=64).name == "r0"


def test_ties_go_to_the_first_replica_every_time():
    links = replicas((0, 0), (0, 0), (0, 0))
    assert [choose(links, 32, False, 0.0, 0.5, 64).name for _ in range(3)] == ["r0"] * 3
    assert choose(replicas((2, 40), (1, 40), (5, 40)), 1, True, 0.002, 0.5, 64).name == "r0"


def test_interactive_calls_keep_off_replicas_holding_background_work_while_another_is_free_of_it():
    links = replicas((3, 10), (1, 500))
    links[0].background_jobs = 2  # a document's sentences, in the replicas (--background-replica false)
    assert choose(links, 32, False, 0.0, 0.5, 64).name == "r1"  # more work, but none of it background
    links[1].background_jobs = 1
    assert choose(links, 32, False, 0.0, 0.5, 64).name == "r0"  # both hold some: the least work
