"""The document jobs' shared record: one directory that every frontend process reads and writes.

With `--frontends N > 1` the HTTP port is shared (SO_REUSEPORT), so a DeepL client's status poll or
download lands on any of the N processes, not the one that took the upload and translates it. Jobs
held in that process's memory answered such requests 404 (three times in four with four frontends).
So a job's public state and its result live here, in files, and any process answers from them:

    <id>.json    the job's record (status, progress, owner, key, ...), replaced atomically on change
    <id>.out     the translated file, written once the job is done; a download claims it by renaming
                 it (one rename wins, so a result is downloaded once however many processes race)
    <id>.dropped a deleted job's tombstone: written before its files are removed, checked after every
                 record write, so a progress write racing the delete cannot bring the job back

The process that took the upload keeps translating it (its workers, its gRPC calls); it writes the
record on each change and, between batches, notices a record deleted elsewhere and stops. Results on
disk also keep finished documents (up to the byte bound, for an hour) out of the server's memory.

Records carry the writer's pid: a job whose process died unfinished is marked failed by whichever
process sweeps next, so a client polling it gets an error instead of `translating` forever.
Timestamps are time.monotonic(), which is one clock for every process on the host.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
import time
import weakref
from pathlib import Path
from typing import Iterator, Optional

FINISHED = ("done", "error")


class Spool:
    def __init__(self, directory: Optional[str] = None):
        if directory:
            self.dir = Path(directory)
            self.dir.mkdir(parents=True, exist_ok=True)
        else:  # nobody named a shared one: this process's own, removed with it
            self.dir = Path(tempfile.mkdtemp(prefix="nmt-documents-"))
            weakref.finalize(self, shutil.rmtree, str(self.dir), True)

    def _path(self, ident: str, suffix: str) -> Path:
        return self.dir / f"{ident}{suffix}"

    def _replace(self, ident: str, suffix: str, data: bytes) -> None:
        """Write then rename: a reader sees the old file or the new one, never half of one."""
        tmp = self._path(f".{ident}.{os.getpid()}.{secrets.token_hex(4)}", ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self._path(ident, suffix))

    # -- records --------------------------------------------------------------------------
    def write(self, record: dict) -> bool:
        """Publish a record; False (and nothing kept) when the job was deleted."""
        ident = record["id"]
        self._replace(ident, ".json", json.dumps(record).encode())
        if self._path(ident, ".dropped").exists():
            self._path(ident, ".json").unlink(missing_ok=True)
            return False
        return True

    def read(self, ident: str) -> Optional[dict]:
        try:
            return json.loads(self._path(ident, ".json").read_bytes())
        except (FileNotFoundError, ValueError):  # gone, or a stray file that is not a record
            return None

    def exists(self, ident: str) -> bool:
        return self._path(ident, ".json").exists() and not self._path(ident, ".dropped").exists()

    def records(self) -> Iterator[dict]:
        for path in self.dir.glob("*.json"):
            record = self.read(path.stem)
            if record is not None:
                yield record

    def remove(self, ident: str) -> None:
        self._path(ident, ".out").unlink(missing_ok=True)
        self._path(ident, ".json").unlink(missing_ok=True)

    def drop(self, ident: str) -> None:
        """Delete a job that may still be running in another process."""
        self._path(ident, ".dropped").touch()
        self.remove(ident)

    def forget_tombstones(self, older_than_s: float) -> None:
        cutoff = time.time() - older_than_s
        for path in self.dir.glob("*.dropped"):
            try:
                if path.stat().st_mtime < cutoff:
                    path.unlink()
            except FileNotFoundError:
                pass

    # -- results --------------------------------------------------------------------------
    def put_result(self, ident: str, data: bytes) -> None:
        self._replace(ident, ".out", data)

    def take_result(self, ident: str) -> Optional[bytes]:
        """The result, and the job is gone; None when another download (any process) took it first."""
        claimed = self._path(f".{ident}.{os.getpid()}.{secrets.token_hex(4)}", ".taken")
        try:
            os.rename(self._path(ident, ".out"), claimed)
        except FileNotFoundError:
            return None
        try:
            return claimed.read_bytes()
        finally:
            claimed.unlink(missing_ok=True)
            self._path(ident, ".json").unlink(missing_ok=True)


def alive(pid: int) -> bool:
    """Whether a process with this pid exists (the job's writer, on this host)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, someone else's
        return True
    return True
