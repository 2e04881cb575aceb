"""What a sync costs the link (issue 26), against a real gateway on loopback: an unchanged KB
costs a poll a few bytes (GetKB answers `not_modified` while the edge's etag is current; a
change, or a pinned pack gone from the edge, brings the whole listing again), and a KB served
on demand is indexed from one FetchHeads call per 256 packs, not a ranged read each."""
import pytest

from daemons import in_process_gateway
from kvedge.cloud.catalog import Catalog
from kvedge.common.errors import NotFound
from kvedge.common.model.models import load_model
from kvedge.common.net.cloud_client import CloudClient
from kvedge.edge.packcache import PackCache
from kvedge.edge.sync import Syncer, Target
from test_on_demand import DOCS, MODEL

KB = Target("default", "etag-towns")


class Listing(CloudClient):
    """Records each GetKB: (if_none_match sent, segments received, not_modified), each
    FetchHeads call's pack count and each ranged FetchPack."""

    def __init__(self, *args):
        super().__init__(*args)
        self.calls: list[tuple[str, int, bool]] = []
        self.heads: list[int] = []
        self.ranged = 0

    def fetch_heads(self, namespace, pack_ids):
        self.heads.append(len(pack_ids))
        return super().fetch_heads(namespace, pack_ids)

    def fetch_pack(self, namespace, pack_id, offset=0, length=0):
        self.ranged += bool(length)
        return super().fetch_pack(namespace, pack_id, offset, length)

    def get_kb(self, namespace, kb, variant="", if_none_match=""):
        info = super().get_kb(namespace, kb, variant, if_none_match)
        self.calls.append((if_none_match, len(info.segments), info.not_modified))
        return info


def upload(client, folder, docs):
    for file, text in docs.items():
        (folder / file).write_text(text)
    client.upload(folder, KB.namespace, KB.kb)
    return client.wait_ready(KB.namespace, KB.kb, timeout=180)


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    server, gateway, address, token = in_process_gateway(tmp_path_factory.mktemp("cloud"),
                                                         MODEL, 24)
    client = Listing(address, token)
    upload(client, tmp_path_factory.mktemp("kb"), DOCS)
    yield client, gateway
    client.close()
    server.stop(0)


def syncer(client, state, pin=False):
    loaded = load_model(MODEL)
    cache = PackCache(state / "packs", loaded.fingerprint)
    return Syncer(client, cache, state, [KB] if pin else [], loaded.tokenizer.decode,
                  on_demand=[KB]), cache


def test_an_unchanged_kb_is_not_listed_again_and_a_change_is(cloud, tmp_path):
    client, _ = cloud
    edge, _ = syncer(client, tmp_path)
    client.calls.clear()
    edge.sync_once()
    first = edge.local(KB)
    (sent, n, unchanged), = client.calls
    assert sent == "" and n == len(first["segments"]) > 0 and not unchanged
    edge.sync_once()
    edge.sync_once()
    etag = client.calls[1][0]
    assert etag and client.calls[1:] == [(etag, 0, True), (etag, 0, True)]
    assert edge.local(KB) == first

    changed = {**DOCS, "alpha.md": "The alpha code is 4242. Alpha has a mill of brick."}
    (tmp_path / "kb2").mkdir()
    upload(client, tmp_path / "kb2", changed)
    client.calls.clear()
    edge.sync_once()
    (sent, n, unchanged), = client.calls
    assert sent == etag and n > 0 and not unchanged  # the new listing, in the same call
    assert [s["pack_id"] for s in edge.local(KB)["segments"]] != \
        [s["pack_id"] for s in first["segments"]]
    edge.sync_once()
    assert client.calls[-1][2]  # current again


def test_a_pinned_pack_gone_from_the_edge_lists_the_kb_and_fetches_it_again(cloud, tmp_path):
    client, _ = cloud
    edge, cache = syncer(client, tmp_path, pin=True)
    assert edge.sync_once()[KB.key] > 0
    lost = edge.local(KB)["segments"][0]["pack_id"]
    cache.path(lost).unlink()
    client.calls.clear()
    assert edge.sync_once()[KB.key] == 1
    assert [c[2] for c in client.calls] == [True, False]  # unchanged, but incomplete here
    assert cache.has(lost)


def test_the_catalog_version_changes_with_every_write(tmp_path):
    catalog = Catalog(tmp_path / "catalog.db")
    catalog.begin_ingest("ns", "kb", {"a.md": ("0" * 64, 3)}, mode="rag", segment_tokens=24,
                         codec="fp16")
    seen = [catalog.version("ns", "kb")]
    catalog.set_progress("ns", "kb", "", "ingesting", done=1, total=2)
    seen.append(catalog.version("ns", "kb"))
    assert seen[-1] == catalog.version("ns", "kb")  # reading changes nothing
    with pytest.raises(NotFound, match="variant"):
        catalog.version("ns", "kb", "snapkv-0.5")
    catalog.set_progress("ns", "kb", "snapkv-0.5", "ingesting")  # another variant shows too
    seen.append(catalog.version("ns", "kb"))
    assert len(set(seen)) == 3


def test_a_kb_served_on_demand_is_indexed_from_one_fetch_heads_call(cloud, tmp_path):
    client, _ = cloud
    edge, _ = syncer(client, tmp_path)
    client.heads.clear()
    client.ranged = 0
    edge.sync_once()
    segments = edge.local(KB)["segments"]
    assert client.heads == [len({s["pack_id"] for s in segments})] and client.ranged == 0
    one = edge.fetcher.manifest(KB.namespace, segments[0]["pack_id"])  # a ranged read
    assert edge.fetcher.manifests(KB.namespace, [segments[0]["pack_id"]]) == \
        {segments[0]["pack_id"]: one}


def test_an_older_gateway_without_fetch_heads_is_read_pack_by_pack(cloud, tmp_path):
    client, _ = cloud

    class Older(Listing):
        def fetch_heads(self, namespace, pack_ids):
            raise NotImplementedError("the gateway has no FetchHeads")
            yield

    older = Older(client.address, client.token)
    try:
        edge, _ = syncer(older, tmp_path)
        edge.sync_once()
        n = len(edge.local(KB)["segments"])
        assert n > 0 and older.ranged >= len({s["pack_id"] for s in edge.local(KB)["segments"]})
    finally:
        older.close()


def test_fetch_heads_refuses_too_many_packs_and_packs_of_another_namespace(cloud):
    from kvedge.common.errors import BadInput
    from kvedge.common.net.rpc import MAX_HEADS

    client, _ = cloud
    pid = client.get_kb(KB.namespace, KB.kb).segments[0].pack_id
    with pytest.raises(BadInput, match="at most"):
        list(client.fetch_heads(KB.namespace, [pid] * (MAX_HEADS + 1)))
    with pytest.raises(NotFound, match="namespace 'other'"):
        list(client.fetch_heads("other", [pid]))
