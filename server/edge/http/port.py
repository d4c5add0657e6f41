"""The HTTP port: the native JSON API, DeepL- and LibreTranslate-compatible endpoints, and health probes.

Starlette (routing, requests, streamed responses) served by uvicorn, on the server's own event
loop beside grpc.aio: both are asyncio, so the HTTP handlers await the same servicer through the
in-process gateway (server/edge/gateway.py) with no thread hop and no second copy of any state.
Chosen over FastAPI (its value is pydantic models and generated docs; the request shapes here are
protobuf messages and two external APIs with their own quirks, and the OpenAPI description is
derived from the protobuf descriptors) and over aiohttp (uvicorn + Starlette are the most used
ASGI pair, with h11's strict HTTP/1.1 parsing and header size limits).

Probes: GET /healthz is liveness (200 while the engine lives; 503 once the watchdog declared it
failed), GET /readyz is readiness (200 SERVING; 503 while starting, in lame duck and draining),
following the gRPC health states.
"""
from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from typing import Optional

import uvicorn
from grpc_health.v1 import health_pb2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from server.edge.http.deepl import DeepLApi
from server.edge.http.documents import DocumentsApi
from server.edge.http.context import Edge
from server.edge.http.glossaries import GlossaryApi
from server.edge.http.guard import HttpGuard, api_of, error_body
from server.edge.http.libre import LibreTranslateApi
from server.edge.http.native import NativeApi, error_response
from server.edge.http.pages import WebPages
from server.edge.http.status import EngineView, StatusApi

log = logging.getLogger(__name__)
SERVING = health_pb2.HealthCheckResponse.SERVING


class HttpFrontend:
    def __init__(self, edge: Edge, health, cfg, engine: EngineView):
        self.edge, self.health, self.cfg = edge, health, cfg
        self.port = 0
        self._server: Optional[uvicorn.Server] = None
        self._task: Optional[asyncio.Task] = None
        routes = [Route("/healthz", self.healthz, methods=["GET", "HEAD"]),
                  Route("/readyz", self.readyz, methods=["GET", "HEAD"])]
        documents = DocumentsApi(edge, cfg.document_dir or None)  # jobs' spool shared by the frontends
        apis = [NativeApi(edge), StatusApi(edge, engine, self._health), DeepLApi(edge), LibreTranslateApi(edge),
                documents, GlossaryApi(edge)]
        for api in apis + ([WebPages(edge)] if cfg.web_ui else []):
            routes += api.routes()
        # HttpGuard (server/edge/http/guard.py) turns a handler's exception into a counted 500 that keeps the
        # connection; Starlette's own error middleware would send it and then re-raise.
        self.app = Starlette(routes=routes, exception_handlers={404: self._not_found, 405: self._not_allowed},
                             middleware=[Middleware(HttpGuard, max_header_bytes=cfg.http_max_header_bytes,
                                                    count=self._count, budget=edge.admission.budget)])

    # -- probes -------------------------------------------------------------------------
    def _status(self, service: str) -> int:
        return getattr(self.health, "_server_status", {}).get(service, health_pb2.HealthCheckResponse.UNKNOWN)

    def _health(self) -> dict:
        from server.edge.lifecycle import LIVENESS
        word = lambda service: "SERVING" if self._status(service) == SERVING else "NOT_SERVING"  # noqa: E731
        return {"live": word(LIVENESS), "ready": word("")}

    async def healthz(self, request: Request) -> Response:
        from server.edge.lifecycle import LIVENESS
        ok = self._status(LIVENESS) == SERVING
        return self.edge.count("health", "healthz", JSONResponse({"status": "SERVING" if ok else "NOT_SERVING"},
                                                                 status_code=200 if ok else 503))

    async def readyz(self, request: Request) -> Response:
        ok = self._status("") == SERVING
        return self.edge.count("health", "readyz", JSONResponse({"status": "SERVING" if ok else "NOT_SERVING"},
                                                                status_code=200 if ok else 503))

    # -- errors outside any endpoint ------------------------------------------------------
    # In the shape of the API the path belongs to: DeepL's {"message"} on every /v2 and /v3 path (its
    # clients read nothing else), LibreTranslate's {"error"} on its endpoints, the native one elsewhere.
    async def _not_found(self, request: Request, exc) -> Response:
        path = request.url.path
        if api_of(path) == "deepl":
            return _error(path, 404, "NOT_FOUND", f"Not found: this server has no endpoint {path!r} (DeepL's "
                          "/v2/translate, /v2/languages and /v2/usage are served)")
        return error_response(404, "NOT_FOUND", f"no endpoint {path!r}; see /openapi.json")

    async def _not_allowed(self, request: Request, exc) -> Response:
        allowed = getattr(exc, "headers", None) or {}
        return _error(request.url.path, 405, "UNIMPLEMENTED",
                      f"{request.method} is not allowed on {request.url.path!r}", allowed)

    def _count(self, api: str, operation: str, status: int) -> None:
        self.edge.metrics.http_requests.labels(api, operation, str(status)).inc()

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self, host: str, port: int, reuse_port: bool = False) -> int:
        """Serve on host:port; `reuse_port`: several processes listen on it (--frontends), the kernel
        spreads the connections (SO_REUSEPORT, which uvicorn does not set itself)."""
        cfg = self.cfg
        tls = dict(ssl_certfile=cfg.tls_cert_file, ssl_keyfile=cfg.tls_key_file) if cfg.tls_cert_file else {}
        if cfg.tls_cert_file and cfg.tls_client_ca_file:
            tls.update(ssl_ca_certs=cfg.tls_client_ca_file, ssl_cert_reqs=ssl.CERT_REQUIRED)
        config = uvicorn.Config(self.app, host=host, port=port, log_config=None, access_log=False, lifespan="off",
                                timeout_keep_alive=cfg.http_keepalive_s, limit_concurrency=cfg.http_max_connections,
                                h11_max_incomplete_event_size=cfg.http_max_header_bytes, server_header=False, **tls)
        # uvicorn's own INFO lines (started, waiting for connections to close...) say what the server's
        # "serving"/"stopped" events already say, without an event field; its errors still come through.
        logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
        self._server = uvicorn.Server(config)
        # uvicorn's serve() takes over SIGINT/SIGTERM; the server's own handlers drain gRPC and HTTP together.
        self._server.capture_signals = _no_signal_capture
        sockets = [_shared_socket(host, port)] if reuse_port else None
        self._task = asyncio.create_task(self._server.serve(sockets=sockets))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # the bind failed: raise its error
                raise RuntimeError("the HTTP server stopped during start-up")
            await asyncio.sleep(0.01)
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self.port

    async def stop(self) -> None:
        """Stop accepting; requests in flight finish (they are drained with the engine's work)."""
        if self._server is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), 5.0)
        except asyncio.TimeoutError:
            self._server.force_exit = True
            await self._task


def _error(path: str, status: int, code: str, message: str, headers=None) -> Response:
    return Response(error_body(api_of(path), status, code, message), status_code=status, headers=headers,
                    media_type="application/json")


class _NoCapture:
    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        return None


def _no_signal_capture() -> _NoCapture:
    return _NoCapture()


def _shared_socket(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind(address)
    sock.listen(2048)
    sock.set_inheritable(False)
    return sock
