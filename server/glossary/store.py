"""The glossary store: SQLite (the standard library's sqlite3), one file, per tenant.

Why SQLite: an embedded database with transactions and crash safety (write-ahead log, synchronous
commits), no server to run, and safe to share between the processes of one host: the extra
frontends (--frontends N) each open the same file, and a glossary one creates is in the list the
others answer at once. A tenant is the API key id the request authenticated with ("" when the
server has no key file), so one key never sees, uses or deletes another key's glossaries.

The file: NMT_GLOSSARY_DB, else ~/.cache/nmt-serve/glossaries.sqlite3 ($XDG_CACHE_HOME honoured).

Schema (PRAGMA user_version 1):
    glossaries(id, tenant, name, creation_time, created)
    dictionaries(glossary_id, source_lang, target_lang, position, entry_count, bytes, entries, revision)
A dictionary's entries are kept as one validated TSV text (what DeepL answers for them); its
`revision` changes with every write, so a process that compiled the dictionary for matching
(server/glossary/matching.py) notices another process's change with one indexed read.

Bounds (DeepL's): 1000 glossaries per tenant; 10 MiB of entries per glossary, 1024 UTF-8 bytes per
term and name; and, beyond DeepL, 100 MiB of entries per tenant, so a key cannot fill the disk.
"""
from __future__ import annotations

import collections
import datetime
import os
import re
import sqlite3
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from server.glossary.entries import (MAX_GLOSSARY_BYTES, Entries, GlossaryError, from_tsv, to_tsv,
                                     too_large)

MAX_GLOSSARIES = 1000
MAX_TENANT_BYTES = 100 * 1024 * 1024
CACHE_BYTES = 64 * 1024 * 1024  # parsed dictionaries kept in memory (least recently used go first)
_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_SCHEMA = """
CREATE TABLE IF NOT EXISTS glossaries (
    id TEXT PRIMARY KEY,
    tenant TEXT NOT NULL,
    name TEXT NOT NULL,
    creation_time TEXT NOT NULL,
    created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS glossaries_by_tenant ON glossaries (tenant, created);
CREATE TABLE IF NOT EXISTS dictionaries (
    glossary_id TEXT NOT NULL REFERENCES glossaries (id) ON DELETE CASCADE,
    source_lang TEXT NOT NULL,
    target_lang TEXT NOT NULL,
    position INTEGER NOT NULL,
    entry_count INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    entries TEXT NOT NULL,
    revision TEXT NOT NULL,
    PRIMARY KEY (glossary_id, source_lang, target_lang)
);
"""


@dataclass(frozen=True)
class DictionaryInfo:
    source_lang: str
    target_lang: str
    entry_count: int


@dataclass(frozen=True)
class GlossaryInfo:
    glossary_id: str
    name: str
    creation_time: str  # ISO 8601 with microseconds and a zone: 2026-01-02T03:04:05.678901Z
    dictionaries: tuple[DictionaryInfo, ...]


@dataclass
class Dictionary:
    """One language pair's entries, as translation uses them; `compiled` holds what matching.py built
    from them (per tokenizer), valid as long as the revision is."""
    key: tuple[str, str, str, str]  # glossary id, source, target, revision
    entries: Entries
    size: int
    compiled: dict = field(default_factory=dict)


Patch = tuple[str, str, Entries]  # source language, target language, entries


def default_path() -> Path:
    if os.environ.get("NMT_GLOSSARY_DB"):
        return Path(os.environ["NMT_GLOSSARY_DB"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "nmt-serve" / "glossaries.sqlite3"


def check_id(glossary_id: str) -> str:
    if not isinstance(glossary_id, str) or not _ID.match(glossary_id.lower()):
        raise GlossaryError(400, "Invalid glossary ID", f"{str(glossary_id)[:64]!r} is not a glossary id "
                            "(a UUID such as 96ab91fd-e715-41a1-adeb-5d701f84a483)")
    return glossary_id.lower()


def not_found() -> GlossaryError:
    return GlossaryError(404, "Glossary not found")


def _now() -> tuple[str, float]:
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), now.timestamp()


class GlossaryStore:
    def __init__(self, path: str | Path, max_glossaries: int = MAX_GLOSSARIES,
                 max_tenant_bytes: int = MAX_TENANT_BYTES, cache_bytes: int = CACHE_BYTES):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_glossaries, self.max_tenant_bytes, self.cache_bytes = max_glossaries, max_tenant_bytes, cache_bytes
        self._lock = threading.Lock()
        # isolation_level=None: transactions are begun explicitly (BEGIN IMMEDIATE for writes, so the
        # limits are checked and the write made under one lock across processes).
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None, timeout=30.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.execute("PRAGMA busy_timeout=30000")
        with self._lock:
            self._db.executescript(_SCHEMA)
            self._db.execute("PRAGMA user_version=1")
        self._cache: collections.OrderedDict[tuple, Dictionary] = collections.OrderedDict()
        self._cached_bytes = 0

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- reading ---------------------------------------------------------------------------
    def _info(self, row: tuple) -> GlossaryInfo:
        gid, name, creation_time = row
        dicts = self._db.execute("SELECT source_lang, target_lang, entry_count FROM dictionaries "
                                 "WHERE glossary_id = ? ORDER BY position", (gid,)).fetchall()
        return GlossaryInfo(gid, name, creation_time, tuple(DictionaryInfo(*d) for d in dicts))

    def _row(self, tenant: str, glossary_id: str) -> tuple:
        row = self._db.execute("SELECT id, name, creation_time FROM glossaries WHERE id = ? AND tenant = ?",
                               (check_id(glossary_id), tenant)).fetchone()
        if row is None:
            raise not_found()
        return row

    def list(self, tenant: str) -> list[GlossaryInfo]:
        with self._lock:
            rows = self._db.execute("SELECT id, name, creation_time FROM glossaries WHERE tenant = ? "
                                    "ORDER BY created, rowid", (tenant,)).fetchall()
            return [self._info(r) for r in rows]

    def get(self, tenant: str, glossary_id: str) -> GlossaryInfo:
        with self._lock:
            return self._info(self._row(tenant, glossary_id))

    def entries(self, tenant: str, glossary_id: str, source_lang: str, target_lang: str) -> str:
        """The dictionary's entries as DeepL's TSV (404 when the glossary or the pair is not there)."""
        with self._lock:
            gid = self._row(tenant, glossary_id)[0]
            row = self._db.execute("SELECT entries FROM dictionaries WHERE glossary_id = ? AND source_lang = ? "
                                   "AND target_lang = ?", (gid, source_lang, target_lang)).fetchone()
        if row is None:
            raise GlossaryError(404, "Glossary dictionary not found",
                                f"the glossary has no {source_lang}->{target_lang} dictionary")
        return row[0]

    def dictionary(self, tenant: str, glossary_id: str, source_lang: str, target_lang: str) -> Dictionary:
        """The entries a translation uses (cached while their revision stands). Raises 404 for an unknown
        glossary (or another tenant's) and for a glossary without this pair (400: DeepL's wording)."""
        with self._lock:
            gid = self._row(tenant, glossary_id)[0]
            row = self._db.execute("SELECT revision FROM dictionaries WHERE glossary_id = ? AND source_lang = ? "
                                   "AND target_lang = ?", (gid, source_lang, target_lang)).fetchone()
            if row is None:
                pairs = self._db.execute("SELECT source_lang, target_lang FROM dictionaries WHERE glossary_id = ? "
                                         "ORDER BY position", (gid,)).fetchall()
                raise GlossaryError(400, "Glossary does not match the language pair",
                                    f"the glossary has no {source_lang}->{target_lang} dictionary; it has: "
                                    + (", ".join(f"{s}->{t}" for s, t in pairs) or "none"))
            key = (gid, source_lang, target_lang, row[0])
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
                return found
            text, size = self._db.execute("SELECT entries, bytes FROM dictionaries WHERE glossary_id = ? AND "
                                          "source_lang = ? AND target_lang = ?", key[:3]).fetchone()
            found = Dictionary(key, from_tsv(text), size)
            self._cache[key] = found
            self._cached_bytes += size
            while self._cached_bytes > self.cache_bytes and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._cached_bytes -= old.size
            return found

    # -- writing ---------------------------------------------------------------------------
    def _write(self, work):
        """Run `work()` in one immediate transaction (other processes wait on the file lock)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                out = work()
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")
            return out

    def _check_room(self, tenant: str, glossary_id: str, new_bytes: int, adding: bool) -> None:
        """The tenant's bounds, once the glossary `glossary_id` holds `new_bytes` of entries."""
        if new_bytes > MAX_GLOSSARY_BYTES:
            raise too_large(new_bytes)
        count, total = self._db.execute(
            "SELECT COUNT(*), COALESCE((SELECT SUM(d.bytes) FROM dictionaries d JOIN glossaries g ON "
            "d.glossary_id = g.id WHERE g.tenant = ? AND g.id != ?), 0) FROM glossaries WHERE tenant = ?",
            (tenant, glossary_id, tenant)).fetchone()
        if adding and count >= self.max_glossaries:
            raise GlossaryError(456, "Quota exceeded", f"this API key holds {count} glossaries, the limit: "
                                "delete one first")
        if total + new_bytes > self.max_tenant_bytes:
            raise GlossaryError(456, "Quota exceeded", f"this API key's glossaries would hold {total + new_bytes} "
                                f"bytes of entries; the limit is {self.max_tenant_bytes}")

    def _put(self, gid: str, source: str, target: str, entries: Entries, position: Optional[int] = None) -> None:
        text = to_tsv(entries)
        if position is None:
            found = self._db.execute("SELECT position FROM dictionaries WHERE glossary_id = ? AND source_lang = ? "
                                     "AND target_lang = ?", (gid, source, target)).fetchone()
            position = found[0] if found else self._db.execute(
                "SELECT COALESCE(MAX(position) + 1, 0) FROM dictionaries WHERE glossary_id = ?", (gid,)).fetchone()[0]
        self._db.execute("INSERT OR REPLACE INTO dictionaries VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                         (gid, source, target, position, len(entries), len(text.encode("utf-8")), text,
                          uuid.uuid4().hex))

    def _bytes_of(self, gid: str, replaced: set[tuple[str, str]]) -> int:
        rows = self._db.execute("SELECT source_lang, target_lang, bytes FROM dictionaries WHERE glossary_id = ?",
                                (gid,)).fetchall()
        return sum(b for s, t, b in rows if (s, t) not in replaced)

    def create(self, tenant: str, name: str, dictionaries: list[Patch]) -> GlossaryInfo:
        if not dictionaries:
            raise GlossaryError(400, "Parameter 'dictionaries' not specified.")
        pairs = [(s, t) for s, t, _ in dictionaries]
        if len(set(pairs)) != len(pairs):
            raise GlossaryError(400, "Invalid glossary dictionaries provided",
                                "each language pair may have one dictionary in a glossary")
        gid = str(uuid.uuid4())
        size = sum(len(to_tsv(e).encode("utf-8")) for _, _, e in dictionaries)
        creation_time, created = _now()

        def work():
            self._check_room(tenant, gid, size, adding=True)
            self._db.execute("INSERT INTO glossaries VALUES (?, ?, ?, ?, ?)", (gid, tenant, name, creation_time,
                                                                             created))
            for position, (source, target, entries) in enumerate(dictionaries):
                self._put(gid, source, target, entries, position)
            return self._info((gid, name, creation_time))
        return self._write(work)

    def delete(self, tenant: str, glossary_id: str) -> None:
        def work():
            gid = self._row(tenant, glossary_id)[0]
            self._db.execute("DELETE FROM glossaries WHERE id = ?", (gid,))
        self._write(work)

    def update(self, tenant: str, glossary_id: str, name: Optional[str] = None,
               dictionaries: Optional[list[Patch]] = None, merge: bool = True) -> GlossaryInfo:
        """v3 PATCH (merge=True: entries added to, or replacing those of the same source term in, the
        pair's dictionary; a new pair is added) and PUT (merge=False: the pair's dictionary replaced)."""
        def work():
            gid, old_name, creation_time = self._row(tenant, glossary_id)
            if name is not None:
                self._db.execute("UPDATE glossaries SET name = ? WHERE id = ?", (name, gid))
            merged: list[Patch] = []
            for source, target, entries in dictionaries or ():
                if merge:
                    found = self._db.execute("SELECT entries FROM dictionaries WHERE glossary_id = ? AND "
                                             "source_lang = ? AND target_lang = ?", (gid, source, target)).fetchone()
                    if found is not None:
                        combined = dict(from_tsv(found[0]))
                        combined.update(dict(entries))
                        entries = list(combined.items())
                merged.append((source, target, entries))
            if merged:
                replaced = {(s, t) for s, t, _ in merged}
                size = self._bytes_of(gid, replaced) + sum(len(to_tsv(e).encode("utf-8")) for _, _, e in merged)
                self._check_room(tenant, gid, size, adding=False)
                for source, target, entries in merged:
                    self._put(gid, source, target, entries)
            return self._info((gid, old_name if name is None else name, creation_time))
        return self._write(work)

    def delete_dictionary(self, tenant: str, glossary_id: str, source_lang: str, target_lang: str) -> None:
        def work():
            gid = self._row(tenant, glossary_id)[0]
            gone = self._db.execute("DELETE FROM dictionaries WHERE glossary_id = ? AND source_lang = ? AND "
                                    "target_lang = ?", (gid, source_lang, target_lang)).rowcount
            if not gone:
                raise GlossaryError(404, "Glossary dictionary not found",
                                    f"the glossary has no {source_lang}->{target_lang} dictionary")
        self._write(work)


_stores: dict[Path, GlossaryStore] = {}
_stores_lock = threading.Lock()


def open_store(path: Optional[str | Path] = None) -> GlossaryStore:
    """The process's store for `path` (default_path() when None): one connection per file."""
    resolved = Path(path) if path else default_path()
    with _stores_lock:
        store = _stores.get(resolved)
        if store is None:
            store = _stores[resolved] = GlossaryStore(resolved)
        return store
