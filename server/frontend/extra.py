"""python -m server.frontend.extra: an extra frontend process (`--frontends N`), started by the
primary's FrontendPool (server/frontend/pool.py), never by hand.

A whole TranslationServer attached to the running engine core: the same gRPC and HTTP ports
(SO_REUSEPORT), no metrics port of its own (the primary exports its series), its own link to the
core. On the control channel it says when it serves, answers the primary's metrics requests and
drains on its Stop. SIGINT is ignored and SIGTERM drains, as the primary does: a signal to the
whole process group must not cut calls short.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal

import zmq
import zmq.asyncio
from prometheus_client import generate_latest

from server.frontend.server import TranslationServer
from server.config import ServerConfig
from server.coreprocess import protocol
from server.frontend.cores.link import identity
from server.observability import logs
from models.core.heap import limit_malloc_arenas

log = logging.getLogger("server.coreprocess")
PARENT_POLL_S = 0.5


async def serve(cfg: ServerConfig, core: str, control: str, parent: int) -> int:
    app = TranslationServer(cfg, attach=core)
    await app.start()
    ctx = zmq.asyncio.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, identity(os.getpid()))
    sock.connect(control)
    await sock.send(protocol.encode(protocol.Ready([], os.getpid())))
    loop, stop = asyncio.get_running_loop(), asyncio.Event()
    orphaned: list[bool] = []

    def stop_or_hurry() -> None:  # a second request cuts the lame duck short, as in the primary
        if stop.is_set():
            asyncio.ensure_future(app.stop())
        stop.set()
    loop.add_signal_handler(signal.SIGTERM, stop_or_hurry)

    async def control_channel() -> None:
        while True:
            msg = protocol.to_core(await sock.recv())
            if isinstance(msg, protocol.AskMetrics):
                await sock.send(protocol.encode(protocol.MetricsText(msg.ticket, generate_latest(app.metrics.registry).decode())))
            elif isinstance(msg, protocol.Stop):  # the primary's shutdown: the same lame duck and drain here
                stop_or_hurry()

    async def parent_alive() -> None:
        while os.getppid() == parent:
            await asyncio.sleep(PARENT_POLL_S)
        log.error("frontend: the primary process is gone; stopping", extra={"event": "frontend_orphaned"})
        orphaned.append(True)
        stop.set()
    tasks = [asyncio.create_task(control_channel()), asyncio.create_task(parent_alive())]
    await stop.wait()
    await app.stop(**(dict(grace=0.0, lame_duck=0.0) if orphaned else {}))
    for task in tasks:
        task.cancel()
    sock.close(0)
    ctx.term()
    return 0


def main() -> int:
    limit_malloc_arenas()  # before gRPC, uvicorn and the link start their threads (models/core/heap.py)
    p = argparse.ArgumentParser(prog="python -m server.frontend.extra", description=__doc__)
    p.add_argument("--config", required=True, help="the server's settings as JSON (written by the primary)")
    p.add_argument("--core", required=True, help="the engine replicas' socket paths, comma-separated")
    p.add_argument("--control", required=True, help="the primary's control address")
    p.add_argument("--port", type=int, required=True, help="the gRPC port the primary bound")
    p.add_argument("--http-port", type=int, required=True, help="the HTTP port the primary bound (-1: none)")
    p.add_argument("--index", type=int, required=True, help="this frontend's number (1..N-1)")
    p.add_argument("--parent", type=int, required=True, help="the primary's pid: this process ends without it")
    args = p.parse_args()
    with open(args.config, encoding="utf-8") as f:
        settings = json.load(f)
    settings.update(model=tuple(settings.get("model", ())), port=args.port, http_port=args.http_port,
                    metrics_port=-1, frontends=1)
    cfg = ServerConfig(**settings)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logs.configure(cfg.log_format, cfg.log_level)
    return asyncio.run(serve(cfg, args.core, args.control, args.parent))


if __name__ == "__main__":
    raise SystemExit(main())
