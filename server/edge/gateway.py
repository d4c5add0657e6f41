"""The in-process gateway: the HTTP edge calls the Translator servicer as a gRPC client would, with no socket.

The HTTP APIs (server/edge/http/) must serve exactly what the gRPC API serves: the same models,
limits, validation, API keys, model permissions, rate limits, request counters and access log.
A second request path beside the servicer would drift from it one check at a time; a loopback
gRPC client would pay a second serialisation and an HTTP/2 hop per message on the cores the
engine needs. So the HTTP edge builds the nmt.v1 request message and runs the very handler the
gRPC server registered (server/edge/wire.py), behind the same auth interceptor
(server/security/auth.py), with a servicer context of its own (`_Context`). The servicer cannot
tell the difference: its `abort(code, message)` comes back here as `CallFailed`, its stream
writes as an async iterator with the same back-pressure a slow gRPC reader exerts (one
message in flight; the stream coalesces what piles up meanwhile).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import AsyncIterator, Optional, Sequence

import grpc
from google.rpc import error_details_pb2, status_pb2

from protos.nmt.v1 import translator_pb2 as pb
from server.edge.retry import DETAILS_KEY

SERVICE = pb.DESCRIPTOR.services_by_name["Translator"]


class CallFailed(grpc.aio.AbortError):
    """The status a call ended with (anything but OK), with its trailing metadata."""

    def __init__(self, code: grpc.StatusCode, message: str, trailers: Sequence[tuple] = ()):
        super().__init__(f"{code.name}: {message}")
        self.code, self.message, self.trailers = code, message, tuple(trailers)

    @property
    def retry_after(self) -> Optional[float]:
        """Seconds to wait from the google.rpc.RetryInfo a rate-limit refusal carries, else None."""
        for name, value in self.trailers:
            if name != DETAILS_KEY:
                continue
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                info = error_details_pb2.RetryInfo()
                if detail.Unpack(info):
                    return info.retry_delay.ToNanoseconds() / 1e9
        return None


@dataclass(frozen=True)
class _Details:
    """What grpc.aio hands an interceptor about a call (grpc.HandlerCallDetails' fields)."""
    method: str
    invocation_metadata: tuple


class _Context:
    """The part of grpc.aio.ServicerContext the servicer, the auth interceptor and the access log use."""

    def __init__(self, metadata: tuple, peer: str, timeout: Optional[float], out: Optional[asyncio.Queue] = None):
        self._metadata, self._peer, self._out = metadata, peer, out
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._trailers: tuple = ()
        self._over = self._cancelled = False
        self.initial_metadata: tuple = ()

    def invocation_metadata(self) -> tuple:
        return self._metadata

    def peer(self) -> str:
        return self._peer

    def time_remaining(self) -> Optional[float]:
        return None if self._deadline is None else max(self._deadline - time.monotonic(), 0.0)

    def done(self) -> bool:
        return self._over

    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        """The HTTP client went away."""
        self._over = self._cancelled = True

    def set_trailing_metadata(self, metadata) -> None:
        self._trailers = tuple(metadata)

    def trailing_metadata(self) -> tuple:
        return self._trailers

    async def send_initial_metadata(self, metadata) -> None:
        self.initial_metadata = tuple(metadata)

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()) -> None:
        self._over = True
        raise CallFailed(code, details, self._trailers + tuple(trailing_metadata))

    async def write(self, message) -> None:
        await self._out.put(message)  # a queue of one: the writer waits while the reader is behind

    def request_id(self) -> str:
        return next((v for k, v in self._trailers if k == "x-request-id"), "")


@dataclass
class Caller:
    """Who is calling, as the HTTP edge knows it: the API key (None: none sent), the client's
    x-request-id and address, and how long the call may take (seconds; None: no deadline)."""
    key: Optional[str] = None
    request_id: str = ""
    peer: str = ""
    forwarded_for: str = ""
    timeout: Optional[float] = None

    def metadata(self) -> tuple:
        md = []
        if self.key is not None:
            md.append(("authorization", f"Bearer {self.key}"))
        if self.request_id:
            md.append(("x-request-id", self.request_id))
        if self.forwarded_for:
            md.append(("x-forwarded-for", self.forwarded_for))
        return tuple(md)


class Gateway:
    """Runs Translator RPCs in process: `unary` returns the response message, `stream` yields them.
    Both raise CallFailed with the status the servicer (or the auth interceptor) sent."""

    def __init__(self, servicer, interceptor: Optional[grpc.aio.ServerInterceptor] = None):
        self._interceptor = interceptor
        self._handlers = {}
        for method in SERVICE.methods:
            make = grpc.unary_stream_rpc_method_handler if method.server_streaming \
                else grpc.unary_unary_rpc_method_handler
            self._handlers[method.name] = make(getattr(servicer, method.name))

    async def _handler(self, method: str, caller: Caller) -> grpc.RpcMethodHandler:
        handler = self._handlers[method]
        if self._interceptor is None:
            return handler

        async def continuation(_details):
            return handler
        return await self._interceptor.intercept_service(
            continuation, _Details(f"/{SERVICE.full_name}/{method}", caller.metadata()))

    def _context(self, caller: Caller, out: Optional[asyncio.Queue] = None) -> _Context:
        return _Context(caller.metadata(), caller.peer, caller.timeout, out)

    async def unary(self, method: str, request, caller: Caller):
        """The response message. `caller.request_id` is set to the call's request id."""
        context = self._context(caller)
        handler = await self._handler(method, caller)
        task = asyncio.ensure_future(handler.unary_unary(request, context))
        try:
            await self._settled(task, context)
        finally:
            caller.request_id = context.request_id() or caller.request_id
        return task.result()

    async def stream(self, method: str, request, caller: Caller) -> AsyncIterator:
        """The stream's messages as the servicer writes them. Closing the iterator early (the HTTP
        client went away) cancels the call, which frees its decode slots at the next step."""
        out: asyncio.Queue = asyncio.Queue(maxsize=1)
        context = self._context(caller, out)
        handler = await self._handler(method, caller)
        task = asyncio.ensure_future(handler.unary_stream(request, context))
        get: Optional[asyncio.Future] = None
        try:
            while True:
                get = asyncio.ensure_future(out.get())
                await asyncio.wait((get, task), timeout=context.time_remaining(),
                                   return_when=asyncio.FIRST_COMPLETED)
                caller.request_id = context.request_id() or caller.request_id
                if get.done():
                    yield get.result()
                    continue
                get.cancel()
                if not task.done():  # the deadline passed with nothing written
                    await self._settled(task, context)
                while not out.empty():
                    yield out.get_nowait()
                await self._settled(task, context)
                return
        finally:
            # A client that goes away cancels this generator inside asyncio.wait: the pending get must
            # go too, or it is destroyed pending (an ERROR line per dropped SSE stream, issue 33).
            if get is not None and not get.done():
                get.cancel()
            await _cancel(task, context)

    @staticmethod
    async def _settled(task: asyncio.Future, context: _Context) -> None:
        """Wait for the handler within the call's deadline; raise CallFailed unless it ended OK.

        When the deadline passes, the handler is cancelled as grpc core cancels it, and records
        DEADLINE_EXCEEDED itself (TranslatorService._guard); an HTTP client that goes away
        cancels it the same way (CANCELLED)."""
        try:
            await asyncio.wait((task,), timeout=context.time_remaining())
        except asyncio.CancelledError:
            await _cancel(task, context)
            raise
        if not task.done():
            await _cancel(task, context)
        if task.cancelled():  # cancelled here, or the servicer found the call over
            remaining = context.time_remaining()
            if remaining is not None and remaining <= 0:
                raise CallFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded", context.trailing_metadata())
            raise CallFailed(grpc.StatusCode.CANCELLED, "the call was cancelled", context.trailing_metadata())
        task.result()  # raises the CallFailed the servicer or the interceptor aborted with


async def _cancel(task: asyncio.Future, context: _Context) -> None:
    if task.done():
        return
    context.cancel()
    task.cancel()
    try:
        await task
    except (asyncio.CancelledError, CallFailed):
        pass
