"""One served model as the frontend prepares its requests: its bundle, tokenizer, languages, documents
planned into sentences, the request checks that depend on the model (source length in tokens, output
budget, the decoding options against the server's limits) and the jobs, so every limit is enforced before
anything is queued. The jobs go to the engine through `link`: a core's link (server/frontend/cores/link.py)
or, with `--engine-core thread`, the ModelEngine built here (server/coreprocess/model_engine.py: the
engine's construction and warm-up live there, where an engine core process builds its own).
"""
from __future__ import annotations

import functools
from typing import Callable, Optional

from models.core.bundle import Bundle
from models.core.config import max_output_len
from server.config import ServerConfig
from server.coreprocess.model_engine import ModelEngine, limits
from server.texts.html import plan_html
from server.texts.plan import MIME_HTML, DocumentOptions, Plan
from server.texts.segment import plan_text
from server.core.errors import InvalidArgument, shown
from server.observability.metrics import Metrics
from server.core.request import DecodingParams, EmbedJob, Event, Job
from server.core.terms import pieces_of


class HostedModel:
    def __init__(self, bundle: Bundle, cfg: ServerConfig, metrics: Metrics, engine: bool = True,
                 pieces: Optional[tuple[str, ...]] = None):
        """`pieces`: the vocabulary's pieces as the frontend's tokenizer spells them (`self.pieces`). An engine
        core process is given them and loads no tokenizer: it decodes ids its frontend tokenised, and a
        tokenizer is ~14 MB resident in every replica (the library and two models' vocabularies, measured)."""
        self.bundle, self.cfg, self.name = bundle, cfg, bundle.name
        self.tok = None
        if pieces is None:  # imported here: a core given `pieces` never loads the tokenizers library
            from models.core.bundle_tokenizer import load_tokenizer
            self.tok = load_tokenizer(bundle.tokenizer_entry, bundle.path)
        self._pieces = pieces
        # Planning measures each sentence in tokens, then the jobs tokenise it: once is enough.
        # (The ids are never mutated: callers build new lists around them.)
        self._encode = functools.lru_cache(maxsize=8192)(self.tok.encode) if self.tok else None
        self.max_source, self.max_output = limits(cfg, bundle)
        self.capacity, self.provider = cfg.max_batch_size, ""
        self.variant = cfg.variant  # the engine's, once built here or told by the core (int8 may run int8-vnni)
        self.m = metrics.for_model(self.name)
        # With the engine in a core process (--engine-core process) this process only builds and checks
        # requests: the core's link queues them (server/frontend/cores/link.py). Else the engine is here.
        self.link = None  # where jobs go: a core's link (server/frontend/cores/link.py), or the engine here
        self.here = None  # the engine in this process (--engine-core thread)
        if engine:
            self._build_engine(bundle, cfg, metrics)

    @property
    def pieces(self) -> tuple[str, ...]:
        """Every output id's piece (glossary enforcement and the runaway guard read them in the engine)."""
        if self._pieces is None:
            self._pieces = pieces_of(self.tok, self.bundle.spec.out_vocab_size)
        return self._pieces

    async def submit(self, jobs: list) -> None:
        """Queue a request's jobs, all or none (a ServiceError otherwise): through the link into the engine
        core's scheduler, or into this process's engine (--engine-core thread)."""
        await self.link.submit(self.name, jobs)

    # -- the engine in this process (--engine-core thread; server/coreprocess/model_engine.py) --------------
    def _build_engine(self, bundle: Bundle, cfg: ServerConfig, metrics: Metrics) -> None:
        prepare = (lambda texts, params, sink: self.jobs(texts, params, sink, None)) if self.tok else None
        here = self.here = ModelEngine(bundle, cfg, metrics, self.pieces, prepare)
        self.link = here  # requests queue into it as into a core's link
        self.provider, self.variant, self.capacity = here.provider, here.variant, here.capacity

    # -- languages -----------------------------------------------------------------------
    def serves(self, source: str, target: str) -> bool:
        return any((not source or s == source) and (not target or t == target) for s, t in self.bundle.languages.pairs)

    def describe_languages(self) -> str:
        lang = self.bundle.languages
        if len(lang.pairs) <= 20:
            return ", ".join(f"{s}->{t}" for s, t in lang.pairs)
        # A many-to-many model: name the languages, not the thousands of pairs.
        return (f"from {len(lang.sources)} languages ({', '.join(lang.sources)}) "
                f"into {len(lang.targets)} ({', '.join(lang.targets)})")

    def language_tokens(self, source: str, target: str) -> tuple[list[int], tuple[int, ...]]:
        """The request's languages -> (ids leading the source, tokens forced as the first outputs)."""
        lang = self.bundle.languages
        source, target = source or self.bundle.source_language, target or self.bundle.target_language
        if (source, target) not in lang.pairs:
            raise InvalidArgument(f"model {self.name} does not translate {shown(source)}->{shown(target)}; "
                                  f"it serves {self.describe_languages()}")
        if lang.target_rule == "source_prefix":
            return [lang.target_tokens[target]], ()
        if lang.target_rule == "forced_bos":
            return [lang.source_tokens[source]], (lang.target_tokens[target],)
        return [], ()

    # -- requests ------------------------------------------------------------------
    def plan(self, texts: list[str], options: DocumentOptions, languages: tuple[str, str] = ("", "")) -> list[Plan]:
        """Each text split into the sentences to decode, with its layout kept (server/texts/)."""
        prefix, _ = self.language_tokens(*languages)
        budget = self.max_source - len(prefix)

        def fits(sentence: str) -> bool:
            return len(self._encode(sentence)) <= budget
        language = languages[0] or self.bundle.source_language
        if options.mime_type == MIME_HTML:
            return [plan_html(text, options.split, language, fits) for text in texts]
        return [plan_text(text, options.split, language, fits) for text in texts]

    def encode_texts(self, texts: list[str], prefix: Optional[list[int]] = None,
                     labels: Optional[list[str]] = None) -> list[list[int]]:
        from models.core.tokenizer import normalize  # a frontend's: loaded with its tokenizer (__init__)
        problems, out = [], []
        for i, text in enumerate(texts):
            label = labels[i] if labels else f"texts[{i}]"
            if not normalize(text):
                problems.append(f"{label} is empty")
                continue
            ids = (prefix or []) + list(self._encode(text))
            if len(ids) > self.max_source:
                problems.append(f"{label} is {len(ids)} tokens long; the limit is {self.max_source}"
                                + (" (send it with split_sentences on)" if labels else ""))
            out.append(ids)
        if problems:
            raise InvalidArgument("; ".join(problems))
        return out

    @property
    def metrics(self):
        """This model's series of the server's metrics (server/observability/metrics.py ModelMetrics)."""
        return self.m

    def param_problems(self, p: DecodingParams) -> list[str]:
        """Every problem of the decoding options against this model and the server's limits."""
        problems = []
        if p.beam_size > self.cfg.max_beam_size:
            problems.append(f"beam_size {p.beam_size} exceeds the limit {self.cfg.max_beam_size}")
        if p.beam_size > 1 and p.sampling:
            problems.append("beam search and sampling (temperature > 0) cannot be combined")
        if p.num_hypotheses > max(p.beam_size, 1) and not p.sampling:
            problems.append(f"num_hypotheses {p.num_hypotheses} needs beam_size >= it, or sampling")
        if p.num_hypotheses > self.cfg.max_hypotheses:
            problems.append(f"num_hypotheses {p.num_hypotheses} exceeds the limit {self.cfg.max_hypotheses}")
        if p.rows > self.capacity:
            problems.append(f"the request needs {p.rows} decode slots; the server has {self.capacity}")
        # Range checks written as `lo <= x <= hi` are False for NaN, so NaN and +-inf fail them all.
        for name, value, lo, hi in (("temperature", p.temperature, 0.0, 100.0), ("top_p", p.top_p, 0.0, 1.0),
                                    ("length_penalty", p.length_penalty, 0.0, 10.0)):
            if not lo <= value <= hi:
                problems.append(f"{name} {value} must be a finite number in [{lo:g}, {hi:g}]")
        if p.top_k < 0:
            problems.append(f"top_k {p.top_k} must be >= 0")
        if not 0.0 < p.repetition_penalty <= 10.0:
            problems.append(f"repetition_penalty {p.repetition_penalty} must be a finite number in (0, 10]")
        if not 0 <= p.no_repeat_ngram_size <= 10:
            problems.append(f"no_repeat_ngram_size {p.no_repeat_ngram_size} must be in [0, 10]")
        budget = p.max_output_tokens or self.max_output
        if not 0 <= p.min_output_tokens <= budget:
            problems.append(f"min_output_tokens {p.min_output_tokens} must be in [0, {budget}] "
                            "(max_output_tokens, or the model's limit)")
        if p.alternatives and (p.beam_size > 1 or p.sampling or p.num_hypotheses > 1):
            problems.append("alternatives continue greedily: they need beam_size <= 1, temperature 0 and "
                            "num_hypotheses 0 or 1 (the alternatives are the hypotheses)")
        if p.alternatives > self.cfg.max_hypotheses:
            problems.append(f"alternatives {p.alternatives} exceeds the limit {self.cfg.max_hypotheses}")
        if p.no_unknown_token and self.bundle.spec.unk_id is None:
            problems.append(f"no_unknown_token: model {self.name} names no unknown token")
        if p.max_output_tokens > self.max_output:
            problems.append(f"max_output_tokens {p.max_output_tokens} exceeds the limit {self.max_output}")
        if p.target_prefix:
            room = self.max_output - 1  # the forced language token, if any, and one generated token
            length = len(self.tok.encode_target(p.target_prefix))
            if length >= room:
                problems.append(f"target_prefix is {length} tokens long; at most {room - 1} leave room "
                                "for a translation")
        return problems

    def jobs(self, texts: list[str], params: DecodingParams, sink: Callable[[Event], None] | list,
             deadline: Optional[float], scores: bool = False, stream: bool = False,
             languages: tuple[str, str] = ("", ""), labels: Optional[list[str]] = None,
             prefixed: Optional[list[bool]] = None, background: bool = False) -> list[Job]:
        """Jobs for texts whose options passed `param_problems` (server/frontend/admission.py); `sink` is one callable
        for all, or one per text. A target prefix goes to the texts `prefixed` marks (a document's first
        sentence), to every text by default."""
        lead, forced = self.language_tokens(*languages)
        target = tuple(self.tok.encode_target(params.target_prefix)) if params.target_prefix else ()
        room = self.max_output - len(forced)
        sinks = sink if isinstance(sink, list) else [sink] * len(texts)
        marks = prefixed if prefixed is not None else [True] * len(texts)
        out = []
        for ids, s, mark in zip(self.encode_texts(texts, lead, labels), sinks, marks):
            prefix = target if mark else ()
            budget = params.max_output_tokens or max_output_len(len(ids), self.max_output)
            out.append(Job(self.name, ids, params, min(budget + len(prefix), room), s, deadline,
                           scores=scores, stream=stream, forced=forced, prefix=prefix, background=background))
        return out

    def embed_jobs(self, texts: list[str], sinks: list, deadline: Optional[float]) -> list[EmbedJob]:
        return [EmbedJob(self.name, ids, s, deadline) for ids, s in zip(self.encode_texts(texts), sinks)]

    def info(self) -> dict:
        spec = self.bundle.spec
        return {"name": self.name, "version": self.bundle.version,
                "source_language": self.bundle.source_language, "target_language": self.bundle.target_language,
                "max_source_tokens": self.max_source, "max_output_tokens": self.max_output,
                "max_texts_per_request": self.cfg.max_texts_per_request, "max_beam_size": self.cfg.max_beam_size,
                "variant": self.variant, "provider": self.provider,
                "vocab_size": spec.out_vocab_size, "embedding_dimension": spec.d_model,
                "language_pairs": [{"source_language": s, "target_language": t}
                                   for s, t in self.bundle.languages.pairs]}

