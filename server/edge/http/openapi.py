"""The native HTTP API's OpenAPI 3.1 description, derived from the nmt.v1 protobuf descriptors.

Derived, not written by hand, so it cannot drift from the messages: each message becomes a
schema in protobuf's JSON mapping (lowerCamelCase names, 64-bit integers as strings, enums as
their value names, repeated fields as arrays, well-known types as their JSON forms).
"""
from __future__ import annotations

import functools

from google.protobuf.descriptor import Descriptor, FieldDescriptor

from protos.nmt.v1 import translator_pb2 as pb

_SCALARS = {
    FieldDescriptor.TYPE_DOUBLE: {"type": "number"}, FieldDescriptor.TYPE_FLOAT: {"type": "number"},
    FieldDescriptor.TYPE_INT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_SINT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_SFIXED32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_UINT32: {"type": "integer", "format": "uint32", "minimum": 0},
    FieldDescriptor.TYPE_FIXED32: {"type": "integer", "format": "uint32", "minimum": 0},
    FieldDescriptor.TYPE_INT64: {"type": "string", "format": "int64"},
    FieldDescriptor.TYPE_SINT64: {"type": "string", "format": "int64"},
    FieldDescriptor.TYPE_SFIXED64: {"type": "string", "format": "int64"},
    FieldDescriptor.TYPE_UINT64: {"type": "string", "format": "uint64"},
    FieldDescriptor.TYPE_FIXED64: {"type": "string", "format": "uint64"},
    FieldDescriptor.TYPE_BOOL: {"type": "boolean"}, FieldDescriptor.TYPE_STRING: {"type": "string"},
    FieldDescriptor.TYPE_BYTES: {"type": "string", "format": "byte"},
}
_ROUTES = (("/v1/translate", "Translate", "Translate texts (documents: plain text or HTML)"),
           ("/v1/translate:stream", "TranslateStream", "Translate one text, streamed as Server-Sent Events"),
           ("/v1/embed", "Embed", "Encoder embeddings of texts"))


def _field_schema(field: FieldDescriptor, schemas: dict) -> dict:
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        _message_schema(field.message_type, schemas)
        one = {"$ref": f"#/components/schemas/{field.message_type.full_name}"}
    elif field.type == FieldDescriptor.TYPE_ENUM:
        one = {"type": "string", "enum": [v.name for v in field.enum_type.values]}
    else:
        one = dict(_SCALARS[field.type])
    if field.is_repeated:
        return {"type": "array", "items": one}
    return one


def _message_schema(message: Descriptor, schemas: dict) -> None:
    if message.full_name in schemas:
        return
    schemas[message.full_name] = {}  # placed first: a message that refers to itself stops here
    properties = {f.json_name: _field_schema(f, schemas) for f in message.fields}
    schemas[message.full_name] = {"type": "object", "properties": properties, "additionalProperties": False}


def _body(message: Descriptor) -> dict:
    return {"application/json": {"schema": {"$ref": f"#/components/schemas/{message.full_name}"}}}


_HISTOGRAM = {"type": "object", "description": "cumulative since start: counts[i] observations <= bounds[i] "
               "seconds; count and sum over all", "properties": {
                   "bounds": {"type": "array", "items": {"type": "number"}},
                   "counts": {"type": "array", "items": {"type": "integer"}},
                   "count": {"type": "integer"}, "sum": {"type": "number"}}}
_STATUS = {"type": "object", "properties": {
    "time": {"type": "number", "description": "the server's clock, Unix seconds"},
    "health": {"type": "object", "properties": {"live": {"type": "string"}, "ready": {"type": "string"}}},
    "engine": {"type": "string", "enum": ["process", "thread"]},
    "replicas": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}, "up": {"type": "boolean"}, "pid": {"type": "integer"}}}},
    "memory": {"type": "array", "description": "every process of the server: its resident memory (VmRSS)",
               "items": {"type": "object", "properties": {
                   "role": {"type": "string", "enum": ["frontend", "replica", "background"]},
                   "name": {"type": "string"}, "pid": {"type": "integer"}, "rssBytes": {"type": "integer"}}}},
    "memoryTotalBytes": {"type": "integer"},
    "models": {"type": "array", "items": {"type": "object", "properties": {
        "name": {"type": "string"}, "version": {"type": "integer"}, "variant": {"type": "string"},
        "provider": {"type": "string"}, "pairs": {"type": "array", "items": {"type": "string"}},
        "running": {"type": "integer"}, "waiting": {"type": "integer"}, "outputTokens": {"type": "integer"},
        "texts": {"type": "integer"}, "latency": _HISTOGRAM, "firstToken": _HISTOGRAM}}}}}


@functools.lru_cache(maxsize=1)
def describe() -> dict:
    schemas: dict = {}
    service = pb.DESCRIPTOR.services_by_name["Translator"]
    paths: dict = {}
    error = {"description": "an error: {\"error\": {\"code\", \"status\", \"message\"}}"}
    for path, rpc, summary in _ROUTES:
        method = service.methods_by_name[rpc]
        _message_schema(method.input_type, schemas)
        _message_schema(method.output_type, schemas)
        reply = ({"text/event-stream": {"schema": {"type": "string", "description": "`data:` lines, each a "
                                                   f"{method.output_type.full_name} in JSON; an `error` event "
                                                   "ends a failed stream"}}}
                 if method.server_streaming else _body(method.output_type))
        paths[path] = {"post": {"operationId": rpc, "summary": summary, "requestBody": {"required": True,
                                                                                       "content": _body(method.input_type)},
                                "responses": {"200": {"description": "OK", "content": reply}, "default": error}}}
    listing = service.methods_by_name["ListModels"]
    _message_schema(listing.output_type, schemas)
    paths["/v1/models"] = {"get": {"operationId": "ListModels", "summary": "The models served",
                                   "responses": {"200": {"description": "OK", "content": _body(listing.output_type)},
                                                 "default": error}}}
    schemas["Status"] = _STATUS
    paths["/v1/status"] = {"get": {"operationId": "Status", "summary": "Health, replicas and the engine's cumulative "
                                   "counters per model (what the status page plots; server/edge/http/status.py)",
                                   "responses": {"200": {"description": "OK", "content": {"application/json": {
                                       "schema": {"$ref": "#/components/schemas/Status"}}}}, "default": error}}}
    for probe, what in (("/healthz", "liveness"), ("/readyz", "readiness (503 while starting or draining)")):
        paths[probe] = {"get": {"summary": what, "responses": {"200": {"description": "OK"},
                                                               "503": {"description": "not ready"}}}}
    return {"openapi": "3.1.0",
            "info": {"title": "nmt-serve native HTTP API", "version": "v1",
                     "description": "The nmt.v1 gRPC messages in protobuf's JSON mapping. Also served: DeepL API v2 "
                                    "(/v2/...) and LibreTranslate (/translate, /languages, /detect) compatible "
                                    "endpoints; see docs/http.md."},
            "components": {"schemas": schemas,
                           "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
            "paths": paths}
