"""TranslateFile: one document job (server/files/jobs.py) driven for one gRPC call, its progress streamed.

    files = FileCalls(gateway, admission, spool=cfg.document_dir)     # one per server process
    async for message in files.translate(request, caller_of(context)):  # pb.TranslateFileResponse
        await context.write(message)

The servicer (server/edge/servicer.py TranslateFile) only writes what this yields; status codes come from
the ServiceErrors raised here, through its `_guard` like every RPC's.

Why a Jobs of its own rather than the HTTP port's (server/edge/http/documents.py):
* the gRPC server translates files with the HTTP port off (--http-port -1) too;
* its jobs are reached only through the call that made them, never by id: no download or DELETE of
  another API can take one, and the call ending (result sent, job failed, client cancelled, deadline
  passed) drops its job at once, with the Translate calls it has in flight.
It keeps its records in the same spool directory (--document-dir) as the HTTP port's, so the bounds
on unfinished jobs and bytes held (jobs.py MAX_ACTIVE, MAX_JOBS, MAX_BYTES) count both APIs' documents.

Every segment is translated as the HTTP port's are: a Translate call through the in-process Gateway
(server/edge/gateway.py) with the gRPC caller's API key and request id, so the key's model permissions,
rate limits and character quota apply to each call, and the access log shows them under the file
call's request id.
"""
from __future__ import annotations

import asyncio
import contextvars
from typing import AsyncIterator, Optional

from protos.nmt.v1 import translator_pb2 as pb
from server.core.errors import InvalidArgument, ResourceExhausted, ServiceError, shown
from server.files import LIMITS, FileError
from server.files.jobs import Full, Job, JobFailed, Jobs
from server.edge.gateway import Caller, CallFailed, Gateway
from server.observability import calls
from server.security.auth import bearer_key

# The request message: the file and a few short fields. wire.py lets TranslateFile's requests be this large
# whatever --max-request-bytes says (the bound of every other request).
FILE_REQUEST_BYTES = LIMITS.max_file_bytes + (64 << 10)
# The translated file rides in one message. A translation grows its text (German runs ~30% longer than
# English, a non-Latin script doubles the bytes) but the file limit bounds the source's size and text, so
# a real result stays far below this; past it the call fails RESOURCE_EXHAUSTED rather than sending a
# message no client accepts. Clients raise their receive limit to this (client/client.py does).
MAX_RESULT_BYTES = 64 << 20
PROGRESS_EVERY_S = 0.5  # at most two progress messages a second
# A job queued behind others, or a long batch, changes nothing for minutes; proxies end a stream silent that
# long (nginx's grpc_read_timeout, deploy/nginx/nginx.conf: 300 s), so its state goes out this often anyway.
HEARTBEAT_S = 30.0
STATUS = {"queued": pb.FILE_STATUS_QUEUED, "translating": pb.FILE_STATUS_TRANSLATING, "done": pb.FILE_STATUS_DONE}


class FileCallFailed(ServiceError):
    """The job failed: its message, with the status of what failed it."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def caller_of(context) -> Caller:
    """The gRPC caller as the Gateway replays it on each segment's call: key, request id, address."""
    metadata = tuple(context.invocation_metadata() or ())
    forwarded = next((v for k, v in metadata if k == calls.FORWARDED_FOR and isinstance(v, str)), "")
    call = calls.current()
    return Caller(key=bearer_key(metadata), request_id=call.request_id if call is not None else "",
                  peer=context.peer() or "", forwarded_for=forwarded)


class FileCalls:
    def __init__(self, gateway: Gateway, admission, spool: Optional[str] = None):
        self.gateway, self.admission = gateway, admission
        self.jobs = Jobs(self._translate, self._detect, spool=spool)
        self.running: dict[str, Job] = {}  # the jobs of the calls in progress, by id
        self._calls: dict[str, set[asyncio.Future]] = {}  # each job's Translate calls in flight
        # Each job's failures seen by the callables below, message -> status code name: the job keeps only
        # the message, and its call must end with the status of what failed it.
        self._failures: dict[str, dict[str, str]] = {}

    # -- the call ---------------------------------------------------------------------------
    async def translate(self, request: pb.TranslateFileRequest, caller: Caller
                        ) -> AsyncIterator[pb.TranslateFileResponse]:
        """Progress messages, then the file; ServiceError when the file, the languages or the job fail.
        However the call ends, its job is gone after (closing this generator early drops it)."""
        source, target = self._languages(request)
        job = await self._submit(request, source, target, caller)
        self.running[job.id] = job
        calls.note(texts=job.total)
        ended = asyncio.ensure_future(job.ended.wait())
        taken = False
        try:
            last, sent = None, 0.0
            while not ended.done():
                now = (job.status, job.done, job.source)
                if now != last or self.jobs.clock() - sent >= HEARTBEAT_S:  # something changed, or a while
                    last, sent = now, self.jobs.clock()
                    yield self._progress(job)
                await asyncio.wait((ended,), timeout=PROGRESS_EVERY_S)
            if job.status != "done":
                raise self._failure(job)
            data, taken = self.jobs.take(job), True
            if data is None:  # only this call knows the job's id: nothing else can have taken it
                raise FileCallFailed("INTERNAL", "the translated file was gone when it was done")
            if len(data) > MAX_RESULT_BYTES:
                raise ResourceExhausted(f"File too large: the translated file is {len(data)} bytes; a result may "
                                        f"have {MAX_RESULT_BYTES} (translate the document in parts)")
            done = self._progress(job)
            done.filename, done.content = job.output_name(), data
            yield done
        finally:
            ended.cancel()
            self.running.pop(job.id, None)
            self._failures.pop(job.id, None)
            if not taken:
                self._drop(job)

    def _languages(self, request: pb.TranslateFileRequest) -> tuple[str, str]:
        """(source, target) as /v1/files takes them: lower case; no target = the only one served."""
        targets = self.admission.targets()
        target = request.target_language.strip().lower() or (targets[0] if len(targets) == 1 else "")
        source = request.source_language.strip().lower()
        if not target:
            raise InvalidArgument(f"target_language is required: this server translates into {targets}")
        if target not in targets:
            raise InvalidArgument(f"target_language {shown(target)} is not a target language of this server; "
                                  f"served: {targets}")
        sources = self.admission.sources(target)
        if source and source not in sources:
            raise InvalidArgument(f"source_language {shown(source)} is not translated into {shown(target)} by this "
                                  f"server; served: {sources}")
        return source, target

    async def _submit(self, request: pb.TranslateFileRequest, source: str, target: str, caller: Caller) -> Job:
        """The file read and queued (FileError, Full: this call's status). Submitted in a context of its own:
        the Jobs' workers start in the first submit's context and must not carry this call's access-log record
        and key id into every later job's calls."""
        submitting = asyncio.get_running_loop().create_task(
            self.jobs.submit(request.filename, request.content, source, target, caller, calls.caller_key_id(),
                             request.glossary_id), context=contextvars.Context())
        try:
            return await submitting
        except FileError as e:
            too_large = str(e).startswith("File too large")  # as /v1/files answers it: 413, RESOURCE_EXHAUSTED
            raise (ResourceExhausted if too_large else InvalidArgument)(str(e)) from None
        except Full as e:
            raise ResourceExhausted(str(e)) from None
        except asyncio.CancelledError:
            # The call went away while the file was read: a job made at that very moment has no reader.
            submitting.add_done_callback(self._drop_submitted)
            raise

    def _drop_submitted(self, submitting: asyncio.Task) -> None:
        if not submitting.cancelled() and submitting.exception() is None:
            self._drop(submitting.result())

    def _progress(self, job: Job) -> pb.TranslateFileResponse:
        return pb.TranslateFileResponse(status=STATUS.get(job.status, pb.FILE_STATUS_UNSPECIFIED),
                                        segments_done=job.done, segments_total=job.total,
                                        seconds_remaining=job.seconds_remaining(self.jobs.clock()),
                                        billed_characters=job.billed, source_language=job.source)

    def _failure(self, job: Job) -> ServiceError:
        """The status of a job that ended in error: that of the call or check that failed it; INTERNAL only
        for a failure nothing here explains (jobs.py's "internal error (...)": a bug)."""
        if job.status != "error":  # ended without an outcome: its record was deleted under it
            return FileCallFailed("ABORTED", "the document job was deleted before it finished")
        for message, code in self._failures.get(job.id, {}).items():
            if message and job.error.endswith(message):  # jobs.py may prefix it ("Quota exceeded: ...")
                return FileCallFailed(code, job.error)
        if job.error.startswith("File too large"):
            return ResourceExhausted(job.error)
        if job.error.startswith("Invalid file"):  # a FileError while the file was rebuilt
            return InvalidArgument(job.error)
        return FileCallFailed("INTERNAL", job.error)

    def _failed(self, job: Job, code: str, message: str) -> None:
        self._failures.setdefault(job.id, {})[message] = code

    def _drop(self, job: Job) -> None:
        """The job deleted (it stops before its next batch) and its calls in flight cancelled now, which
        frees their engine slots at the next step."""
        self.jobs.drop(job)
        for call in self._calls.pop(job.id, ()):
            call.cancel()

    # -- the job's callables (server/files/jobs.py) -----------------------------------------
    async def _translate(self, job: Job, texts: list[str]) -> list[str]:
        """As the HTTP port's: one Translate call, HTML for markup segments, sentences split, scheduled as
        background work (nobody reads a file's texts token by token)."""
        request = pb.TranslateRequest(texts=texts, source_language=job.source, target_language=job.target,
                                      split_sentences=pb.SPLIT_SENTENCES_ON, glossary_id=job.glossary_id,
                                      mime_type="text/html" if job.document.markup else "",
                                      priority=pb.PRIORITY_BACKGROUND)
        call = asyncio.ensure_future(self.gateway.unary("Translate", request, job.caller))
        held = self._calls.setdefault(job.id, set())
        held.add(call)
        try:
            # Shielded: `_drop` cancels the call alone, and the job's worker must see a JobFailed then,
            # not a CancelledError (which would end the worker itself).
            response = await asyncio.shield(call)
        except asyncio.CancelledError:
            if not call.cancelled():  # the job's own task was cancelled: its call goes with it
                call.cancel()
                raise
            raise JobFailed("the TranslateFile call ended") from None
        except CallFailed as e:
            self._failed(job, e.code.name, e.message)
            raise
        finally:
            held.discard(call)
            if not held and self._calls.get(job.id) is held:
                del self._calls[job.id]
        return [t.hypotheses[0].text if t.hypotheses else "" for t in response.translations]

    async def _detect(self, job: Job, sample: str) -> str:
        """The served source language the document is in (as the HTTP port decides it); refused when the
        document reads as the target language already."""
        try:
            return await self.admission.document_source(job.target, sample, "send source_language")
        except ServiceError as e:
            self._failed(job, e.code, str(e))
            raise JobFailed(str(e)) from None
