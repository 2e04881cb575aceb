"""Batch compression jobs: re-compress KBs' contexts with an eviction method, budget and codec.

A job reads the base pack of every context (each RAG segment, or the whole KB in KBQA mode) of
its KBs, runs the method on the Ray prefill actors (query-agnostic: once per context), encodes
the kept KV with the codec and publishes the result as a new variant of each KB, next to the
uncompressed one (`kvedge serve --kb NS/KB@VARIANT` answers from it). Ray retries a task
whose worker died; a context that still fails is reported with its error and its KB's variant
is not published (a half-compressed variant is never served).
"""
from __future__ import annotations

import logging
import threading
import time
import uuid

from kvedge.cloud.catalog import BASE, Catalog, JobRecord, SegmentRecord
from kvedge.common.errors import BadInput, InvalidRequest

log = logging.getLogger("kvedge.jobs")


def check_spec(method: str, budget: float, codec: str) -> None:
    """Refuse, before anything is queued, a job the workers could not run (the client's
    error: BadInput)."""
    from kvedge.cloud.eviction import METHODS, get_method
    from kvedge.common.pack.codecs import get_codec

    names = sorted(METHODS)
    if method not in names:
        raise BadInput(f"unknown method {method!r}; choose one of {names}")
    try:
        get_method(method, budget)  # its options' checks: the budget in (0, 1]
    except InvalidRequest as err:
        raise BadInput(str(err)) from None
    get_codec(codec)


class JobRunner:
    def __init__(self, catalog: Catalog, store, pool):
        self.catalog, self.store, self.pool = catalog, store, pool
        self._threads: dict[str, threading.Thread] = {}
        self._cancel: dict[str, threading.Event] = {}

    def submit(self, namespace: str, kbs: list[str], method: str, budget: float,
               codec: str) -> JobRecord:
        check_spec(method, budget, codec)
        if not kbs:
            raise BadInput("a job needs at least one knowledge base")
        plans = {}
        for kb in dict.fromkeys(kbs):
            rec = self.catalog.get(namespace, kb)
            if rec.variants[BASE]["status"] != "ready" and not rec.segments:
                raise BadInput(f"{kb!r} has no ready base packs yet (status "
                               f"{rec.variants[BASE]['status']})")
            plans[kb] = rec.segments
        job = JobRecord(uuid.uuid4().hex[:12], namespace, list(plans), method, budget, codec,
                        total=sum(len(s) for s in plans.values()), created=time.time())
        self.catalog.put_job(job)
        self._cancel[job.id] = threading.Event()
        thread = threading.Thread(target=self._run, args=(job, plans), name=f"job-{job.id}",
                                  daemon=True)
        self._threads[job.id] = thread
        thread.start()
        return job

    def cancel(self, namespace: str, job_id: str) -> JobRecord:
        job = self.catalog.job(namespace, job_id)
        if job.id in self._cancel and job.status in ("queued", "running"):
            self._cancel[job.id].set()
            self._threads[job.id].join(60)
        return self.catalog.job(namespace, job_id)

    def wait(self, job_id: str, timeout: float | None = None) -> None:
        if job_id in self._threads:
            self._threads[job_id].join(timeout)

    def _run(self, job: JobRecord, plans: dict[str, list[SegmentRecord]]) -> None:
        job.status = "running"
        self.catalog.put_job(job)
        cancelled = self._cancel[job.id]
        for kb, segments in plans.items():
            if cancelled.is_set():
                break
            self._compress_kb(job, kb, segments, cancelled)
        job.status = ("cancelled" if cancelled.is_set() else
                      "failed" if job.failures else "done")
        job.finished = time.time()
        self.catalog.put_job(job)
        log.info("job %s %s: %d/%d contexts, %d failures", job.id, job.status, job.done,
                 job.total, len(job.failures))

    def _compress_kb(self, job: JobRecord, kb: str, segments: list[SegmentRecord],
                     cancelled) -> None:
        ns, variant = job.namespace, job.variant
        self.catalog.set_progress(ns, kb, variant, "ingesting", total=len(segments))
        packs = [(s.idx, self.store.read(s.pack_id)) for s in segments]
        rows, stored, failed = [], [], False
        for idx, outcome in self.pool.compress_all(packs, job.method, job.budget, job.codec,
                                                   cancelled):
            if isinstance(outcome, Exception):
                failed = True
                job.failures.append({"kb": kb, "segment": idx,
                                     "error": f"{type(outcome).__name__}: {outcome}"})
            else:
                self.store.put(outcome.pack_id, outcome.data)
                stored.append(outcome.pack_id)
                src = next(s.source for s in segments if s.idx == idx)
                rows.append(SegmentRecord(idx, outcome.pack_id, len(outcome.data),
                                          outcome.n_tokens, src, outcome.fp16_bytes))
                job.compress_s += outcome.seconds
            job.done += 1
            self.catalog.put_job(job)
        if failed or cancelled.is_set() or len(rows) != len(segments):
            for pack in stored:
                if not self.catalog.pack_namespaces(pack):
                    self.store.delete(pack)
            why = "cancelled" if cancelled.is_set() else f"{len(segments) - len(rows)} context(s) failed"
            self.catalog.set_progress(ns, kb, variant, "failed", error=f"job {job.id}: {why}")
            return
        rows.sort(key=lambda s: s.idx)
        fingerprint = self.catalog.get(ns, kb).model_fingerprint
        for orphan in self.catalog.publish(ns, kb, variant, rows, model_fingerprint=fingerprint):
            self.store.delete(orphan)
