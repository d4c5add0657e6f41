"""python -m server: serve every bundle in the model repository (default: the shipped model)."""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
from typing import Sequence

from models.core.bundle import BundleError
from server.app import EXIT_ENGINE_FAILED, ConfigError, TranslationServer
from server.config import ServerConfig


async def serve(cfg: ServerConfig) -> int:
    """Serve until SIGTERM/SIGINT (drain, exit 0) or an engine failure (exit EXIT_ENGINE_FAILED)."""
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
    return EXIT_ENGINE_FAILED if app.engine_failure else 0


def main(argv: Sequence[str] | None = None) -> int:
    cfg = ServerConfig.from_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(serve(cfg))
    except (BundleError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
