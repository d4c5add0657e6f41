"""The request options have one spelling: the .proto's DecodingOptions (issue 60). Every other form of them
is checked against it here, so a field added in one place only fails this test instead of being dropped
silently somewhere between the wire and the token choice:
  * the engine's plain struct, server/core/request.py DecodingParams (same names, same order);
  * the frontend -> core message, server/coreprocess/protocol.py Params (built from DecodingParams by name);
  * the edge's conversion, server/edge/servicer.py decoding_params (every field read from the message);
  * the client library's keywords, client/client.py options();
  * the load generator's workload keys, client/loadgen/workload.py OPTION_KEYS.
"""
from __future__ import annotations

import dataclasses
import inspect

import pytest

from client.client import options
from client.loadgen.workload import OPTION_KEYS
from protos.nmt.v1 import translator_pb2 as pb
from server.core.request import DecodingParams
from server.coreprocess import protocol
from server.edge.options import decoding_params

pytestmark = pytest.mark.unit

PROTO = [f.name for f in sorted(pb.DecodingOptions.DESCRIPTOR.fields, key=lambda f: f.number)]
# A value for each field that differs from its default on every side (so a field a conversion drops shows).
SET = {"beam_size": 3, "length_penalty": 0.5, "temperature": 0.7, "top_k": 5, "top_p": 0.9, "seed": 11,
       "max_output_tokens": 21, "num_hypotheses": 2, "repetition_penalty": 1.3, "no_repeat_ngram_size": 3,
       "min_output_tokens": 2, "no_unknown_token": True, "target_prefix": "Ein", "alternatives": 2}


def test_the_engine_struct_and_the_core_message_spell_the_proto_fields_in_its_order():
    assert [f.name for f in dataclasses.fields(DecodingParams)] == PROTO
    assert list(protocol.PARAM_FIELDS) == PROTO


def test_the_test_values_cover_every_field():
    assert sorted(SET) == sorted(PROTO)


def test_every_field_crosses_from_the_client_to_the_engine_and_over_the_core_link():
    message = options(**SET)
    assert sorted(f.name for f, _ in message.ListFields()) == sorted(PROTO)  # the client set every field
    params = decoding_params(message)
    for name, value in SET.items():
        got = getattr(params, name)
        assert got == pytest.approx(value) if isinstance(value, float) else got == value, name
    assert protocol.params_in(protocol.params_out(params)) == params


def test_the_client_and_the_load_generator_name_every_option():
    assert sorted(inspect.signature(options).parameters) == sorted(PROTO)
    assert sorted(OPTION_KEYS) == sorted(PROTO)
