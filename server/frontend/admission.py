"""Admission: a plain request in, every check, the texts split and tokenised, the jobs queued.

The edges (the gRPC servicer, and through it the HTTP APIs) turn their wire formats into a
`TranslateCall` or an `EmbedCall` and make one call here. Admission owns every request check,
one place per concern, and reports all the problems of a request at once:

- routing: the model named, or the one serving the languages asked for, or the one serving
  the language the texts are in (`route`; NOT_FOUND / INVALID_ARGUMENT);
- the request's shape: text count, characters per text, empty texts, sentences per request;
- the document options (split mode, MIME type) and the decoding options against the model's
  limits (HostedModel.param_problems);
- the caller's character quota (server/security/usage.py).

Splitting documents, tokenising and building jobs run in one hop off the event loop for a request of
more than INLINE_CHARS characters (a request of many long texts took seconds there and stalled every
other call, health checks included), and on the loop for a smaller one, where the hop cost more than
the work; the jobs are then queued atomically (all or none) from the loop.
"""
from __future__ import annotations

import asyncio
import contextvars
import time
from concurrent.futures import Executor
from dataclasses import dataclass, field
from functools import partial
from typing import Callable, Optional

from models.core.tokenizer import normalize
from server.texts.plan import DocumentOptions, Plan
from server.core.errors import InvalidArgument, NotFound, ServiceError, shown
from server.glossary import per_call as glossary
from server.frontend.hosted import HostedModel
from server.frontend.language_id import Detection, LanguageIdentifier, route
from server.observability import calls
from server.core.request import DecodingParams, EmbedJob, Job
from server.security.usage import CharacterUsage

Sink = Callable[[object], None]


# Admission of a request this small (language identification, splitting and tokenising a few sentences:
# tens of microseconds) runs on the event loop. Handing it to a worker thread cost more than the work:
# the executor's wake-up, a second thread taking the interpreter lock, the result's way back to the
# loop (docs/serving_speed.md). Larger requests still go to a worker, so that one long document cannot
# hold up every stream's writes.
INLINE_CHARS = 2_000


@dataclass
class TranslateCall:
    """A Translate or TranslateStream request as the edge received it, in plain values."""
    texts: list[str]
    params: DecodingParams = field(default_factory=DecodingParams)
    model: str = ""
    source_language: str = ""
    target_language: str = ""
    options: DocumentOptions = field(default_factory=DocumentOptions)
    scores: bool = False
    stream: bool = False
    deadline: Optional[float] = None  # time.monotonic() value; None = no deadline
    glossary_id: str = ""  # a stored glossary of the caller's key (server/glossary/), or
    glossary_entries: tuple[tuple[str, str], ...] = ()  # inline (source, target) entries
    background: bool = False  # PRIORITY_BACKGROUND: scheduled after interactive work (server/core/scheduler.py)


@dataclass
class Admitted:
    """What admission queued: the documents (to assemble the answer), their jobs in document order,
    the source language used and the detection it came from (None: named or the model's own)."""
    model: HostedModel
    plans: list[Plan]
    jobs: list[Job]
    source_language: str
    detection: Optional[Detection]
    glossary: Optional[list] = None  # with a glossary: each text's matches (server/glossary/matching.py Match)

    @property
    def confidence(self) -> float:
        d = self.detection
        if d is None:
            return 0.0
        if d.language == self.source_language:
            return d.confidence
        return next((p for lang, p in d.ranked if lang == self.source_language), 0.0)


@dataclass(frozen=True)
class Limits:
    max_texts: int
    max_text_chars: int
    max_sentences: int


class Admission:
    def __init__(self, models: dict[str, HostedModel], default: str, limits: Limits,
                 executor: Optional[Executor] = None, metrics=None):
        self.models, self.default, self.limits, self.metrics = models, default, limits, metrics
        self.executor = executor
        self.identifier = LanguageIdentifier()  # requests that name no source language (server/frontend/language_id.py)
        self.usage = CharacterUsage()  # characters per API key, and their quota (server/security/usage.py)
        self.quota_of: Callable[[str], int] = lambda key_id: 0  # a key id's character quota; the app sets it
        self.glossaries = None  # server.glossary.store.GlossaryStore; None: the default file's (open_store)
        self.budget = None  # server/frontend/memory_budget.py MemoryBudget (--memory-limit); the app sets it

    # -- routing -------------------------------------------------------------------------
    def model(self, name: str, source_language: str = "", target_language: str = "") -> HostedModel:
        """The named model; with no name, the default one, or the first serving the languages asked for."""
        if not name and (source_language or target_language):
            order = [self.default] + sorted(n for n in self.models if n != self.default)
            for candidate in order:
                if self.models[candidate].serves(source_language, target_language):
                    calls.note(model=candidate)
                    return self.models[candidate]
            raise InvalidArgument(f"no loaded model translates {shown(source_language or '*')}->"
                                  f"{shown(target_language or '*')}; served: {self.served()}")
        model = self.models.get(name or self.default)
        if model is None:
            raise NotFound(f"unknown model {shown(name)}; loaded: {sorted(self.models)}")
        calls.note(model=model.name)
        return model

    def served(self) -> str:
        return "; ".join(f"{n}: {m.describe_languages()}" for n, m in sorted(self.models.items()))

    def sources(self, target_language: str = "") -> list[str]:
        """The source languages some model translates into `target_language` (any target: "")."""
        return sorted({s for m in self.models.values() for s, t in m.bundle.languages.pairs
                       if not target_language or t == target_language})

    def targets(self, source_language: str = "") -> list[str]:
        """The target languages some model translates `source_language` into (any source: "")."""
        return sorted({t for m in self.models.values() for s, t in m.bundle.languages.pairs
                       if not source_language or s == source_language})

    def source_of(self, found: Detection, target_language: str, what: str = "the text") -> str:
        """The served source language a detection routes to (server/frontend/language_id.py `route`), counted in
        nmt_language_detections_total; INVALID_ARGUMENT naming the served pairs when `what` is
        confidently in a language no model serving the target translates from."""
        language = route(found, self.sources(target_language))
        if self.metrics is not None:
            self.metrics.language_detections.labels(found.language if language else "unserved").inc()
        if language is None:
            raise InvalidArgument(f"{what} is in {shown(found.language)} (detected, confidence "
                                  f"{found.confidence:.2f}); no loaded model translates it"
                                  f"{' into ' + shown(target_language) if target_language else ''}: "
                                  f"send source_language, or use one of: {self.served()}")
        return language

    def route(self, name: str, source_language: str, target_language: str, texts, mime_type: str = ""
              ) -> tuple[HostedModel, str, Optional[Detection]]:
        """(model, source language, the detection it came from or None). A request that names neither a
        model nor a source language is routed by the language its texts are in when several models are
        loaded (with one, its source language is the default)."""
        detects = not name and not source_language and len(self.models) > 1
        if not detects or not any(t.strip() for t in texts):
            return self.model(name, source_language, target_language), source_language, None
        found = self.identifier.detect_all(texts, html="html" in mime_type.lower())
        language = self.source_of(found, target_language)
        return self.model("", language, target_language), language, found

    # -- languages for the edges that detect per text or per file (DeepL, LibreTranslate, file APIs) ---------
    async def detect(self, texts: list[str], html: bool = False) -> list[Detection]:
        """Each text's language ranking, off the event loop (up to 64 texts of up to --max-text-chars)."""
        return await self.off_loop(lambda: [self.identifier.detect(t, html) for t in texts])

    async def sources_of(self, texts: list[str], target_language: str, html: bool = False
                         ) -> list[tuple[str, float]]:
        """Each text's served source language and its detection confidence: texts of one DeepL or
        LibreTranslate request may be in different languages, and each group then goes as one call naming
        its language (so nothing is detected twice). A blank text goes with the first served source.
        INVALID_ARGUMENT when a text is confidently in a language nobody serves."""
        served = self.sources(target_language)
        out = []
        for i, found in enumerate(await self.detect(texts, html)):
            language = served[0] if served and not texts[i].strip() else \
                self.source_of(found, target_language, f"text {i}")
            out.append((language, dict(found.ranked).get(language, 0.0)))
        return out

    async def document_source(self, target_language: str, sample: str, hint: str) -> str:
        """A document file's source language when the uploader named none, the same rule for every file API:
        ranked on a sample of its text; refused when it reads as the target much more (twice the score)
        than as any served source, rather than "translated" into itself (`hint` says how to insist)."""
        served = self.sources(target_language)
        if not sample.strip():  # nothing to read: the first served source (the file's text is blank anyway)
            return served[0] if served else ""
        (found,) = await self.detect([sample])
        ranked = dict(found.ranked)
        best = max((ranked.get(s, 0.0) for s in served), default=0.0)
        if ranked.get(target_language, 0.0) > 2 * best:
            raise InvalidArgument(f"Source and target language are the same: the document reads as "
                                  f"{target_language.upper()!r} already ({hint} to translate it anyway)")
        return self.source_of(found, target_language, "the document")

    def model_name_for(self, name: str, source_language: str = "", target_language: str = "", texts=()) -> str:
        """The model a request would run on, for API-key permissions (server/security/auth.py): the
        default model when it names none; the name as sent when none resolves (the call then fails)."""
        try:
            return self.route(name, source_language, target_language, texts)[0].name
        except ServiceError:
            return name

    # -- the request's shape --------------------------------------------------------------
    def text_problems(self, texts: list[str], blank_is_empty: bool = False) -> list[str]:
        """Count, characters per text, empty texts. A text of spaces only is layout and comes back as it is
        (a blank-looking cell); one with no characters at all is almost surely a caller's bug. Embeddings
        of blank text mean nothing: `blank_is_empty` refuses those too."""
        calls.note(texts=len(texts))
        limits = self.limits
        if not texts:
            return ["texts is empty: send at least one text"]
        problems = []
        if len(texts) > limits.max_texts:
            problems.append(f"{len(texts)} texts in one request; the limit is {limits.max_texts}")
        long = [i for i, t in enumerate(texts) if len(t) > limits.max_text_chars]
        if long:
            problems.append(f"{len(long)} text(s) longer than {limits.max_text_chars} characters "
                            f"(first: texts[{long[0]}], {len(texts[long[0]])} characters)")
        empty = [i for i, t in enumerate(texts) if not (normalize(t) if blank_is_empty else t)]
        if empty:
            problems.append(f"texts[{empty[0]}] is empty" + (f" (and {len(empty) - 1} more)" if empty[1:] else ""))
        return problems

    # -- admission ------------------------------------------------------------------------
    async def translate(self, call: TranslateCall, sink_for: Callable[[int], Sink]) -> Admitted:
        """Route, check, split, tokenise and queue a Translate/TranslateStream call; `sink_for(i)` is the
        sink of the i-th sentence (document order). Raises a ServiceError naming every problem."""
        if self.budget is not None:  # a document job waits this out as it waits out a full queue (files/jobs.py)
            self.budget.check()
        size = sum(map(len, call.texts)) + sum(len(s) + len(t) for s, t in call.glossary_entries)  # inline terms too
        admitted = await self._run(size, self._admit, call, sink_for)
        if admitted.jobs:
            await admitted.model.submit(admitted.jobs)  # all or none
        return admitted

    def _admit(self, call: TranslateCall, sink_for: Callable[[int], Sink]) -> Admitted:
        # Routing first: a model that does not exist is NOT_FOUND whatever else is wrong. (Language
        # identification runs here: ~40 µs a request, measured in frontend_profile.md.)
        model, source, detection = self.route(call.model, call.source_language, call.target_language,
                                              call.texts, call.options.mime_type)
        problems = self.text_problems(call.texts) + call.options.problems() + model.param_problems(call.params)
        if call.stream and (call.params.num_hypotheses != 1 or call.params.alternatives):
            problems.append("streaming returns one hypothesis: num_hypotheses must be 0 or 1, alternatives 0")
        if problems:
            raise InvalidArgument("; ".join(problems))
        languages = (source, call.target_language)
        terms = glossary.lookup(self, call.glossary_id, call.glossary_entries,
                                source or model.bundle.source_language,
                                call.target_language or model.bundle.target_language)
        t0 = time.perf_counter()
        plans = model.plan(call.texts, call.options, languages)
        literals = glossary.literal(plans, terms) if terms is not None else None
        model.metrics.split_time.observe(time.perf_counter() - t0)
        labels = [f"texts[{i}]" + (f" sentence {j}" if len(plan.units) > 1 else "")
                  for i, plan in enumerate(plans) for j in range(len(plan.units))]
        model.metrics.document_sentences.observe(len(labels))
        calls.note(sentences=len(labels))
        if len(labels) > self.limits.max_sentences:
            raise InvalidArgument(f"the request's texts hold {len(labels)} sentences; the limit is "
                                  f"{self.limits.max_sentences} per request (send fewer or shorter texts)")
        self._charge(call.texts)
        sources = [unit.source for plan in plans for unit in plan.units]
        firsts = [j == 0 for plan in plans for j in range(len(plan.units))]  # a target prefix starts each text
        jobs = model.jobs(sources, call.params, [sink_for(i) for i in range(len(sources))], call.deadline,
                          scores=call.scores, stream=call.stream, languages=languages, labels=labels,
                          prefixed=firsts, background=call.background)
        matches = glossary.attach(jobs, sources, terms, model, plans, literals) if terms is not None else None
        calls.submitted(jobs)
        return Admitted(model, plans, jobs, source, detection, matches)

    async def embed(self, name: str, texts: list[str], sink_for: Callable[[int], Sink],
                    deadline: Optional[float]) -> tuple[HostedModel, list[EmbedJob]]:
        model = self.model(name)
        if self.budget is not None:
            self.budget.check()

        def admit() -> list[EmbedJob]:
            problems = self.text_problems(texts, blank_is_empty=True)
            if problems:
                raise InvalidArgument("; ".join(problems))
            return model.embed_jobs(texts, [sink_for(i) for i in range(len(texts))], deadline)
        jobs = await self._run(sum(map(len, texts)), admit)
        calls.submitted(jobs)
        await model.submit(jobs)
        return model, jobs

    def usage_of(self, key_id: str) -> tuple[int, int]:
        """(characters charged to the key so far, its quota; 0: none)."""
        return self.usage.report(key_id, self.quota_of(key_id))

    def most_hypotheses(self) -> int:
        """Hypotheses one request may ask for on every loaded model (--max-hypotheses)."""
        return min(m.cfg.max_hypotheses for m in self.models.values())

    def _charge(self, texts: list[str]) -> None:
        """The caller's key pays the texts' characters (DeepL's billing unit), or its quota refuses them."""
        key_id = calls.caller_key_id()
        self.usage.charge(key_id, sum(map(len, texts)), self.quota_of(key_id))

    async def _run(self, chars: int, fn, *args):
        """Admission work for a request of `chars` characters: on the loop when small, else off it."""
        if chars <= INLINE_CHARS:
            return fn(*args)
        return await self.off_loop(fn, *args)

    async def off_loop(self, fn, *args):
        """fn(*args) on the frontend's worker threads, in the call's context (log lines written there carry
        its request id, and calls.note reaches it): work that could hold the event loop for milliseconds."""
        run = partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self.executor, run)
