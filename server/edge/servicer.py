"""The gRPC servicer: protobuf in, plain dataclasses to the scheduler, protobuf out.

Thin by design. Every RPC goes through `_guard`, the one place where service
errors become gRPC status codes and where request counts and latencies are
recorded. Results come back from the engine thread through the loop's EventRelay
(one wake-up per batch of events, not one per token).
"""
from __future__ import annotations

import asyncio
import logging
import time
from functools import partial
from typing import AsyncIterator, Awaitable, Callable, Optional

import grpc
import numpy as np

from protos.nmt.v1 import translator_pb2 as pb
from protos.nmt.v1 import translator_pb2_grpc as pb_grpc
from server.texts.assemble import TextResult, TextStream, assemble
from server.files.rpc import caller_of
from server.glossary.per_call import hits as glossary_hits
from server.core.errors import InvalidArgument, ResourceExhausted, ServiceError, Unavailable, bounded
from server.frontend.admission import Admission
from server.frontend.hosted import HostedModel
from server.observability.metrics import Metrics
from server.observability import calls
from server.core.relay import Outflow, outflow_for, relay_for
from server.core.request import ErrorEvent, Event, FinishEvent, FinishReason, TokenEvent
from server.edge.options import deadline_of, timings, translate_call
from server.edge.retry import retry_trailer
from server.edge.wire import Malformed, Oversized

try:  # raised by grpc when a status or message is sent on a call that is already over
    from grpc._cython.cygrpc import ExecuteBatchError
except ImportError:  # pragma: no cover (moved in some grpc release: nothing to catch then)
    class ExecuteBatchError(Exception):
        pass

log = logging.getLogger(__name__)

FINISH = {FinishReason.EOS: pb.FINISH_REASON_EOS, FinishReason.LENGTH: pb.FINISH_REASON_LENGTH,
          FinishReason.CANCELLED: pb.FINISH_REASON_CANCELLED, FinishReason.RUNAWAY: pb.FINISH_REASON_RUNAWAY}


class Results:
    """The outcomes of a unary call's jobs, settled on the loop through its relay (one wake-up per engine
    step for all of them). `sink(i)` may be built on any thread; events arrive only after the jobs are
    queued, by which time `expect(n)` has said how many there are."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.relay, self.future = relay_for(loop), loop.create_future()
        # A job may fail (its deadline passed in the queue) while the call is being cancelled before it
        # awaits the results: the failure then has no reader, and asyncio would log it as an ERROR.
        self.future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self.got: dict[int, object] = {}
        self.expected: Optional[int] = None

    def sink(self, index: int) -> Callable:
        return self.relay.sink(partial(self._settle, index))

    def _settle(self, index: int, value) -> None:
        if self.future.done() or isinstance(value, TokenEvent):
            return
        if isinstance(value, (ErrorEvent, Exception)):
            self.future.set_exception(value.error if isinstance(value, ErrorEvent) else value)
            return
        self.got[index] = value
        self._maybe_done()

    def expect(self, n: int) -> None:
        self.expected = n
        self._maybe_done()

    def _maybe_done(self) -> None:
        if self.expected is not None and len(self.got) == self.expected and not self.future.done():
            self.future.set_result([self.got[i] for i in range(self.expected)])

    async def wait(self, jobs: list) -> list:
        """All results in order; if one fails or the client goes away, cancel the rest so every slot is
        freed at the next step."""
        self.expect(len(jobs))
        try:
            return await self.future
        except BaseException:
            for job in jobs:
                job.cancel()
            raise


class _StreamInbox:
    """A stream's events, (sentence index, event) in arrival order. The stream counts once in the loop's
    Outflow while it has events it has not taken yet and is not blocked in a write: that is the loop's
    backlog. (A stream whose client reads slowly sits in its write and is not counted: it must not
    hold back everyone else; its tokens merge into its next message anyway.)"""

    def __init__(self, flow: Outflow) -> None:
        self.queue: asyncio.Queue = asyncio.Queue()
        self.flow, self.owed, self.writing, self.closed = flow, False, False, False

    def put(self, index: int, event: Event) -> None:
        self.queue.put_nowait((index, event))
        if not (self.owed or self.writing or self.closed):
            self.owed = True
            self.flow.add()

    def taken(self) -> None:
        """Everything queued has been read (a message is about to be written, or nothing is to be)."""
        if self.owed:
            self.owed = False
            self.flow.done()

    def wrote(self) -> None:
        self.writing = False
        if not self.queue.empty() and not self.closed:
            self.owed = True
            self.flow.add()

    def close(self) -> None:
        self.closed = True
        self.taken()


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


async def _abort(context, code: grpc.StatusCode, message: str, trailing: tuple = ()) -> grpc.StatusCode:
    """Send the status: context.abort raises AbortError once it is sent.

    Returns only when grpc fails the send with ExecuteBatchError, which it would log as an
    ERROR traceback. Seen two ways: the deadline expired between `_call_over`'s check and
    the send (about once in 15,000 short-deadline calls of the soak; the client saw
    DEADLINE_EXCEEDED), and the client hanging up right after reading the status (it saw
    `code`). The return value is that code; the caller ends the handler quietly.
    """
    try:
        await context.abort(code, message, trailing_metadata=trailing)
    except ExecuteBatchError:
        remaining = context.time_remaining()
        if remaining is not None and remaining <= DEADLINE_SLACK_S:
            return grpc.StatusCode.DEADLINE_EXCEEDED
        return code
    raise AssertionError("context.abort returned")  # pragma: no cover (it always raises)


class TranslatorService(pb_grpc.TranslatorServicer):
    """Protobuf in and out, streaming and assembly, and the status mapping (`_guard`); every check of a
    request is admission's (server/frontend/admission.py)."""

    def __init__(self, admission: Admission, metrics: Metrics):
        self.admission, self.metrics = admission, metrics
        self.accepting = True
        self.tracer = None  # an RpcTracer when tracing is on (server/observability/tracing.py)
        self.files = None  # TranslateFile's jobs: a server.files.rpc.FileCalls, set by the app

    # -- the one place for status codes and request metrics ------------------------
    async def _guard(self, rpc: str, request, context, work: Callable[[], Awaitable]):
        t0, code = time.perf_counter(), grpc.StatusCode.OK
        call = calls.begin(rpc, context, self.tracer)  # request id, the access log's record (observability)
        try:
            if isinstance(request, Oversized):  # as gRPC answers a message over its receive limit
                raise ResourceExhausted(f"request too large: a {request.type_name} of {request.size} bytes; "
                                        f"{request.reason}")
            if isinstance(request, Malformed):
                raise InvalidArgument(f"malformed request: not a valid {request.type_name} "
                                      f"({request.reason}; {request.size} bytes)")
            if not self.accepting:
                raise Unavailable("the server is shutting down")
            answer = await work()
            if answer is not None and _call_over(context) is not None:
                # A unary answer with nobody to take it (cancelled, deadline): grpc would fail the send and
                # log an ERROR traceback (observability/logs.py ClientGone); end as a cancelled call does.
                raise asyncio.CancelledError()
            return answer
        except ServiceError as e:
            status = grpc.StatusCode[e.code]
            code = _call_over(context) or status
            if code != status:  # nobody is listening: fail quietly, as a cancelled call does
                raise asyncio.CancelledError() from None
            message = bounded(str(e))
            trailing = retry_trailer(message, e.retry_after) if e.retry_after else ()  # RetryInfo: when to retry
            code = await _abort(context, status, message, trailing)
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

    # -- RPCs -------------------------------------------------------------------------
    async def Translate(self, request: pb.TranslateRequest, context) -> pb.TranslateResponse:
        return await self._guard("Translate", request, context, lambda: self._translate(request, context))

    async def _translate(self, request: pb.TranslateRequest, context) -> pb.TranslateResponse:
        results = Results()
        admitted = await self.admission.translate(translate_call(request, deadline_of(context)), results.sink)
        done: list[FinishEvent] = await results.wait(admitted.jobs) if admitted.jobs else []
        calls.decoded(done)
        model = admitted.model
        out = pb.TranslateResponse(model=model.name)
        if admitted.detection is not None:
            out.detected_source_language, out.detection_confidence = admitted.source_language, admitted.confidence
        start = 0
        for i, plan in enumerate(admitted.plans):
            units = done[start:start + len(plan.units)]
            start += len(plan.units)
            doc = assemble(plan, units, model.tok)
            self._add_translation(out, model, doc, request)
            if admitted.glossary is not None:
                self._add_hits(out.translations[-1].glossary_hits, admitted.glossary[i],
                               doc.hypotheses[0].text if doc.hypotheses else "")
        return out

    def _add_hits(self, field, matches: list, text: str) -> None:
        for source, target, occurrences, applied in glossary_hits(matches, text, self.metrics):
            field.add(source=source, target=target, occurrences=occurrences, applied=applied)

    @staticmethod
    def _add_translation(out: pb.TranslateResponse, model: HostedModel, doc: TextResult,
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
        call = translate_call(request, deadline_of(context))
        loop = asyncio.get_running_loop()
        relay, inbox = relay_for(loop), _StreamInbox(outflow_for(loop))
        events = inbox.queue
        try:
            admitted = await self.admission.translate(call, lambda i: relay.sink(partial(inbox.put, i)))
        except BaseException:
            inbox.close()
            raise
        model, jobs, (plan,) = admitted.model, admitted.jobs, admitted.plans
        doc = TextStream(plan, model.tok)
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
                inbox.taken()
                if delta and not doc.done:
                    inbox.writing = True
                    yield pb.TranslateStreamResponse(delta=delta, token_ids=unsent, model=model.name)
                    inbox.wrote()  # produce() resumes this generator once the write has completed
                    unsent, delta = [], ""
            res = doc.result()
            unsent += doc.take_released()
            final = pb.TranslateStreamResponse(
                delta=delta, token_ids=unsent, final=True, finish_reason=FINISH[res.reason],
                input_tokens=res.input_tokens, output_tokens=res.output_tokens, timings=timings(res.timing),
                model=model.name, detected_source_language=admitted.source_language if admitted.detection else "",
                detection_confidence=admitted.confidence)
            if admitted.glossary is not None:
                self._add_hits(final.glossary_hits, admitted.glossary[0], "\n".join(
                    [p for p in plan.parts if isinstance(p, str)] + [model.tok.decode(ids) for ids in doc.ids]))
            yield final
        finally:
            inbox.close()
            calls.note(output_tokens=sum(map(len, doc.ids)))  # decoded so far, if the stream was cut short
            if not doc.done:
                for job in jobs:
                    job.cancel()

    async def TranslateFile(self, request: pb.TranslateFileRequest, context) -> None:
        # As TranslateStream: written with context.write so errors pass through _guard. The job, its
        # progress and its errors are server/files/rpc.py's.
        async def produce():
            if self.files is None:
                raise Unavailable("this server translates no files")
            await context.send_initial_metadata(((calls.REQUEST_ID, calls.current().request_id),))
            messages = self.files.translate(request, caller_of(context))
            try:
                async for message in messages:
                    await context.write(message)
            finally:
                # A cancel that lands in write() leaves the generator suspended: close it now, so the job
                # is dropped before _guard records the call.
                await messages.aclose()
        await self._guard("TranslateFile", request, context, produce)

    async def Embed(self, request: pb.EmbedRequest, context) -> pb.EmbedResponse:
        return await self._guard("Embed", request, context, lambda: self._embed(request, context))

    async def _embed(self, request: pb.EmbedRequest, context) -> pb.EmbedResponse:
        results = Results()
        model, jobs = await self.admission.embed(request.model, list(request.texts), results.sink,
                                                 deadline_of(context))
        vectors = await results.wait(jobs)
        out = pb.EmbedResponse(model=model.name, dimension=model.bundle.spec.d_model)
        for job, vec in zip(jobs, vectors):
            if request.normalize:
                vec = vec / max(float(np.linalg.norm(vec)), 1e-12)
            out.embeddings.add(values=vec.astype(np.float32).tolist(), tokens=len(job.src_ids))
        return out

    async def ListModels(self, request: pb.ListModelsRequest, context) -> pb.ListModelsResponse:
        async def work():
            admission = self.admission
            out = pb.ListModelsResponse(default_model=admission.default)
            for name in sorted(admission.models):
                out.models.add(is_default=name == admission.default, **admission.models[name].info())
            return out
        return await self._guard("ListModels", request, context, work)
