"""SamKV's side tensors (the pooled local query and the block summaries) are in a pack only
when the gateway is told to make them (`kvctl cloud up --side-tensors`): a real gateway
(tiny model, its real Ray pool), a real edge sync over gRPC on loopback, files on disk."""
import pytest
import torch

from daemons import write_kb
from kvedge.cloud.ingest import TextSegment, prefill_key
from kvedge.common.net.cloud_client import CloudClient
from kvedge.common.pack.container import read_manifest
from kvedge.common.pack.format import read_pack

MODEL = "tiny-llama"
DOCS = {f"d{i}.md": " ".join(f"Document {i}, line {j}, tells of lake {100 * i + j}."
                             for j in range(10)) for i in range(2)}


def test_a_pack_with_side_tensors_keeps_the_key_it_had_before_the_option():
    identity = {"fingerprint": "f", "tokenizer_id": "t"}
    before = prefill_key(identity, "ns", "int8+zstd", False, [1, 2, 3])
    assert prefill_key(identity, "ns", "int8+zstd", False, [1, 2, 3], True) == before
    assert prefill_key(identity, "ns", "int8+zstd", False, [1, 2, 3], False) != before


def test_without_side_tensors_a_pack_holds_the_same_kv_in_fewer_bytes():
    from kvedge.cloud.workers import PrefillEngine

    engine = PrefillEngine(MODEL)
    ids = torch.randint(0, 250, (150,), generator=torch.Generator().manual_seed(0)).tolist()
    seg = TextSegment(0, "d.md", "", ids)
    with_side, without = (engine.encode(seg, "ns", "int8+zstd", side_tensors=side)
                          for side in (True, False))
    assert set(read_manifest(with_side.data).side) == {"block_summaries", "query_cache"}
    assert read_manifest(without.data).side == {}
    assert len(without.data) < len(with_side.data) and without.pack_id != with_side.pack_id
    a, b = read_pack(with_side.data), read_pack(without.data)
    assert b.block_summaries is None and b.query_cache is None
    for layer in range(a.n_layers):
        for head in range(a.n_kv_heads):
            assert torch.equal(a.keys[layer][head], b.keys[layer][head])
            assert torch.equal(a.values[layer][head], b.values[layer][head])


@pytest.fixture(scope="module")
def gateways(tmp_path_factory):
    """Two gateways on one Ray: the default, and one with `side_tensors`."""
    from kvedge.cloud.gateway import GatewayConfig, serve_local

    out = {}
    for side in (False, True):
        server, gateway, address, token = serve_local(GatewayConfig(
            tmp_path_factory.mktemp(f"cloud-{side}"), model=MODEL, segment_tokens=32,
            side_tensors=side))
        out[side] = (server, address, token)
    yield out
    for server, *_ in out.values():
        server.stop(0)


@pytest.mark.parametrize("side", [False, True])
def test_the_gateway_makes_side_tensors_only_when_told_and_the_edge_mirrors_it(
        gateways, tmp_path, side):
    """The edge's sync records per segment whether its pack carries side tensors, and a
    segment the edge computes instead of fetching carries them exactly then."""
    from kvedge.common.model.models import load_model
    from kvedge.common.model.runtime import Runtime
    from kvedge.edge.fetcher import Fetcher
    from kvedge.edge.local_prefill import LocalPrefill
    from kvedge.edge.packcache import PackCache
    from kvedge.edge.sync import Syncer, Target

    _, address, token = gateways[side]
    with CloudClient(address, token) as client:
        client.upload(write_kb(tmp_path / "kb", DOCS), "default", "lakes")
        info = client.wait_ready("default", "lakes", timeout=120)
        for s in info.segments:
            data = b"".join(ch.data for ch in client.fetch_pack("default", s.pack_id))
            assert bool(read_manifest(data).side) is side

        loaded = load_model(MODEL)
        kb = Target("default", "lakes")
        cache = PackCache(tmp_path / "packs", loaded.fingerprint)
        fetcher = Fetcher(client, cache)
        syncer = Syncer(client, cache, tmp_path, [kb], loaded.tokenizer.decode, fetcher=fetcher)
        syncer.sync_once()
        segments = syncer.local(kb)["segments"]
        assert [s["side_tensors"] for s in segments] == [side] * len(info.segments)
        fetcher.stop()
        local = LocalPrefill(loaded.fingerprint, loaded.tokenizer_id, anchor=None)
        meta = segments[0]
        computed = local.context(Runtime(loaded), local.segment("default", meta))
        fetched = read_pack(cache.path(meta["pack_id"]))
        assert (computed.query_cache is None) is (fetched.query_cache is None) is (not side)
        assert (computed.block_summaries is None) is (fetched.block_summaries is None)
