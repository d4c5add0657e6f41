"""Client-side load balancing, retries and keepalive for channels to one or several replicas.

A target is one of:
    host:port                      one server, or a balancer in front of several (pick_first)
    host1:port,host2:port,...      several replicas: gRPC's round_robin over them (names are
                                   resolved once, here; IP literals are used as they are)
    dns:///name:port               every address the name resolves to, re-resolved by gRPC when a
                                   connection fails or ends (a headless Kubernetes Service): round_robin
    ipv4:a:p,b:p / ipv6:[a]:p,...  explicit address lists: round_robin

With round_robin the channel keeps a connection to every replica and spreads calls over those
whose health (grpc.health.v1, watched over each connection) is SERVING: a replica in its lame-duck
period (NOT_SERVING at once on SIGTERM) stops getting new calls before it refuses any. Every
channel carries gRPC's own retry policy: a call that fails with UNAVAILABLE before the server
sent anything (a replica refusing work while it drains, a connection that died) is sent again,
usually to another replica. Streams are retried only until their first message has arrived.
"""
from __future__ import annotations

import ipaddress
import json
import socket
from dataclasses import dataclass
from typing import Optional

SERVICE = "nmt.v1.Translator"
POLICIES = ("auto", "round_robin", "pick_first")
MAX_ATTEMPTS = 5  # gRPC caps a retry policy's maxAttempts at 5


@dataclass(frozen=True)
class Balancing:
    lb: str = "auto"  # auto: round_robin for a list or a dns:/ipv4:/ipv6: target, else pick_first
    retries: int = 4  # extra attempts of a call refused with UNAVAILABLE (gRPC retry policy; 0 = none)
    health_check: bool = True  # round_robin only: skip replicas whose health is not SERVING
    keepalive_time_ms: int = 30_000  # ping an idle connection this often (the server allows >= 10 s); 0 = never
    keepalive_timeout_ms: int = 10_000  # a ping not answered within this closes the connection
    keepalive_permit_without_calls: bool = True  # keep pinging with no call running (idle pools behind NAT)
    max_reconnect_backoff_ms: int = 10_000  # a replica back on its address is reconnected within this (gRPC: 120 s)


def _split_host_port(entry: str) -> tuple[str, str]:
    if entry.startswith("["):  # [v6]:port
        host, _, port = entry[1:].partition("]:")
        return host, port
    host, sep, port = entry.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"target {entry!r} is not HOST:PORT")
    return host, port


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise ValueError(f"cannot resolve {host!r}: {e}") from None
    found = [ipaddress.ip_address(info[4][0]) for info in infos]
    v4 = [a for a in found if a.version == 4]
    return (v4 or found)[0]  # one address per entry: "localhost" must not count twice (127.0.0.1 and ::1)


def address_list(target: str) -> str:
    """'a:1,b:2' -> 'ipv4:1.2.3.4:1,1.2.3.5:2' (or ipv6:[...]:p, with IPv4 mapped when families mix)."""
    resolved = []
    for entry in (e.strip() for e in target.split(",")):
        if not entry:
            continue
        host, port = _split_host_port(entry)
        resolved.append((_address(host), port))
    if not resolved:
        raise ValueError("no target")
    if all(a.version == 4 for a, _ in resolved):
        return "ipv4:" + ",".join(f"{a}:{p}" for a, p in resolved)
    return "ipv6:" + ",".join(f"[{a if a.version == 6 else ipaddress.IPv6Address('::ffff:' + str(a))}]:{p}"
                              for a, p in resolved)


def is_multi(target: str) -> bool:
    """Whether the target names (or may resolve to) several replicas."""
    return "," in target or target.startswith(("dns:", "ipv4:", "ipv6:"))


def service_config(round_robin: bool, retries: int, health_check: bool) -> dict:
    """The channel's default service config: LB policy, client-side health checking, retry policy."""
    config: dict = {"loadBalancingConfig": [{"round_robin": {}} if round_robin else {"pick_first": {}}]}
    if round_robin and health_check:
        config["healthCheckConfig"] = {"serviceName": SERVICE}
    if retries > 0:
        config["methodConfig"] = [{
            "name": [{"service": SERVICE}],
            "retryPolicy": {"maxAttempts": min(retries + 1, MAX_ATTEMPTS), "initialBackoff": "0.05s",
                            "maxBackoff": "1s", "backoffMultiplier": 2,
                            # CANCELLED too: a proxy resets a stream it had just sent to a replica that
                            # was closing (nginx has no gRPC health check). gRPC retries only calls that
                            # have no response yet, and never the client's own cancel, so this is safe.
                            "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"]},
        }]
        # Retries stop while more than half of the recent calls fail (a whole fleet down): no retry storm.
        config["retryThrottling"] = {"maxTokens": 100, "tokenRatio": 0.1}
    return config


def channel_args(target: str, balancing: Optional[Balancing] = None) -> tuple[str, list[tuple[str, object]]]:
    """(gRPC target, channel options) for a target as described in this module's docstring."""
    b = balancing or Balancing()
    if b.lb not in POLICIES:
        raise ValueError(f"lb must be one of {POLICIES} (got {b.lb!r})")
    target = target.strip()
    round_robin = b.lb == "round_robin" or (b.lb == "auto" and is_multi(target))
    options: list[tuple[str, object]] = []
    if "," in target and not target.startswith(("dns:", "ipv4:", "ipv6:", "unix:")):
        first = target.split(",")[0].strip()
        target = address_list(target)
        if not _is_ip(_split_host_port(first)[0]):
            options.append(("grpc.default_authority", first))  # names were given: keep one as :authority
    options += [
        ("grpc.service_config", json.dumps(service_config(round_robin, b.retries, b.health_check))),
        ("grpc.enable_retries", 1 if b.retries > 0 else 0),
        ("grpc.keepalive_time_ms", b.keepalive_time_ms or 2**31 - 1),
        ("grpc.keepalive_timeout_ms", b.keepalive_timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(b.keepalive_permit_without_calls)),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.max_reconnect_backoff_ms", b.max_reconnect_backoff_ms),
    ]
    return target, options


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return False
