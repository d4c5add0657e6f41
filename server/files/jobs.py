"""Document jobs: read on upload, translated in the background, kept until downloaded or expired.

    jobs = Jobs(translate=..., detect=...)       # one per HTTP port
    job = await jobs.submit(filename, data, source, target, caller, owner)   # FileError / Full
    job.state()                                   # queued / translating / done / error, progress
    data = jobs.take(job)                         # the result, then the job is gone

Bounds (constants here; docs/documents.md "Files" lists them):
* files read at once: `READERS` threads of their own (parsing a 10 MB Office file takes seconds;
  the server's own executor splits requests and must not wait behind it);
* documents translated at once: `WORKERS`; each sends at most `CALLS_PER_JOB` Translate calls at a
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
import math
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Optional

import grpc

from server.files import Document, FileError, Format, format_of, read
from server.gateway import Caller, CallFailed
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
CHARS_PER_SECOND = 300.0  # the first estimate of seconds_remaining, before any batch finished


class Full(Exception):
    """No room for another job now (retry later)."""


class JobFailed(Exception):
    """A job ends in error with this message."""


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
    caller: Caller
    total: int
    billed: int  # characters to translate
    size: int  # bytes held for it
    status: str = "queued"
    done: int = 0
    error: str = ""
    result: Optional[bytes] = None
    created: float = 0.0
    started: float = 0.0
    finished: float = 0.0
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    glossary_id: str = ""  # a glossary of the owner's key, applied to every segment (server/glossary/)

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


class Jobs:
    def __init__(self, translate: Translate, detect: Detect, clock: Callable[[], float] = time.monotonic):
        self.translate, self.detect, self.clock = translate, detect, clock
        self.jobs: dict[str, Job] = {}
        self.readers = ThreadPoolExecutor(READERS, thread_name_prefix="nmt-files")
        self.reading = asyncio.Semaphore(READERS)
        self.queue: Optional[asyncio.Queue] = None
        self.workers: list[asyncio.Task] = []

    # -- storage --------------------------------------------------------------------------
    def sweep(self) -> None:
        now = self.clock()
        for job in list(self.jobs.values()):
            if job.finished and now - job.finished > TTL_S:
                del self.jobs[job.id]

    def held(self) -> int:
        return sum(job.size for job in self.jobs.values())

    def get(self, ident: str) -> Optional[Job]:
        self.sweep()
        return self.jobs.get(ident)

    def take(self, job: Job) -> bytes:
        """The result of a done job; the job is deleted (a result is downloaded once)."""
        self.jobs.pop(job.id, None)
        return job.result or b""

    def _room(self, size: int) -> None:
        self.sweep()
        active = sum(job.status in ("queued", "translating") for job in self.jobs.values())
        if active >= MAX_ACTIVE:
            raise Full(f"{active} documents are being translated; the limit is {MAX_ACTIVE}: try again later")
        if len(self.jobs) >= MAX_JOBS or self.held() + size > MAX_BYTES:
            raise Full("the server holds as many documents as it may: download or wait for results, then try again")

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
            if job.id not in self.jobs:
                continue
            job.status, job.started = "translating", self.clock()
            try:
                await self._run(job)
                job.status = "done"
            except JobFailed as e:
                job.status, job.error = "error", str(e)
            except FileError as e:
                job.status, job.error = "error", str(e)
            except Exception as e:  # noqa: BLE001 (a bug or a library's surprise: this job fails, the pool lives)
                import logging
                logging.getLogger(__name__).exception("document job %s failed", job.id)
                job.status, job.error = "error", f"internal error ({type(e).__name__})"
            finally:
                job.document, job.finished = None, self.clock()
                job.size = len(job.result or b"")
                job.ended.set()

    # -- translating ----------------------------------------------------------------------
    async def _run(self, job: Job) -> None:
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
                done = await self._call(job, [document.segments[i] for i in batch])
            for i, text in zip(batch, done):
                out[i] = text
            job.done += len(batch)
        await asyncio.gather(*(one(b) for b in batches))
        job.result = await asyncio.get_running_loop().run_in_executor(self.readers, document.rebuild, out, job.target)

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
