"""The catalog: knowledge bases, their files, variants and segment packs, in SQLite. Torch-free.

A KB's pack list changes in one transaction once every pack of a new ingest is stored, so a
reader sees either the old complete KB or the new complete one, never a half-written one.
Several processes may share the file (the gateway, and batch jobs run as Ray jobs: `kvctl job
run`): SQLite's locking keeps each transaction whole across them, which needs the
file on a local disk, not a network filesystem.
"""
from __future__ import annotations

import hashlib

import json
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kvedge.common.errors import NotFound
from kvedge.common.pack.manifest import KVShape

SCHEMA = """
CREATE TABLE IF NOT EXISTS kbs (
    id INTEGER PRIMARY KEY, namespace TEXT NOT NULL, name TEXT NOT NULL,
    mode TEXT NOT NULL DEFAULT 'rag', segment_tokens INTEGER NOT NULL DEFAULT 512,
    codec TEXT NOT NULL DEFAULT 'fp16', model_fingerprint TEXT NOT NULL DEFAULT '',
    n_tokens INTEGER NOT NULL DEFAULT 0, updated REAL NOT NULL,
    n_layers INTEGER NOT NULL DEFAULT 0, n_kv_heads INTEGER NOT NULL DEFAULT 0,
    head_dim INTEGER NOT NULL DEFAULT 0,
    UNIQUE (namespace, name));
CREATE TABLE IF NOT EXISTS files (
    kb_id INTEGER NOT NULL REFERENCES kbs(id) ON DELETE CASCADE, path TEXT NOT NULL,
    sha256 TEXT NOT NULL, size INTEGER NOT NULL, PRIMARY KEY (kb_id, path));
CREATE TABLE IF NOT EXISTS variants (
    kb_id INTEGER NOT NULL REFERENCES kbs(id) ON DELETE CASCADE, variant TEXT NOT NULL,
    status TEXT NOT NULL, error TEXT NOT NULL DEFAULT '', done INTEGER NOT NULL DEFAULT 0,
    total INTEGER NOT NULL DEFAULT 0, updated REAL NOT NULL, PRIMARY KEY (kb_id, variant));
CREATE TABLE IF NOT EXISTS segments (
    kb_id INTEGER NOT NULL REFERENCES kbs(id) ON DELETE CASCADE, variant TEXT NOT NULL,
    idx INTEGER NOT NULL, pack_id TEXT NOT NULL, pack_bytes INTEGER NOT NULL,
    n_tokens INTEGER NOT NULL, source TEXT NOT NULL,
    PRIMARY KEY (kb_id, variant, idx));
CREATE INDEX IF NOT EXISTS segments_by_pack ON segments(pack_id);
CREATE TABLE IF NOT EXISTS prefilled (
    kb_id INTEGER NOT NULL REFERENCES kbs(id) ON DELETE CASCADE, key TEXT NOT NULL,
    pack_id TEXT NOT NULL, pack_bytes INTEGER NOT NULL, n_tokens INTEGER NOT NULL,
    PRIMARY KEY (kb_id, key));
CREATE INDEX IF NOT EXISTS prefilled_by_key ON prefilled(key);
CREATE INDEX IF NOT EXISTS prefilled_by_pack ON prefilled(pack_id);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY, namespace TEXT NOT NULL, kbs TEXT NOT NULL, method TEXT NOT NULL,
    budget REAL NOT NULL, codec TEXT NOT NULL, status TEXT NOT NULL, done INTEGER NOT NULL,
    total INTEGER NOT NULL, failures TEXT NOT NULL, created REAL NOT NULL,
    finished REAL NOT NULL DEFAULT 0, compress_s REAL NOT NULL DEFAULT 0,
    owner TEXT NOT NULL DEFAULT '');
"""
# columns added since a table was first created: (table, column, definition); a catalog
# written by an older kvedge gains them when it is opened. A KB's KV shape is the model's (its
# fp16 size follows from it, `KVShape.fp16_bytes`); in an older catalog it reads (0, 0, 0),
# unknown, until the KB is ingested again.
MIGRATIONS = [("jobs", "owner", "TEXT NOT NULL DEFAULT ''"),
              ("kbs", "n_layers", "INTEGER NOT NULL DEFAULT 0"),
              ("kbs", "n_kv_heads", "INTEGER NOT NULL DEFAULT 0"),
              ("kbs", "head_dim", "INTEGER NOT NULL DEFAULT 0")]
# columns an older kvedge wrote and this one derives instead: (table, column); dropped when
# the catalog is opened (a NOT NULL column without a default would refuse new rows)
DROPPED = [("segments", "fp16_bytes")]
UNKNOWN_SHAPE = KVShape(0, 0, 0)
ACTIVE = ("queued", "running", "cancelling")  # a job some process is (or should be) running

BASE = ""  # the base (uncompressed) variant's name


@dataclass
class SegmentRecord:
    """One context of a KB variant as the catalog keeps it: its pack and what it measures."""

    idx: int
    pack_id: str
    pack_bytes: int
    n_tokens: int
    source: str


@dataclass(frozen=True)
class Prefilled:
    """A pack an ingest stored for one segment's prefill key (`Catalog.remember`)."""

    pack_id: str
    pack_bytes: int
    n_tokens: int

    def record(self, idx: int, source: str) -> SegmentRecord:
        """This pack as context `idx` (from file `source`) of a KB variant."""
        return SegmentRecord(idx, self.pack_id, self.pack_bytes, self.n_tokens, source)


@dataclass
class KBRecord:
    namespace: str
    name: str
    mode: str
    segment_tokens: int
    codec: str
    model_fingerprint: str
    n_tokens: int
    updated: float
    kv_shape: KVShape = UNKNOWN_SHAPE  # of the model the KB was prefilled with
    files: dict[str, tuple[str, int]] = field(default_factory=dict)  # path → (sha256, size)
    variants: dict[str, dict] = field(default_factory=dict)  # variant → status row
    segments: list[SegmentRecord] = field(default_factory=list)  # of the requested variant


@dataclass
class JobRecord:
    """A batch compression job: `method` at `budget` with `codec` over some KBs' contexts."""

    id: str
    namespace: str
    kbs: list[str]
    method: str
    budget: float
    codec: str
    status: str = "queued"  # queued | running | cancelling | done | failed | cancelled
    done: int = 0
    total: int = 0
    failures: list[dict] = field(default_factory=list)  # {"kb", "segment", "error"}
    created: float = 0.0
    finished: float = 0.0
    compress_s: float = 0.0
    owner: str = ""  # the process running it (`cloud.jobs.Owner`); "" in older catalogs

    @property
    def variant(self) -> str:
        return variant_name(self.method, self.budget, self.codec)

    @classmethod
    def from_row(cls, row) -> "JobRecord":
        (id_, ns, kbs, method, budget, codec, status, done, total, failures, created, finished,
         compress_s, owner) = row
        return cls(id_, ns, json.loads(kbs), method, budget, codec, status, done, total,
                   json.loads(failures), created, finished, compress_s, owner)


def variant_name(method: str, budget: float, codec: str) -> str:
    """e.g. contrastkv-0.2-int4+zstd: one pack variant per (method, budget, codec)."""
    return f"{method}-{budget:g}-{codec}"


class Catalog:
    def __init__(self, path: Path | str):
        self.path = str(path)
        self._lock = threading.Lock()
        # the gateway and batch jobs run as Ray jobs share this file: a writer waits for
        # another process's transaction (all are short) instead of failing "locked"
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None,
                                   timeout=30)
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.executescript(SCHEMA)
        self._migrate()

    def _migrate(self) -> None:
        with self._tx() as db:  # in a transaction: two processes may open an old file at once
            for table, column, definition in MIGRATIONS:
                if column not in self._columns(db, table):
                    db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {definition}")
            for table, column in DROPPED:
                if column in self._columns(db, table):
                    db.execute(f"ALTER TABLE {table} DROP COLUMN {column}")

    @staticmethod
    def _columns(db, table: str) -> set[str]:
        return {r[1] for r in db.execute(f"PRAGMA table_info({table})")}

    @contextmanager
    def _tx(self):
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _kb_id(self, db, namespace: str, name: str) -> int:
        row = db.execute("SELECT id FROM kbs WHERE namespace=? AND name=?",
                         (namespace, name)).fetchone()
        if row is None:
            raise NotFound(f"no knowledge base {name!r} in namespace {namespace!r}")
        return row[0]

    # ------------------------------------------------------------------ writes

    def begin_ingest(self, namespace: str, name: str, files: dict[str, tuple[str, int]], *,
                     mode: str, segment_tokens: int, codec: str) -> None:
        """Record the KB's new file list and mark its base variant as ingesting."""
        now = time.time()
        with self._tx() as db:
            db.execute("INSERT INTO kbs(namespace, name, mode, segment_tokens, codec, updated) "
                       "VALUES (?,?,?,?,?,?) ON CONFLICT(namespace, name) DO UPDATE SET "
                       "mode=excluded.mode, segment_tokens=excluded.segment_tokens, "
                       "codec=excluded.codec, updated=excluded.updated",
                       (namespace, name, mode, segment_tokens, codec, now))
            kb = self._kb_id(db, namespace, name)
            db.execute("DELETE FROM files WHERE kb_id=?", (kb,))
            db.executemany("INSERT INTO files VALUES (?,?,?,?)",
                           [(kb, p, sha, size) for p, (sha, size) in sorted(files.items())])
            self._set_status(db, kb, BASE, "ingesting", "", 0, 0, now)

    def fail_interrupted_ingests(self, error: str) -> int:
        """Mark base variants still 'ingesting' as failed with `error`; returns how many. Only
        a gateway ingests, so at its start any such variant is one whose gateway stopped
        mid-ingest: it would otherwise read 'ingesting' forever (its packs stay unpublished)."""
        with self._tx() as db:
            return db.execute("UPDATE variants SET status='failed', error=?, updated=? WHERE "
                              "variant=? AND status='ingesting'",
                              (error, time.time(), BASE)).rowcount

    def set_progress(self, namespace: str, name: str, variant: str, status: str, *,
                     error: str = "", done: int = 0, total: int = 0) -> None:
        with self._tx() as db:
            self._set_status(db, self._kb_id(db, namespace, name), variant, status, error, done,
                             total, time.time())

    @staticmethod
    def _set_status(db, kb, variant, status, error, done, total, now):
        db.execute("INSERT INTO variants VALUES (?,?,?,?,?,?,?) ON CONFLICT(kb_id, variant) DO "
                   "UPDATE SET status=excluded.status, error=excluded.error, done=excluded.done, "
                   "total=excluded.total, updated=excluded.updated",
                   (kb, variant, status, error, done, total, now))

    def remember(self, namespace: str, name: str, key: str, pack: "Prefilled") -> None:
        """Record that an ingest (or a job) of the KB stored `pack` for `key`
        (`kvedge.cloud.ingest.prefill_key`, `compress_key`): the pack stays in the store,
        referenced, until a publish of the KB finds none of its variants using it, or the KB
        is removed — so an ingest or job cut off resumes, and a re-upload (a job run again
        after it) redoes only the segments that changed."""
        with self._tx() as db:
            db.execute("INSERT OR REPLACE INTO prefilled VALUES (?,?,?,?,?)",
                       (self._kb_id(db, namespace, name), key, pack.pack_id, pack.pack_bytes,
                        pack.n_tokens))

    def prefilled(self, namespace: str, key: str) -> "Prefilled | None":
        """A pack some KB of `namespace` holds for the prefill key, or None (never another
        namespace's: a tenant's packs are not another's to reuse)."""
        with self._lock:
            row = self._db.execute(
                "SELECT p.pack_id, p.pack_bytes, p.n_tokens FROM prefilled p JOIN kbs k ON "
                "k.id = p.kb_id WHERE p.key=? AND k.namespace=? LIMIT 1",
                (key, namespace)).fetchone()
        return Prefilled(*row) if row else None

    def held(self, namespace: str, name: str, keys: dict[int, str],
             exists) -> dict[int, "Prefilled"]:
        """Of `keys` (segment or context index → key), those whose pack the namespace holds
        (`prefilled`) and `exists(pack_id)` confirms in the store: index → pack, each
        remembered for this KB too, so it stays found if the KB that made it goes."""
        out = {}
        for idx, key in keys.items():
            pack = self.prefilled(namespace, key)
            if pack is not None and exists(pack.pack_id):
                self.remember(namespace, name, key, pack)
                out[idx] = pack
        return out

    def publish(self, namespace: str, name: str, variant: str,
                segments: list[SegmentRecord], *, model_fingerprint: str,
                kv_shape: KVShape = UNKNOWN_SHAPE) -> list[str]:
        """Atomically replace a variant's segments and mark it ready; returns pack ids no
        longer referenced anywhere (the caller may delete them from the store). The base
        variant also records the model it was prefilled with: fingerprint and KV shape."""
        with self._tx() as db:
            kb = self._kb_id(db, namespace, name)
            old = {r[0] for r in db.execute("SELECT pack_id FROM segments WHERE kb_id=? AND "
                                            "variant=?", (kb, variant))}
            db.execute("DELETE FROM segments WHERE kb_id=? AND variant=?", (kb, variant))
            db.executemany("INSERT INTO segments VALUES (?,?,?,?,?,?,?)",
                           [(kb, variant, s.idx, s.pack_id, s.pack_bytes, s.n_tokens, s.source)
                            for s in segments])
            # records of packs no variant of the KB uses (old versions, earlier attempts) go;
            # their packs are left to the start-up sweep, not deleted here: an ingest or job
            # of this KB still running may be about to publish one of them
            db.execute("DELETE FROM prefilled WHERE kb_id=? AND pack_id NOT IN (SELECT "
                       "pack_id FROM segments WHERE kb_id=?)", (kb, kb))
            if variant == BASE:
                db.execute("UPDATE kbs SET model_fingerprint=?, n_tokens=?, updated=?, "
                           "n_layers=?, n_kv_heads=?, head_dim=? WHERE id=?",
                           (model_fingerprint, sum(s.n_tokens for s in segments), time.time(),
                            *kv_shape, kb))
            self._set_status(db, kb, variant, "ready", "", len(segments), len(segments),
                             time.time())
            return self._orphans(db, old)

    def remove(self, namespace: str, name: str) -> list[str]:
        """Delete a KB; returns its pack ids that nothing else references."""
        with self._tx() as db:
            kb = self._kb_id(db, namespace, name)
            packs = {r[0] for r in db.execute("SELECT pack_id FROM segments WHERE kb_id=? "
                                              "UNION SELECT pack_id FROM prefilled WHERE "
                                              "kb_id=?", (kb, kb))}
            db.execute("DELETE FROM kbs WHERE id=?", (kb,))
            return self._orphans(db, packs)

    def referenced(self, pack_id: str) -> bool:
        """Whether a segment or an ingest's record (`remember`) still references the pack."""
        with self._lock:
            return not self._orphans(self._db, {pack_id})

    @staticmethod
    def _orphans(db, packs) -> list[str]:
        return sorted(p for p in packs if db.execute(
            "SELECT 1 FROM segments WHERE pack_id=? UNION ALL SELECT 1 FROM prefilled WHERE "
            "pack_id=? LIMIT 1", (p, p)).fetchone() is None)

    # ------------------------------------------------------------------ reads

    def get(self, namespace: str, name: str, variant: str = BASE) -> KBRecord:
        with self._lock:
            db = self._db
            kb = self._kb_id(db, namespace, name)
            row = db.execute("SELECT namespace, name, mode, segment_tokens, codec, "
                             "model_fingerprint, n_tokens, updated, n_layers, n_kv_heads, "
                             "head_dim FROM kbs WHERE id=?", (kb,)).fetchone()
            rec = KBRecord(*row[:8], kv_shape=KVShape(*row[8:]))
            rec.files = {p: (sha, size) for p, sha, size in db.execute(
                "SELECT path, sha256, size FROM files WHERE kb_id=? ORDER BY path", (kb,))}
            for v, status, error, done, total, updated in db.execute(
                    "SELECT variant, status, error, done, total, updated FROM variants "
                    "WHERE kb_id=?", (kb,)):
                rec.variants[v] = dict(status=status, error=error, done=done, total=total,
                                       updated=updated)
            if variant not in rec.variants:
                raise NotFound(f"knowledge base {name!r} has no variant {variant!r}; it has "
                               f"{sorted(v or 'base' for v in rec.variants)}")
            rec.segments = [SegmentRecord(*r) for r in db.execute(
                "SELECT idx, pack_id, pack_bytes, n_tokens, source FROM segments "
                "WHERE kb_id=? AND variant=? ORDER BY idx", (kb, variant))]
            return rec

    def version(self, namespace: str, name: str, variant: str = BASE) -> str:
        """A tag that changes whenever `get(namespace, name, variant)` would read anything new,
        read without its segments (GetKB's etag). Every write stamps `updated` with the time,
        on the KB and on the variant it touches, and the tag covers every variant's status
        (`get` lists them all) and the KB's row id (a KB removed and made again)."""
        with self._lock:
            db = self._db
            kb = self._kb_id(db, namespace, name)
            (updated,) = db.execute("SELECT updated FROM kbs WHERE id=?", (kb,)).fetchone()
            rows = db.execute("SELECT variant, status, done, total, updated FROM variants "
                              "WHERE kb_id=? ORDER BY variant", (kb,)).fetchall()
        if variant not in {r[0] for r in rows}:
            self.get(namespace, name, variant)  # its NotFound names the variants there are
        return hashlib.sha256(repr((kb, updated, rows)).encode()).hexdigest()[:32]

    def names(self, namespaces: list[str] | None) -> list[tuple[str, str]]:
        """(namespace, name) of every KB, restricted to `namespaces` (None = all)."""
        with self._lock:
            rows = self._db.execute("SELECT namespace, name FROM kbs ORDER BY namespace, name")
            return [r for r in rows if namespaces is None or r[0] in namespaces]

    def pack_namespaces(self, pack_id: str) -> set[str]:
        with self._lock:
            return {r[0] for r in self._db.execute(
                "SELECT DISTINCT k.namespace FROM segments s JOIN kbs k ON k.id = s.kb_id "
                "WHERE s.pack_id=?", (pack_id,))}

    # ------------------------------------------------------------------ jobs

    def put_job(self, job: "JobRecord") -> None:
        """Write the job's record; a progress write (queued or running) keeps a pending
        cancel request (`request_cancel`, possibly from another process) in place."""
        with self._tx() as db:
            db.execute("INSERT INTO jobs VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT(id) DO "
                       "UPDATE SET status = CASE WHEN jobs.status = 'cancelling' AND "
                       "excluded.status IN ('queued', 'running') THEN jobs.status ELSE "
                       "excluded.status END, done=excluded.done, total=excluded.total, "
                       "failures=excluded.failures, finished=excluded.finished, "
                       "compress_s=excluded.compress_s",
                       (job.id, job.namespace, json.dumps(job.kbs), job.method, job.budget,
                        job.codec, job.status, job.done, job.total, json.dumps(job.failures),
                        job.created, job.finished, job.compress_s, job.owner))

    def request_cancel(self, namespace: str, job_id: str) -> None:
        """Mark a queued or running job 'cancelling'; whichever process runs it (the gateway or
        a Ray job) sees that, stops and records it 'cancelled'."""
        with self._tx() as db:
            db.execute("UPDATE jobs SET status='cancelling' WHERE id=? AND namespace=? AND "
                       "status IN ('queued', 'running')", (job_id, namespace))

    def job(self, namespace: str, job_id: str) -> "JobRecord":
        with self._lock:
            row = self._db.execute("SELECT * FROM jobs WHERE id=? AND namespace=?",
                                   (job_id, namespace)).fetchone()
        if row is None:
            raise NotFound(f"no job {job_id!r} in namespace {namespace!r}")
        return JobRecord.from_row(row)

    def jobs(self, namespaces: list[str] | None) -> list["JobRecord"]:
        with self._lock:
            rows = self._db.execute("SELECT * FROM jobs ORDER BY created").fetchall()
        return [JobRecord.from_row(r) for r in rows if namespaces is None or r[1] in namespaces]

    def end_abandoned_jobs(self, why: Callable[[str], str | None],
                           only: str | None = None) -> list["JobRecord"]:
        """End the active jobs (all, or job `only`) whose owner `why(owner)` says is gone (it
        returns the reason, else None): 'failed' with the reason as a failure, or 'cancelled'
        if a cancel was requested; their variants still 'ingesting' fail too. Returns the jobs
        ended. Without this a job whose process died would read 'running' forever."""
        with self._tx() as db:
            active = [JobRecord.from_row(r) for r in
                      db.execute(f"SELECT * FROM jobs WHERE status IN {ACTIVE}")]
            ended = []
            for job in active:
                if only in (None, job.id) and (reason := why(job.owner)) is not None:
                    self._end_job(db, job, reason)
                    ended.append(job)
            live = {(j.namespace, kb, j.variant) for j in active if j.status in ACTIVE
                    for kb in j.kbs}
            for job in ended:
                for kb in job.kbs:
                    if (job.namespace, kb, job.variant) not in live:  # else a live job's
                        self._fail_variant(db, job, kb)
        return ended

    @staticmethod
    def _end_job(db, job: "JobRecord", reason: str) -> None:
        job.status = "cancelled" if job.status == "cancelling" else "failed"
        job.failures.append({"kb": "*", "segment": -1, "error": reason})
        job.finished = time.time()
        db.execute("UPDATE jobs SET status=?, failures=?, finished=? WHERE id=?",
                   (job.status, json.dumps(job.failures), job.finished, job.id))

    @staticmethod
    def _fail_variant(db, job: "JobRecord", kb: str) -> None:
        db.execute("UPDATE variants SET status='failed', error=?, updated=? WHERE variant=? AND "
                   "status='ingesting' AND kb_id=(SELECT id FROM kbs WHERE namespace=? AND "
                   "name=?)", (f"job {job.id}: {job.failures[-1]['error']}", time.time(),
                               job.variant, job.namespace, kb))

    def sweep_packs(self, sweep: Callable[[set[str]], list[str]]) -> list[str] | None:
        """Run `sweep(every pack id a segment or an ingest's record references)` if no job is
        active, holding the write lock meanwhile so no process can start one (a job writes
        packs only while its record says it is active); returns what `sweep` returned, or
        None if it did not run.
        Ingests write packs too: the caller (a gateway, before it serves) runs none."""
        with self._tx() as db:
            if db.execute(f"SELECT 1 FROM jobs WHERE status IN {ACTIVE} LIMIT 1").fetchone():
                return None
            return sweep({r[0] for r in db.execute("SELECT pack_id FROM segments UNION "
                                                   "SELECT pack_id FROM prefilled")})

    def close(self) -> None:
        self._db.close()
