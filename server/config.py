"""Server settings: every one a CLI flag with an NMT_* environment-variable fallback."""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional, Sequence

from server.config_help import HELP

CHECKOUT_REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"
# Where `pip install .` puts the shipped bundle (pyproject.toml, [tool.setuptools.data-files]).
INSTALLED_REPOSITORY = Path(sys.prefix) / "share" / "nmt-serve" / "model_repository"


def default_repository() -> Path:
    """The model repository when neither --model-repository nor NMT_MODEL_REPOSITORY names one, the first
    that exists of: the source checkout's (running from it, or an editable install), ./model_repository
    (the current directory), the shipped bundle installed with the package. None: the checkout's path,
    which the start-up error then names."""
    for candidate in (CHECKOUT_REPOSITORY, Path.cwd() / "model_repository", INSTALLED_REPOSITORY):
        if candidate.is_dir():
            return candidate
    return CHECKOUT_REPOSITORY


DEFAULT_REPOSITORY = default_repository()


def physical_cores() -> int:
    """Cores this process may run on, SMT siblings counted once (the size of ONNX Runtime's default pool),
    and no more than a container's CPU quota (a Kubernetes or Docker CPU limit leaves the affinity at
    every core of the node: a replica per node core would oversubscribe the limit)."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else range(os.cpu_count() or 1)
    cores = set()
    for cpu in cpus:
        try:
            cores.add(Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip())
        except OSError:  # no topology (not Linux, a restricted container): count the CPU itself
            cores.add(str(cpu))
    quota = cpu_quota()
    return max(1, min(len(cores), quota) if quota else len(cores))


def cpu_quota(path: str = "/sys/fs/cgroup/cpu.max") -> int:
    """The cgroup v2 CPU limit in whole CPUs, rounded up (0: none, or no cgroup v2 here)."""
    try:
        quota, period = Path(path).read_text().split()[:2]
    except (OSError, ValueError):
        return 0
    if quota == "max":
        return 0
    return max(1, -(-int(quota) // int(period)))


def _cuda_available() -> bool:
    """Whether ONNX Runtime here has its CUDA provider (--provider auto would pick it). Where it is not
    loaded yet, its package is looked at instead of imported: the provider is a library of its own
    (libonnxruntime_providers_cuda), and a frontend over engine core processes never loads ONNX Runtime
    (~20 MB resident) just to ask."""
    loaded = sys.modules.get("onnxruntime")
    if loaded is not None:
        return "CUDAExecutionProvider" in loaded.get_available_providers()
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or not spec.submodule_search_locations:
        return False
    return any((Path(spec.submodule_search_locations[0]) / "capi").glob("*onnxruntime_providers_cuda*"))


@dataclass
class ServerConfig:
    host: str = "0.0.0.0"
    port: int = 50051
    metrics_port: int = 9090  # -1 = no metrics endpoint, 0 = any free port
    http_port: int = 8080  # -1 = no HTTP port, 0 = any free port
    http_host: str = ""  # empty = --host
    http_keepalive_s: int = 5
    http_max_connections: int = 1000
    http_max_header_bytes: int = 16384
    http_body_timeout_s: float = 30.0
    web_ui: bool = True  # the translator and status pages (server/edge/http/pages.py)
    memory_limit: str = "auto"  # auto = the cgroup's limit, or none; 0 = off; 500M, 2G (server/frontend/memory_budget.py)
    model_repository: str = str(DEFAULT_REPOSITORY)
    model: tuple = ()  # Hugging Face models to import and serve (server/frontend/model_imports.py); replaces model_repository
    cache_dir: str = ""
    default_model: str = ""  # empty = the first model by name
    variant: str = "fp32"  # fp32 | int8 | fp16
    int8_weights: str = "auto"  # auto | 7 | 8 (models/core/runtime.py served_variant)
    int8_activations: str = "auto"  # auto | static | row (models/core/runtime.py served_variant)
    calibration_text: str = ""  # --model with --variant int8: the import's int8-static calibration sentences
    provider: str = "auto"  # auto | cpu | cuda
    device: str = ""  # cuda:N[,cuda:M...]; "" = every visible device (see devices)
    decoder: str = "auto"  # auto | inplace | standard | copy
    cuda_graphs: bool = True  # models/core/inplace_step.py (bucketed); CUDA fp32 only
    intra_op_threads: int = 0
    inter_op_threads: int = 1
    ort_spinning: str = "auto"  # auto | true | false: see `spinning`
    max_batch_size: int = 64  # decode rows (KV cache slots) per model
    max_batch_tokens: int = 4096  # source tokens per encoder pass
    max_encode_padding: float = 0.15  # admitted texts are encoded in groups padded at most this much
    max_queue_delay_ms: float = 0.0  # idle engine: wait this long for company before encoding (Triton's default: 0)
    max_queue_size: int = 1024  # sentences waiting per model; beyond: RESOURCE_EXHAUSTED
    stream_interval: int = 1  # streams: first token at once, then messages of at least N tokens
    visit_steps: int = 8  # most decode steps per host visit, plain greedy batches (server/core/loop.py)
    max_texts_per_request: int = 64
    max_text_chars: int = 50_000  # per text (a document), checked before splitting
    max_sentences_per_request: int = 512
    max_request_bytes: int = 4 << 20  # gRPC receive limit; larger messages get RESOURCE_EXHAUSTED unparsed
    max_source_tokens: int = 256
    max_output_tokens: int = 256
    max_beam_size: int = 8
    max_hypotheses: int = 8
    grace_period_s: float = 10.0
    lame_duck_s: float = 0.0  # SIGTERM: NOT_SERVING but still serving for this long, then the drain
    max_connection_age_ms: int = 0  # 0 = connections live forever (gRPC's default)
    max_connection_age_grace_ms: int = 0  # 0 = no limit
    keepalive_time_ms: int = 60_000
    keepalive_timeout_ms: int = 20_000
    keepalive_min_ping_interval_ms: int = 10_000  # the client library pings every 30 s by default
    keepalive_permit_without_calls: bool = True
    workers: int = 4  # threads for the handlers' blocking work (validation, tokenisation), off the event loop
    engine_core: str = "process"  # process | thread (server/coreprocess/)
    glossary_db: str = ""  # the glossaries' SQLite file; "" = server.glossary.store.default_path()
    document_dir: str = ""  # document jobs' spool (server/files/spool.py); "" = a temporary one per server
    background_replica: bool = True  # a nice-19 engine core for PRIORITY_BACKGROUND work (replicas.py)
    engine_replicas: int = 0  # engine core processes (--engine-core process); 0 = one per physical core
    spread_row_cost_ms: float = 0.5  # replicas: spread a model's calls when its rows cost more (placement.py)
    frontends: int = 0  # frontend processes over the core (--engine-core process); 0 = one per 4 cores
    watchdog_s: float = 30.0  # no engine step for this long with work waiting: NOT_SERVING, fail requests, exit 3
    warmup: bool = True
    runaway_guard: bool = True
    runaway_min_span: int = 12
    runaway_length_ratio: float = 3.0
    metrics_host: str = ""  # empty = --host
    tls_cert_file: str = ""  # TLS on the gRPC port with --tls-key-file (and then no plaintext)
    tls_key_file: str = ""
    tls_client_ca_file: str = ""  # mutual TLS: client certificates required and verified
    api_keys_file: str = ""  # empty = no API keys
    auth_health_and_reflection: bool = False  # health and reflection open by default (probes carry no key)
    auth_metrics_max_keys: int = 100
    log_format: str = "auto"  # auto (text on a terminal, json otherwise) | json | text
    log_level: str = "info"
    otlp_endpoint: str = ""  # empty = OTEL_EXPORTER_OTLP_ENDPOINT (or no tracing)

    @classmethod
    def parser(cls) -> argparse.ArgumentParser:
        p = argparse.ArgumentParser(prog="python -m server", description="gRPC translation server.",
                                    formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        for f in fields(cls):
            env = "NMT_" + f.name.upper()
            flag = "--" + f.name.replace("_", "-")
            default = f.default
            if f.type in ("tuple", tuple):  # a repeatable flag; the variable holds the values comma-separated
                given = tuple(v for v in os.environ.get(env, "").split(",") if v)
                p.add_argument(flag, action=_Repeated, default=given, help=f"{HELP[f.name]} [env {env}]")
            elif f.type in ("bool", bool):
                p.add_argument(flag, type=_bool, default=_bool(os.environ.get(env, str(default))),
                               help=f"{HELP[f.name]} [env {env}]")
            else:
                kind = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
                p.add_argument(flag, type=kind, default=kind(os.environ.get(env, default)),
                               help=f"{HELP[f.name]} [env {env}]")
        return p

    @classmethod
    def from_args(cls, argv: Optional[Sequence[str]] = None) -> "ServerConfig":
        return cls(**vars(cls.parser().parse_args(argv)))

    @property
    def spinning(self) -> bool:
        """--ort-spinning resolved: auto spins only when the engine shares the server's process."""
        value = self.ort_spinning
        if isinstance(value, str) and value.strip().lower() == "auto":
            return self.engine_core == "thread"
        return _bool(value.strip() if isinstance(value, str) else value)

    @property
    def frontend_processes(self) -> int:
        """--frontends resolved: N as given, or 0 = one per 4 cores (at least 1) with the engine core in its own
        process; 1 otherwise. Each frontend is an event loop that wants a core of its own under load."""
        if self.engine_core != "process":
            return 1
        return self.frontends if self.frontends > 0 else max(1, (os.cpu_count() or 1) // 4)

    @property
    def on_cuda(self) -> bool:
        return self.provider == "cuda" or (self.provider == "auto" and _cuda_available())

    @property
    def devices(self) -> list[int]:
        """--device resolved: the CUDA device ids the engine replicas run on, one each."""
        if self.device:
            return [int(d.split(":", 1)[1]) for d in self.device.split(",")]
        if self.engine_core != "process":
            return [0]
        from models.core.device_arrays import device_count  # numpy only; CuPy when it is there
        return list(range(max(1, device_count())))  # without CuPy: the one device ONNX Runtime picks

    @property
    def replicas(self) -> int:
        """--engine-replicas resolved: N as given, or 0 = one per physical core with the engine core in its
        own processes (independent single-thread engines: nothing waits on a thread pool's barrier between
        the small kernels of a small model; CTranslate2's inter_threads), 1 in-process."""
        if self.engine_core != "process":
            return 1
        if self.engine_replicas > 0:
            return self.engine_replicas
        if self.on_cuda:
            return len(self.devices)  # one engine per GPU
        # The first frontend shares the engines' cores (its work comes between theirs); extra ones take one each.
        return max(1, physical_cores() - (self.frontend_processes - 1))

    @property
    def background_core(self) -> bool:
        """--background-replica resolved: only with engine core processes on CPU (CPU priority means nothing
        to a GPU, whose one engine would be loaded twice)."""
        if not self.background_replica or self.engine_core != "process":
            return False
        return not self.on_cuda

    @property
    def engine_threads(self) -> int:
        """--intra-op-threads resolved (0 = ONNX Runtime's default, one per physical core).

        With the engine core in its own process, the default leaves a core to each frontend: a loaded
        frontend keeps one core busy with gRPC writes, and ONNX Runtime threads that share it wait on
        the frontend at every operator's barrier. Measured on 2 cores (git show 275dec7:docs/benchmarks/serving_load_engine_core_threads.md):
        one engine thread served 1.1-1.3x the tokens/s of two, at 1, 8 and 64 streams, with the engine
        core's CPU per token down by a third."""
        if self.intra_op_threads > 0 or self.engine_core != "process":
            return self.intra_op_threads
        return max(1, (physical_cores() - self.frontend_processes) // self.replicas)

    def problems(self) -> list[str]:
        """Settings that contradict each other or make a legal request unservable, all at once.

        Each of these once let a request that passes every check wait forever or be refused
        with "retry later": a queue smaller than one request, an encoder budget smaller than
        one legal text. (A beam wider than the decode slots is refused per request, with a
        message that says so.)
        """
        out = []
        try:
            from server.frontend.memory_budget import parse_limit  # here: the configuration imports no frontend
            parse_limit(self.memory_limit)
        except ValueError as e:
            out.append(str(e))
        for name in ("port", "max_batch_size", "max_batch_tokens", "max_queue_size", "stream_interval", "visit_steps",
                     "max_texts_per_request", "max_text_chars", "max_request_bytes", "max_source_tokens",
                     "max_output_tokens", "max_beam_size", "max_hypotheses", "workers", "max_sentences_per_request"):
            if getattr(self, name) < (0 if name == "port" else 1):
                out.append(f"--{_flag(name)} must be >= {0 if name == 'port' else 1} (got {getattr(self, name)})")
        if self.max_queue_size < self.max_sentences_per_request:
            out.append(f"--max-queue-size {self.max_queue_size} is below --max-sentences-per-request "
                       f"{self.max_sentences_per_request}: a legal request could never be queued")
        if self.max_sentences_per_request < self.max_texts_per_request:
            out.append(f"--max-sentences-per-request {self.max_sentences_per_request} is below "
                       f"--max-texts-per-request {self.max_texts_per_request}")
        try:
            self.spinning
        except argparse.ArgumentTypeError:
            out.append(f"--ort-spinning must be auto, true or false (got {self.ort_spinning!r})")
        if self.engine_core not in ("thread", "process"):
            out.append(f"--engine-core must be thread or process (got {self.engine_core!r})")
        if self.engine_replicas < 0 or (self.engine_replicas > 1 and self.engine_core != "process"):
            out.append(f"--engine-replicas {self.engine_replicas}: several engine replicas need --engine-core "
                       "process (0 = one per physical core there)")
        if self.frontends < 0 or (self.frontends > 1 and self.engine_core != "process"):
            out.append(f"--frontends {self.frontends}: extra frontend processes need --engine-core process "
                       "(and a count >= 0)")
        if self.runaway_min_span < 2 or not self.runaway_length_ratio > 0:
            out.append("--runaway-min-span must be >= 2 and --runaway-length-ratio > 0")
        if self.max_batch_tokens < self.max_source_tokens:
            out.append(f"--max-batch-tokens {self.max_batch_tokens} is below --max-source-tokens "
                       f"{self.max_source_tokens}: a legal text could never be encoded")
        if not 0.0 <= self.max_encode_padding < 1.0:
            out.append(f"--max-encode-padding must be in [0, 1) (got {self.max_encode_padding})")
        if self.spread_row_cost_ms < 0:
            out.append(f"--spread-row-cost-ms must be >= 0 (got {self.spread_row_cost_ms})")
        if self.max_queue_delay_ms < 0 or self.grace_period_s < 0 or self.watchdog_s <= 0:
            out.append("--max-queue-delay-ms and --grace-period-s must be >= 0, --watchdog-s > 0")
        if self.http_port < -1 or self.http_keepalive_s < 1 or self.http_max_connections < 1 \
                or self.http_max_header_bytes < 1024 or not self.http_body_timeout_s > 0:
            out.append("--http-port must be >= -1, --http-keepalive-s and --http-max-connections >= 1, "
                       "--http-max-header-bytes >= 1024, --http-body-timeout-s > 0")
        if self.lame_duck_s < 0:
            out.append(f"--lame-duck-s must be >= 0 (got {self.lame_duck_s})")
        for name in ("max_connection_age_ms", "max_connection_age_grace_ms", "keepalive_time_ms",
                     "keepalive_min_ping_interval_ms"):
            if getattr(self, name) < 0:
                out.append(f"--{_flag(name)} must be >= 0 (got {getattr(self, name)})")
        if self.keepalive_timeout_ms < 1:
            out.append(f"--keepalive-timeout-ms must be >= 1 (got {self.keepalive_timeout_ms})")
        if self.variant not in ("fp32", "int8", "fp16"):
            out.append(f"--variant must be fp32, int8 or fp16 (got {self.variant!r})")
        if self.int8_weights not in ("auto", "7", "8"):
            out.append(f"--int8-weights must be auto, 7 or 8 (got {self.int8_weights!r})")
        if self.int8_activations not in ("auto", "static", "row"):
            out.append(f"--int8-activations must be auto, static or row (got {self.int8_activations!r})")
        if self.calibration_text and not os.path.isfile(self.calibration_text):
            out.append(f"--calibration-text {self.calibration_text}: no such file")
        if self.decoder not in ("auto", "inplace", "standard", "copy"):
            out.append(f"--decoder must be auto, inplace, standard or copy (got {self.decoder!r})")
        if self.device and not all(re.fullmatch(r"cuda:\d+", d) for d in self.device.split(",")):
            out.append(f"--device must be cuda:N or a comma-separated list of them (got {self.device!r})")
        elif self.device and self.engine_core != "process" and "," in self.device:
            out.append("--device with several devices needs --engine-core process (a replica per device)")
        if self.provider not in ("auto", "cpu", "cuda"):
            out.append(f"--provider must be auto, cpu or cuda (got {self.provider!r})")
        if self.log_format not in ("auto", "json", "text") or self.log_level.lower() not in _LOG_LEVELS:
            out.append(f"--log-format must be auto, json or text and --log-level one of {', '.join(_LOG_LEVELS)} "
                       f"(got {self.log_format!r}, {self.log_level!r})")
        from server.security.wiring import security_problems  # TLS files, key file lines (with line numbers)
        out += security_problems(self)
        return out


_LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


class _Repeated(argparse.Action):
    """A flag given several times collects its values; given at all, they replace the default (the env's)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        held = getattr(namespace, self.dest)
        setattr(namespace, self.dest, (() if held is self.default else tuple(held)) + (values,))


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean, got {text!r}")
