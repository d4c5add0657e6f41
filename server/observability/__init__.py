"""Observability: structured logs, request ids, one access-log line per RPC, optional tracing.

calls.py    the per-RPC record (request id, model, counts, engine timings) and the access log
logs.py     logging set-up: JSON or text lines on stderr, written off the event loop
tracing.py  OpenTelemetry spans over OTLP, only when configured and installed (the `otel` extra)

Metrics stay in server/observability/metrics.py. See docs/observability.md.
"""
