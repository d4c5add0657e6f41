"""Document jobs: read on upload, translated in the background, kept until downloaded or expired.

    jobs = Jobs(translate=..., detect=..., spool=dir)   # per process; `dir` shared by the frontends
    job = await jobs.submit(filename, data, source, target, caller, owner)   # FileError / Full
    job = jobs.get(ident)                         # any process's job: queued / translating / done / error
    data = jobs.take(job)                         # the result, then the job is gone (None: taken already)

The process that takes an upload translates it; its state and result are kept in the spool directory
(server/files/spool.py), so every frontend process answers its status and download.

Bounds (constants here, over all the frontend processes; docs/documents.md "Files" lists them):
* files read at once: `READERS` threads of their own (parsing a 10 MB Office file takes seconds;
  the server's own executor splits requests and must not wait behind it);
* documents translated at once: `WORKERS` per process; each sends at most `CALLS_PER_JOB` Translate calls at a
  time, so a big document shares the engine with ordinary requests instead of filling its queue;
* jobs not finished (queued or translating): `MAX_ACTIVE`; jobs held (any state): `MAX_JOBS`; bytes
  held (uploads until done, results until taken): `MAX_BYTES`. A submit past any of them is `Full`;
* a result is deleted once downloaded, and every finished job `TTL_S` seconds after it finished.

A job's calls go through the same Translate path as any request (the caller's key, rate limits and
quota apply to each); RESOURCE_EXHAUSTED (a full queue, a rate limit) and UNAVAILABLE are waited out
and retried, INVALID_ARGUMENT on a batch of several texts splits the batch, anything else ends the
job in `error` with the server's message.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import os
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional

import grpc

from server.files import Document, FileError, Format, format_of, read
from server.files.spool import FINISHED, Spool, alive
from server.edge.gateway import Caller, CallFailed
from server.security.usage import QUOTA_REASON

READERS = 2
WORKERS = 2
CALLS_PER_JOB = 2
BATCH_TEXTS = 16  # texts per Translate call (the server takes 64)
BATCH_CHARS = 6_000  # characters per call: well under 512 sentences for any ordinary text
MAX_ACTIVE = 16
MAX_JOBS = 256
MAX_BYTES = 256 << 20
TTL_S = 3600.0
CALL_TIMEOUT_S = 300.0  # one Translate call of a job
RETRY_FOR_S = 300.0  # how long RESOURCE_EXHAUSTED / UNAVAILABLE are retried before the job fails
CHARS_PER_SECOND = 300.0
POLL_S = 0.05  # how often a wait for another process's job reads its record
PROGRESS_EVERY_S = 0.5  # how often a running job's progress is written for the other frontend processes  # the first estimate of seconds_remaining, before any batch finished


class Full(Exception):
    """No room for another job now (retry later)."""


class JobFailed(Exception):
    """A job ends in error with this message."""


class Dropped(Exception):
    """The job was deleted while it ran: it ends with nothing written."""


@dataclass
class Job:
    id: str
    key: str
    owner: Optional[str]  # the API key id that uploaded it ("" with auth off)
    filename: str
    format: Format
    document: Optional[Document]
    source: str  # "" = detect from the text
    target: str
    caller: Optional[Caller]  # None in a job read back from its record (nothing to run)
    total: int
    billed: int  # characters to translate
    size: int  # bytes held for it
    status: str = "queued"
    done: int = 0
    error: str = ""
    created: float = 0.0
    started: float = 0.0
    finished: float = 0.0
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    glossary_id: str = ""  # a glossary of the owner's key, applied to every segment (server/glossary/)
    pid: int = field(default_factory=os.getpid)  # the process that translates it
    remote: bool = False  # read back from the spool: its state as last recorded
    dropped: bool = False  # deleted (here or in another process): stop at the next batch
    recorded: bool = False
    reported: float = 0.0  # when progress was last recorded

    def seconds_remaining(self, now: float) -> int:
        if self.status in ("done", "error"):
            return 0
        if self.done and self.started:
            rate = self.done / max(now - self.started, 1e-3)
            return math.ceil((self.total - self.done) / rate)
        return math.ceil(self.billed / CHARS_PER_SECOND)

    def output_name(self) -> str:
        return self.filename.rsplit("/", 1)[-1].rsplit("\\", 1)[-1] or f"document{self.format.extensions[0]}"


Translate = Callable[[Job, list[str]], Awaitable[list[str]]]
Detect = Callable[[Job, str], Awaitable[str]]  # (job, a sample of its text) -> source language; JobFailed


RECORDED = ("id", "key", "owner", "filename", "source", "target", "total", "billed", "size", "status", "done",
            "error", "created", "started", "finished", "glossary_id", "pid")  # the fields other processes read


def record_of(job: Job) -> dict:
    return {name: getattr(job, name) for name in RECORDED}


def job_of(record: dict) -> Job:
    """A job another process (or this one, before) recorded: its state to report, nothing to run."""
    job = Job(format=format_of(record["filename"]), document=None, caller=None, remote=True,
              **{name: record[name] for name in RECORDED})
    if job.status in FINISHED:
        job.ended.set()
    return job


class Jobs:
    def __init__(self, translate: Translate, detect: Detect, clock: Callable[[], float] = time.monotonic,
                 spool: Optional[str] = None):
        self.translate, self.detect, self.clock = translate, detect, clock
        self.spool = Spool(spool)  # every frontend process's jobs, shared (server/files/spool.py)
        self.jobs: dict[str, Job] = {}  # this process's unfinished jobs; finished ones live in the spool
        self.readers = ThreadPoolExecutor(READERS, thread_name_prefix="nmt-files")
        self.reading = asyncio.Semaphore(READERS)
        self.queue: Optional[asyncio.Queue] = None
        self.workers: list[asyncio.Task] = []

    # -- storage --------------------------------------------------------------------------
    def sweep(self) -> list[dict]:
        """Drop expired jobs, fail those whose process died; the records left, for the bounds."""
        now, kept = self.clock(), []
        self.spool.forget_tombstones(TTL_S)
        for record in self.spool.records():
            if record["status"] in FINISHED:
                if now - record["finished"] > TTL_S:
                    self.spool.remove(record["id"])
                    continue
            elif record["pid"] != os.getpid() and not alive(record["pid"]):
                record.update(status="error", finished=now, size=0,
                              error="the server process translating this document stopped: upload it again")
                self.spool.write(record)
            kept.append(record)
        return kept

    def get(self, ident: str) -> Optional[Job]:
        """The job, whichever process runs it; None once downloaded, deleted or expired."""
        job = self.jobs.get(ident)
        if job is not None:  # deleted by another process: this one stops it at its next batch
            return None if self._deleted(job) else job
        record = self.spool.read(ident)
        if record is None:
            return None
        job = job_of(record)
        if job.status in FINISHED and self.clock() - job.finished > TTL_S:
            self.spool.remove(ident)
            return None
        if job.status not in FINISHED and job.pid != os.getpid() and not alive(job.pid):
            self.sweep()
            return self.get(ident) if self.spool.exists(ident) else None
        return job

    async def wait(self, job: Job, timeout: float) -> Job:
        """The job once finished, or as it stands after `timeout` seconds (another process's job: its record
        read again every POLL_S)."""
        if not job.remote:
            try:
                await asyncio.wait_for(asyncio.shield(job.ended.wait()), timeout)
            except asyncio.TimeoutError:
                pass
            return job
        give_up = self.clock() + timeout
        while job.status not in FINISHED and self.clock() < give_up:
            await asyncio.sleep(POLL_S)
            job = self.get(job.id) or job
        return job

    def take(self, job: Job) -> Optional[bytes]:
        """The result of a done job, and the job is deleted (a result is downloaded once: None when a
        download elsewhere took it first)."""
        return self.spool.take_result(job.id)

    def drop(self, job: Job) -> None:
        """Delete a job in any state; the process translating it stops at its next batch."""
        job.dropped = True
        local = self.jobs.get(job.id)
        if local is not None:
            local.dropped = True
        self.spool.drop(job.id)

    def _room(self, size: int) -> None:
        records = self.sweep()
        active = sum(r["status"] not in FINISHED for r in records)
        if active >= MAX_ACTIVE:
            raise Full(f"{active} documents are being translated; the limit is {MAX_ACTIVE}: try again later")
        if len(records) >= MAX_JOBS or sum(r["size"] for r in records) + size > MAX_BYTES:
            raise Full("the server holds as many documents as it may: download or wait for results, then try again")

    def _deleted(self, job: Job) -> bool:
        """Whether the job was deleted, here or by any process (its record gone once written); marks it so."""
        if not job.dropped and job.recorded and not self.spool.exists(job.id):
            job.dropped = True
        return job.dropped

    def _record(self, job: Job) -> None:
        """Publish the job's state; a record deleted elsewhere (DELETE, any process) stops the job."""
        if self._deleted(job) or not self.spool.write(record_of(job)):
            job.dropped = True
            raise Dropped()
        job.recorded = True

    # -- submitting -----------------------------------------------------------------------
    async def submit(self, filename: str, data: bytes, source: str, target: str, caller: Caller,
                     owner: Optional[str], glossary_id: str = "") -> Job:
        """Checks and reads the file (FileError), makes room (Full) and queues the job."""
        fmt = format_of(filename)
        self._room(len(data))
        async with self.reading:
            document = await asyncio.get_running_loop().run_in_executor(self.readers, read, filename, data)
        self._room(len(data))  # again: others may have been submitted while this one was read
        texts = document.texts()
        billed = sum(len(t) for t in texts if t.strip())
        job = Job(id=secrets.token_hex(16).upper(), key=secrets.token_hex(32).upper(), owner=owner,
                  filename=filename, format=fmt, document=document, source=source, target=target,
                  caller=dataclasses.replace(caller, timeout=CALL_TIMEOUT_S), total=len(document.segments),
                  billed=billed, size=len(data), created=self.clock(), glossary_id=glossary_id)
        self._record(job)
        self.jobs[job.id] = job
        self._start()
        self.queue.put_nowait(job)
        return job

    def _start(self) -> None:
        if self.queue is None:
            self.queue = asyncio.Queue()
            self.workers = [asyncio.create_task(self._work(), name=f"nmt-files-{i}") for i in range(WORKERS)]

    async def _work(self) -> None:
        while True:
            job = await self.queue.get()
            if job.dropped:
                self.jobs.pop(job.id, None)
                job.document, job.finished = None, self.clock()
                job.ended.set()
                continue
            result = None
            try:
                job.status, job.started = "translating", self.clock()
                self._record(job)
                result = await self._run(job)
                job.status = "done"
            except Dropped:
                pass
            except (JobFailed, FileError) as e:
                job.status, job.error = "error", str(e)
            except Exception as e:  # noqa: BLE001 (a bug or a library's surprise: this job fails, the pool lives)
                logging.getLogger(__name__).exception("document job %s failed", job.id)
                job.status, job.error = "error", f"internal error ({type(e).__name__})"
            finally:
                self.jobs.pop(job.id, None)
                job.document, job.finished = None, self.clock()
                job.size = len(result or b"")
                self._finish(job, result)
                job.ended.set()

    def _finish(self, job: Job, result: Optional[bytes]) -> None:
        """The result first, then the record that says done: a reader never sees done without a file."""
        if self._deleted(job):
            self.spool.remove(job.id)
            return
        if result is not None:
            self.spool.put_result(job.id, result)
        if not self.spool.write(record_of(job)):
            self.spool.remove(job.id)

    # -- translating ----------------------------------------------------------------------
    async def _run(self, job: Job) -> bytes:
        document = job.document
        texts = document.texts()
        if not job.source:
            sample = " ".join(t for t in texts if t.strip())[:5_000]
            job.source = await self.detect(job, sample)
        wanted = [i for i, t in enumerate(texts) if t.strip()]
        out = list(document.segments)  # blank segments come back as they are
        job.done = job.total - len(wanted)
        batches, current, size = [], [], 0
        for i in wanted:
            n = len(document.segments[i])
            if current and (len(current) >= BATCH_TEXTS or size + n > BATCH_CHARS):
                batches.append(current)
                current, size = [], 0
            current.append(i)
            size += n
        if current:
            batches.append(current)
        gate = asyncio.Semaphore(CALLS_PER_JOB)

        async def one(batch: list[int]) -> None:
            async with gate:
                self._check(job)
                done = await self._call(job, [document.segments[i] for i in batch])
            for i, text in zip(batch, done):
                out[i] = text
            job.done += len(batch)
            self._progress(job)
        calls = [asyncio.ensure_future(one(b)) for b in batches]
        try:
            await asyncio.gather(*calls)
        except BaseException:  # one batch failed or the job was dropped: the others stop too
            for call in calls:
                call.cancel()
            raise
        return await asyncio.get_running_loop().run_in_executor(self.readers, document.rebuild, out, job.target)

    def _check(self, job: Job) -> None:
        """Stop a job deleted here or elsewhere (its record gone) before its next call."""
        if self._deleted(job):
            raise Dropped()

    def _progress(self, job: Job) -> None:
        now = self.clock()
        if now - job.reported >= PROGRESS_EVERY_S:
            job.reported = now
            self._record(job)

    async def _call(self, job: Job, texts: list[str]) -> list[str]:
        give_up = self.clock() + RETRY_FOR_S
        pause = 0.2
        while True:
            try:
                found = await self.translate(job, texts)
                if len(found) != len(texts):
                    raise JobFailed(f"{len(found)} translations came back for {len(texts)} texts")
                return found
            except CallFailed as e:
                if e.code == grpc.StatusCode.INVALID_ARGUMENT and len(texts) > 1:
                    half = len(texts) // 2
                    return await self._call(job, texts[:half]) + await self._call(job, texts[half:])
                quota = e.code == grpc.StatusCode.RESOURCE_EXHAUSTED and e.message.startswith(QUOTA_REASON)
                retry = e.code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE) and not quota
                if not retry or self.clock() > give_up:
                    raise JobFailed(f"Quota exceeded: {e.message}" if quota else e.message) from None
                await asyncio.sleep(max(pause, e.retry_after or 0.0))
                pause = min(pause * 2, 5.0)
