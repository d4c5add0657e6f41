"""python -m server: serve every bundle in the model repository (default: the shipped model)."""
from __future__ import annotations

import asyncio
import logging
import os
import signal
from pathlib import Path
from typing import Sequence

from models.core.bundle import BundleError
from server.frontend.server import EXIT_ENGINE_FAILED, ConfigError, TranslationServer
from server.config import ServerConfig
from server.frontend.model_imports import ImportFailed, prepare_repository
from server.observability import logs
from models.core.heap import limit_malloc_arenas

log = logging.getLogger("server")


async def serve(cfg: ServerConfig) -> int:
    """Serve until SIGTERM/SIGINT (drain, exit 0) or an engine failure (exit EXIT_ENGINE_FAILED)."""
    app = TranslationServer(cfg)
    await app.start()  # logs the "serving" event: ports, models, settings
    loop = asyncio.get_running_loop()
    stopping = []

    def on_signal(sig: signal.Signals) -> None:
        log.info("%s: stopping", sig.name, extra={"event": "signal", "signal": sig.name})
        stopping.append(asyncio.ensure_future(app.stop()))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    await app.wait()
    if stopping:
        await stopping[0]
    return EXIT_ENGINE_FAILED if app.engine_failure else 0


def main(argv: Sequence[str] | None = None) -> int:
    limit_malloc_arenas()  # before gRPC, uvicorn and the executors start their threads
    cfg = ServerConfig.from_args(argv)
    logs.configure(cfg.log_format, cfg.log_level)  # JSON or text lines on stderr (server/observability/logs.py)
    log.info("starting nmt-serve", extra={"event": "starting", "pid": os.getpid()})
    try:
        if cfg.model:  # Hugging Face models: imported once (in a subprocess: no torch here), then served
            export_args = {"int8": ["--int8"], "fp16": ["--fp16"]}.get(cfg.variant, [])
            if cfg.variant == "int8" and cfg.calibration_text:
                export_args += ["--calibration-text", str(Path(cfg.calibration_text).resolve())]
            cfg.model_repository = str(prepare_repository(cfg.model, Path(cfg.cache_dir) if cfg.cache_dir else None,
                                                          export_args=export_args))
        status = asyncio.run(serve(cfg))
    except (BundleError, ConfigError, ImportFailed) as e:
        log.error("error: %s", e, extra={"event": "exit", "status": 2})
        return 2
    log.info("exit %d", status, extra={"event": "exit", "status": status})
    return status


if __name__ == "__main__":
    raise SystemExit(main())
