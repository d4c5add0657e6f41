"""benchmarks/host_bound.py's model and measurement against a real server: the near-free model the exporter
builds decodes exactly the asked number of tokens (EOS held back), batched and streamed alike, and one short
level's figures come back whole, the server's CPU split by process kind."""
from __future__ import annotations

import pytest

from benchmarks import host_bound
from benchmarks.harness import ServerProcess
from client.client import TranslatorClient
from tests.serving import flickr_sentences


@pytest.fixture(scope="module")
def repository(tmp_path_factory):
    root = tmp_path_factory.mktemp("host-bound") / "repository"
    target = host_bound.build_bundle(root)
    assert target == root / host_bound.MODEL / "1" and (target / "decoder_inplace.onnx").exists()
    return root


def test_the_near_free_model_runs_every_request_to_its_limit(repository):
    texts = flickr_sentences(6)
    with ServerProcess("--model-repository", str(repository), "--runaway-guard", "false", metrics=False) as server, \
            TranslatorClient(server.target, timeout=60) as client:
        out = client.translate(texts, max_output_tokens=12, return_tokens=True).translations
        assert [t.output_tokens for t in out] == [12] * len(texts)
        assert all(t.finish_reason == out[0].finish_reason for t in out)
        for text, batched in zip(texts[:3], out):
            messages = list(client.translate_stream(text, max_output_tokens=12))
            streamed = [i for m in messages for i in m.token_ids]
            assert streamed == list(batched.hypotheses[0].token_ids)  # a stream = the batched call
            assert messages[-1].final and messages[-1].output_tokens == 12
            # (How many messages carry them is the reader's speed: a client slower than the 12 steps gets
            # them merged. That the first token goes alone is tests/unit/test_engine_visits.py's, which
            # drives the loop itself.)


def test_a_level_reports_tokens_and_the_cpu_of_every_process_kind(repository):
    figures = host_bound.serve_side(host_bound.ROOT, repository, [], ["stream:4"], 2.0, 8)["stream:4"]
    assert figures["errors"] == 0 and figures["tokens_per_s"] > 0
    # The default layout: the frontend and the engine core process both worked for the level.
    assert figures["frontend_us_per_token"] > 0 and figures["engine core_us_per_token"] > 0
    assert figures["server_us_per_token"] == pytest.approx(figures["frontend_us_per_token"]
                                                           + figures["engine core_us_per_token"])
    assert figures["client_us_per_token"] > 0
