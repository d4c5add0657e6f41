"""Every Prometheus metric the server exports, declared in one place.

Base units (seconds, tokens), `_total` counters, and histogram buckets sized
for these latencies: a decode step on CPU is ~1-20 ms, a whole translation
~20 ms to a few seconds. Each server instance owns a registry, so tests can
run several servers in one process and scrape each one's endpoint.
"""
from __future__ import annotations

import threading

import numpy as np
from prometheus_client import (CollectorRegistry, Counter, Gauge, GCCollector, Histogram, PlatformCollector,
                               ProcessCollector, start_http_server)
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

STEP_BUCKETS = (0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.0)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
RATIO_BUCKETS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
SENTENCE_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Metrics:
    """`engine_here`: False in a frontend whose engine runs in the core process (server/coreprocess/): the
    engine's series (registered in `engine_registry`: queue, tokens, batches, steps, slots) are then the
    core's, read from it at each scrape (`add_core`), and this process's copies of them stay unexported."""

    def __init__(self, engine_here: bool = True) -> None:
        r = self.registry = CollectorRegistry()
        e = r if engine_here else CollectorRegistry()  # the engine's series: exported here, or the core's
        self.requests = Counter("nmt_requests_total", "Finished RPCs by method and gRPC status code.",
                                ["rpc", "code"], registry=r)
        self.request_latency = Histogram("nmt_request_duration_seconds", "End-to-end RPC latency.",
                                         ["rpc"], buckets=LATENCY_BUCKETS, registry=r)
        # The series the engine thread observes (per job, per step, per pass) are BatchHistograms: an append each.
        self.queue_time = BatchHistogram("nmt_queue_duration_seconds", "Time from arrival to the encoder pass.",
                                         "model", LATENCY_BUCKETS, registry=e)
        self.ttft = BatchHistogram("nmt_time_to_first_token_seconds", "Time from arrival to the first generated "
                                   "token.", "model", LATENCY_BUCKETS, registry=e)
        self.inter_token = BatchHistogram("nmt_inter_token_seconds", "Time between consecutive tokens of a sequence.",
                                          "model", STEP_BUCKETS, registry=e)
        self.e2e = BatchHistogram("nmt_sequence_duration_seconds", "Time from arrival to the last token of a text.",
                                  "model", LATENCY_BUCKETS, registry=e)
        self.input_tokens = Counter("nmt_input_tokens_total", "Source tokens accepted.", ["model"], registry=e)
        self.output_tokens = Counter("nmt_output_tokens_total", "Target tokens generated.", ["model"], registry=e)
        self.output_length = BatchHistogram("nmt_output_length_tokens", "Generated tokens per text.", "model",
                                            TOKEN_BUCKETS, registry=e)
        self.running = Gauge("nmt_running_requests", "Texts being decoded.", ["model"], registry=e)
        self.waiting = Gauge("nmt_waiting_requests", "Texts waiting for a slot.", ["model"], registry=e)
        self.kv_usage = Gauge("nmt_kv_cache_usage_ratio", "Fraction of KV cache slots in use.", ["model"], registry=e)
        self.decode_batch = BatchHistogram("nmt_decode_batch_size", "Rows in a decode step.", "model",
                                           BATCH_BUCKETS, registry=e)
        self.encode_batch = BatchHistogram("nmt_encode_batch_size", "Texts in an encoder pass.", "model",
                                           BATCH_BUCKETS, registry=e)
        self.padding = BatchHistogram("nmt_encode_padding_ratio", "Padding share of an encoder batch.", "model",
                                      RATIO_BUCKETS, registry=e)
        self.encode_time = BatchHistogram("nmt_encode_duration_seconds", "Encoder pass duration.", "model",
                                          STEP_BUCKETS, registry=e)
        self.step_time = BatchHistogram("nmt_decode_step_duration_seconds", "Decoder step duration (all rows).",
                                        "model", STEP_BUCKETS, registry=e)
        self.guarded_rows = Counter("nmt_runaway_stopped_total",
                                    "Decodes stopped by the runaway guard (looping or outgrowing the source).",
                                    ["model"], registry=e)
        self.glossary_rewinds = Counter("nmt_glossary_rewinds_total",
                                        "Greedy decodes that chose to end with a glossary term never begun and "
                                        "went back to write it where the model found it likeliest (server/"
                                        "core/term_placement.py).", ["model"], registry=e)
        self.failed_rows = Counter("nmt_engine_failed_rows_total",
                                   "Decode rows failed alone: the model gave them NaN or infinite scores, or their "
                                   "token choice or bookkeeping raised (their request ends INTERNAL; the batch "
                                   "goes on).", ["model"], registry=e)
        self.document_sentences = Histogram("nmt_request_sentences", "Sentences decoded per Translate/TranslateStream "
                                            "request (all its texts).", ["model"], buckets=SENTENCE_BUCKETS,
                                            registry=r)
        self.split_time = Histogram("nmt_sentence_split_duration_seconds", "Time to split a request's texts into "
                                    "sentences (and tokenise them).", ["model"], buckets=STEP_BUCKETS, registry=r)
        # A frontend's event loop behind its timers: the time a ready callback (a new call, a stream's next
        # write) waits for the loop. The engine's TTFT and queue time start when admission has run, so a
        # saturated frontend is invisible in them (server/observability/looplag.py).
        self.loop_lag = Histogram("nmt_event_loop_lag_seconds", "How late the frontend's asyncio event loop ran "
                                  "a timer due every 0.1 s: the wait of everything ready on the loop.",
                                  buckets=STEP_BUCKETS, registry=r)
        self.stream_messages = Counter("nmt_stream_messages_total",
                                       "TranslateStream messages sent; each carries one or more tokens.",
                                       ["model"], registry=r)
        # Security (server/security/): the key id, never the key; ids past --auth-metrics-max-keys are "other".
        self.auth_requests = Counter("nmt_auth_requests_total", "RPCs checked by API-key auth, by key id ('' "
                                     "without a valid key, 'other' past the label cap) and result: ok, "
                                     "unauthenticated, permission_denied, rate_limited.", ["key_id", "result"],
                                     registry=r)
        self.auth_keys = Gauge("nmt_auth_keys", "API keys loaded from --api-keys-file.", registry=r)
        self.auth_reloads = Counter("nmt_auth_key_reloads_total", "Reloads of --api-keys-file (SIGHUP) by result: "
                                    "ok, or error (the old keys stay).", ["result"], registry=r)

        # The HTTP APIs (server/edge/http/): every HTTP request by API (native, deepl, libretranslate, health), the
        # operation it asked for and its HTTP status; the translation calls among them are also counted in
        # nmt_requests_total by RPC and gRPC code, as the gRPC ones are (they run the same servicer).
        self.http_requests = Counter("nmt_http_requests_total", "HTTP requests by API, operation and HTTP status.",
                                     ["api", "operation", "status"], registry=r)
        self.language_detections = Counter("nmt_language_detections_total", "Source languages detected for texts "
                                           "sent without one, by detected language ('unserved' when no model "
                                           "translates from it).", ["language"], registry=r)
        # Glossaries (docs/glossaries.md): each translation request's glossary, by how it was found, and
        # each entry found in a text, by whether its target term made it into the translation.
        self.glossary_lookups = Counter("nmt_glossary_lookups_total", "Glossaries a translation request asked "
                                        "for, by result: stored (found in the store), inline (entries sent with "
                                        "the request), refused (unknown id, another key's, no dictionary for the "
                                        "pair, or bad entries).", ["result"], registry=r)
        self.glossary_terms = Counter("nmt_glossary_terms_total", "Glossary entries whose source term occurs in "
                                      "a translated text, by outcome: applied (the target term is in the "
                                      "translation) or missed.", ["outcome"], registry=r)

        # Observability (docs/observability.md): the process (CPU, memory, open files, start time), the
        # interpreter and its garbage collector, as prometheus_client exports them on its default registry,
        # here on the server's own; and what is running: build and models, as labels of a gauge set to 1.
        for collector in (ProcessCollector, PlatformCollector, GCCollector):
            collector(registry=r)
        self.build_info = Gauge("nmt_build_info", "The server's build: its version and its runtime's, as labels (1).",
                                ["version", "python", "onnxruntime", "grpc"], registry=r)
        self.build = dict(zip(("version", "python", "onnxruntime", "grpc"), build_versions()))
        self.build_info.labels(**self.build).set(1)
        self.model_info = Gauge("nmt_model_info", "A served model: name, bundle version, graph variant, execution "
                                "provider, as labels (1).", ["model", "version", "variant", "provider"], registry=r)
        self.core_restarts = Counter("nmt_engine_core_restarts", "Restarts of the engine core process after "
                                     "it exited unasked (--engine-core process): its calls in flight failed "
                                     "UNAVAILABLE.", registry=r)
        self.engine_registry = e
        self.frontend_restarts = Counter("nmt_frontend_restarts", "Restarts of an extra frontend process "
                                         "(--frontends) after it exited unasked: its own calls were lost.",
                                         registry=r)
        # --frontends N: () -> the other frontends' expositions, merged into this one's at each scrape
        self.others = None
        self.memory_trims = Counter("nmt_memory_trims", "Times this frontend handed its free heap pages back to "
                                    "the system after a burst (server/frontend/memory_budget.py).", registry=r)
        self.memory_trimmed = Counter("nmt_memory_trimmed_bytes", "Resident bytes those trims gave back.",
                                      registry=r)
        self.queue_capacity = Gauge("nmt_queue_capacity", "Sentences the waiting queue holds per model "
                                    "(--max-queue-size): nmt_waiting_requests / this is the queue's fill.",
                                    ["model"], registry=r)

    def add_processes(self, processes) -> None:
        """Export every process's resident memory (server/observability/memory.py ServerProcesses), read
        from /proc at each scrape: the primary's, which knows every pid."""
        self.registry.register(_ProcessMemory(processes))

    def add_core(self, fetch) -> None:
        """Export the engine's series from the core process: `fetch()` returns its registry's exposition."""
        names = {family.name for family in self.engine_registry.collect()}
        self.registry.register(_CoreSeries(fetch, names))

    def model_loaded(self, model: str, version: int, variant: str, provider: str, queue_capacity: int) -> None:
        self.model_info.labels(model, str(version), variant, provider).set(1)
        self.queue_capacity.labels(model).set(queue_capacity)

    def for_model(self, model: str) -> "ModelMetrics":
        return ModelMetrics(self, model)

    def serve(self, port: int, addr: str = "0.0.0.0"):
        """Start the /metrics HTTP endpoint; returns (server, thread)."""
        return start_http_server(port, addr=addr, registry=_Exposition(self))


def build_versions() -> tuple[str, str, str, str]:
    """(nmt-serve, Python, ONNX Runtime, grpcio) versions; "unknown" for one that cannot be read."""
    import platform
    import sys
    from importlib import metadata

    def installed(*distributions: str) -> str:  # read, not imported: the engine core has no grpc, a frontend
        for name in distributions:                # over engine cores no ONNX Runtime
            try:
                return metadata.version(name)
            except metadata.PackageNotFoundError:
                pass
        return "unknown"
    loaded = sys.modules.get("onnxruntime")  # where it is loaded, the build that is (CPU or GPU)
    ort = getattr(loaded, "__version__", "") or installed("onnxruntime-gpu", "onnxruntime")
    version = installed("nmt-serve")  # "unknown" when run from a checkout that was never installed
    return version, platform.python_version(), ort, installed("grpcio")


class _Exposition:
    """What the metrics port exports: this process's registry, plus, with extra frontend processes, their
    counters and histograms added sample by sample (one view of the server). Gauges (build, models,
    keys: the same in every frontend) and the process_/python_ families are this process's own."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self):
        families = list(self.metrics.registry.collect())
        texts = self.metrics.others() if self.metrics.others is not None else []
        if not texts:
            yield from families
            return
        by_name = {f.name: f for f in families}
        at = {f.name: {(s.name, tuple(sorted(s.labels.items()))): i for i, s in enumerate(f.samples)}
              for f in families}
        for text in texts:
            for family in text_string_to_metric_families(text):
                mine = by_name.get(family.name)
                if mine is None or family.type not in ("counter", "histogram") or \
                        family.name.startswith(("process_", "python_")):
                    continue
                for sample in family.samples:
                    if sample.name.endswith("_created"):
                        continue
                    key = (sample.name, tuple(sorted(sample.labels.items())))
                    i = at[family.name].get(key)
                    if i is None:
                        at[family.name][key] = len(mine.samples)
                        mine.samples.append(sample)
                    else:
                        mine.samples[i] = mine.samples[i]._replace(value=mine.samples[i].value + sample.value)
        yield from families


class _ProcessMemory:
    """nmt_process_resident_memory_bytes{role, name}: one series per process of the server at the scrape."""

    def __init__(self, processes):
        self.processes = processes

    def collect(self):
        family = GaugeMetricFamily("nmt_process_resident_memory_bytes", "Resident memory (VmRSS) of each "
                                   "process of the server: role frontend (name 0 the primary, 1.. --frontends), "
                                   "replica (its index) or background; shared pages count in each.",
                                   labels=["role", "name"])
        for p in self.processes.snapshot():
            family.add_metric([p.role, p.name], p.rss_bytes)
        yield family


class _CoreSeries:
    """The engine core's families named in `names`, parsed from its exposition at each collect."""

    def __init__(self, fetch, names: set[str]):
        self.fetch, self.names = fetch, names

    def collect(self):
        text = self.fetch()
        for family in text_string_to_metric_families(text) if text else ():
            if family.name in self.names:
                yield family


class BatchHistogram:
    """A Prometheus histogram for the engine thread: an observation is a list append, counted into the
    buckets in one numpy pass when read (a scrape) or when FOLD_AT have piled up.

    prometheus_client's Histogram.observe walks its buckets in Python under a lock: the inter-token gap,
    one observation per decoded row per step, was a tenth of the engine's Python per step, and with the
    step's own time and rows, the gauges and the encoder's three, the metrics were ~14% of it at one row
    (python -m benchmarks.engine_overhead, 2026-11-28). The exposition is the same histogram (_bucket,
    _count, _sum)."""

    FOLD_AT = 4096  # observations held before the engine thread counts them itself (nobody scraping)

    def __init__(self, name: str, documentation: str, label: str, buckets: tuple, registry: CollectorRegistry):
        self.name, self.documentation, self.label = name, documentation, label
        self.bounds = np.array(buckets, dtype=np.float64)
        self.children: dict[str, "_BatchHistogramChild"] = {}
        self.lock = threading.Lock()
        registry.register(self)

    def labels(self, value: str) -> "_BatchHistogramChild":
        with self.lock:
            return self.children.setdefault(value, _BatchHistogramChild(self))

    def collect(self):
        family = HistogramMetricFamily(self.name, self.documentation, labels=[self.label])
        with self.lock:
            children = sorted(self.children.items())
        bounds = [floatToGoString(b) for b in [*self.bounds.tolist(), float("inf")]]
        for value, child in children:
            counts, total = child.read()
            family.add_metric([value], list(zip(bounds, np.cumsum(counts).tolist())), total)
        yield family


class _BatchHistogramChild:
    def __init__(self, parent: BatchHistogram):
        self.parent = parent
        self.lock = threading.Lock()  # held for an append or a fold: an observation is never lost
        self.pending: list[float] = []
        self.counts = np.zeros(len(parent.bounds) + 1, dtype=np.int64)  # per bucket, the last is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        with self.lock:
            self.pending.append(value)
            if len(self.pending) >= BatchHistogram.FOLD_AT:
                self._fold()

    def observe_many(self, values) -> None:
        if not len(values):
            return
        with self.lock:
            self.pending.extend(values)
            if len(self.pending) >= BatchHistogram.FOLD_AT:
                self._fold()

    def read(self) -> tuple[np.ndarray, float]:
        """(count per bucket, sum) of every observation so far."""
        with self.lock:
            self._fold()
            return self.counts.copy(), self.total

    def _fold(self) -> None:
        if self.pending:
            v = np.asarray(self.pending, dtype=np.float64)
            self.pending = []
            at = np.searchsorted(self.parent.bounds, v, side="left")  # le-bound buckets, as Prometheus counts
            self.counts += np.bincount(at, minlength=len(self.counts))
            self.total += float(v.sum())


class ModelMetrics:
    """The per-model children, bound once: `labels()` costs a locked dict lookup, and the
    engine loop would otherwise pay it several times per decode step."""

    PER_MODEL = ("queue_time", "ttft", "inter_token", "e2e", "input_tokens", "output_tokens", "output_length",
                 "running", "waiting", "kv_usage", "decode_batch", "encode_batch", "padding", "encode_time",
                 "step_time", "stream_messages", "guarded_rows", "failed_rows", "document_sentences",
                 "split_time", "glossary_rewinds")

    def __init__(self, metrics: Metrics, model: str):
        for name in self.PER_MODEL:
            setattr(self, name, getattr(metrics, name).labels(model))
