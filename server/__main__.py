"""python -m server: serve every bundle in the model repository (default: the shipped model)."""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Sequence

from server.app import TranslationServer
from server.bundle import BundleError
from server.config import ServerConfig


async def serve(cfg: ServerConfig) -> None:
    app = TranslationServer(cfg)
    await app.start()
    print(f"nmt-serve: gRPC on {cfg.host}:{app.port}, metrics on :{app.metrics_port or '-'}, "
          f"models {sorted(app.models)}", file=sys.stderr, flush=True)
    loop = asyncio.get_running_loop()
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stopping.append(asyncio.ensure_future(app.stop())))
    await app.wait()
    if stopping:
        await stopping[0]


def main(argv: Sequence[str] | None = None) -> int:
    cfg = ServerConfig.from_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(serve(cfg))
    except BundleError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
