"""server/eventloop.py: which asyncio loop the frontends run on, and that each choice runs one."""
from __future__ import annotations

import asyncio

import pytest

from server import eventloop
from server.config import ServerConfig


async def running_loop_name() -> str:
    await asyncio.sleep(0)
    return eventloop.name_of(asyncio.get_running_loop())


def test_auto_is_uvloop_where_it_is_installed():
    pytest.importorskip("uvloop")  # the serve extra installs it; this checks the choice, not the package
    assert eventloop.resolve("auto") == "uvloop"
    assert eventloop.run(running_loop_name(), "auto") == "uvloop"


@pytest.mark.parametrize("choice", ["asyncio", "uvloop"])
def test_each_choice_runs_its_own_loop(choice):
    if choice == "uvloop":
        pytest.importorskip("uvloop")
    assert eventloop.run(running_loop_name(), choice) == choice


def test_a_coroutine_result_and_its_exception_come_back():
    async def fails():
        raise KeyError("x")
    assert eventloop.run(asyncio.sleep(0, result=7), "auto") == 7
    with pytest.raises(KeyError):
        eventloop.run(fails(), "auto")


def test_an_unknown_choice_is_a_config_problem():
    problems = ServerConfig(event_loop="tokio").problems()
    assert any("--event-loop must be one of auto, uvloop, asyncio" in p for p in problems)
    assert not any("--event-loop" in p for p in ServerConfig().problems())
