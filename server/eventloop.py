"""The frontend's asyncio event loop: uvloop where it is installed, asyncio's own loop otherwise.

Measured problem: on a 2-core host at 64 streams the frontend process's loop thread is where every
streamed token's Python runs (grpc.aio's callbacks and writes, our handlers, ZeroMQ's readiness, the
inbox queues), 0.8-0.9 of a core, and asyncio's own machinery (a selector round, a Handle per callback,
Future and Queue wake-ups) is a fifth of it (py-spy, docs/serving_speed.md). uvloop runs the same
machinery in C on libuv: the numbers it is the default for are in docs/serving_speed.md ("The frontend's
event loop").

Everything above the loop is the same code on both: grpc.aio supports any asyncio loop (its poller thread
hands completions over with call_soon_threadsafe), pyzmq's asyncio sockets watch their file descriptor
with add_reader, and uvicorn serves on whatever loop is running. `--event-loop asyncio` keeps the
standard loop (a second implementation is a dependency some deployments will not want); the whole test
suite runs on the default, and tests/system/test_event_loop.py serves on both.

The engine core processes do not run an event loop (a ZeroMQ poll on their main thread), so this is the
frontends' choice alone: the primary's and every extra frontend process's.
"""
from __future__ import annotations

import asyncio
import importlib.util
from typing import Any, Callable, Coroutine, Optional

CHOICES = ("auto", "uvloop", "asyncio")


def available() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve(choice: str) -> str:
    """"auto" -> "uvloop" where it is installed, else "asyncio"; the others as given (uvloop must be there)."""
    if choice not in CHOICES:
        raise ValueError(f"--event-loop must be one of {', '.join(CHOICES)} (got {choice!r})")
    if choice == "auto":
        return "uvloop" if available() else "asyncio"
    if choice == "uvloop" and not available():
        raise ValueError("--event-loop uvloop: the uvloop package is not installed (pip install uvloop)")
    return choice


def factory(choice: str) -> Optional[Callable[[], asyncio.AbstractEventLoop]]:
    """A loop factory for asyncio.Runner; None = asyncio's default loop."""
    if resolve(choice) == "uvloop":
        import uvloop
        return uvloop.new_event_loop
    return None


def run(main: Coroutine[Any, Any, Any], choice: str) -> Any:
    """asyncio.run(main) on the loop `choice` names."""
    with asyncio.Runner(loop_factory=factory(choice)) as runner:
        return runner.run(main)


def name_of(loop: asyncio.AbstractEventLoop) -> str:
    """What a running loop is, for the "serving" log line and the server's info metric."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"
