"""Faults injected into real processes on loopback; after each, nothing is lost or half-visible.

- the gateway SIGKILLed in the middle of a pack transfer: the edge resumes from its offset and
  ends with the very bytes the store holds;
- a Ray prefill actor's process killed in the middle of an ingest and of a batch job: Ray
  restarts it and retries the task, and the packs are those of a run without the fault;
- the edge restarted: its verified cache is reused, not a byte fetched again;
- a pack damaged on the edge's disk: found at load, fetched again inside the ask, the answer
  the same as before the damage;
- the gateway SIGKILLed after storing some packs but before publishing them: after restart no
  half-ingested KB is visible, every catalog reference has its pack, a re-upload completes;
- the gateway process gone: the edge keeps answering from its cache.

Edges run as `kvedge serve`, gateways as `kvctl cloud up` joined to this test's Ray
(`daemons.py`), except where a test kills a Ray actor or counts what the gateway serves: there
the gateway runs in this process, its actors still real processes of the same Ray. A pack
transfer is interrupted for real only if the pack is bigger than what gRPC pushes ahead of the
reader (~5 MB on loopback), so the gateway process runs a random-weight model with wide KV
heads (32 KB of fp16 KV per token), built here into a local folder.
"""
import hashlib
import os
import time
from collections import Counter
from contextlib import contextmanager

import psutil
import pytest
import ray
import torch

from daemons import EdgeProcess, GatewayProcess
from kvedge.cloud.gateway import GatewayConfig, serve
from kvedge.cloud.workers import PrefillEngine, start_ray
from kvedge.common.net.cloud_client import CloudClient
from kvedge.common.net.edge_client import EdgeClient
from kvedge.common.errors import NotFound
from kvedge.common.model.models import _tiny_config, build_random_model, load_model
from kvedge.common.pack.codecs import DEFAULT_CODEC
from kvedge.common.pack.container import pack_id as content_id
from kvedge.common.pack.format import open_pack
from kvedge.common.net.rpc import PACK_CHUNK as CHUNK, RemoteError
from kvedge.common.model.tokenizer import tiny_tokenizer
from kvedge.edge.packcache import PackCache
from kvedge.edge.sync import Syncer, Target

TINY = "tiny-llama"
QUESTION = "What is the harbour code?"
BIG = {"big.md": "The harbour code is 4417. Boats leave at dawn from the east pier. " * 6}
SMALL = {"alpha.md": "# Alpha\n\nThe alpha code is 1234567.\n\nAlpha is a small harbour town.\n",
         "beta.txt": "Beta facts. The beta code is 7654321.\n"}
# many short segments: an ingest or a job that runs long enough to be interrupted
MANY = {f"doc{i}.md": f"Document {i} says the code of room {i} is {1000 + i}. " * 6
        for i in range(3)}


def write_kb(folder, docs):
    for name, text in docs.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def upload_ready(client, folder, name, docs, **options):
    client.upload(write_kb(folder, docs), "default", name, **options)
    return client.wait_ready("default", name, timeout=180)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def retry(call, timeout: float = 60):
    """What the edge's sync loop does: try again until the service answers (a channel whose
    server went away reconnects with back-off)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except RemoteError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def ask(edge, kb: str, question: str = QUESTION) -> str:
    with EdgeClient(edge.address, edge.token) as client:
        return list(client.ask("default", kb, question, max_new_tokens=6))[-1].answer


@pytest.fixture(scope="module")
def ray_address():
    start_ray(num_cpus=2)
    return ray.get_runtime_context().gcs_address


# ---------------------------------------------------------------------- Ray actors


@pytest.fixture(scope="module")
def ray_cloud(ray_address, tmp_path_factory):
    """A gateway in this process (its actors are at hand), the tiny model; counts its KB
    version reads (one per edge sync poll, changed or not) and the pack bytes it serves."""
    data = tmp_path_factory.mktemp("ray-cloud")
    server, gateway, port = serve(GatewayConfig(data, model=TINY, segment_tokens=24),
                                  "127.0.0.1:0")
    counts, version, read = Counter(), gateway.catalog.version, gateway.store.read

    def counting_version(*args, **kw):  # every GetKB reads it first: an edge's sync poll
        counts["syncs"] += 1
        return version(*args, **kw)

    def counting_read(*args, **kw):
        data = read(*args, **kw)
        counts["bytes"] += len(data)
        return data

    gateway.catalog.version, gateway.store.read = counting_version, counting_read
    yield {"address": f"127.0.0.1:{port}", "token": (data / "admin.token").read_text().strip(),
           "gateway": gateway, "counts": counts}
    server.stop(0)
    gateway.pool.shutdown()


@pytest.fixture()
def ray_client(ray_cloud):
    with CloudClient(ray_cloud["address"], ray_cloud["token"]) as client:
        yield client


def busy_actor(method: str, timeout: float = 120) -> int:
    """The pid of a prefill actor of this test's Ray running `method` (Ray titles a worker
    'ray::Class.method' while it runs a task)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for proc in psutil.Process().children(recursive=True):
            try:
                title = " ".join(proc.cmdline())
            except psutil.Error:
                continue
            if f"PrefillEngine.{method}" in title:
                return proc.pid
        time.sleep(0.01)
    raise AssertionError(f"no prefill actor ran {method} in {timeout} s")


def packs_of(client, kb: str, variant: str = "") -> list[str]:
    return [s.pack_id for s in client.get_kb("default", kb, variant).segments]


def check_packs(client, kb: str, variant: str = "") -> None:
    """Every pack of the KB variant is served whole, named by its content, and decodes."""
    fingerprint = load_model(TINY).fingerprint
    for pack in packs_of(client, kb, variant):
        opened = open_pack(fetch(client, pack), fingerprint)
        assert opened.id == pack
        opened.context()  # every tensor verifies against its checksum


def test_a_prefill_actor_killed_during_an_ingest_is_restarted_and_the_packs_are_right(
        ray_cloud, ray_client, tmp_path):
    """Ray restarts the actor and retries the task it was running; the packs are those of an
    ingest without the fault."""
    ray_client.upload(write_kb(tmp_path / "victim", MANY), "default", "victim")
    killed = busy_actor("encode")
    psutil.Process(killed).kill()  # SIGKILL, mid-task
    info = ray_client.get_kb("default", "victim")
    assert info.status == "ingesting" and info.segments_done < info.segments_total
    assert ray_client.wait_ready("default", "victim", timeout=180).status == "ready"
    assert actor_pid(ray_cloud) != killed
    with engine_alone() as engine:
        segments = engine.segment(MANY, 24, whole=False)
        side = ray_cloud["gateway"].config.side_tensors  # as the gateway encodes
        reference = [engine.encode(seg, "default", DEFAULT_CODEC, side_tensors=side).pack_id
                     for seg in segments]
    assert packs_of(ray_client, "victim") == reference
    check_packs(ray_client, "victim")


def test_a_prefill_actor_killed_during_a_batch_job_is_restarted_and_the_job_completes(
        ray_cloud, ray_client, tmp_path):
    """Run after the ingest test this is the same actor's second death: an actor restarts
    however often it dies in the gateway's life (it once could only once)."""
    upload_ready(ray_client, tmp_path / "kb", "jobkb", MANY)
    job = ray_client.submit_job("default", ["jobkb"], "streamingllm", 0.5, "int8")
    killed = busy_actor("compress")
    (actor,) = ray_cloud["gateway"].pool._ensure()
    ray.kill(actor, no_restart=False)  # Ray's own kill, restart allowed
    final = list(ray_client.watch_job("default", job.job_id))[-1]
    assert final.status == "done" and list(final.failures) == [] and final.done == final.total
    assert actor_pid(ray_cloud) != killed
    with engine_alone() as engine:
        reference = [engine.compress(i, fetch(ray_client, pack), "streamingllm", 0.5,
                                     "int8").pack_id
                     for i, pack in enumerate(packs_of(ray_client, "jobkb"))]
    assert packs_of(ray_client, "jobkb", final.variant) == reference
    check_packs(ray_client, "jobkb", final.variant)


@contextmanager
def engine_alone():
    """The actors' engine in this process, on one thread like them: what a run without
    faults computes, byte for byte."""
    threads = torch.get_num_threads()
    try:
        yield PrefillEngine(TINY, threads=1)
    finally:
        torch.set_num_threads(threads)


def fetch(client, pack: str) -> bytes:
    return b"".join(c.data for c in client.fetch_pack("default", pack))


def actor_pid(ray_cloud) -> int:
    (actor,) = ray_cloud["gateway"].pool._ensure()
    return ray.get(actor.__ray_call__.remote(lambda engine: os.getpid()))


# ---------------------------------------------------------------------- edge process


@pytest.fixture(scope="module")
def tiny_edge(ray_cloud, tmp_path_factory):
    """`kvedge serve` of one KB of the in-process gateway, retrieving every segment."""
    with CloudClient(ray_cloud["address"], ray_cloud["token"]) as client:
        info = upload_ready(client, tmp_path_factory.mktemp("kb"), "served", SMALL)
    ray_cloud["gateway"].pool.shutdown()  # its CPU back to the cluster
    edge = EdgeProcess(tmp_path_factory.mktemp("tiny-edge") / "state", ray_cloud["address"],
                       ray_cloud["token"], ["default/served"], TINY, "--top-k", "32")
    edge.start()
    edge.info, edge.answer = info, ask(edge, "served")
    yield edge
    edge.kill()


def inodes(folder) -> dict[str, int]:
    return {p.name: p.stat().st_ino for p in folder.iterdir()}


def test_a_restarted_edge_reuses_its_verified_cache(ray_cloud, tiny_edge):
    counts, edge = ray_cloud["counts"], tiny_edge
    files = inodes(edge.state / "packs")
    assert sorted(files) == sorted(f"{s.pack_id}.kvp" for s in edge.info.segments)
    assert edge.stop() == 0
    counts.clear()
    edge.start()
    edge.wait_for(lambda: counts["syncs"] >= 2, 30, "two syncs after the restart")
    assert ask(edge, "served") == edge.answer
    assert counts["bytes"] == 0  # not a byte fetched again
    assert inodes(edge.state / "packs") == files  # no file replaced


def test_a_pack_damaged_on_the_edges_disk_is_fetched_again_inside_the_ask(ray_cloud, tiny_edge):
    counts, edge = ray_cloud["counts"], tiny_edge
    assert edge.stop() == 0
    path = edge.state / "packs" / f"{edge.info.segments[0].pack_id}.kvp"
    good = path.read_bytes()
    damaged = bytearray(good)
    damaged[-100] ^= 0x20  # a payload byte: the file keeps its name and size
    path.write_bytes(bytes(damaged))
    counts.clear()
    edge.start()
    # every segment is retrieved (top_k 32), the damaged one too: a miss like any other
    assert ask(edge, "served") == edge.answer
    assert path.read_bytes() == good and counts["bytes"] == len(good)
    assert "fetching it again" in edge.output()


# ---------------------------------------------------------------------- gateway process


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory):
    """A random-weight Llama with 4 layers × 16 KV heads × 128 dims: 377 tokens make a 24 MB
    fp32 pack (24 chunks), computed as fast as the tiny models."""
    folder = tmp_path_factory.mktemp("wide-kv")
    config = _tiny_config("llama", num_hidden_layers=4, num_attention_heads=16,
                          num_key_value_heads=16, head_dim=128,
                          rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    build_random_model(config).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def gateway_process(ray_address, wide_model, tmp_path_factory):
    cloud = GatewayProcess(tmp_path_factory.mktemp("faults") / "cloud", wide_model, ray_address,
                           "--segment-tokens", "48")
    yield cloud.start()
    cloud.kill()


@pytest.fixture()
def cloud(gateway_process):
    """The gateway process, running (a test before may have killed it)."""
    if not gateway_process.alive():
        gateway_process.start()
    return gateway_process


class RecordingClient(CloudClient):
    """The edge's cloud client, noting each pack fetch's [offset, bytes received]; `on_chunk`
    runs after each chunk has been handed to the syncer (which has written it)."""

    def __init__(self, *args, on_chunk=None):
        super().__init__(*args)
        self.fetches, self.on_chunk = [], on_chunk

    def fetch_pack(self, namespace, pack_id, offset=0):
        record = [offset, 0]
        self.fetches.append(record)
        for chunk in super().fetch_pack(namespace, pack_id, offset):
            record[1] += len(chunk.data)
            yield chunk
            if self.on_chunk:
                self.on_chunk()


def test_gateway_killed_during_a_pack_fetch_resumes_from_its_offset(cloud, wide_model, tmp_path):
    with CloudClient(cloud.address, cloud.token) as client:
        info = upload_ready(client, tmp_path / "kb", "big", BIG, whole=True, codec="fp32")
    (seg,) = info.segments
    (stored,) = cloud.store_files(f"{seg.pack_id}.kvp")
    stored = stored.read_bytes()
    assert len(stored) == seg.pack_bytes > 16 * CHUNK
    loaded, target = load_model(wide_model), Target("default", "big")
    cache = PackCache(tmp_path / "edge" / "packs", loaded.fingerprint)
    client = RecordingClient(cloud.address, cloud.token, on_chunk=cloud.kill)
    syncer = Syncer(client, cache, tmp_path / "edge", [target], loaded.tokenizer.decode)
    with pytest.raises(RemoteError):
        syncer.sync_once()  # the gateway dies once the first chunk is on the edge's disk
    held = cache.held(seg.pack_id)
    assert 0 < held < len(stored) and held % CHUNK == 0
    assert not cache.has(seg.pack_id) and syncer.local(target) is None  # nothing half-visible

    client.on_chunk = None
    cloud.start()
    assert retry(syncer.sync_once) == {"default/big": 1}
    offset, received = client.fetches[-1]
    assert (offset, received) == (held, len(stored) - held)  # resumed, not started over
    assert sha(cache.path(seg.pack_id).read_bytes()) == sha(stored)  # 0 bytes lost or changed
    assert not cache.path(seg.pack_id, partial=True).exists()
    assert syncer.local(target)["segments"][0]["pack_id"] == seg.pack_id
    client.close()


def test_a_gateway_killed_between_storing_packs_and_publishing_leaves_no_half_state(
        cloud, tmp_path):
    folder = write_kb(tmp_path / "kb", MANY)
    with CloudClient(cloud.address, cloud.token) as client:
        referenced_before = referenced(client)
        client.upload(folder, "default", "crash")
        deadline = time.monotonic() + 120
        while (info := client.get_kb("default", "crash")).segments_done < 2:
            assert info.status == "ingesting" and time.monotonic() < deadline, info
            time.sleep(0.02)
    cloud.kill()  # some packs are in the store, the catalog has not published them
    stored = {p.stem for p in cloud.store_files("*.kvp")}
    orphans = stored - referenced_before
    assert orphans and info.segments_total > len(orphans)

    cloud.start()
    with CloudClient(cloud.address, cloud.token) as client:
        info = client.get_kb("default", "crash")
        assert info.status == "failed" and "upload again" in info.error
        assert list(info.segments) == []
        assert referenced(client) == referenced_before
        check_store(cloud, client)
        for orphan in orphans:  # stored but never published: not served
            with pytest.raises(NotFound):
                list(client.fetch_pack("default", orphan))
        again = client.upload(folder, "default", "crash")
        assert again.files_received == 0 and again.files_skipped == len(MANY)  # staged whole
        info = client.wait_ready("default", "crash", timeout=180)
        assert len(info.segments) == info.segments_total
        check_store(cloud, client)


def referenced(client) -> set[str]:
    return {s.pack_id for kb in client.list_kbs("default") for v in kb.variants
            for s in client.get_kb("default", kb.kb, v).segments}


def check_store(cloud, client) -> None:
    """Every pack the catalog names is in the store, whole and named by its content."""
    for pack in referenced(client):
        (path,) = cloud.store_files(f"{pack}.kvp")
        assert content_id(path.read_bytes()) == pack


def test_the_edge_keeps_answering_with_the_gateway_process_gone(cloud, wide_model, tmp_path):
    with CloudClient(cloud.address, cloud.token) as client:
        upload_ready(client, tmp_path / "kb", "small", SMALL)
    edge = EdgeProcess(tmp_path / "edge", cloud.address, cloud.token, ["default/small"],
                       wide_model).start()
    try:
        before = ask(edge, "small")
        packs = inodes(edge.state / "packs")
        cloud.kill()
        edge.wait_for(lambda: "sync of default/small failed" in edge.output(), 30,
                      "a failed sync")
        for _ in range(3):
            assert ask(edge, "small") == before
            time.sleep(0.5)  # a sync attempt between asks
        assert inodes(edge.state / "packs") == packs  # nothing dropped or replaced
        assert edge.stop() == 0
    finally:
        edge.kill()
