"""The gateway with its packs on S3 (`kvctl cloud up --store s3://bucket/prefix`), against a
real S3-compatible server on loopback (moto's: tests/s3server.py) reached through the standard
AWS settings, the tiny random model.

One KB uploaded to a gateway on S3 and to one on a local disk gives the same packs, and an
edge gets the same bytes from either: a pack whole, resumed from an offset, its header and
manifest by a ranged read, and synced into its pack cache (which checks each pack against its
id)."""
from types import SimpleNamespace

import pytest

from kvedge.cloud.gateway import GatewayConfig, serve_local
from kvedge.cloud.workers import PrefillPool, start_ray
from kvedge.common.model.models import load_model
from kvedge.common.net.cloud_client import CloudClient
from kvedge.common.pack.container import HEADER_SIZE
from kvedge.edge.fetcher import Fetcher
from kvedge.edge.packcache import PackCache
from kvedge.edge.sync import Syncer, Target

MODEL = "tiny-llama"
DOCS = {"alpha.md": "The alpha code is 1234567. Alpha is a small harbour town.\n" * 3,
        "beta.txt": "Beta facts. The beta code is 7654321. Beta has a bridge of copper.\n" * 3}


def start_gateway(data, store_url, pool) -> SimpleNamespace:
    server, gateway, address, token = serve_local(
        GatewayConfig(data, store_url, MODEL, segment_tokens=48), pool=pool)
    client = CloudClient(address, token)
    return SimpleNamespace(server=server, gateway=gateway, client=client)


def upload(client, folder):
    for name, text in DOCS.items():
        (folder / name).write_text(text)
    client.upload(folder, "default", "facts")
    return client.wait_ready("default", "facts", timeout=120)


@pytest.fixture(scope="module")
def clouds(s3_server, tmp_path_factory):
    """{"local": ..., "s3": ...}: two gateways sharing one prefill actor, each holding the KB."""
    with pytest.MonkeyPatch.context() as env:
        for name, value in s3_server.env.items():
            env.setenv(name, value)
        start_ray(num_cpus=2)
        pool = PrefillPool(MODEL)
        stores = {"local": None, "s3": s3_server.url("gateway")}
        clouds = {}
        try:
            for kind, store_url in stores.items():
                clouds[kind] = cloud = start_gateway(tmp_path_factory.mktemp(kind), store_url,
                                                     pool)
                cloud.info = upload(cloud.client, tmp_path_factory.mktemp(f"kb-{kind}"))
            yield clouds
        finally:
            for cloud in clouds.values():
                cloud.client.close()
                cloud.server.stop(0)
            pool.shutdown()


def fetch(cloud, pack_id, offset=0, length=0) -> bytes:
    return b"".join(c.data for c in cloud.client.fetch_pack("default", pack_id, offset, length))


def test_the_s3_gateway_keeps_the_same_packs_in_the_bucket(clouds, s3_server):
    local, s3 = clouds["local"], clouds["s3"]
    packs = [s.pack_id for s in s3.info.segments]
    assert len(packs) >= 2 and packs == [s.pack_id for s in local.info.segments]
    assert s3.gateway.store.url == s3_server.url("gateway")
    assert all(s3.gateway.store.exists(p) for p in packs)
    assert not (s3.gateway.config.data_dir / "store").exists()  # nothing on the local disk


def test_an_edge_fetches_the_same_bytes_from_either_store(clouds, tmp_path):
    local, s3 = clouds["local"], clouds["s3"]
    cache = PackCache(tmp_path / "packs", load_model(MODEL).fingerprint)
    manifests = {kind: Fetcher(cloud.client, cache).manifest for kind, cloud in clouds.items()}
    for seg in s3.info.segments:
        whole = fetch(local, seg.pack_id)
        assert len(whole) == seg.pack_bytes and fetch(s3, seg.pack_id) == whole
        assert fetch(s3, seg.pack_id, 0, HEADER_SIZE) == whole[:HEADER_SIZE]  # ranged
        middle = seg.pack_bytes // 3
        assert fetch(s3, seg.pack_id, middle, 100) == whole[middle:middle + 100]
        assert fetch(s3, seg.pack_id, middle) == whole[middle:]  # a resumed transfer
        # what an edge serving the KB on demand reads: a pack's header and manifest alone
        assert manifests["s3"]("default", seg.pack_id) == manifests["local"]("default",
                                                                             seg.pack_id)


def test_an_edge_syncs_the_kb_from_the_s3_gateway(clouds, tmp_path):
    s3, target = clouds["s3"], Target("default", "facts")
    loaded = load_model(MODEL)
    cache = PackCache(tmp_path / "packs", loaded.fingerprint)
    syncer = Syncer(s3.client, cache, tmp_path, [target], loaded.tokenizer.decode)
    assert syncer.sync_once() == {"default/facts": len(s3.info.segments)}
    for seg in s3.info.segments:  # verified against its id on commit
        assert cache.path(seg.pack_id).read_bytes() == fetch(clouds["local"], seg.pack_id)
