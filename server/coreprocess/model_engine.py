"""One served model's engine, built and warmed: ONNX Runtime, the slot cache, the scheduler and the engine loop.

Where the engine runs: in an engine core process (server/coreprocess/process.py builds one per model, and
loads no tokenizer: its frontend tokenises and hands it the vocabulary's pieces), or, with
`--engine-core thread`, in the frontend's own process under its HostedModel (server/frontend/hosted.py),
which prepares the requests. The request checks and the jobs are the frontend's; this is the rest: the
engine's construction from the settings, warm-up (every graph, and with CUDA graphs every bucket, before any
traffic), probes of a few ids, the watchdog's question, and the queue jobs enter.
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

from models.core.bundle import Bundle
from models.core.config import max_output_len
from server.config import ServerConfig
from server.core.request import DecodingParams, ErrorEvent, Event, FinishEvent, GenerationRules, Job

# A frontend's way to turn texts into jobs (HostedModel.jobs), so that warm-up reaches its tokenizer too
Prepare = Callable[[list[str], DecodingParams, Callable[[Event], None]], list[Job]]


def limits(cfg: ServerConfig, bundle: Bundle) -> tuple[int, int]:
    """(source tokens, output tokens) a request to this model may have: the server's limits within the
    model's positions. The frontend checks requests against them; the engine sizes its slots by them."""
    spec = bundle.spec
    return min(cfg.max_source_tokens, spec.max_positions), min(cfg.max_output_tokens, spec.max_positions - 1)


class ModelEngine:
    def __init__(self, bundle: Bundle, cfg: ServerConfig, metrics, pieces: tuple[str, ...],
                 prepare: Optional[Prepare] = None):
        """`pieces`: every output id's piece (glossary terms and the runaway guard read them); `prepare`: see
        Prepare (None in a core process, which has no tokenizer: probes are a few ids, probe_job)."""
        self.bundle, self.cfg, self.name, self.pieces, self.prepare = bundle, cfg, bundle.name, pieces, prepare
        self.max_source, self.max_output = limits(cfg, bundle)
        # Imported here, not with this module: a frontend over engine core processes imports it (limits) but
        # builds no engine, and ONNX Runtime alone is ~20 MB resident in every process that imports it.
        from models.core.kv_cache import SlotCache
        from models.core.heap import keep_freed_memory
        from models.core.runtime import OnnxModel, RuntimeOptions
        from server.core.chooser import TokenChooser
        from server.core.engine import Engine
        from server.core.loop import EngineLoop
        from server.core.runaway import RunawayGuard
        from server.core.scheduler import Scheduler
        keep_freed_memory()
        self.runtime = OnnxModel(bundle, RuntimeOptions(variant=cfg.variant, int8_weights=cfg.int8_weights,
                                                        int8_activations=cfg.int8_activations,
                                                        provider=cfg.provider, decoder=cfg.decoder,
                                                        cuda_graphs=cfg.cuda_graphs,
                                                        device_id=cfg.devices[0] if cfg.on_cuda else 0,
                                                        intra_op_threads=cfg.engine_threads,
                                                        inter_op_threads=cfg.inter_op_threads,
                                                        shared_pool=cfg.spinning,
                                                        allow_spinning=cfg.spinning))
        spec = bundle.spec
        self.provider, self.variant = self.runtime.providers[0], self.runtime.variant
        self.cache = SlotCache(spec, cfg.max_batch_size, self.max_source, self.max_output + 1,
                               self.runtime.cache_dtype, self.runtime.cache_device)
        self.capacity = self.cache.capacity
        generation = bundle.config.get("generation", {})
        rules = GenerationRules(spec.eos_id, spec.suppress_ids, bool(generation.get("force_eos_at_limit", False)),
                                bool(generation.get("renormalize", False)),
                                bool(generation.get("early_stopping", True)), spec.bos_id,
                                self.pieces)
        self.scheduler = Scheduler(self.name, self.cache, metrics, spec.eos_id,
                                   max_queue=cfg.max_queue_size, max_encode_tokens=cfg.max_batch_tokens,
                                   max_encode_batch=cfg.max_batch_size, stream_interval=cfg.stream_interval,
                                   rules=rules, guard=RunawayGuard(cfg.runaway_guard, min_span=cfg.runaway_min_span,
                                                                   length_ratio=cfg.runaway_length_ratio))
        self.engine = Engine(self.name, self.runtime, self.cache, metrics, cfg.max_encode_padding,
                             TokenChooser(rules.suppress_ids, rules.renormalize, spec.eos_id, spec.unk_id))
        self.loop = EngineLoop(self.scheduler, self.engine, cfg.max_queue_delay_ms / 1000.0, cfg.visit_steps)
        for gauge in (metrics.running, metrics.waiting, metrics.kv_usage):
            gauge.labels(self.name).set(0)


    async def submit(self, name: str, jobs: list) -> None:
        """Queue a request's jobs, all or none (a ServiceError otherwise): the queue a HostedModel in the same
        process submits to, as it submits to a core's link otherwise."""
        self.scheduler.submit(jobs)

    def engine_problem(self, now: float, stuck_after: float) -> Optional[str]:
        """Why this model's engine loop cannot be trusted any more (dead, or no progress with work
        waiting for `stuck_after` seconds), or None."""
        if not self.loop.is_alive():
            return f"the engine loop of {self.name} has died"
        if not self.scheduler.idle and now - self.loop.heartbeat > stuck_after:
            return f"the engine loop of {self.name} made no progress for {now - self.loop.heartbeat:.1f} s with work waiting"
        return None

    def start(self) -> None:
        self.loop.start()
        if self.cfg.warmup:
            self.warmup()

    def warmup(self) -> None:
        """One greedy and one beam translation, so the first user request pays no lazy initialisation; with
        CUDA graphs, every bucket's graph too (warm_buckets)."""
        for params in (DecodingParams(), DecodingParams(beam_size=2)):
            self._warm(params)
        step = self.engine.inplace
        if step is not None and step.bucketed:
            self.warm_buckets(step.sizes)

    def warm_buckets(self, sizes: list[int]) -> None:
        """Run the step at every bucket of rows a few times, so each bucket's CUDA graph is captured now,
        before any traffic, on the engine thread (models/core/inplace_step.py). ONNX Runtime keeps a graph
        in the capturing thread's context and captures with cudaStreamCaptureModeGlobal, so another thread's
        CUDA calls during a capture break it: captured at run time, one model's first step at a new bucket
        could fail another model's concurrent step. Models warm up one after another, with no traffic."""
        for rows in sizes:  # one source sampled `rows` times: exactly `rows` rows for 4 steps
            self._warm(DecodingParams(temperature=1.0, seed=0, num_hypotheses=rows, min_output_tokens=4,
                                      max_output_tokens=4))

    def _warm(self, params: DecodingParams) -> None:
        self.run_probes(params, 1, "warm-up", 60.0)

    def run_probes(self, params: DecodingParams, count: int, what: str, timeout_s: float) -> list[Job]:
        """Submit `count` probe calls with `params` together and wait until every one has ended; -> their jobs
        (each with its timing). Through the tokenizer when this model has one, so warm-up reaches it too;
        probe_job's ids otherwise. Warm-up and the decode step's measurement (server/frontend/cores/placement.py)
        run these on an idle engine, before any traffic. Raises RuntimeError, naming `what`, if one fails or
        they take longer than `timeout_s`."""
        done, ends = threading.Event(), []

        def sink(event: Event) -> None:
            if isinstance(event, (FinishEvent, ErrorEvent)):
                ends.append(event)
                if len(ends) == count:
                    done.set()
        jobs = self.prepare(["Warm-up."] * count, params, sink) if self.prepare else \
            [self.probe_job(params, sink) for _ in range(count)]
        self.scheduler.submit(jobs)
        if not done.wait(timeout_s) or any(isinstance(e, ErrorEvent) for e in ends):
            raise RuntimeError(f"{what} of {self.name} failed: {ends}")
        return jobs

    def probe_job(self, params: DecodingParams, sink: Callable[[Event], None]) -> Job:
        """A job of a few ids, no tokenizer needed (an engine core has none): runs every graph as text would
        (run_probes)."""
        lead, forced = default_language_tokens(self.bundle)
        spec = self.bundle.spec
        word = next(i for i in range(spec.vocab_size - 1, -1, -1) if i not in (spec.pad_id, spec.eos_id, spec.unk_id))
        ids = lead + [word] * 3 + [spec.eos_id]
        budget = min(params.max_output_tokens or max_output_len(len(ids), self.max_output), self.max_output - len(forced))
        return Job(self.name, ids, params, budget, sink, None, forced=forced)

    def stop(self, grace: float) -> None:
        self.loop.stop(grace)


def default_language_tokens(bundle: Bundle) -> tuple[list[int], tuple[int, ...]]:
    """The model's default pair's language ids: (ids leading the source, tokens forced first), as
    HostedModel.language_tokens gives them for a request that names no languages."""
    lang = bundle.languages
    source, target = bundle.source_language, bundle.target_language
    if lang.target_rule == "source_prefix":
        return [lang.target_tokens[target]], ()
    if lang.target_rule == "forced_bos":
        return [lang.source_tokens[source]], (lang.target_tokens[target],)
    return [], ()
