"""benchmarks.harness.free_port: ports outside the kernel's ephemeral range, never the same one twice in a
process, and free when handed out (a scale-out replica once lost its port to an outgoing connection that
the OS gave the same ephemeral port in the moment between the pick and the server's bind)."""
from __future__ import annotations

import socket
from pathlib import Path

import pytest

from benchmarks.harness import bindable, free_port

RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def test_ports_are_distinct_bindable_and_outside_the_ephemeral_range():
    ports = [free_port() for _ in range(64)]
    assert len(set(ports)) == len(ports)
    if not RANGE.exists():
        pytest.skip("no /proc/sys/net/ipv4/ip_local_port_range: the OS's own pick is used")
    low, high = (int(x) for x in RANGE.read_text().split())
    assert all(not low <= p <= high for p in ports), (low, high, ports)
    for port in ports[:8]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # raises if something holds it


def test_a_port_someone_listens_on_is_never_handed_out(monkeypatch):
    """Eight ports in the range, seven held by listeners that free_port never handed out: the eighth comes
    back, then no port at all from the range (it is used up), so the OS's own pick."""
    from benchmarks import harness
    start = next(p for p in range(21000, 31000, 10)
                 if all(bindable(q) for q in range(p, p + 8)) and not set(range(p, p + 8)) & harness._handed_out)
    listeners = []
    try:
        for port in range(start, start + 7):
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))
            sock.listen()
            listeners.append(sock)
        monkeypatch.setattr(harness, "_outside_ephemeral", lambda: range(start, start + 8))
        assert free_port() == start + 7
        assert free_port() not in range(start, start + 8)
    finally:
        for sock in listeners:
            sock.close()

