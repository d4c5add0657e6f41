"""The gRPC servicer: protobuf in, plain dataclasses to the scheduler, protobuf out.

Thin by design. Every RPC goes through `_guard`, the one place where service
errors become gRPC status codes and where request counts and latencies are
recorded. Results come back from the engine thread through the loop's EventRelay
(one wake-up per batch of events, not one per token).
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from concurrent.futures import Executor
from functools import partial
from typing import AsyncIterator, Awaitable, Callable, Optional

import grpc
import numpy as np

from protos.nmt.v1 import translator_pb2 as pb
from protos.nmt.v1 import translator_pb2_grpc as pb_grpc
from server.documents.assemble import DocumentResult, DocumentStream, assemble
from server.documents.plan import MIME_PLAIN, SPLIT_NEWLINES, SPLIT_OFF, SPLIT_ON, DocumentOptions, Plan
from server.errors import InvalidArgument, NotFound, ServiceError, Unavailable, bounded, shown
from server.hosted import HostedModel
from server.language_id import Detection, LanguageIdentifier, route
from server.metrics import Metrics
from server.security.usage import CharacterUsage
from server.observability import calls
from server.relay import relay_for
from server.request import DecodingParams, ErrorEvent, Event, FinishEvent, FinishReason, TokenEvent
from server.wire import Malformed

try:  # raised by grpc when a status or message is sent on a call that is already over
    from grpc._cython.cygrpc import ExecuteBatchError
except ImportError:  # pragma: no cover (moved in some grpc release: nothing to catch then)
    class ExecuteBatchError(Exception):
        pass

log = logging.getLogger(__name__)

FINISH = {FinishReason.EOS: pb.FINISH_REASON_EOS, FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
          FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED, FinishReason.RUNAWAY: pb.FINISH_REASON_RUNAWAY}
SPLIT = {pb.SPLIT_SENTENCES_UNSPECIFIED: SPLIT_ON, pb.SPLIT_SENTENCES_ON: SPLIT_ON,
         pb.SPLIT_SENTENCES_OFF: SPLIT_OFF, pb.SPLIT_SENTENCES_NEWLINES: SPLIT_NEWLINES}


def document_options(split: int, mime_type: str) -> DocumentOptions:
    if split not in SPLIT:
        raise InvalidArgument(f"unknown split_sentences value {split}")
    return DocumentOptions(SPLIT[split], mime_type.strip().lower() or MIME_PLAIN).check()


def decoding_params(o: pb.DecodingOptions) -> DecodingParams:
    return DecodingParams(
        beam_size=max(o.beam_size, 1),
        length_penalty=o.length_penalty if o.HasField("length_penalty") else 1.0,
        # 0 is proto3's "unset" for top_p; any other value, negative and NaN included, is checked as sent.
        temperature=o.temperature, top_k=o.top_k, top_p=o.top_p if o.top_p != 0 else 1.0,
        seed=o.seed if o.HasField("seed") else None,
        max_output_tokens=o.max_output_tokens, num_hypotheses=max(o.num_hypotheses, 1),
        # 0 is proto3's "unset" for the penalty: off, like 1.
        repetition_penalty=o.repetition_penalty if o.HasField("repetition_penalty") and o.repetition_penalty != 0
        else 1.0,
        no_repeat_ngram_size=o.no_repeat_ngram_size, min_output_tokens=o.min_output_tokens,
        no_unknown_token=o.no_unknown_token, target_prefix=o.target_prefix, alternatives=o.alternatives)


def deadline_of(context) -> Optional[float]:
    remaining = context.time_remaining()
    return None if remaining is None else time.monotonic() + remaining


def _futures(n: int) -> tuple[list[asyncio.Future], list[Callable]]:
    """n futures on the running loop, and sinks the engine thread may call to settle them.

    A sink takes a FinishEvent or a vector (result), an ErrorEvent or exception
    (failure), or a TokenEvent (ignored: unary calls only want the end).
    """
    loop = asyncio.get_running_loop()
    relay = relay_for(loop)
    futures = [loop.create_future() for _ in range(n)]

    def sink_for(fut: asyncio.Future) -> Callable:
        def settle(value) -> None:
            if fut.done() or isinstance(value, TokenEvent):
                return
            if isinstance(value, (ErrorEvent, Exception)):
                fut.set_exception(value.error if isinstance(value, ErrorEvent) else value)
            else:
                fut.set_result(value)
        return relay.sink(settle)
    return futures, [sink_for(f) for f in futures]


async def _run(model: HostedModel, jobs: list, futures: list[asyncio.Future]) -> list:
    """Queue a request's jobs and await them all; if one fails or the client goes away, cancel
    the rest so every slot is freed at the next step."""
    model.scheduler.submit(jobs)
    try:
        return await asyncio.gather(*futures)
    except BaseException:
        for job in jobs:
            job.cancel()
        raise


def _tagged(put: Callable, index: int, event: Event) -> None:
    """A document's sentence i reports to the stream's one queue as (i, event)."""
    put((index, event))


def timings(t) -> pb.Timings:
    s = t.seconds()
    return pb.Timings(queue_seconds=s["queue"], first_token_seconds=s["first_token"], total_seconds=s["total"])


# A client whose own deadline fires cancels the call (RST_STREAM), and that can reach the server a
# few milliseconds before the server's copy of the same deadline expires: the handler is then
# cancelled with time still remaining, and grpc's context says neither done() nor cancelled() yet
# (seen every time with a 1 s deadline on a request held in the queue). The server's copy starts
# when the request arrived, so on a loaded machine it can also run later than the client's by the
# request's delivery time. A cancellation this close to the deadline is the deadline; a client
# cancelling on purpose within 250 ms of its own deadline is counted as a deadline too, which is
# what it was close to becoming.
DEADLINE_SLACK_S = 0.25


def _call_over(context, known_over: bool = False) -> Optional[grpc.StatusCode]:
    """DEADLINE_EXCEEDED or CANCELLED when the call is already over (grpc core answered the client),
    else None. A status sent on such a call fails inside grpc with a logged traceback.
    `known_over`: the caller knows it is over (its task was cancelled, or a write found it gone),
    whatever the context says yet."""
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        return grpc.StatusCode.DEADLINE_EXCEEDED
    if known_over or context.done() or context.cancelled():
        if remaining is not None and remaining <= DEADLINE_SLACK_S:
            return grpc.StatusCode.DEADLINE_EXCEEDED
        return grpc.StatusCode.CANCELLED
    return None


async def _abort(context, code: grpc.StatusCode, message: str) -> grpc.StatusCode:
    """Send the status: context.abort raises AbortError once it is sent.

    Returns only when grpc fails the send with ExecuteBatchError, which it would log as an
    ERROR traceback. Seen two ways: the deadline expired between `_call_over`'s check and
    the send (about once in 15,000 short-deadline calls of the soak; the client saw
    DEADLINE_EXCEEDED), and the client hanging up right after reading the status (it saw
    `code`). The return value is that code; the caller ends the handler quietly.
    """
    try:
        await context.abort(code, message)
    except ExecuteBatchError:
        remaining = context.time_remaining()
        if remaining is not None and remaining <= DEADLINE_SLACK_S:
            return grpc.StatusCode.DEADLINE_EXCEEDED
        return code
    raise AssertionError("context.abort returned")  # pragma: no cover (it always raises)


class TranslatorService(pb_grpc.TranslatorServicer):
    def __init__(self, models: dict[str, HostedModel], default: str, max_texts: int, max_text_chars: int,
                 metrics: Metrics, executor: Optional[Executor] = None, max_sentences: int = 512):
        self.models, self.default, self.max_texts, self.metrics = models, default, max_texts, metrics
        self.max_text_chars, self.max_sentences = max_text_chars, max_sentences
        # Tokenisation and validation run here, never on the event loop: a request of many long
        # texts took seconds there and stalled every other RPC, health checks included.
        self.executor = executor
        self.accepting = True
        self.tracer = None  # an RpcTracer when tracing is on (server/observability/tracing.py)
        self.identifier = LanguageIdentifier()  # requests that name no source language (server/language_id.py)
        self.usage = CharacterUsage()  # characters per API key, and their quota (server/security/usage.py)
        self.quota_of: Callable[[str], int] = lambda key_id: 0  # a key id's character quota; the app sets it

    # -- the one place for status codes and request metrics ------------------------
    async def _guard(self, rpc: str, request, context, work: Callable[[], Awaitable]):
        t0, code = time.perf_counter(), grpc.StatusCode.OK
        call = calls.begin(rpc, context, self.tracer)  # request id, the access log's record (observability)
        try:
            if isinstance(request, Malformed):
                raise InvalidArgument(f"malformed request: not a valid {request.type_name} "
                                      f"({request.reason}; {request.size} bytes)")
            if not self.accepting:
                raise Unavailable("the server is shutting down")
            return await work()
        except ServiceError as e:
            status = grpc.StatusCode[e.code]
            code = _call_over(context) or status
            if code != status:  # nobody is listening: fail quietly, as a cancelled call does
                raise asyncio.CancelledError() from None
            code = await _abort(context, status, bounded(str(e)))
            raise asyncio.CancelledError() from None
        except (asyncio.CancelledError, ExecuteBatchError):
            # The client cancelled, the deadline passed, or a write found the call gone.
            code = _call_over(context, known_over=True)
            raise asyncio.CancelledError() from None
        except grpc.aio.AbortError:
            raise
        except Exception as e:  # noqa: BLE001 (a bug: answer INTERNAL, log once, keep serving)
            code = grpc.StatusCode.INTERNAL
            log.exception("%s failed", rpc)
            code = await _abort(context, code, bounded(f"internal error ({type(e).__name__}); see the server log"))
            raise asyncio.CancelledError() from None
        finally:
            self.metrics.requests.labels(rpc, code.name).inc()
            self.metrics.request_latency.labels(rpc).observe(time.perf_counter() - t0)
            call.end(code, time.perf_counter() - t0)

    def _model(self, name: str, source_language: str = "", target_language: str = "") -> HostedModel:
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

    def detects(self, name: str, source_language: str) -> bool:
        """A request is routed by its detected language when it names neither a model nor a source
        language and several models are loaded (with one, its source language is the default)."""
        return not name and not source_language and len(self.models) > 1

    def route(self, name: str, source_language: str, target_language: str, texts, mime_type: str = ""
              ) -> tuple[HostedModel, str, Optional[Detection]]:
        """(model, source language, the detection it came from or None). The detection is refused when
        the texts are confidently in a language no model serving the target translates from."""
        if not self.detects(name, source_language) or not any(t.strip() for t in texts):
            return self._model(name, source_language, target_language), source_language, None
        found = self.identifier.detect_all(texts, html="html" in mime_type.lower())
        served = sorted({s for m in self.models.values() for s, t in m.bundle.languages.pairs
                         if not target_language or t == target_language})
        language = route(found, served)
        self.metrics.language_detections.labels(found.language if language else "unserved").inc()
        if language is None:
            raise InvalidArgument(f"the text is in {shown(found.language)} (detected, confidence "
                                  f"{found.confidence:.2f}); no loaded model translates it"
                                  f"{' into ' + shown(target_language) if target_language else ''}: "
                                  f"send source_language, or use one of: {self.served()}")
        return self._model("", language, target_language), language, found

    def model_name_for(self, name: str, source_language: str = "", target_language: str = "", texts=()) -> str:
        """The model a request would run on, for API-key permissions (server/security/auth.py): the
        default model when it names none; the name as sent when none resolves (the RPC then fails)."""
        try:
            return self.route(name, source_language, target_language, texts)[0].name
        except ServiceError:
            return name

    def _texts(self, texts) -> list[str]:
        """Cheap checks (count, characters) before any tokenisation."""
        calls.note(texts=len(texts))
        if not texts:
            raise InvalidArgument("texts is empty: send at least one text")
        if len(texts) > self.max_texts:
            raise InvalidArgument(f"{len(texts)} texts in one request; the limit is {self.max_texts}")
        long = [i for i, t in enumerate(texts) if len(t) > self.max_text_chars]
        if long:
            raise InvalidArgument(f"{len(long)} text(s) longer than {self.max_text_chars} characters "
                                  f"(first: texts[{long[0]}], {len(texts[long[0]])} characters)")
        return list(texts)

    def _charge(self, texts: list[str]) -> None:
        """The caller's key pays the texts' characters (DeepL's billing unit), or its quota refuses them."""
        key_id = calls.caller_key_id()
        self.usage.charge(key_id, sum(map(len, texts)), self.quota_of(key_id))

    async def _off_loop(self, fn, *args, **kwargs):
        # In the call's context: log lines written there carry its request id.
        run = partial(contextvars.copy_context().run, fn, *args, **kwargs)
        return await asyncio.get_running_loop().run_in_executor(self.executor, run)

    # -- RPCs -------------------------------------------------------------------------
    async def Translate(self, request: pb.TranslateRequest, context) -> pb.TranslateResponse:
        return await self._guard("Translate", request, context, lambda: self._translate(request, context))

    async def _plan(self, model: HostedModel, texts: list[str], split: int, mime_type: str,
                    languages: tuple[str, str], params: DecodingParams) -> tuple[list[Plan], list[str]]:
        """Texts -> documents split into sentences (off the loop), with the request-level limits."""
        options = document_options(split, mime_type)
        model.check_params(params)
        t0 = time.perf_counter()
        plans = await self._off_loop(model.plan, texts, options, languages)
        model.scheduler.m.split_time.observe(time.perf_counter() - t0)
        labels = [f"texts[{i}]" + (f" sentence {j}" if len(plan.units) > 1 else "")
                  for i, plan in enumerate(plans) for j in range(len(plan.units))]
        model.scheduler.m.document_sentences.observe(len(labels))
        calls.note(sentences=len(labels))
        if len(labels) > self.max_sentences:
            raise InvalidArgument(f"the request's texts hold {len(labels)} sentences; the limit is "
                                  f"{self.max_sentences} per request (send fewer or shorter texts)")
        return plans, labels

    async def _translate(self, request: pb.TranslateRequest, context) -> pb.TranslateResponse:
        texts = self._texts(request.texts)
        model, source, detected = self.route(request.model, request.source_language, request.target_language, texts,
                                             request.mime_type)
        params, languages = decoding_params(request.options), (source, request.target_language)
        plans, labels = await self._plan(model, texts, request.split_sentences, request.mime_type, languages, params)
        self._charge(texts)
        sources = [unit.source for plan in plans for unit in plan.units]
        firsts = [j == 0 for plan in plans for j in range(len(plan.units))]  # a target prefix starts each text
        futures, sinks = _futures(len(sources))
        jobs = await self._off_loop(model.jobs, sources, params, sinks, deadline_of(context),
                                    scores=request.return_scores, languages=languages, labels=labels,
                                    prefixed=firsts)
        calls.submitted(jobs)
        results: list[FinishEvent] = await _run(model, jobs, futures) if jobs else []
        calls.decoded(results)
        out = pb.TranslateResponse(model=model.name)
        if detected is not None:
            out.detected_source_language, out.detection_confidence = source, dict(detected.ranked).get(source, 0.0)
        start = 0
        for plan in plans:
            done = results[start:start + len(plan.units)]
            start += len(plan.units)
            self._add_translation(out, model, assemble(plan, done, model.tok), request)
        return out

    @staticmethod
    def _add_translation(out: pb.TranslateResponse, model: HostedModel, doc: DocumentResult,
                         request: pb.TranslateRequest) -> None:
        t = out.translations.add(finish_reason=FINISH[doc.reason], input_tokens=doc.input_tokens,
                                 output_tokens=doc.output_tokens, timings=timings(doc.timing),
                                 sentences=doc.sentences)
        for h in doc.hypotheses:
            hyp = t.hypotheses.add(text=h.text)
            if request.return_scores:
                hyp.score = h.score
            if request.return_tokens:
                hyp.token_ids.extend(h.token_ids)
                hyp.tokens.extend(model.tok.piece(i) for i in h.token_ids)

    async def TranslateStream(self, request: pb.TranslateStreamRequest, context) -> None:
        # Written with context.write rather than yield, so errors pass through _guard like the unary RPCs.
        async def produce():
            await context.send_initial_metadata(((calls.REQUEST_ID, calls.current().request_id),))
            sent, stream = None, self._stream(request, context)
            try:
                async for message in stream:
                    sent = sent or self.metrics.stream_messages.labels(message.model)
                    sent.inc()  # before the write: the client may read the count once it has the message
                    await context.write(message)
            finally:
                # A cancel that lands in write() leaves the generator suspended at its yield: close it
                # now, so its cleanup (cancelling the jobs, noting the tokens decoded) runs before
                # _guard records the call, not whenever the generator is collected.
                await stream.aclose()
        await self._guard("TranslateStream", request, context, produce)

    async def _stream(self, request: pb.TranslateStreamRequest, context) -> AsyncIterator:
        texts = self._texts([request.text] if request.text else [])
        model, source, detected = self.route(request.model, request.source_language, request.target_language, texts,
                                             request.mime_type)
        params, languages = decoding_params(request.options), (source, request.target_language)
        if params.num_hypotheses != 1 or params.alternatives:
            raise InvalidArgument("streaming returns one hypothesis: num_hypotheses must be 0 or 1, "
                                  "alternatives 0")
        (plan,), labels = await self._plan(model, texts, request.split_sentences, request.mime_type, languages,
                                           params)
        self._charge(texts)
        events: asyncio.Queue = asyncio.Queue()
        relay = relay_for(asyncio.get_running_loop())
        sinks = [relay.sink(partial(_tagged, events.put_nowait, i)) for i in range(len(labels))]
        jobs = await self._off_loop(model.jobs, [u.source for u in plan.units], params, sinks, deadline_of(context),
                                    stream=True, languages=languages, labels=labels,
                                    prefixed=[j == 0 for j in range(len(plan.units))])
        calls.submitted(jobs)
        if jobs:
            model.scheduler.submit(jobs)
        doc = DocumentStream(plan, model.tok)
        try:
            unsent: list[int] = []  # released, but no visible text yet: rides along with the next message
            delta = doc.ready()  # the layout before the first sentence (all of it when nothing needs decoding)
            while not doc.done:
                # Take whatever piled up: a slow reader gets it in one message, not one write each.
                i, event = await events.get()
                while True:
                    if isinstance(event, ErrorEvent):
                        raise event.error
                    delta += doc.tokens(i, event.token_ids) if isinstance(event, TokenEvent) \
                        else doc.finished(i, event)
                    if events.empty():
                        break
                    i, event = events.get_nowait()
                unsent += doc.take_released()
                if delta and not doc.done:
                    yield pb.TranslateStreamResponse(delta=delta, token_ids=unsent, model=model.name)
                    unsent, delta = [], ""
            res = doc.result()
            unsent += doc.take_released()
            yield pb.TranslateStreamResponse(
                delta=delta, token_ids=unsent, final=True, finish_reason=FINISH[res.reason],
                input_tokens=res.input_tokens, output_tokens=res.output_tokens, timings=timings(res.timing),
                model=model.name, detected_source_language=source if detected else "",
                detection_confidence=dict(detected.ranked).get(source, 0.0) if detected else 0.0)
        finally:
            calls.note(output_tokens=sum(map(len, doc.ids)))  # decoded so far, if the stream was cut short
            if not doc.done:
                for job in jobs:
                    job.cancel()

    async def Embed(self, request: pb.EmbedRequest, context) -> pb.EmbedResponse:
        return await self._guard("Embed", request, context, lambda: self._embed(request, context))

    async def _embed(self, request: pb.EmbedRequest, context) -> pb.EmbedResponse:
        model = self._model(request.model)
        texts = self._texts(request.texts)
        futures, sinks = _futures(len(texts))
        jobs = await self._off_loop(model.embed_jobs, texts, sinks, deadline_of(context))
        calls.submitted(jobs)
        vectors = await _run(model, jobs, futures)
        out = pb.EmbedResponse(model=model.name, dimension=model.bundle.spec.d_model)
        for job, vec in zip(jobs, vectors):
            if request.normalize:
                vec = vec / max(float(np.linalg.norm(vec)), 1e-12)
            out.embeddings.add(values=vec.astype(np.float32).tolist(), tokens=len(job.src_ids))
        return out

    async def ListModels(self, request: pb.ListModelsRequest, context) -> pb.ListModelsResponse:
        async def work():
            out = pb.ListModelsResponse(default_model=self.default)
            for name in sorted(self.models):
                out.models.add(is_default=name == self.default, **self.models[name].info())
            return out
        return await self._guard("ListModels", request, context, work)
