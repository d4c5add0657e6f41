"""What the app uses of server/security/: start-up checks, the port binding (TLS or not), the auth
interceptor, and the SIGHUP reload of the key file. See docs/security.md.
"""
from __future__ import annotations

import asyncio
import logging
import signal
import threading
from typing import Callable, Optional

import grpc

from server.security.auth import AuthInterceptor
from server.security.keys import KeyFileError, KeyStore, load_key_file
from server.security.ratelimit import RateLimiter
from server.security.tls import server_credentials, tls_problems

log = logging.getLogger(__name__)


def security_problems(cfg) -> list[str]:
    """The security settings' problems, for ServerConfig.problems(): files that are missing or do not
    load, TLS halves without the other half, malformed key-file lines (with their line numbers)."""
    problems = tls_problems(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_client_ca_file)
    if cfg.api_keys_file:
        try:
            load_key_file(cfg.api_keys_file)
        except KeyFileError as e:
            problems += e.problems
    elif cfg.auth_health_and_reflection:
        problems.append("--auth-health-and-reflection needs --api-keys-file")
    if cfg.auth_metrics_max_keys < 0:
        problems.append(f"--auth-metrics-max-keys must be >= 0 (got {cfg.auth_metrics_max_keys})")
    return problems


class Security:
    def __init__(self, cfg, metrics):
        self.cfg, self.metrics = cfg, metrics
        self.keys: Optional[KeyStore] = KeyStore(cfg.api_keys_file) if cfg.api_keys_file else None
        self.limiter = RateLimiter()
        self.interceptor: Optional[AuthInterceptor] = None
        if self.keys is not None:
            metrics.auth_keys.set(len(self.keys.table))
            if not len(self.keys.table):
                log.warning("--api-keys-file %s holds no key: every authenticated RPC will be refused",
                            cfg.api_keys_file)
            if not cfg.tls_cert_file:
                # Legitimate behind a TLS-terminating proxy on the same host; otherwise keys cross the wire in clear.
                log.warning("API keys without --tls-cert-file: keys travel in plaintext unless a proxy terminates TLS")

    def interceptors(self, service_name: str, resolve_model: Callable[..., str]) -> list:
        if self.keys is None:
            return []
        self.interceptor = AuthInterceptor(self.keys, self.metrics, service_name, resolve_model, self.limiter,
                                           self.cfg.auth_health_and_reflection, self.cfg.auth_metrics_max_keys)
        return [self.interceptor]

    def check_models(self, served) -> None:
        """Warn about keys that name models this server does not serve (a shared key file may do so)."""
        for key in self.keys.table.keys if self.keys else ():
            missing = sorted((key.models or set()) - set(served))
            if missing:
                log.warning("API key %s names models not served here: %s", key.key_id, missing)

    def quota_of(self, key_id: str) -> int:
        """The character quota of a key id (0: none, or no such key)."""
        if self.keys is None:
            return 0
        return next((k.limits.characters for k in self.keys.table.keys if k.key_id == key_id), 0)

    def bind(self, server: grpc.aio.Server, address: str) -> int:
        """Bind the port: TLS only when configured (no plaintext listener beside it)."""
        cfg = self.cfg
        creds = server_credentials(cfg.tls_cert_file, cfg.tls_key_file, cfg.tls_client_ca_file)
        if creds is None:
            return server.add_insecure_port(address)
        log.info("gRPC port: TLS%s", " with client certificates required (mTLS)" if cfg.tls_client_ca_file else "")
        return server.add_secure_port(address, creds)

    def reload(self) -> bool:
        """Re-read the key file (SIGHUP). A file that does not parse leaves the keys in use as they are."""
        if self.keys is None:
            log.info("reload asked for, but no --api-keys-file is set")
            return False
        ok, note = self.keys.reload()
        self.metrics.auth_reloads.labels("ok" if ok else "error").inc()
        if ok:
            self.limiter.retain(self.keys.table.ids)
            self.metrics.auth_keys.set(len(self.keys.table))
            log.info("reloaded --api-keys-file %s: %s", self.keys.path, note)
        else:
            log.error("reload of --api-keys-file %s refused, keeping the %d keys in use: %s", self.keys.path,
                      len(self.keys.table), note)
        return ok

    def watch_reload_signal(self, loop: asyncio.AbstractEventLoop, also=None) -> None:
        """SIGHUP reloads the key file; `also()` runs after (the primary frontend passes it on to the
        other frontend processes, --frontends). Signals reach only the main thread's loop: a server run
        in another thread (the tests' ServerThread) calls reload() directly instead."""
        if self.keys is None or not hasattr(signal, "SIGHUP"):
            return
        if threading.current_thread() is not threading.main_thread():
            return

        def reload() -> None:
            self.reload()
            if also is not None:
                also()
        loop.add_signal_handler(signal.SIGHUP, reload)
