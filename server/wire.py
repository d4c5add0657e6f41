"""Registering the Translator service with deserializers that never raise.

grpc's generated `add_TranslatorServicer_to_server` parses each request with
`Message.FromString`. When that raises (invalid UTF-8 in a string field, a
truncated message, a wrong wire type), grpc answers UNKNOWN "Unexpected
DecodeError" and logs a traceback per call: a hostile or broken client could
flood the log, and the request never reached the servicer, so it was not
counted. Here a payload that does not parse becomes a `Malformed` value
that the servicer turns into INVALID_ARGUMENT through its usual error path.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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


def lenient(cls) -> Callable[[bytes], object]:
    type_name = cls.DESCRIPTOR.full_name

    def parse(data: bytes):
        try:
            return cls.FromString(data)
        except pb_message.DecodeError as e:
            # protobuf's message names the type, then the cause ("String field had bad UTF-8").
            return Malformed(type_name, str(e).rsplit(": ", 1)[-1], len(data))
    return parse


def add_translator_service(servicer, server: grpc.aio.Server) -> None:
    """Like the generated add_TranslatorServicer_to_server, with lenient request parsing."""
    handlers = {}
    for method in SERVICE.methods:
        request_cls = message_factory.GetMessageClass(method.input_type)
        response_cls = message_factory.GetMessageClass(method.output_type)
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(getattr(servicer, method.name), request_deserializer=lenient(request_cls),
                                     response_serializer=response_cls.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE.full_name, handlers),))
    server.add_registered_method_handlers(SERVICE.full_name, handlers)
