"""Security of the gRPC port (docs/security.md): TLS and mutual TLS (tls.py), API keys (keys.py), per-RPC
authentication, model permissions and rate-limit checks (auth.py, with CALLER_KEY_ID), token buckets
(ratelimit.py), and their assembly for the app (wiring.py).

Nothing is imported here, so `python -m server.security.keys` runs its module once, as __main__.
"""
