"""Assembly and lifecycle: load every bundle, warm up, serve gRPC + health + reflection + metrics, drain on stop."""
from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import generate_latest

from models.core.bundle import discover
from protos.nmt.v1 import translator_pb2 as pb
from server.config import ServerConfig
from server.frontend.pool import FrontendPool
from server.frontend.cores.replicas import Replicas
from server.glossary.store import open_store
from server.core.errors import Unavailable
from server.frontend.admission import Admission, Limits
from server.edge.gateway import Gateway
from server.frontend.hosted import HostedModel
from server.edge.http.port import HttpFrontend
from server.edge.http.context import Edge
from server.edge.http.status import EngineView
from server.edge.lifecycle import Health, enable_reflection, server_options
from server.observability.metrics import Metrics
from server.observability import looplag, tracing
from server.frontend.memory_budget import MemoryBudget, parse_limit
from server.observability.memory import ServerProcesses, siblings
from server.observability.logs import config_summary
from server.security.wiring import Security
from server.edge.servicer import TranslatorService
from server.files.rpc import FILE_REQUEST_BYTES, FileCalls
from server.edge.wire import add_translator_service, receive_limit

log = logging.getLogger(__name__)
SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Translator"].full_name
EXIT_ENGINE_FAILED = 3  # the process exit status after the watchdog fired (a supervisor restarts it)


class ConfigError(ValueError):
    """Settings that contradict each other; the message lists every problem."""


class TranslationServer:
    def __init__(self, cfg: ServerConfig, attach: str = ""):
        """`attach`: the address of an engine core another process started (an extra frontend,
        server/frontend/extra.py); this server then starts no core and exports no engine series."""
        self.cfg, self.attach = cfg, attach
        self.metrics = Metrics(engine_here=cfg.engine_core == "thread" and not attach)
        self.models: dict[str, HostedModel] = {}
        self.core: Optional[Replicas] = None  # --engine-core process: the engine replicas' supervisors
        self.frontends: Optional[FrontendPool] = None  # --frontends N > 1: the other frontend processes
        self.processes = ServerProcesses(self._members)  # every process's memory, read when asked
        self.budget: Optional[MemoryBudget] = None
        self.server: Optional[grpc.aio.Server] = None
        self.health = Health(("", SERVICE_NAME))  # readiness names; the "liveness" entry stays up while draining
        self.port = 0
        self.metrics_port = 0
        self.http_port = 0
        self.http: Optional[HttpFrontend] = None  # the HTTP/JSON port (server/edge/http/), unless --http-port -1
        self._metrics_http = None
        self._stopped = asyncio.Event()
        self._hurry = asyncio.Event()  # a second stop request ends the lame-duck period early
        self._watchdog: Optional[asyncio.Task] = None
        self._loop_lag: Optional[asyncio.Task] = None  # nmt_event_loop_lag_seconds (server/observability/looplag.py)
        self.engine_failure: Optional[str] = None  # set by the watchdog; the process then exits non-zero
        self.tracer: Optional[tracing.RpcTracer] = None  # OpenTelemetry, when configured (server/observability/)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._own_dir = ""  # the --document-dir made at start when none was named, removed at stop
        self.span_exporter = None  # tests: an OpenTelemetry span exporter to trace into, set before start()

    async def start(self) -> int:
        """Load and warm every model, then serve; health turns SERVING last. Returns the bound port."""
        cfg = self.cfg
        self._loop = loop = asyncio.get_running_loop()
        problems = cfg.problems()
        if problems:
            raise ConfigError("invalid settings: " + "; ".join(problems))
        if not cfg.document_dir and not self.attach:  # one spool for every frontend process: the config they read
            cfg.document_dir = self._own_dir = tempfile.mkdtemp(prefix="nmt-documents-")
        # --memory-limit, before the cores: it decides how many replicas start (Replicas)
        self.budget = MemoryBudget(parse_limit(cfg.memory_limit), self.processes, self.metrics)
        # grpcio-health-checking's servicer starts with the whole server ("") SERVING: until serving() below,
        # a health check made while the HTTP port and the rest were still starting said SERVING (seen: the HTTP
        # port refused connections for ~0.2 s after the gRPC health check had said SERVING).
        await self.health.not_ready()
        if cfg.engine_core == "process" or self.attach:
            await self._start_core()
        else:
            await self._load_models()
        default = cfg.default_model or sorted(self.models)[0]
        if default not in self.models:
            raise ValueError(f"--default-model {default!r} is not in {sorted(self.models)}")
        self.executor = ThreadPoolExecutor(cfg.workers, thread_name_prefix="nmt-prep")
        self.admission = Admission(self.models, default, Limits(cfg.max_texts_per_request, cfg.max_text_chars,
                                                                cfg.max_sentences_per_request),
                                   self.executor, self.metrics)
        self.admission.glossaries = open_store(cfg.glossary_db or None)  # DeepL glossaries (server/glossary/)
        self.service = TranslatorService(self.admission, self.metrics)
        self.tracer = self.service.tracer = tracing.from_config(cfg.otlp_endpoint, self.span_exporter,
                                                                self.metrics.build["version"])
        self.security = Security(cfg, self.metrics)  # TLS, API keys, rate limits: server/security/
        self.security.check_models(self.models)
        # Oversized messages are refused by grpc before they are parsed (RESOURCE_EXHAUSTED); TranslateFile's
        # requests carry a whole file and may be larger than --max-request-bytes, which server/edge/wire.py then
        # checks for every other method (unparsed too).
        file_bounds = {"TranslateFile": FILE_REQUEST_BYTES}
        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length",
                                                receive_limit(cfg.max_request_bytes, file_bounds)),
                                               *server_options(cfg)],
                                      interceptors=self.security.interceptors(SERVICE_NAME,
                                                                              self.admission.model_name_for))
        add_translator_service(self.service, self.server, cfg.max_request_bytes, file_bounds)
        # TranslateFile's jobs translate through the servicer as the HTTP port's do: behind the same key checks.
        self.service.files = FileCalls(Gateway(self.service, self.security.interceptor), self.admission,
                                       cfg.document_dir or None)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        enable_reflection(self.server, [SERVICE_NAME, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name])
        self.port = self.security.bind(self.server, f"{cfg.host}:{cfg.port}")  # TLS only, when configured
        if cfg.metrics_port >= 0:
            self._metrics_http = self.metrics.serve(cfg.metrics_port, cfg.metrics_host or cfg.host)
            self.metrics_port = self._metrics_http[0].server_port
        self.admission.quota_of = self.security.quota_of
        self.admission.budget = self.budget
        await self.server.start()
        self._loop_lag = asyncio.create_task(looplag.watch(self.metrics.loop_lag), name="loop-lag")
        count = 1 if self.attach else cfg.frontend_processes
        if cfg.http_port >= 0:
            await loop.run_in_executor(None, self.admission.identifier.warm)  # the language model: ~0.3 s, once
            edge = Edge(Gateway(self.service, self.security.interceptor), self.admission, self.metrics,
                        cfg.max_request_bytes, cfg.http_body_timeout_s, self.security.keys)
            self.http = HttpFrontend(edge, self.health, cfg, self._engine_view())
            shared = bool(self.attach) or count > 1  # several processes listen on the one port
            self.http_port = await self.http.start(cfg.http_host or cfg.host, cfg.http_port, reuse_port=shared)
        if count > 1:
            self.frontends = FrontendPool(count, self.core.config_file, self.core.dir, self.core.addresses,
                                          self.port, self.http_port if self.http else -1, self.metrics,
                                          self.core.forget)
            await self.frontends.start()
            self.metrics.others = lambda: self._on_loop(self.frontends.metrics_texts, [])
        if not self.attach:  # the primary knows every process's pid (server/observability/memory.py)
            self.metrics.add_processes(self.processes)
        self.budget.start()
        # SIGHUP: reload --api-keys-file (here, and in the other frontend processes)
        self.security.watch_reload_signal(loop, self.frontends.signal_reload if self.frontends else None)
        await self.health.serving()
        log.info("serving %s on port %d (HTTP on %s, metrics on %s)", sorted(self.models), self.port,
                 self.http_port or "-", self.metrics_port or "-",
                 extra={"event": "serving", "models": sorted(self.models), "default_model": default,
                        "grpc_port": self.port, "http_port": self.http_port or None,
                        "metrics_port": self.metrics_port or None,
                        "build": self.metrics.build, "config": config_summary(cfg)})
        if self.core is None:  # the core process watches its own loops; its supervisor restarts it
            self._watchdog = asyncio.create_task(self._watch())
        return self.port

    def _cores(self) -> list[tuple[str, object]]:
        """(name, supervisor) of every engine core process: the replicas by index, then the background one
        while it runs."""
        cores = [(str(i), m) for i, m in enumerate(self.core.members)]
        if self.core.background is not None:
            cores.append(("background", self.core.background))
        return cores

    def _members(self) -> list[tuple[str, str, int]]:
        """(role, name, pid) of every live process of this server, as it knows them now (an extra frontend
        finds the primary's other children in /proc: it started none of them)."""
        if self.attach:
            replicas = [("replica", str(i), m.pid) for i, m in enumerate(self.core.members) if m.pid]
            primary = os.getppid()
            others = siblings(primary, {pid for _, _, pid in replicas})
            order = {"frontend": 0, "replica": 1, "background": 2}  # as the primary lists them
            return sorted([("frontend", "0", primary), *others, *replicas],
                          key=lambda m: (order[m[0]], int(m[1]) if m[1].isdigit() else 0))
        out = [("frontend", "0", os.getpid())]
        if self.frontends is not None:
            out += [("frontend", str(i), p.pid) for i, p in sorted(self.frontends.procs.items()) if p.poll() is None]
        if self.core is not None:
            out += [("background" if name == "background" else "replica", name, m.pid)
                    for name, m in self._cores() if m.pid]
        return out

    def _memory(self) -> list[dict]:
        return [{"role": p.role, "name": p.name, "pid": p.pid, "rssBytes": p.rss_bytes}
                for p in self.processes.snapshot()]

    def _engine_view(self) -> EngineView:
        """What GET /v1/status reads of the engine (server/edge/http/status.py)."""
        if self.core is not None:
            def replicas() -> list[dict]:
                return [{"name": name, "up": bool(m.link.up), "pid": m.pid} for name, m in self._cores()]
            return EngineView("process", self.core.metrics_text, replicas, self._memory)

        async def exposition() -> str:
            return generate_latest(self.metrics.engine_registry).decode()
        return EngineView("thread", exposition,
                          lambda: [{"name": "in-process", "up": self.engine_failure is None, "pid": os.getpid()}],
                          self._memory)

    async def _load_models(self) -> None:
        """Every bundle with its engine in this process, warmed up."""
        loop = asyncio.get_running_loop()
        for bundle in discover(self.cfg.model_repository):
            t0 = time.perf_counter()
            model = HostedModel(bundle, self.cfg, self.metrics)
            await loop.run_in_executor(None, model.here.start)  # warm-up blocks; keep the event loop free
            self.models[bundle.name] = model
            self._loaded(model, time.perf_counter() - t0)

    async def _start_core(self) -> None:
        """The engine core process loads and warms every model; this process keeps their tokenizers and
        request checks, and queues through the core's link (server/coreprocess/)."""
        t0 = time.perf_counter()
        models = [HostedModel(bundle, self.cfg, self.metrics, engine=False)
                  for bundle in discover(self.cfg.model_repository)]
        # A replica count the server chooses (one per core) is as many as the budget holds; one given is kept.
        chosen = not self.cfg.engine_replicas and not self.cfg.on_cuda
        self.core = Replicas(self.cfg, self.metrics, on_down=self.health.not_ready, on_up=self._core_back,
                             attach=self.attach, pieces={m.name: m.pieces for m in models},
                             memory_line=self.budget.line if chosen else None, room_for=self.budget.room_for)
        ready = await self.core.start()
        facts = {f.name: f for f in ready.models}
        if not self.attach:  # the primary exports the core's series; an extra frontend only its own
            self.metrics.add_core(lambda: self._on_loop(self.core.metrics_text, ""))
        for model in models:
            model.link, model.provider, model.capacity, model.variant = self.core, facts[model.name].provider, \
                facts[model.name].capacity, facts[model.name].variant
            self.models[model.name] = model
            self._loaded(model, time.perf_counter() - t0)

    async def _core_back(self) -> None:
        if not self._stopped.is_set():
            await self.health.serving()

    def _on_loop(self, coroutine, default):
        """Run `coroutine()` on the server's loop for a caller on another thread (the metrics port's),
        e.g. to ask the core or the other frontends for their series; `default` if it cannot."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return default
        try:
            if asyncio.get_running_loop() is loop:
                return default  # a scrape on the loop itself cannot wait for the loop's own answer
        except RuntimeError:
            pass
        try:
            return asyncio.run_coroutine_threadsafe(coroutine(), loop).result(timeout=5.0)
        except Exception:  # noqa: BLE001 (a core restarting: the scrape shows what this process has)
            return default

    def _loaded(self, model: HostedModel, seconds: float) -> None:
        bundle, cfg = model.bundle, self.cfg
        self.metrics.model_loaded(bundle.name, bundle.version, model.variant, model.provider, cfg.max_queue_size)
        log.info("loaded %s v%d (%s -> %s) on %s", bundle.name, bundle.version, bundle.source_language,
                 bundle.target_language, model.provider,
                 extra={"event": "model_loaded", "model": bundle.name, "version": bundle.version,
                        "variant": model.variant, "provider": model.provider, "source_language": bundle.source_language,
                        "target_language": bundle.target_language, "load_s": round(seconds, 3),
                        "engine_core": cfg.engine_core})

    # -- watchdog -----------------------------------------------------------------------
    def _engine_problem(self, now: float) -> Optional[str]:
        for model in self.models.values():
            problem = model.here.engine_problem(now, self.cfg.watchdog_s)
            if problem:
                return problem
        return None

    async def _watch(self) -> None:
        """A dead or stuck engine must not leave requests waiting forever behind a SERVING health
        status: fail everything with UNAVAILABLE, report NOT_SERVING and stop, so the process exits
        non-zero and its supervisor restarts it (the failure modes of vLLM #5901, TGI #2192)."""
        period = min(1.0, self.cfg.watchdog_s / 4)
        while not self._stopped.is_set():
            await asyncio.sleep(period)
            problem = self._engine_problem(time.monotonic())
            if problem and not self._stopped.is_set():
                self.engine_failure = problem
                log.error("watchdog: %s; failing all requests and shutting down", problem)
                error = Unavailable(f"the server's engine failed ({problem}); retry on another replica")
                for model in self.models.values():
                    model.here.scheduler.fail_everything(error)
                await self.health.enter_graceful_shutdown()  # liveness too: this replica is broken
                await self.stop(grace=0.0, lame_duck=0.0)
                return

    async def stop(self, grace: Optional[float] = None, lame_duck: Optional[float] = None) -> None:
        """NOT_SERVING at once; keep serving new and in-flight requests for the lame-duck period (balancers
        and health-checking clients move away meanwhile); then refuse new work (UNAVAILABLE) and let
        in-flight work finish within the grace period. A second call while in lame duck cuts it short."""
        if self._stopped.is_set():
            self._hurry.set()
            if self.frontends is not None:  # the other frontends cut their lame duck short too
                await self.frontends.send_stop()
            return
        self._stopped.set()
        grace = self.cfg.grace_period_s if grace is None else grace
        lame_duck = self.cfg.lame_duck_s if lame_duck is None else lame_duck
        await self.health.not_ready()
        if self.core is not None:
            for member in self.core.members:
                if member.attached:
                    member.stopping = True  # the primary stops the cores: their exit from here on is no loss
        others = None
        if self.frontends is not None:  # the same lame duck and drain in each, for its own calls
            await self.frontends.begin_stop()
            others = asyncio.create_task(self.frontends.stop(lame_duck + grace))
        if lame_duck > 0:
            log.info("lame duck: health NOT_SERVING, still serving for %.1f s", lame_duck,
                     extra={"event": "lame_duck", "lame_duck_s": lame_duck})
            try:
                await asyncio.wait_for(self._hurry.wait(), lame_duck)
            except asyncio.TimeoutError:
                pass
        log.info("refusing new work; draining in-flight work within %.1f s", grace,
                 extra={"event": "draining", "grace_period_s": grace, "in_flight": self._in_flight()})
        self.service.accepting = False
        loop = asyncio.get_running_loop()
        if self.core is not None:
            await self.core.stop(grace)
            if others is not None:
                await others
        else:
            await asyncio.gather(*(loop.run_in_executor(None, m.here.stop, grace) for m in self.models.values()))
        await self.server.stop(1.0)
        if self.http is not None:
            await self.http.stop()
        if self._own_dir:  # the documents' spool this server made (results not downloaded go with it)
            shutil.rmtree(self._own_dir, ignore_errors=True)
        self.executor.shutdown(wait=False, cancel_futures=True)
        if self._loop_lag is not None:
            self._loop_lag.cancel()
        if self.budget is not None:
            self.budget.stop()
        if self._metrics_http:
            self._metrics_http[0].shutdown()
        if self.tracer is not None:  # export the spans still buffered (bounded by the exporter's timeout)
            await loop.run_in_executor(None, self.tracer.shutdown)
        log.info("stopped", extra={"event": "stopped", "left_unfinished": self._in_flight(),
                                   "engine_failure": self.engine_failure})

    def _in_flight(self) -> int:
        """Texts queued or decoding, all models together."""
        if self.core is not None:
            return sum(len(m.link.jobs) for m in self.core.members)
        return sum(len(m.here.scheduler.waiting) + len(m.here.scheduler.running) for m in self.models.values())

    async def wait(self) -> None:
        await self.server.wait_for_termination()
