"""Batch compression jobs: re-compress KBs' contexts with an eviction method, budget and codec.

A job reads the base pack of every context (each RAG segment, or the whole KB in KBQA mode) of
its KBs, runs the method on the Ray prefill actors (query-agnostic: once per context), encodes
the kept KV with the codec and publishes the result as a new variant of each KB, next to the
uncompressed one (`kvedge serve --kb NS/KB@VARIANT` answers from it). Ray retries a task
whose worker died; a context that still fails is reported with its error and its KB's variant
is not published (a half-compressed variant is never served).

A job runs in the gateway (`kvctl job submit`) or as its own process on a Ray cluster
(`ray job submit -- kvctl job run --data DIR ...`, `run_job_here` below): both read and
write the same store and catalog, so `kvctl job list` shows either, and `kvctl job cancel`
stops either (through the catalog's cancel request). Each job records its owner, the process
running it (`Owner`), so a gateway starting up can end the jobs whose process is gone — its
own, killed with it, or a killed job process's — and leave a live job process's alone.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import click

from kvedge.cloud.catalog import BASE, Catalog, JobRecord, Prefilled, SegmentRecord, variant_name
from kvedge.cloud.ingest import compress_key
from kvedge.common.net.auth import InvalidName, check_variant
from kvedge.common.errors import BadInput, InvalidRequest, ModelMismatch

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
    try:  # the variant is asked by name: one the edge would refuse is refused here
        check_variant(variant_name(method, budget, codec))
    except InvalidName as err:
        raise BadInput(f"codec spec {codec!r} cannot name the job's variant: {err}") from None


@dataclass(frozen=True)
class Owner:
    """The process running a job, recorded in the catalog as `role@host:pid:started`.

    `host` is the host name and the pid namespace (two containers may share a host name, not
    their pids); `started` is the process's start time (clock ticks since boot, Linux's
    /proc), so a pid the system has since given to another process does not pass for it."""

    role: str  # "gateway", or "jobs" (python -m kvedge.cloud.jobs)
    host: str  # e.g. "head-0/4026531836"
    pid: int
    started: int  # 0 where /proc is missing: then only the pid is checked

    def __str__(self) -> str:
        return f"{self.role}@{self.host}:{self.pid}:{self.started}"

    @classmethod
    def parse(cls, text: str) -> "Owner | None":
        role, _, rest = text.partition("@")
        host, _, numbers = rest.partition(":")
        pid, _, started = numbers.partition(":")
        if not (role and host and pid.isdigit() and started.isdigit()):
            return None
        return cls(role, host, int(pid), int(started))

    @classmethod
    def this_process(cls, role: str) -> "Owner":
        stat = _proc_stat(os.getpid())
        return cls(role, _this_host(), os.getpid(), stat[1] if stat else 0)

    def gone(self) -> bool:
        """True only when provably gone: on this host, and its pid is free, a zombie, or a
        process started at another time. One on another host cannot be checked: not gone."""
        if self.host != _this_host():
            return False
        stat = _proc_stat(self.pid)
        if stat is not None:
            state, started = stat
            return state == "Z" or self.started not in (0, started)
        if os.path.exists("/proc/self/stat"):
            return True  # /proc has no such pid
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # a process, someone else's
        return False


def _this_host() -> str:
    try:  # "pid:[4026531836]"
        namespace = os.readlink("/proc/self/ns/pid").strip("pid:[]")
    except OSError:
        namespace = ""
    return f"{socket.gethostname()}/{namespace}"


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks) of a process, from /proc; None if unreadable."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ", comm may hold spaces
    return fields[0], int(fields[19])


def abandoned(owner: str) -> str | None:
    """Why a job owned by `owner` (its catalog text) will never end, or None if its process
    may still run it. A job recorded by an older kvedge names no owner: nothing could ever end
    it, so it counts as abandoned (were its process alive, its next progress write would set
    its status again)."""
    who = Owner.parse(owner)
    if who is None:
        return ("interrupted: recorded by an older kvedge that did not note the process "
                "running it, taken as stopped; submit it again")
    if not who.gone():
        return None
    if who.role == "gateway":
        return "interrupted: the gateway stopped while the job ran; submit it again"
    return (f"interrupted: its process (pid {who.pid} on {who.host.partition('/')[0]}) stopped "
            "while the job ran; submit it again")


class CancelFlag:
    """A job's cancel request: set in this process, or found in the catalog ('cancelling',
    written by the gateway for a job another process runs). The runner checks it between
    contexts and the pool about once a second while it waits, so polling the catalog is cheap."""

    def __init__(self, catalog: Catalog, job: JobRecord):
        self._catalog, self._job = catalog, job
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        if not self._event.is_set() and \
                self._catalog.job(self._job.namespace, self._job.id).status == "cancelling":
            self._event.set()
        return self._event.is_set()


class JobRunner:
    """Runs jobs in this process's threads, as `role` ("gateway", or "jobs": a job process)."""

    def __init__(self, catalog: Catalog, store, pool, role: str = "jobs"):
        self.catalog, self.store, self.pool = catalog, store, pool
        self.owner = Owner.this_process(role)
        self._threads: dict[str, threading.Thread] = {}
        self._cancel: dict[str, CancelFlag] = {}

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
                        total=sum(len(s) for s in plans.values()), created=time.time(),
                        owner=str(self.owner))
        self.catalog.put_job(job)
        self._cancel[job.id] = CancelFlag(self.catalog, job)
        thread = threading.Thread(target=self._run, args=(job, plans), name=f"job-{job.id}",
                                  daemon=True)
        self._threads[job.id] = thread
        thread.start()
        return job

    def cancel(self, namespace: str, job_id: str) -> JobRecord:
        """Stop a job: one this runner runs at once; one another process runs (a Ray job)
        when that process next checks (about a second), so it may still read 'cancelling';
        one whose process is gone at once (nothing else would ever record it cancelled)."""
        job = self.catalog.job(namespace, job_id)
        if job.status in ("queued", "running"):
            self.catalog.request_cancel(namespace, job_id)
            if job.id in self._cancel:
                self._cancel[job.id].set()
                self._threads[job.id].join(60)
        if job.id not in self._cancel:  # no process would ever record it cancelled
            self.catalog.end_abandoned_jobs(abandoned, only=job.id)
        return self.catalog.job(namespace, job_id)

    def end_abandoned(self) -> list[JobRecord]:
        """End the jobs whose process is gone (`abandoned` says why); returns them."""
        return self.catalog.end_abandoned_jobs(abandoned)

    def wait(self, job_id: str, timeout: float | None = None) -> bool:
        """Wait for a job this runner runs; True once it has ended."""
        thread = self._threads.get(job_id)
        if thread is not None:
            thread.join(timeout)
        return thread is None or not thread.is_alive()

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
        """Compress one KB's contexts and publish them as its variant in one catalog
        transaction, or publish nothing and delete what was stored."""
        ns, variant = job.namespace, job.variant
        self.catalog.set_progress(ns, kb, variant, "ingesting", total=len(segments))
        rows, stored, failures = [], [], len(job.failures)
        try:
            self._compress_contexts(job, kb, segments, cancelled, rows, stored)
        except Exception as err:  # noqa: BLE001 - e.g. a base pack gone from the store
            log.exception("job %s: %s failed", job.id, kb)
            job.failures.append({"kb": kb, "segment": -1,
                                 "error": f"{type(err).__name__}: {err}"})
        if len(job.failures) > failures or cancelled.is_set() or len(rows) != len(segments):
            for pack in stored:  # those `remember`ed stay, for the job that retries it
                if not self.catalog.referenced(pack):
                    self.store.delete(pack)
            why = "cancelled" if cancelled.is_set() else \
                f"{len(segments) - len(rows)} context(s) failed"
            self.catalog.set_progress(ns, kb, variant, "failed", error=f"job {job.id}: {why}")
            return
        rows.sort(key=lambda s: s.idx)
        fingerprint = self.catalog.get(ns, kb).model_fingerprint
        for orphan in self.catalog.publish(ns, kb, variant, rows, model_fingerprint=fingerprint):
            self.store.delete(orphan)

    def _compress_contexts(self, job, kb, segments, cancelled, rows, stored) -> None:
        """Run the method over the KB's contexts; appends to `rows` (what to publish),
        `stored` (packs written) and the job's failures, saving progress per context."""
        from kvedge.cloud.workers import install_transforms

        sources = {s.idx: s.source for s in segments}
        keys = {s.idx: compress_key(s.pack_id, job.method, job.budget, job.codec)
                for s in segments}
        # a context whose pack this job's spec already made is not redone
        held = self.catalog.held(job.namespace, kb, keys, self.store.exists)
        rows += [held[s.idx].record(s.idx, s.source) for s in segments if s.idx in held]
        todo = [s for s in segments if s.idx not in held]
        job.done += len(held)
        self.catalog.put_job(job)
        packs = [(s.idx, self.store.read(s.pack_id)) for s in todo]
        for idx, outcome in self.pool.compress_all(packs, job.method, job.budget, job.codec,
                                                   cancelled):
            if isinstance(outcome, Exception):
                job.failures.append({"kb": kb, "segment": idx,
                                     "error": f"{type(outcome).__name__}: {outcome}"})
            else:
                install_transforms(outcome)
                self.store.put(outcome.pack_id, outcome.data)
                stored.append(outcome.pack_id)
                pack = Prefilled(outcome.pack_id, len(outcome.data), outcome.n_tokens)
                self.catalog.remember(job.namespace, kb, keys[idx], pack)
                rows.append(pack.record(idx, sources[idx]))
                job.compress_s += outcome.seconds
            job.done += 1
            self.catalog.put_job(job)


# ---------------------------------------------------------------- a job as its own process


def run_job_here(data_dir, store_url, namespace, kbs, method, budget, codec, model_name,
             ray_address, actors, cpus_per_actor) -> JobRecord:
    import signal

    from kvedge.cloud.store import PackStore
    from kvedge.cloud.workers import PrefillPool, start_ray
    from kvedge.common.net.auth import check_name
    from kvedge.common.cli import home_path

    check_name("namespace", namespace)
    for kb in kbs:
        check_name("knowledge base", kb)
    data = Path(data_dir) if data_dir else home_path("cloud")
    if not (data / "catalog.sqlite").exists():
        raise BadInput(f"no catalog in {data}: pass the gateway's --data directory")
    catalog = Catalog(data / "catalog.sqlite")
    check_spec(method, budget, codec)
    made_by = {kb: catalog.get(namespace, kb).model_fingerprint for kb in kbs}  # NotFound now
    start_ray(ray_address, num_cpus=None if ray_address else
              max(os.cpu_count() or 1, actors * cpus_per_actor))
    pool = PrefillPool(model_name, actors, cpus_per_actor)
    fingerprint = pool.identity()["fingerprint"]
    for kb, made in made_by.items():
        if made not in ("", fingerprint):
            raise ModelMismatch(f"{kb!r} was ingested with another model than {model_name!r}: "
                                "pass the gateway's --model")
    runner = JobRunner(catalog, PackStore(store_url or str(data / "store")), pool)
    job = runner.submit(namespace, kbs, method, budget, codec)
    for sig in (signal.SIGTERM, signal.SIGINT):  # `ray job stop` sends SIGTERM
        signal.signal(sig, lambda *_: runner.cancel(namespace, job.id))
    click.echo(f"job {job.id}: {job.total} contexts of {job.kbs} → variant {job.variant} "
               f"(catalog {catalog.path})")
    return _follow(runner, catalog, job)


def _follow(runner: JobRunner, catalog: Catalog, job: JobRecord) -> JobRecord:
    """Wait for the job, printing its progress; returns its final record."""
    done, ended = -1, False
    while not ended:
        ended = runner.wait(job.id, timeout=1.0)
        rec = catalog.job(job.namespace, job.id)
        if rec.done != done:
            done = rec.done
            click.echo(f"{rec.status} {rec.done}/{rec.total} contexts")
    for f in rec.failures:
        click.echo(f"  {f['kb']} segment {f['segment']}: {f['error']}", err=True)
    click.echo(f"job {rec.id} {rec.status}: variant {rec.variant}, {rec.compress_s:.1f} s "
               "compressing")
    return rec

