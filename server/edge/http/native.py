"""The native HTTP API: the nmt.v1 messages in protobuf's JSON mapping (what grpcurl sends and prints).

    POST /v1/translate          TranslateRequest   -> TranslateResponse
    POST /v1/translate:stream   TranslateStreamRequest -> Server-Sent Events, one TranslateStreamResponse each
    POST /v1/embed              EmbedRequest       -> EmbedResponse
    GET  /v1/models             ListModelsResponse
    GET  /openapi.json          this API's OpenAPI 3.1 description, derived from the protobuf descriptors

Field names are lowerCamelCase on output (the JSON mapping's json_name); both spellings are
accepted on input. Errors: `{"error": {"code": <http>, "status": "<gRPC code>", "message": ...}}`
(Google's HTTP mapping of a google.rpc.Status), with the statuses grpc-gateway uses.
"""
from __future__ import annotations

import json
from typing import AsyncIterator

from google.protobuf import json_format
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from protos.nmt.v1 import translator_pb2 as pb
from server.edge.gateway import CallFailed
from server.edge.http.body import BodyError, parse_json, read_body
from server.edge.http.context import Edge, http_status, retry_headers
from server.edge.http.openapi import describe

API = "native"


def error_response(status: int, code: str, message: str, request_id: str = "", headers=None) -> JSONResponse:
    body = {"error": {"code": status, "status": code, "message": message}}
    if request_id:
        body["error"]["requestId"] = request_id
    return JSONResponse(body, status_code=status, headers=headers)


def failed(e: CallFailed, request_id: str) -> JSONResponse:
    headers = retry_headers(e)
    return error_response(http_status(e.code), e.code.name, e.message, request_id, headers)


def to_json(message) -> dict:
    return json_format.MessageToDict(message)


class NativeApi:
    def __init__(self, edge: Edge):
        self.edge = edge

    def routes(self) -> list[Route]:
        return [Route("/v1/translate", self.translate, methods=["POST"]),
                Route("/v1/translate:stream", self.translate_stream, methods=["POST"]),
                Route("/v1/embed", self.embed, methods=["POST"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/openapi.json", self.openapi, methods=["GET"])]

    async def _parse(self, request: Request, cls):
        body = await read_body(request, self.edge.max_body_bytes, self.edge.body_timeout_s)
        kind = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
        # `curl -d '{...}'` labels JSON as a form: a body that is a JSON object is read as one.
        curl = kind == "application/x-www-form-urlencoded" and body.lstrip()[:1] == b"{"
        if kind not in ("application/json", "") and not curl:
            raise BodyError(415, f"unsupported content type {kind!r}: send application/json")
        fields = parse_json(body) if body.strip() else {}  # the body limits every API shares (depth, numbers)
        try:
            return json_format.ParseDict(fields, cls())
        except json_format.ParseError as e:
            raise BodyError(400, f"not a valid {cls.DESCRIPTOR.full_name}: {e}") from None

    async def _unary(self, request: Request, method: str, cls) -> Response:
        caller = self.edge.caller(request)
        try:
            message = await self._parse(request, cls)
            response = await self.edge.gateway.unary(method, message, caller)
        except BodyError as e:
            return self.edge.count(API, method, error_response(e.status, "INVALID_ARGUMENT" if e.status != 413
                                                               else "RESOURCE_EXHAUSTED", e.message))
        except CallFailed as e:
            return self.edge.count(API, method, failed(e, caller.request_id))
        return self.edge.count(API, method, JSONResponse(to_json(response),
                                                         headers={"x-request-id": caller.request_id}))

    async def translate(self, request: Request) -> Response:
        return await self._unary(request, "Translate", pb.TranslateRequest)

    async def embed(self, request: Request) -> Response:
        return await self._unary(request, "Embed", pb.EmbedRequest)

    async def models(self, request: Request) -> Response:
        caller = self.edge.caller(request)
        try:
            response = await self.edge.gateway.unary("ListModels", pb.ListModelsRequest(), caller)
        except CallFailed as e:
            return self.edge.count(API, "ListModels", failed(e, caller.request_id))
        return self.edge.count(API, "ListModels", JSONResponse(to_json(response)))

    async def openapi(self, request: Request) -> Response:
        return JSONResponse(describe())

    async def translate_stream(self, request: Request) -> Response:
        """Server-Sent Events. A request that fails before its first message (bad input, no key) gets an
        ordinary error response; a failure later arrives as an `error` event and ends the stream."""
        caller = self.edge.caller(request)
        try:
            message = await self._parse(request, pb.TranslateStreamRequest)
        except BodyError as e:
            return self.edge.count(API, "TranslateStream", error_response(e.status, "INVALID_ARGUMENT", e.message))
        stream = self.edge.gateway.stream("TranslateStream", message, caller)
        try:
            first = await stream.__anext__()
        except CallFailed as e:
            return self.edge.count(API, "TranslateStream", failed(e, caller.request_id))

        async def events() -> AsyncIterator[bytes]:
            try:
                yield _event(to_json(first))
                async for item in stream:
                    yield _event(to_json(item))
            except CallFailed as e:
                yield _event({"error": {"code": http_status(e.code), "status": e.code.name, "message": e.message}},
                             "error")
            finally:
                await stream.aclose()
        headers = {"x-request-id": caller.request_id, "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        return self.edge.count(API, "TranslateStream",
                               StreamingResponse(events(), media_type="text/event-stream", headers=headers))


def _event(data: dict, name: str = "") -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n".encode()

