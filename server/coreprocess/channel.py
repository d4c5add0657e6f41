"""The frontend <-> engine core transport: length-prefixed frames over one Unix stream socket per pair.

Measured problem (issue 35, docs/serving_speed.md, 2-core AMD EPYC, 2026-11-28): ZeroMQ passes every
message through an I/O thread on each side, so a message from the core's engine thread to the
frontend's event loop woke three threads (the core's I/O thread, the frontend's, then the loop), and
a request and its answer six. On this virtual machine a cross-thread wake-up costs ~16 µs of CPU (two
threads handing a byte back and forth: 32 µs per round trip, against 0.7 µs for the same write and
read in one thread): about 7% of the server's CPU per token at 64 streams, more per call at one.

The design: the frontend connects to the core's listening socket; every message after that goes
straight from the thread that makes it into the kernel, and wakes only the thread that reads it: the
frontend's event loop (asyncio's own transport, `FrameProtocol`) or the core's main thread (a
selector, server/coreprocess/process.py). The core's engine threads write their Events themselves
(`Peer.send`, never blocking: what the kernel does not take waits in the peer's buffer for the main
thread to write out when the socket drains), so a frontend that stops reading cannot stall a step.
A job's events come from one engine thread through one connection, in order. The core learns of a
frontend that dies from its connection's end, without waiting for anyone to tell it.

Frames: a 4-byte little-endian length, then one msgspec message (server/coreprocess/protocol.py).
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import threading
from typing import Callable, Optional

log = logging.getLogger("server.coreprocess")
HEADER = struct.Struct("<I")
MAX_FRAME = 1 << 30  # a larger length is a corrupt stream, not a message
SEND_BUFFER = 4 << 20  # the kernel's share of a burst: the peer's own buffer should rarely hold anything
READ_SIZE = 1 << 18


def frame(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


class Frames:
    """Bytes as they arrive -> whole frames' payloads, in order."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer
        buffer += data
        payloads, at, end = [], 0, len(buffer)
        while end - at >= HEADER.size:
            (size,) = HEADER.unpack_from(buffer, at)
            if size > MAX_FRAME:
                raise ValueError(f"a frame of {size} bytes: the stream is corrupt")
            if end - at - HEADER.size < size:
                break
            at += HEADER.size
            payloads.append(bytes(buffer[at:at + size]))
            at += size
        del buffer[:at]
        return payloads


def listen(path: str) -> socket.socket:
    """The core's listening socket at `path` (a stale file from a killed core of the same path is replaced)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(64)
    sock.setblocking(False)
    return sock


class Peer:
    """One frontend's connection in the core. `send` may be called from any thread and never blocks;
    the main thread reads (`receive`), and writes out what the kernel left over (`write_pending`) when
    the selector says the socket drains."""

    def __init__(self, sock: socket.socket, wake: Callable[[], None]) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        self.sock, self._wake = sock, wake
        self.identity = b""  # from its Hello
        self.lock = threading.Lock()
        self.pending = bytearray()  # what the kernel has not taken yet, in order
        self.broken = False  # a write failed: the frontend is gone (the main thread drops it at its EOF)
        self.frames = Frames()

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, payload: bytes) -> None:
        data = frame(payload)
        with self.lock:
            if self.broken:
                return
            if self.pending:  # after what is already waiting, never before it
                self.pending += data
                return
            try:
                sent = self.sock.send(data)
            except BlockingIOError:
                sent = 0
            except OSError:
                self.broken = True
                return
            if sent == len(data):
                return
            self.pending += data[sent:]
        self._wake()  # the main thread watches the socket for room (process.py)

    def write_pending(self) -> bool:
        """Write what the kernel now takes; True when nothing is left waiting."""
        with self.lock:
            if self.pending and not self.broken:
                try:
                    sent = self.sock.send(self.pending)
                    del self.pending[:sent]
                except BlockingIOError:
                    pass
                except OSError:
                    self.broken = True
            if self.broken:
                self.pending.clear()
            return not self.pending

    def receive(self) -> Optional[list[bytes]]:
        """Every whole frame that has arrived; None when the frontend has closed the connection."""
        try:
            data = self.sock.recv(READ_SIZE)
        except BlockingIOError:
            return []
        except OSError:
            return None
        if not data:
            return None
        return self.frames.feed(data)

    def close(self, wait: float = 0.0) -> None:
        """Close the socket, after writing out what waits (blocking up to `wait` seconds) when asked."""
        with self.lock:
            if wait and self.pending and not self.broken:
                try:
                    self.sock.settimeout(wait)
                    self.sock.sendall(self.pending)
                except OSError:
                    pass
            self.pending.clear()
            self.broken = True
            self.sock.close()


class FrameProtocol(asyncio.Protocol):
    """The frontend's end, on its event loop: each whole frame to `on_message` as it arrives (one read, one
    wake-up of the loop, every frame in it); `on_lost` when the connection ends."""

    def __init__(self, on_message: Callable[[bytes], None], on_lost: Callable[[Optional[Exception]], None]) -> None:
        self.on_message, self.on_lost = on_message, on_lost
        self.frames = Frames()
        self.transport: Optional[asyncio.Transport] = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            payloads = self.frames.feed(data)
        except ValueError:
            log.exception("corrupt stream from the engine core")
            self.transport.close()
            return
        for payload in payloads:
            try:
                self.on_message(payload)
            except Exception:  # noqa: BLE001 (one bad message must not close the connection)
                log.exception("bad message from the engine core")

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.on_lost(exc)

    def send(self, payload: bytes) -> None:
        self.transport.write(frame(payload))  # written at once while the kernel takes it: no other thread
