"""Optional OpenTelemetry tracing: a SERVER span per RPC with child spans for its engine phases.

Off unless an endpoint is configured (`--otlp-endpoint`, or OpenTelemetry's own
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT) and the `otel` extra is
installed (`pip install .[otel]`). Nothing here imports opentelemetry until then, so a server
without it pays neither the import nor anything per call (TranslatorService.tracer stays None).

Each server owns its TracerProvider (the global one is left alone, as each server owns its
metrics registry), exporting over OTLP/gRPC in batches from a background thread. A client's W3C
`traceparent` metadata makes the RPC's span a child of the caller's. The phases are known only
when the engine has reported them, so they are recorded when the call ends, with their real
start and end times, from the jobs' timings:

  queue   arrival of the first sentence -> the first encoder pass that takes one of them
  encode  -> the first generated token (the encoder pass, cross-attention K/V, the first decode step)
  decode  -> the last sentence finished
"""
from __future__ import annotations

import logging
import os
import time
from typing import Optional

import grpc

from server.observability.calls import SERVICE, Call

log = logging.getLogger(__name__)

# Server-side span status per OpenTelemetry's gRPC semantic conventions: these codes are errors
# of the server; the others (INVALID_ARGUMENT, NOT_FOUND, CANCELLED...) are the caller's and leave it unset.
SERVER_ERRORS = {grpc.StatusCode.UNKNOWN, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNIMPLEMENTED,
                 grpc.StatusCode.INTERNAL, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DATA_LOSS}


def endpoint_from(flag: str) -> str:
    return (flag or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
            or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", ""))


def from_config(otlp_endpoint: str, exporter=None, version: str = "") -> Optional["RpcTracer"]:
    """An RpcTracer exporting to the endpoint (or to `exporter`, synchronously: tests), or None when
    tracing is off, disabled (OTEL_SDK_DISABLED=true) or not installed (a warning says so)."""
    endpoint = endpoint_from(otlp_endpoint)
    if (exporter is None and not endpoint) or os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return None
    try:
        from opentelemetry import propagate, trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    except ImportError as e:
        log.warning("tracing is configured (%s) but OpenTelemetry is not installed (%s): pip install '.[otel]'; "
                    "serving without traces", endpoint, e.name, extra={"event": "tracing_unavailable"})
        return None
    if exporter is None:
        # A plain host:port would be taken for TLS: "http://collector:4317" for plaintext.
        processor = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint or None))
    else:
        processor = SimpleSpanProcessor(exporter)
    resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", "nmt-serve"),
                                "service.version": version})
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(processor)
    log.info("tracing: OTLP spans to %s", endpoint or type(exporter).__name__,
             extra={"event": "tracing_enabled", "otlp_endpoint": endpoint})
    return RpcTracer(provider, trace, propagate)


class RpcTracer:
    def __init__(self, provider, trace_api, propagate_api):
        self.provider = provider
        self.tracer = provider.get_tracer("nmt-serve.server")
        self._trace, self._propagate = trace_api, propagate_api
        from opentelemetry.trace import Status, StatusCode
        self._status, self._error = Status, StatusCode.ERROR

    def start(self, rpc: str, metadata) -> object:
        carrier = {k: v for k, v in metadata if isinstance(v, str)}
        parent = self._propagate.extract(carrier) if "traceparent" in carrier else None
        return self.tracer.start_span(f"{SERVICE}/{rpc}", context=parent, kind=self._trace.SpanKind.SERVER,
                                      attributes={"rpc.system": "grpc", "rpc.service": SERVICE, "rpc.method": rpc})

    @staticmethod
    def trace_id(span) -> str:
        return format(span.get_span_context().trace_id, "032x")

    def finish(self, call: Call, code: grpc.StatusCode) -> None:
        span = call.span
        span.set_attributes({"rpc.grpc.status_code": code.value[0], "nmt.request_id": call.request_id,
                             "nmt.texts": call.texts, "nmt.sentences": call.sentences,
                             "nmt.input_tokens": call.input_tokens, "nmt.output_tokens": call.output_tokens})
        if call.model:
            span.set_attribute("nmt.model", call.model)
        if code in SERVER_ERRORS:
            span.set_status(self._status(self._error, code.name))
        phases = call.phases()
        if phases is not None:
            offset = time.time_ns() - time.monotonic_ns()  # monotonic seconds -> epoch nanoseconds
            wall = lambda t: int(t * 1e9) + offset  # noqa: E731
            parent = self._trace.set_span_in_context(span)
            end = phases.finished if phases.finished is not None else time.monotonic()  # cut short: now
            marks = [("queue", phases.arrival, phases.first_scheduled or end),
                     ("encode", phases.first_scheduled, phases.first_token or end),
                     ("decode", phases.first_token, end)]
            for name, start, stop in marks:
                if start is not None and stop >= start:
                    self.tracer.start_span(name, context=parent, start_time=wall(start)).end(end_time=wall(stop))
        span.end()

    def shutdown(self) -> None:
        """Export what is buffered and stop (the server's stop)."""
        self.provider.shutdown()
