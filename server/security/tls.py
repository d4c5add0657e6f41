"""TLS and mutual TLS for the gRPC port: start-up checks and the server credentials.

With --tls-cert-file and --tls-key-file the port is bound with add_secure_port only, so it
speaks nothing but TLS: a plaintext client fails its handshake (UNAVAILABLE on its side)
and never reaches a handler. --tls-client-ca-file turns on mutual TLS: every client must
present a certificate that chains to one of those CAs, checked by gRPC core in the
handshake (REQUIRE_AND_VERIFY), before any RPC exists.

The files are checked with Python's ssl module before the server starts, because gRPC
only finds a bad file when the first client connects, and then says little more than
"handshake failed" on the client side. The ssl module also proves that the key matches
the certificate. The files are read once at start-up: rotating a certificate means a
restart (a rolling one, with the lame-duck drain, in a fleet).
"""
from __future__ import annotations

import ssl
from pathlib import Path
from typing import Optional

import grpc


class _EncryptedKey(Exception):
    pass


def _no_password() -> bytes:
    # Called by ssl only for an encrypted key. Without this callback ssl would prompt on the
    # terminal and hang a server under a supervisor; gRPC cannot use encrypted keys anyway.
    raise _EncryptedKey()


def _readable(path: str, flag: str, problems: list[str]) -> bool:
    p = Path(path)
    if not p.is_file():
        problems.append(f"{flag} {path}: no such file")
        return False
    try:
        p.read_bytes()
    except OSError as e:
        problems.append(f"{flag} {path}: cannot be read ({e.strerror or e})")
        return False
    return True


def tls_problems(cert_file: str, key_file: str, client_ca_file: str) -> list[str]:
    """Every problem with the TLS settings, for ServerConfig.problems()."""
    problems: list[str] = []
    if bool(cert_file) != bool(key_file):
        problems.append("--tls-cert-file and --tls-key-file go together (TLS needs both)")
    if client_ca_file and not cert_file:
        problems.append("--tls-client-ca-file (mutual TLS) needs --tls-cert-file and --tls-key-file")
    if cert_file and key_file and _readable(cert_file, "--tls-cert-file", problems) \
            and _readable(key_file, "--tls-key-file", problems):
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert_file, key_file, password=_no_password)
        except _EncryptedKey:
            problems.append(f"--tls-key-file {key_file}: the key is encrypted; give an unencrypted PEM key "
                            f"(protect it with file permissions or a secret store)")
        except ssl.SSLError as e:
            problems.append(f"--tls-cert-file {cert_file} / --tls-key-file {key_file}: not a PEM certificate "
                            f"chain and its matching private key ({e.reason or e})")
    if client_ca_file and _readable(client_ca_file, "--tls-client-ca-file", problems):
        try:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_verify_locations(cafile=client_ca_file)
            if not ctx.get_ca_certs():
                problems.append(f"--tls-client-ca-file {client_ca_file}: holds no CA certificate")
        except ssl.SSLError as e:
            problems.append(f"--tls-client-ca-file {client_ca_file}: not PEM CA certificates ({e.reason or e})")
    return problems


def server_credentials(cert_file: str, key_file: str, client_ca_file: str) -> Optional[grpc.ServerCredentials]:
    """None without TLS; else credentials for add_secure_port (client certificates required with a CA)."""
    if not cert_file:
        return None
    pair = (Path(key_file).read_bytes(), Path(cert_file).read_bytes())
    ca = Path(client_ca_file).read_bytes() if client_ca_file else None
    return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)
