"""The frontends' event loop (server/eventloop.py): `python -m server` on uvloop (the default where it is
installed) and on asyncio's own loop (`--event-loop asyncio`) serve the same tokens, unary and streamed,
over many concurrent calls, and say in their "serving" log line which loop they run.

The rest of the suite runs on the default: every subprocess server, and the in-process ServerThread
(tests/serving.py runs it on the configured loop)."""
from __future__ import annotations

import concurrent.futures as cf
import json

import pytest

from benchmarks.harness import ServerProcess
from client.client import TranslatorClient
from server import eventloop
from tests.serving import flickr_sentences

TEXTS = flickr_sentences(48)[:48]


def serving_event(log_path) -> dict:
    events = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines()
              if line.startswith("{") and '"event": "serving"' in line]
    assert len(events) == 1, events
    return events[0]


def served_tokens(target: str) -> tuple[list[list[int]], list[list[int]]]:
    """Every text's tokens from one unary call of all of them, and from a stream of each, eight at a time."""
    with TranslatorClient(target, timeout=120) as client:
        unary = [list(t.hypotheses[0].token_ids) for t in
                 client.translate(TEXTS, return_tokens=True).translations]

        def stream(text: str) -> list[int]:
            return [t for message in client.translate_stream(text) for t in message.token_ids]
        with cf.ThreadPoolExecutor(8) as pool:
            streamed = list(pool.map(stream, TEXTS))
    return unary, streamed


@pytest.fixture(scope="module")
def by_loop(tmp_path_factory):
    out = {}
    for choice in ("auto", "asyncio"):
        log_path = tmp_path_factory.mktemp("event-loop") / f"{choice}.log"
        server = ServerProcess("--event-loop", choice, "--log-format", "json", metrics=False,
                               log_path=log_path).start(timeout=120)
        try:
            out[choice] = (serving_event(log_path)["event_loop"], *served_tokens(server.target))
        finally:
            server.stop()
    return out


def test_the_serving_line_names_the_loop(by_loop):
    assert by_loop["auto"][0] == eventloop.resolve("auto")
    assert by_loop["asyncio"][0] == "asyncio"


def test_both_loops_serve_the_same_tokens_unary_and_streamed(by_loop):
    _, unary, streamed = by_loop["asyncio"]
    assert all(unary) and streamed == unary
    _, unary_default, streamed_default = by_loop["auto"]
    assert unary_default == unary and streamed_default == unary
