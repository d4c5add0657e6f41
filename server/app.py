"""Assembly and lifecycle: load every bundle, warm up, serve gRPC + health + reflection + metrics, drain on stop."""
from __future__ import annotations

import asyncio
import logging
from typing import Optional

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from protos.nmt.v1 import translator_pb2 as pb
from protos.nmt.v1 import translator_pb2_grpc as pb_grpc
from server.bundle import discover
from server.config import ServerConfig
from server.hosted import HostedModel
from server.metrics import Metrics
from server.service import TranslatorService

log = logging.getLogger(__name__)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Translator"].full_name


class TranslationServer:
    def __init__(self, cfg: ServerConfig):
        self.cfg = cfg
        self.metrics = Metrics()
        self.models: dict[str, HostedModel] = {}
        self.server: Optional[grpc.aio.Server] = None
        self.health = health.aio.HealthServicer()
        self.port = 0
        self.metrics_port = 0
        self._metrics_http = None
        self._stopped = asyncio.Event()

    async def start(self) -> int:
        """Load and warm every model, then serve; health turns SERVING last. Returns the bound port."""
        cfg = self.cfg
        loop = asyncio.get_running_loop()
        for bundle in discover(cfg.model_repository):
            model = HostedModel(bundle, cfg, self.metrics)
            await loop.run_in_executor(None, model.start)  # warm-up blocks; keep the event loop free
            self.models[bundle.name] = model
            log.info("loaded %s v%d (%s -> %s) on %s", bundle.name, bundle.version, bundle.source_language,
                     bundle.target_language, model.runtime.providers[0])
        default = cfg.default_model or sorted(self.models)[0]
        if default not in self.models:
            raise ValueError(f"--default-model {default!r} is not in {sorted(self.models)}")
        self.service = TranslatorService(self.models, default, cfg.max_texts_per_request, self.metrics)
        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length", 16 << 20)])
        pb_grpc.add_TranslatorServicer_to_server(self.service, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
            self.server)
        self.port = self.server.add_insecure_port(f"{cfg.host}:{cfg.port}")
        if cfg.metrics_port >= 0:
            self._metrics_http = self.metrics.serve(cfg.metrics_port, cfg.host)
            self.metrics_port = self._metrics_http[0].server_port
        await self.server.start()
        for name in ("", SERVICE_NAME):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("serving %s on port %d (metrics on %s)", sorted(self.models), self.port, self.metrics_port or "-")
        return self.port

    async def stop(self, grace: Optional[float] = None) -> None:
        """NOT_SERVING at once, refuse new work (UNAVAILABLE), let in-flight work finish within the grace period."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        grace = self.cfg.grace_period_s if grace is None else grace
        await self.health.enter_graceful_shutdown()
        self.service.accepting = False
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, m.stop, grace) for m in self.models.values()))
        await self.server.stop(1.0)
        if self._metrics_http:
            self._metrics_http[0].shutdown()

    async def wait(self) -> None:
        await self.server.wait_for_termination()
