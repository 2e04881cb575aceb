"""Batch jobs the Ray way: `kvctl job run` (what `ray job submit` runs) as its own
process, a driver joining the local Ray cluster this module starts, against a live gateway's
data dir. Its progress shows through the gateway (`kvctl job list`, WatchJob); a cancel
through the gateway or a SIGTERM (`ray job stop`) stops it with nothing half-published.

`ray job submit` itself needs the dashboard's job server (`ray[default]`: aiohttp and friends),
which the test environment does not install; the entry point it would run is what is tested.
"""
import json
import re
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from daemons import in_process_gateway
from kvedge.cloud.catalog import Catalog, JobRecord
from kvedge.apps.kvctl import kvctl
from kvedge.common.net.cloud_client import CloudClient
from kvedge.common.model.models import load_model
from kvedge.common.pack.format import open_pack

MODEL = "tiny-llama"
SEGMENT_TOKENS = 32
JOB_TIMEOUT = 180


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    import ray

    data = tmp_path_factory.mktemp("cloud")
    server, gateway, address, token = in_process_gateway(data, MODEL, SEGMENT_TOKENS)
    yield {"address": address, "token": token, "data": data, "gateway": gateway,
           "ray": ray.get_runtime_context().gcs_address}
    server.stop(0)
    gateway.pool.shutdown()  # its actor's CPU back to the cluster other modules share


@pytest.fixture()
def client(cloud):
    with CloudClient(cloud["address"], cloud["token"]) as c:
        yield c


def upload(client, folder, name, docs):
    for path, text in docs.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    client.upload(folder, "default", name)
    return client.wait_ready("default", name, timeout=120)


def start_job(cloud, *args) -> tuple[subprocess.Popen, str]:
    """Start the job process; returns it and the job id from its first line."""
    proc = subprocess.Popen(
        [sys.executable, "-u", "-m", "kvedge.apps.kvctl", "job", "run", "--data", str(cloud["data"]),
         "--model", MODEL, "--ray-address", cloud["ray"], *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stdout.readline()
    match = re.match(r"job (\w+): ", first)
    if match is None:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"no job line from the job process: {first!r}{out}\n{err[-3000:]}")
    return proc, match.group(1)


def finish(proc) -> tuple[int, str]:
    out, err = proc.communicate(timeout=JOB_TIMEOUT)
    return proc.returncode, out + err


def kvctl_jobs(cloud) -> list[dict]:
    result = CliRunner().invoke(kvctl, ["job", "list", "--cloud", cloud["address"],
                                        "--token", cloud["token"], "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


DOCS = {"harbour.md": "The harbour code is 4417. Boats leave at dawn. " * 12,
        "notes/archive.txt": "The archive keeps maps of the old town walls. " * 12}


def test_a_ray_job_publishes_a_variant_the_gateway_lists_and_serves(cloud, client, tmp_path):
    base = upload(client, tmp_path / "kb", "harbour", DOCS)
    proc, job_id = start_job(cloud, "--kb", "harbour", "--method", "contrastkv",
                             "--budget", "0.3", "--codec", "int8")
    seen = [j.status for j in client.watch_job("default", job_id)]  # progress via the gateway
    code, output = finish(proc)
    assert code == 0, output
    assert seen[-1] == "done" and f"job {job_id} done: variant contrastkv-0.3-int8" in output
    listed = {j["job_id"]: j for j in kvctl_jobs(cloud)}[job_id]
    assert listed["status"] == "done" and listed["done"] == listed["total"] == len(base.segments)
    assert listed["variant"] == "contrastkv-0.3-int8" and listed["kbs"] == ["harbour"]
    variant = client.get_kb("default", "harbour", "contrastkv-0.3-int8")
    assert variant.status == "ready" and len(variant.segments) == len(base.segments)
    assert [s.source for s in variant.segments] == [s.source for s in base.segments]
    fingerprint = load_model(MODEL).fingerprint
    for seg in variant.segments:  # the gateway serves the job's packs from the shared store
        data = b"".join(c.data for c in client.fetch_pack("default", seg.pack_id))
        pack = open_pack(data, fingerprint)
        assert len(data) == seg.pack_bytes and pack.id == seg.pack_id
        assert {e.codec for n, e in pack.manifest.tensors.items() if n.startswith("k.")} == {"int8"}
        pack.context()  # every tensor decodes and verifies
    # 30 % kept as int8 against the DEFAULT_CODEC base (5-bit keys, 4-bit values): ~0.65 of
    # its bytes
    assert sum(s.pack_bytes for s in variant.segments) < 0.7 * sum(s.pack_bytes
                                                                   for s in base.segments)


LONG = {f"doc{i:02d}.md": f"Document {i} says the code of room {i} is {1000 + i}. " * 12
        for i in range(8)}  # ~130 contexts: a job that runs for a while


@pytest.fixture(scope="module")
def long_kb(cloud, tmp_path_factory):
    with CloudClient(cloud["address"], cloud["token"]) as c:
        return upload(c, tmp_path_factory.mktemp("long"), "long", LONG)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kvctl job cancel", "SIGTERM"])
def test_a_cancelled_ray_job_publishes_nothing(cloud, client, long_kb, how):
    codec = "int8" if how == "SIGTERM" else "int4"
    proc, job_id = start_job(cloud, "--kb", "long", "--method", "none", "--codec", codec)
    if how == "SIGTERM":
        proc.send_signal(signal.SIGTERM)  # what `ray job stop` sends the entry point
    else:
        assert client.cancel_job("default", job_id).status in ("cancelling", "cancelled")
    code, output = finish(proc)
    assert code == 1, output
    job = client.get_job("default", job_id)
    assert job.status == "cancelled" and job.done < job.total == len(long_kb.segments)
    variants = client.get_kb("default", "long").variants
    if job.variant in variants:  # absent when cancelled before the KB's first context
        variant = client.get_kb("default", "long", job.variant)
        assert variant.status == "failed" and "cancelled" in variant.error
        assert list(variant.segments) == []
    referenced = {s.pack_id for kb in client.list_kbs("default") for v in kb.variants
                  for s in client.get_kb("default", kb.kb, v).segments}
    on_disk = {p.stem for p in (cloud["data"] / "store").rglob("*.kvp")}
    assert referenced <= on_disk  # nothing a KB uses is missing
    # nothing unreferenced is left: a context finished before the cancel keeps its pack only
    # as `remember`ed (JobRunner._compress_kb), for a rerun of the same spec to resume with
    catalog = Catalog(cloud["data"] / "catalog.sqlite")
    assert [p for p in on_disk - referenced if not catalog.referenced(p)] == []
    assert not list((cloud["data"] / "store").rglob("*.tmp"))


def test_job_process_errors_are_one_line(cloud, tmp_path):
    cases = [(["--data", str(tmp_path), "--kb", "x", "--method", "none"], "no catalog in"),
             (["--data", str(cloud["data"]), "--kb", "ghost", "--method", "none",
               "--ray-address", cloud["ray"], "--model", MODEL], "NotFound")]
    for args, message in cases:
        proc = subprocess.run([sys.executable, "-m", "kvedge.apps.kvctl", "job", "run", *args],
                              capture_output=True, text=True, timeout=JOB_TIMEOUT)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr


def test_progress_writes_keep_a_cancel_from_another_process(tmp_path):
    """The catalog's side of cross-process cancel: two connections to one file are two
    processes to SQLite."""
    runner_side, gateway_side = Catalog(tmp_path / "c.sqlite"), Catalog(tmp_path / "c.sqlite")
    job = JobRecord("j1", "default", ["kb"], "none", 1.0, "int8", status="running", total=3)
    runner_side.put_job(job)
    gateway_side.request_cancel("default", "j1")
    job.done = 1
    runner_side.put_job(job)  # a progress write after the request
    assert gateway_side.job("default", "j1").status == "cancelling"
    assert gateway_side.job("default", "j1").done == 1
    job.status = "cancelled"
    runner_side.put_job(job)
    gateway_side.request_cancel("default", "j1")  # an ended job stays ended
    assert gateway_side.job("default", "j1").status == "cancelled"


def test_a_job_whose_base_pack_is_gone_fails_instead_of_running_forever(tmp_path):
    """An error outside a context's compression (here the store) ends the job 'failed', with
    the error recorded and nothing published, so no process waits on it for ever."""
    from kvedge.cloud.catalog import SegmentRecord
    from kvedge.cloud.jobs import JobRunner
    from kvedge.cloud.store import PackStore

    catalog = Catalog(tmp_path / "catalog.sqlite")
    catalog.begin_ingest("default", "kb", {"a.md": ("0" * 64, 1)}, mode="rag",
                         segment_tokens=32, codec="fp16")
    catalog.publish("default", "kb", "", [SegmentRecord(0, "ab" * 32, 10, 5, "a.md")],
                    model_fingerprint="f")
    runner = JobRunner(catalog, PackStore(str(tmp_path / "store")), pool=None)  # never reached
    job = runner.submit("default", ["kb"], "none", 1.0, "int8")
    assert runner.wait(job.id, timeout=30)
    record = catalog.job("default", job.id)
    assert record.status == "failed" and "StoreError" in record.failures[0]["error"]
    variant = catalog.get("default", "kb", job.variant)
    assert variant.variants[job.variant]["status"] == "failed" and variant.segments == []


def test_a_job_is_refused_when_its_variant_could_not_be_asked_by_name():
    """A variant is named `method-budget-codec` with the spec as written; a spec no `--kb
    NAME@VARIANT` could name (parentheses) is the client's error before anything is queued."""
    from kvedge.cloud.jobs import check_spec
    from kvedge.common.errors import BadInput

    check_spec("kvzip", 0.2, "kvtc:bits=3,embed=false")
    with pytest.raises(BadInput, match="cannot name the job's variant"):
        check_spec("none", 1.0, "cachegen:layer_bits=((0.5,4),(1.0,2))")
