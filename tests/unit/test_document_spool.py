"""The document jobs' spool (server/files/spool.py): what one frontend process records, another answers.

Two `Jobs` over one directory stand in for two frontend processes (tests/system/test_frontends.py runs
the real ones); a record naming a process that no longer exists stands in for a frontend that died."""
from __future__ import annotations

import asyncio
import subprocess
import sys

from server.files import jobs as jobs_module
from server.files.spool import Spool
from server.edge.gateway import Caller


def _pair(tmp_path, gate: asyncio.Event):
    async def translate(job, texts):
        await gate.wait()
        return [t.upper() for t in texts]

    async def detect(job, sample):
        return "en"
    return (jobs_module.Jobs(translate, detect, spool=str(tmp_path)),
            jobs_module.Jobs(translate, detect, spool=str(tmp_path)))


def test_another_process_answers_status_and_download_once(tmp_path):
    async def scenario():
        gate = asyncio.Event()
        owner, other = _pair(tmp_path, gate)
        job = await owner.submit("a.txt", b"A man rides.\n\nA dog runs.\n", "en", "de", Caller(), "k1")
        seen = other.get(job.id)
        assert seen.remote and seen.status in ("queued", "translating") and seen.owner == "k1"
        assert seen.key == job.key and seen.total == job.total
        assert other.take(seen) is None  # nothing to download before it is done
        gate.set()
        seen = await other.wait(seen, 10)  # polls the record
        assert (seen.status, seen.done) == ("done", seen.total) and seen.billed == job.billed
        assert owner.get(job.id).remote  # finished: the owner answers from the spool too
        assert other.take(seen) == b"A MAN RIDES.\n\nA DOG RUNS.\n"
        assert owner.take(job) is None and owner.get(job.id) is None and other.get(job.id) is None
    asyncio.run(scenario())


def test_a_delete_in_another_process_stops_the_job(tmp_path):
    async def scenario():
        gate = asyncio.Event()
        owner, other = _pair(tmp_path, gate)
        job = await owner.submit("a.txt", b"A man rides.", "en", "de", Caller(), "")
        other.drop(other.get(job.id))
        assert owner.get(job.id) is None and job.dropped
        gate.set()
        await asyncio.wait_for(job.ended.wait(), 10)
        # The owner wrote nothing back: no record, no result, for either process.
        assert other.get(job.id) is None and not list(tmp_path.glob(f"{job.id}.json"))
        assert not list(tmp_path.glob("*.out"))
        assert Spool(str(tmp_path)).write(jobs_module.record_of(job)) is False  # the tombstone wins a late write
    asyncio.run(scenario())


def test_a_job_whose_process_died_reads_as_failed(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()

    async def scenario():
        gate = asyncio.Event()
        owner, other = _pair(tmp_path, gate)
        job = await owner.submit("a.txt", b"A man rides.", "en", "de", Caller(), "")
        record = jobs_module.record_of(job)
        record.update(id="F" * 32, pid=gone.pid, status="translating")
        Spool(str(tmp_path)).write(record)
        seen = other.get("F" * 32)
        assert seen.status == "error" and "stopped" in seen.error and seen.ended.is_set()
        gate.set()
        await asyncio.wait_for(job.ended.wait(), 10)
    asyncio.run(scenario())


def test_bounds_count_every_process_jobs(tmp_path, monkeypatch):
    monkeypatch.setattr(jobs_module, "MAX_ACTIVE", 1)

    async def scenario():
        gate = asyncio.Event()
        owner, other = _pair(tmp_path, gate)
        await owner.submit("a.txt", b"A man rides.", "en", "de", Caller(), "")
        try:
            await other.submit("b.txt", b"A dog.", "en", "de", Caller(), "")
        except jobs_module.Full:
            pass
        else:
            raise AssertionError("the second process took a job past the server's limit")
        gate.set()
    asyncio.run(scenario())
