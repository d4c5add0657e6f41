"""Registering the Translator service with deserializers that never raise.

grpc's generated `add_TranslatorServicer_to_server` parses each request with
`Message.FromString`. When that raises (invalid UTF-8 in a string field, a
truncated message, a wrong wire type), grpc answers UNKNOWN "Unexpected
DecodeError" and logs a traceback per call: a hostile or broken client could
flood the log, and the request never reached the servicer, so it was not
counted. Here a payload that does not parse becomes a `Malformed` value
that the servicer turns into INVALID_ARGUMENT through its usual error path.

Sizes: the server's receive limit is one number for every method, but TranslateFile carries a whole
document (up to the file limit, 10 MiB) while --max-request-bytes (4 MiB by default) bounds every
other request.
So the server receives up to the larger of the two, and each method's deserializer refuses a payload
over its own bound unparsed: an `Oversized` value, which the servicer answers RESOURCE_EXHAUSTED as
gRPC itself answers a message over the receive limit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import grpc
from google.protobuf import message as pb_message
from google.protobuf import message_factory

from protos.nmt.v1 import translator_pb2 as pb

SERVICE = pb.DESCRIPTOR.services_by_name["Translator"]


@dataclass(frozen=True)
class Malformed:
    """A request payload that could not be parsed as `type_name`."""
    type_name: str
    reason: str
    size: int


@dataclass(frozen=True)
class Oversized(Malformed):
    """A request payload over its method's size bound, left unparsed (`reason` names the bound)."""


def lenient(cls, max_bytes: Optional[int] = None) -> Callable[[bytes], object]:
    type_name = cls.DESCRIPTOR.full_name

    def parse(data: bytes):
        if max_bytes is not None and len(data) > max_bytes:
            return Oversized(type_name, f"the limit is {max_bytes} bytes", len(data))
        try:
            return cls.FromString(data)
        except pb_message.DecodeError as e:
            # protobuf's message names the type, then the cause ("String field had bad UTF-8").
            return Malformed(type_name, str(e).rsplit(": ", 1)[-1], len(data))
    return parse


def receive_limit(max_bytes: int, max_bytes_of: Mapping[str, int]) -> int:
    """The server's grpc.max_receive_message_length: room for the largest method's bound."""
    return max([max_bytes, *max_bytes_of.values()])


def add_translator_service(servicer, server: grpc.aio.Server, max_bytes: Optional[int] = None,
                           max_bytes_of: Optional[Mapping[str, int]] = None) -> None:
    """Like the generated add_TranslatorServicer_to_server, with lenient request parsing. `max_bytes`: the
    largest request of a method not named in `max_bytes_of` (method name -> its own bound); None: no
    bound but the server's receive limit."""
    handlers = {}
    for method in SERVICE.methods:
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        parse = lenient(request_cls, (max_bytes_of or {}).get(method.name, max_bytes))
        handlers[method.name] = make(getattr(servicer, method.name), request_deserializer=parse,
                                     response_serializer=response_cls.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
    server.add_registered_method_handlers(SERVICE.full_name, handlers)
