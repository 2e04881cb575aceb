"""What a gateway cleans up, and what it must not touch: uploads verified as they stream (never
read whole to be hashed), jobs whose process is gone ended at start-up, and store files no
catalog entry references deleted at start-up — all on real files and a real catalog file."""
import hashlib
import logging
import os
import socket
import sqlite3
import subprocess
import sys
import time
import tracemalloc

import pytest

from kvedge.cloud.catalog import BASE, Catalog, JobRecord, SegmentRecord
from kvedge.cloud.gateway import Gateway, GatewayConfig
from kvedge.cloud.jobs import JobRunner, Owner, _proc_stat
from kvedge.cloud.staging import HASH_BLOCK, Staging
from kvedge.cloud.store import PackStore
from kvedge.common.errors import BadInput

MiB = 1 << 20
JOB_PROCESS = """
import sys, time
from kvedge.cloud.catalog import Catalog, JobRecord
from kvedge.cloud.jobs import JobRunner
runner = JobRunner(Catalog(sys.argv[1]), store=None, pool=None)  # as kvctl job run
runner.catalog.put_job(JobRecord("live", "ns", ["kb"], "none", 1.0, "int8", status="running",
                                 created=time.time(), owner=str(runner.owner)))
print("running", flush=True)
time.sleep(120)
"""


# ---------------------------------------------------------------- uploads hashed as they stream


def upload(staging: Staging, data: bytes, chunk: int = MiB, start: int = 0) -> bool:
    sha = hashlib.sha256(data).hexdigest()
    done = False
    for offset in range(start, len(data), chunk):
        done = staging.write("ns", sha, offset, data[offset:offset + chunk], len(data))
    return done


def peak_while(fn) -> tuple[int, object]:
    """Peak bytes Python allocated while `fn` ran, beyond what was held before; its result."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        result = fn()
        return tracemalloc.get_traced_memory()[1] - before, result
    finally:
        tracemalloc.stop()


def test_a_multi_megabyte_upload_is_verified_without_being_held_whole(tmp_path):
    data = os.urandom(24 * MiB)
    staging = Staging(tmp_path)
    peak, done = peak_while(lambda: upload(staging, data))
    assert done and peak < 4 * MiB  # a chunk or two in flight, never the 24 MiB file
    assert staging.offset("ns", hashlib.sha256(data).hexdigest()) is None


def test_a_resumed_upload_rehashes_what_is_held_a_block_at_a_time(tmp_path):
    data = os.urandom(24 * MiB)
    sha = hashlib.sha256(data).hexdigest()
    first = Staging(tmp_path)
    for offset in range(0, 20 * MiB, MiB):  # the connection breaks after 20 MiB
        first.write("ns", sha, offset, data[offset:offset + MiB], len(data))
    restarted = Staging(tmp_path)  # a new gateway process: the running hash is gone
    assert restarted.offset("ns", sha) == 20 * MiB
    peak, done = peak_while(lambda: upload(restarted, data, start=20 * MiB))
    assert done and peak < 2 * MiB + 2 * HASH_BLOCK
    assert restarted.path("ns", sha).read_bytes() == data


def test_a_resumed_upload_with_wrong_bytes_is_refused_and_not_kept(tmp_path):
    data = os.urandom(3 * MiB)
    sha = hashlib.sha256(data).hexdigest()
    Staging(tmp_path).write("ns", sha, 0, data[:MiB], len(data))
    restarted = Staging(tmp_path)
    restarted.write("ns", sha, MiB, data[MiB:2 * MiB], len(data))
    with pytest.raises(BadInput, match="does not match its sha256; upload it again"):
        restarted.write("ns", sha, 2 * MiB, b"!" * MiB, len(data))
    assert restarted.offset("ns", sha) == 0 and list((tmp_path / "ns").iterdir()) == []
    assert upload(restarted, data) is True  # and the right bytes then go in


# ---------------------------------------------------------------- jobs whose process is gone


def live_process(role: str = "jobs") -> tuple[subprocess.Popen, Owner]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    return proc, Owner(role, Owner.this_process(role).host, proc.pid, _proc_stat(proc.pid)[1])


def kill(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()  # reaped: its pid is free


def gone_process(role: str = "gateway") -> Owner:
    """The owner a process had before it was killed."""
    proc, owner = live_process(role)
    kill(proc)
    return owner


def running_job(id_: str, owner: str, status: str = "running", kb: str = "kb") -> JobRecord:
    return JobRecord(id_, "ns", [kb], "none", 1.0, "int8", status=status, created=time.time(),
                     owner=owner)


def catalog_with_kb(path) -> Catalog:
    catalog = Catalog(path)
    catalog.begin_ingest("ns", "kb", {"a.md": ("0" * 64, 1)}, mode="rag", segment_tokens=32,
                         codec="fp16")
    catalog.publish("ns", "kb", BASE, [SegmentRecord(0, "ab" * 32, 10, 5, "a.md")],
                    model_fingerprint="f")
    return catalog


def start_gateway(data) -> Gateway:
    gateway = Gateway(GatewayConfig(data), pool=None)  # nothing here reaches the pool
    gateway.catalog.close()
    return gateway


def test_a_dead_gateways_jobs_fail_at_start_and_a_live_processs_are_left(tmp_path):
    catalog = catalog_with_kb(tmp_path / "catalog.sqlite")
    dead, me = gone_process(), Owner.this_process("jobs")
    reused = Owner("jobs", me.host, me.pid, me.started + 1)  # this pid, another process's
    elsewhere = Owner("jobs", "another-host", 1, 1)  # cannot be checked: left alone
    catalog.put_job(running_job("dead", str(dead)))
    catalog.set_progress("ns", "kb", "none-1-int8", "ingesting", total=1)
    catalog.put_job(running_job("stopping", str(dead), status="cancelling"))
    catalog.put_job(running_job("reused", str(reused)))
    catalog.put_job(running_job("mine", str(me)))
    catalog.put_job(running_job("far", str(elsewhere)))
    catalog.put_job(running_job("ended", str(dead), status="done"))

    start_gateway(tmp_path)
    status = {j.id: j.status for j in catalog.jobs(None)}
    assert status == {"dead": "failed", "stopping": "cancelled", "reused": "failed",
                      "mine": "running", "far": "running", "ended": "done"}
    (failure,) = catalog.job("ns", "dead").failures
    assert failure["error"] == "interrupted: the gateway stopped while the job ran; submit " \
                               "it again"
    assert "pid" in catalog.job("ns", "reused").failures[0]["error"]
    variant = catalog.get("ns", "kb", "none-1-int8").variants["none-1-int8"]
    assert variant["status"] == "ingesting"  # "mine" and "far" still write it


def test_a_killed_job_process_is_told_apart_from_a_live_one(tmp_path):
    """A real job process sharing the catalog file: its job is left while it runs, ended at
    the next start once it is killed."""
    path = tmp_path / "catalog.sqlite"
    catalog = catalog_with_kb(path)
    proc = subprocess.Popen([sys.executable, "-c", JOB_PROCESS, str(path)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "running\n"
        start_gateway(tmp_path)
        assert catalog.job("ns", "live").status == "running"
    finally:
        proc.kill()
        proc.wait()
    start_gateway(tmp_path)
    job = catalog.job("ns", "live")
    assert job.status == "failed" and job.finished > 0
    assert job.failures[0]["error"] == (f"interrupted: its process (pid {proc.pid} on "
                                        f"{socket.gethostname()}) stopped while the job ran; "
                                        "submit it again")


def test_cancelling_a_job_whose_process_is_gone_ends_it_at_once(tmp_path):
    catalog = catalog_with_kb(tmp_path / "catalog.sqlite")
    catalog.put_job(running_job("dead", str(gone_process())))
    runner = JobRunner(catalog, store=None, pool=None, role="gateway")
    assert runner.cancel("ns", "dead").status == "cancelled"


OLD_JOBS_TABLE = """CREATE TABLE jobs (
    id TEXT PRIMARY KEY, namespace TEXT NOT NULL, kbs TEXT NOT NULL, method TEXT NOT NULL,
    budget REAL NOT NULL, codec TEXT NOT NULL, status TEXT NOT NULL, done INTEGER NOT NULL,
    total INTEGER NOT NULL, failures TEXT NOT NULL, created REAL NOT NULL,
    finished REAL NOT NULL DEFAULT 0, compress_s REAL NOT NULL DEFAULT 0)"""


def test_a_catalog_from_before_job_owners_is_migrated_and_its_running_job_ended(tmp_path):
    path = tmp_path / "catalog.sqlite"
    with sqlite3.connect(path) as old:
        old.execute(OLD_JOBS_TABLE)
        old.execute("INSERT INTO jobs VALUES ('old', 'ns', '[\"kb\"]', 'none', 1.0, 'int8', "
                    "'running', 1, 3, '[]', 1.0, 0, 0)")
    old.close()
    catalog, again = Catalog(path), Catalog(path)  # a second opener finds it migrated
    assert catalog.job("ns", "old").owner == "" and catalog.job("ns", "old").done == 1
    catalog.put_job(running_job("new", "jobs@h:1:1"))
    assert again.job("ns", "new").owner == "jobs@h:1:1"
    start_gateway(tmp_path)
    job = catalog.job("ns", "old")
    assert job.status == "failed" and "older kvedge" in job.failures[0]["error"]


# ---------------------------------------------------------------- files no catalog references


def store_files(data) -> set[str]:
    root = data / "store" / "packs"
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def leave_leftovers(data) -> tuple[str, set[str]]:
    """A store holding the catalog's pack and what interrupted writes leave: a pack never
    published, a local write's temporary file, an fsspec write's, a stray .part."""
    catalog = catalog_with_kb(data / "catalog.sqlite")
    store = PackStore(str(data / "store"))
    kept, orphan = "ab" * 32, "cd" * 32
    store.put(kept, b"published")
    store.put(orphan, b"stored, never published")
    folder = data / "store" / "packs" / "ef"
    folder.mkdir()
    for name in [f".{'ef' * 32}.kvp.x1y2.tmp", f"{'ef' * 32}.kvp.0123abcd.tmp",
                 f"{'ef' * 32}.kvp.part"]:
        (folder / name).write_bytes(b"torn")
    catalog.close()
    return f"ab/{kept}.kvp", store_files(data) - {f"ab/{kept}.kvp"}


def test_unreferenced_packs_and_temporary_files_are_deleted_at_start(tmp_path, caplog):
    kept, leftovers = leave_leftovers(tmp_path)
    assert len(leftovers) == 4
    with caplog.at_level(logging.INFO, "kvedge.gateway"):
        start_gateway(tmp_path)
    assert store_files(tmp_path) == {kept}
    for path in leftovers:
        assert f"removed packs/{path} from the store" in caplog.text
    start_gateway(tmp_path)  # nothing more to do
    assert store_files(tmp_path) == {kept}


def test_nothing_is_collected_while_a_job_process_runs_a_job(tmp_path, caplog):
    kept, leftovers = leave_leftovers(tmp_path)
    catalog = Catalog(tmp_path / "catalog.sqlite")
    proc, owner = live_process()
    try:
        catalog.put_job(running_job("live", str(owner)))
        with caplog.at_level(logging.INFO, "kvedge.gateway"):
            start_gateway(tmp_path)
        assert store_files(tmp_path) == leftovers | {kept}  # its packs may be among them
        assert "a job process is running a job" in caplog.text
    finally:
        kill(proc)
    start_gateway(tmp_path)
    assert catalog.job("ns", "live").status == "failed"
    assert store_files(tmp_path) == {kept}


def test_nothing_is_collected_when_a_job_of_an_older_kvedge_is_ended(tmp_path):
    kept, leftovers = leave_leftovers(tmp_path)
    Catalog(tmp_path / "catalog.sqlite").put_job(running_job("old", owner=""))
    start_gateway(tmp_path)
    assert store_files(tmp_path) == leftovers | {kept}
    start_gateway(tmp_path)  # the next start: no job runs
    assert store_files(tmp_path) == {kept}
