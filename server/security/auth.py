"""API-key authentication, model permissions and rate limits for every RPC: one grpc.aio interceptor.

An interceptor sees every method of every service registered on the server, including
ones added later, so nothing is served unchecked by omission. Per call:

1. The key comes from the `authorization: Bearer KEY` metadata. No key or an unknown one:
   UNAUTHENTICATED, answered by a stand-in handler that never parses the request.
   grpc.health.v1 and reflection skip this unless --auth-health-and-reflection: load
   balancers and kubelets probe health without credentials.
2. Translator calls run through a wrapper of the servicer's method, which sees the parsed
   request: the model it would run on (the default model when it names none) must be one
   the key allows (else PERMISSION_DENIED), and the key's rate limits must admit the
   estimated cost (else RESOURCE_EXHAUSTED with google.rpc.RetryInfo, ratelimit.py).
3. The wrapper sets CALLER_KEY_ID before the servicer runs. grpc.aio runs each RPC in its
   own task and context, and the wrapper awaits the servicer in that same task, so the
   servicer (TranslatorService._guard, an access log) reads the id, and no other call ever
   sees it. It is not reset when the call ends, so an interceptor outside this one can
   still read it after the call.

Keys never leave this module: logs and metrics name the key id only, and the refusal
messages name the key id (a client may hold several) but never echo what was sent.
"""
from __future__ import annotations

import inspect
import logging
import time
from typing import Callable, Optional

import grpc
from google.rpc import error_details_pb2

from server.core.errors import bounded, shown
from server.observability.calls import CALLER_KEY_ID
from server.security.keys import ApiKey, KeyStore
from server.security.ratelimit import Cost, RateLimiter, Refusal, estimate, reported
from server.edge.retry import DETAILS_KEY, retry_status
from server.edge.wire import Malformed

log = logging.getLogger(__name__)

# CALLER_KEY_ID (server/observability/calls.py): the authenticated caller's key id for the current RPC, set
# here; "" when the call carried no key (an open health check) or auth is off.

OPEN_SERVICES = ("grpc.health.v1.Health", "grpc.reflection.v1alpha.ServerReflection",
                 "grpc.reflection.v1.ServerReflection")
OTHER = "other"  # the key_id label of ids beyond the label cap (keys.py reserves it)


def bearer_key(metadata) -> Optional[str]:
    """The key of the first `authorization` entry if it is `Bearer KEY`, else None."""
    for name, value in metadata or ():
        if name == "authorization":
            if isinstance(value, bytes):
                return None
            scheme, _, key = value.strip().partition(" ")
            if scheme.lower() != "bearer":
                return None
            return key.strip() or None
    return None


class KeyLabels:
    """Bounded label values: the first `cap` key ids seen keep their own label, later ones
    are counted as "other". A key file of thousands of ids must not become thousands of
    time series in every scrape."""

    def __init__(self, cap: int):
        self.cap, self.seen = cap, set()

    def __call__(self, key_id: str) -> str:
        if not key_id or key_id in self.seen:
            return key_id
        if len(self.seen) < self.cap:
            self.seen.add(key_id)
            return key_id
        return OTHER


class LogThrottle:
    """At most one line per event kind per `interval` seconds: a client hammering with a bad key
    or past its limit must not flood the log. Returns None to drop a line, else how many were
    dropped since the last one. Kinds are bounded (results x key ids of the file)."""

    def __init__(self, interval: float = 10.0, clock: Callable[[], float] = time.monotonic):
        self.interval, self.clock = interval, clock
        self.last: dict[tuple, float] = {}
        self.dropped: dict[tuple, int] = {}

    def __call__(self, kind: tuple) -> Optional[int]:
        now = self.clock()
        if kind in self.last and now - self.last[kind] < self.interval:
            self.dropped[kind] = self.dropped.get(kind, 0) + 1
            return None
        self.last[kind] = now
        return self.dropped.pop(kind, 0)


def retry_metadata(message: str, refusal: Refusal, key_id: str) -> tuple:
    """Trailing metadata holding a google.rpc.Status with RetryInfo and QuotaFailure (AIP-193):
    clients (and grpc-status's rpc_status.from_call) read the wait from there, not the text."""
    status = retry_status(message, refusal.retry_after)
    quota = error_details_pb2.QuotaFailure()
    quota.violations.add(subject=f"api_key:{key_id}", description=f"{refusal.limit} {refusal.per_minute}/min")
    status.details.add().Pack(quota)
    return ((DETAILS_KEY, status.SerializeToString()),)


class _Settling:
    """The servicer context, passed through, remembering the cost reported by the stream's final
    message (the Translator stream writes with context.write)."""

    def __init__(self, context, method: str):
        self._context, self._method, self.actual = context, method, None

    def __getattr__(self, name):
        return getattr(self._context, name)

    async def write(self, message) -> None:
        self.actual = reported(self._method, message) or self.actual
        await self._context.write(message)


def _stand_in(handler: grpc.RpcMethodHandler, refuse: Callable) -> grpc.RpcMethodHandler:
    """A handler of the same shape that only calls `refuse(context)`; no deserializer, so a request
    from an unauthenticated caller is never parsed."""
    async def behavior(request_or_iterator, context):
        await refuse(context)
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(behavior)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(behavior)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(behavior)
    return grpc.unary_unary_rpc_method_handler(behavior)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    """resolve_model(name, source_language, target_language, texts) -> the model the service would use
    (texts: a request without a source language is routed by the language they are in)."""

    def __init__(self, keys: KeyStore, metrics, service_name: str, resolve_model: Callable[..., str],
                 limiter: Optional[RateLimiter] = None, protect_open_services: bool = False, max_key_labels: int = 100):
        self.keys, self.metrics, self.service_name = keys, metrics, service_name
        self.resolve_model, self.limiter = resolve_model, limiter or RateLimiter()
        self.protect_open_services = protect_open_services
        self.labels = KeyLabels(max_key_labels)
        self.throttle = LogThrottle()

    def _count(self, key_id: str, result: str) -> None:
        self.metrics.auth_requests.labels(self.labels(key_id), result).inc()

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        if handler is None:
            return None  # unknown method: gRPC answers UNIMPLEMENTED
        service, _, method = details.method.lstrip("/").rpartition("/")
        translator = service == self.service_name
        if not translator and service in OPEN_SERVICES and not self.protect_open_services:
            return handler
        sent = bearer_key(details.invocation_metadata)
        key = self.keys.find(sent) if sent is not None else None
        if key is None:
            return _stand_in(handler, self._unauthenticated(method if translator else None, sent is not None))
        if not translator:
            self._count(key.key_id, "ok")
            return handler
        return self._guarded(handler, method, key)

    def _unauthenticated(self, rpc: Optional[str], invalid: bool):
        message = "invalid API key" if invalid else "missing API key: send metadata 'authorization: Bearer KEY'"

        async def refuse(context):
            self._count("", "unauthenticated")
            if rpc:  # Translator RPCs are all counted in nmt_requests_total, as the servicer would
                self.metrics.requests.labels(rpc, "UNAUTHENTICATED").inc()
            if (dropped := self.throttle(("unauthenticated", invalid))) is not None:
                log.warning("auth: %s from %s%s", "invalid API key" if invalid else "no API key", context.peer(),
                            f" ({dropped} more since the last such line)" if dropped else "")
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        return refuse

    async def _refuse(self, context, rpc: str, key: ApiKey, result: str, code: grpc.StatusCode, message: str,
                      note: str, trailing: tuple = ()) -> None:
        self._count(key.key_id, result)
        self.metrics.requests.labels(rpc, code.name).inc()
        if (dropped := self.throttle((result, key.key_id))) is not None:
            log.warning("auth: key %s: %s%s", key.key_id, note, f" ({dropped} more since the last such line)"
                        if dropped else "")
        await context.abort(code, message, trailing_metadata=trailing)

    async def _admit(self, context, rpc: str, key: ApiKey, request) -> Optional[Cost]:
        """Model permission and rate limits; returns the charged estimate (None: nothing to settle)."""
        parsed = not isinstance(request, Malformed)  # a malformed request goes on to INVALID_ARGUMENT
        if parsed and key.models is not None and hasattr(request, "model"):
            texts = list(getattr(request, "texts", ())) or [getattr(request, "text", "")]
            model = self.resolve_model(request.model, getattr(request, "source_language", ""),
                                       getattr(request, "target_language", ""), texts)
            if not key.allows(model):
                message = bounded(f"API key {key.key_id!r} may not use model {shown(model)}; "
                                  f"it may use {sorted(key.models)}")
                await self._refuse(context, rpc, key, "permission_denied", grpc.StatusCode.PERMISSION_DENIED,
                                   message, f"refused model {shown(model)} on {rpc}")
        if not key.limits.any:
            return None
        cost = estimate(rpc, request) if parsed else Cost(1)
        refusal = self.limiter.admit(key, cost)
        if refusal is not None:
            message = bounded(f"rate limit of API key {key.key_id!r} reached ({refusal.limit} "
                              f"{refusal.per_minute}/min); retry in {refusal.retry_after:.3f} s")
            await self._refuse(context, rpc, key, "rate_limited", grpc.StatusCode.RESOURCE_EXHAUSTED, message,
                               f"over {refusal.limit}={refusal.per_minute}/min on {rpc}",
                               retry_metadata(message, refusal, key.key_id))
        return cost

    def _settle(self, key: ApiKey, estimated: Optional[Cost], actual: Optional[Cost]) -> None:
        if estimated is not None and actual is not None:
            self.limiter.settle(key, estimated, actual)

    def _guarded(self, handler: grpc.RpcMethodHandler, rpc: str, key: ApiKey) -> grpc.RpcMethodHandler:
        """The servicer's handler behind the key's permissions and limits."""
        kwargs = dict(request_deserializer=handler.request_deserializer,
                      response_serializer=handler.response_serializer)
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request, context):
                CALLER_KEY_ID.set(key.key_id)
                cost = await self._admit(context, rpc, key, request)
                self._count(key.key_id, "ok")
                response = await inner(request, context)
                self._settle(key, cost, reported(rpc, response) if response is not None else None)
                return response
            return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
        if handler.unary_stream is not None:
            inner = handler.unary_stream
            if inspect.isasyncgenfunction(inner):  # a servicer that yields its messages
                async def generator(request, context):
                    CALLER_KEY_ID.set(key.key_id)
                    cost = await self._admit(context, rpc, key, request)
                    self._count(key.key_id, "ok")
                    async for message in inner(request, context):
                        self._settle(key, cost, reported(rpc, message))
                        yield message
                return grpc.unary_stream_rpc_method_handler(generator, **kwargs)

            async def stream(request, context):  # a servicer that writes with context.write
                CALLER_KEY_ID.set(key.key_id)
                cost = await self._admit(context, rpc, key, request)
                self._count(key.key_id, "ok")
                seen = _Settling(context, rpc) if cost is not None else context
                await inner(request, seen)
                self._settle(key, cost, getattr(seen, "actual", None))
            return grpc.unary_stream_rpc_method_handler(stream, **kwargs)
        self._count(key.key_id, "ok")  # client-streaming Translator methods: none today; authenticated only
        return handler
