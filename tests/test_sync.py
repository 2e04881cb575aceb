"""The syncer's bookkeeping alone, against an in-process fake of the cloud client.

The fake serves real pack bytes from a dict; the real gRPC path is covered by
tests/test_cloud_edge.py.
"""
import contextlib
import json

import pytest
import torch

from kvedge.common.net.auth import InvalidName
from kvedge.common.errors import NotFound
from kvedge.common.pack import KVContext, PackCorrupt, encode_pack, pack_id
from kvedge.common.net.proto import kvedge_pb2 as pb
from kvedge.edge.packcache import PackCache
from kvedge.edge.sync import Syncer, Target, decode_ids, encode_ids, manifest_path

FP, TOK = "ab" * 32, "cd" * 32
CHUNK = 256


def make_pack(seed: int, namespace: str = "default") -> bytes:
    """A real pack of a tiny random context whose token ids are 1000*seed + 0..7."""
    g = torch.Generator().manual_seed(seed)
    keys = [torch.randn(1, 8, 8, generator=g) for _ in range(2)]
    values = [torch.randn(1, 8, 8, generator=g) for _ in range(2)]
    return encode_pack(KVContext.from_dense(
        keys, values, [1000 * seed + t for t in range(8)], model_fingerprint=FP,
        tokenizer_id=TOK, namespace=namespace, summaries=False), "fp16")


@pytest.fixture(scope="module")
def packs() -> list[bytes]:
    return [make_pack(seed) for seed in range(1, 6)]


class FakeCloud:
    """What Syncer needs of CloudClient: get_kb and a resumable, ranged fetch_pack stream."""

    def __init__(self):
        self.kbs: dict[tuple[str, str, str], pb.KBInfo] = {}
        self.packs: dict[str, bytes] = {}
        self.fetches: list[tuple[str, str, int]] = []  # (namespace, pack id, offset)
        self.ranges: list[tuple[str, str, int, int]] = []  # (…, offset, length)
        self.get_kbs: list[tuple[str, str, str]] = []
        self.break_after: int | None = None  # chunks sent before the connection drops

    def publish(self, target: Target, packs: list[bytes], *, served: list[bytes] | None = None):
        """Make `packs` the target's segments; the cloud sends `served` (default: the same)."""
        segments = []
        for i, (data, sent) in enumerate(zip(packs, served or packs)):
            self.packs[pack_id(data)] = sent
            segments.append(pb.SegmentInfo(index=i, pack_id=pack_id(data), pack_bytes=len(data),
                                           n_tokens=8, source=f"doc{i}.txt", fp16_bytes=4 * i))
        self.kbs[(target.namespace, target.kb, target.variant)] = pb.KBInfo(
            namespace=target.namespace, kb=target.kb, variant=target.variant, status="ready",
            model_fingerprint=FP, mode="rag", segments=segments)

    def get_kb(self, namespace: str, kb: str, variant: str = "") -> pb.KBInfo:
        self.get_kbs.append((namespace, kb, variant))
        if (namespace, kb, variant) not in self.kbs:
            raise NotFound(f"no knowledge base {kb!r} in namespace {namespace!r}")
        return self.kbs[(namespace, kb, variant)]

    def fetch_pack(self, namespace: str, pack_id: str, offset: int = 0, length: int = 0):
        if length:  # a ranged read: the retrieval index of a KB served on demand
            self.ranges.append((namespace, pack_id, offset, length))
        else:
            self.fetches.append((namespace, pack_id, offset))
        data = self.packs[pack_id]
        end = min(len(data), offset + length) if length else len(data)
        for n, start in enumerate(range(offset, end, CHUNK)):
            if self.break_after is not None and n == self.break_after:
                raise ConnectionError("connection reset")
            yield pb.PackChunk(offset=start, data=data[start:min(end, start + CHUNK)],
                               total=len(data))

    def fetched(self) -> list[str]:
        return [pid for _, pid, _ in self.fetches]


def detokenize(ids: list[int]) -> str:
    return " ".join(map(str, ids))


KB = Target("default", "manuals")


@pytest.fixture
def cloud():
    return FakeCloud()


@pytest.fixture
def cache(tmp_path):
    return PackCache(tmp_path / "packs", FP)


def syncer(cloud, cache, tmp_path, targets=(KB,)) -> Syncer:
    return Syncer(cloud, cache, tmp_path / "state", list(targets), detokenize)


def local(tmp_path, target=KB) -> dict | None:
    path = manifest_path(tmp_path / "state", target)
    return json.loads(path.read_text()) if path.exists() else None


# ---------------------------------------------------------------------- targets
@pytest.mark.parametrize("spec, target", [
    ("manuals", Target("default", "manuals", "")),
    ("tenant-a/manuals", Target("tenant-a", "manuals", "")),
    ("tenant-a/manuals@contrastkv-0.2-int4+zstd",
     Target("tenant-a", "manuals", "contrastkv-0.2-int4+zstd")),
    ("manuals@snapkv-0.5-fp16", Target("default", "manuals", "snapkv-0.5-fp16")),
])
def test_target_parse(spec, target):
    assert Target.parse(spec) == target
    assert target.key == (spec if "/" in spec else f"default/{spec}")


def test_target_parse_default_namespace():
    assert Target.parse("kb", default_namespace="edge-ns") == Target("edge-ns", "kb")


@pytest.mark.parametrize("spec", ["", "ns/", "@v", "a/b/kb", "../kb", "ns/..", "ns/../kb",
                                  "ns/.hidden", "ns/with space", "bad ns/kb", "x" * 65])
def test_target_parse_refuses_bad_names(spec):
    with pytest.raises(InvalidName):
        Target.parse(spec)


def test_manifest_path(tmp_path):
    assert manifest_path(tmp_path, Target("ns", "kb")) == tmp_path / "kbs" / "ns" / "kb.json"
    assert manifest_path(tmp_path, Target("ns", "kb", "int4")) == \
        tmp_path / "kbs" / "ns" / "kb@int4.json"
    assert manifest_path(tmp_path, Target("a", "kb")) != manifest_path(tmp_path, Target("b", "kb"))


# ---------------------------------------------------------------------- syncing
def test_sync_fetches_verifies_and_writes_the_manifest(cloud, cache, tmp_path, packs):
    cloud.publish(KB, packs[:3])
    assert syncer(cloud, cache, tmp_path).sync_once() == {"default/manuals": 3}
    ids = [pack_id(p) for p in packs[:3]]
    assert cloud.fetches == [("default", pid, 0) for pid in ids]
    assert all(cache.path(pid).read_bytes() == p for pid, p in zip(ids, packs))
    m = local(tmp_path)
    assert {k: m[k] for k in ("namespace", "kb", "variant", "fingerprint", "mode")} == \
        {"namespace": "default", "kb": "manuals", "variant": "", "fingerprint": FP,
         "mode": "rag"}
    # no fp16 size stored: the engine derives it from the model's shape when it answers
    assert m["segments"][1] == {"index": 1, "pack_id": ids[1], "source": "doc1.txt",
                                "n_tokens": 8, "pack_bytes": len(packs[1]),
                                "text": detokenize(range(2000, 2008)), "transforms": [],
                                "token_ids": encode_ids(list(range(2000, 2008))),
                                "anchored": False, "side_tensors": False}
    assert [s["pack_id"] for s in m["segments"]] == ids


def test_token_ids_round_trip_through_their_compact_form():
    for ids in ([], [0], [1, 2**16, 49151, 2**32 - 1]):
        assert decode_ids(encode_ids(ids)) == ids
    assert len(encode_ids(list(range(300)))) == 1600  # 4 bytes a token, base64


def test_a_local_manifest_without_token_ids_is_indexed_again(cloud, cache, tmp_path, packs):
    """One written by an edge before token ids were kept: the next sync re-reads what it
    lacks (here from the cached packs: nothing fetched)."""
    cloud.publish(KB, packs[:2])
    s = syncer(cloud, cache, tmp_path)
    s.sync_once()
    path = manifest_path(tmp_path / "state", KB)
    old = json.loads(path.read_text())
    for seg in old["segments"]:
        del seg["token_ids"], seg["anchored"]
    path.write_text(json.dumps(old))
    fetched = len(cloud.fetches)
    assert s.sync_once() == {"default/manuals": 0} and len(cloud.fetches) == fetched
    assert [decode_ids(seg["token_ids"]) for seg in local(tmp_path)["segments"]] == \
        [list(range(1000 * i, 1000 * i + 8)) for i in (1, 2)]


def test_a_second_sync_fetches_nothing(cloud, cache, tmp_path, packs):
    cloud.publish(KB, packs[:2])
    s = syncer(cloud, cache, tmp_path)
    s.sync_once()
    path = manifest_path(tmp_path / "state", KB)
    before, mtime = path.read_text(), path.stat().st_mtime_ns
    cloud.fetches.clear()
    assert s.sync_once() == {"default/manuals": 0}
    assert cloud.fetches == [] and len(cloud.get_kbs) == 2
    assert path.read_text() == before and path.stat().st_mtime_ns == mtime  # not rewritten


def test_only_missing_packs_are_fetched(cloud, cache, tmp_path, packs):
    cached = pack_id(packs[1])
    cache.append(cached, 0, packs[1])
    cache.commit(cached)
    cloud.publish(KB, packs[:3])
    assert syncer(cloud, cache, tmp_path).sync_once() == {"default/manuals": 2}
    assert cloud.fetched() == [pack_id(packs[0]), pack_id(packs[2])]
    assert [s["pack_id"] for s in local(tmp_path)["segments"]] == \
        [pack_id(p) for p in packs[:3]]


def test_an_update_fetches_only_the_new_packs(cloud, cache, tmp_path, packs):
    s = syncer(cloud, cache, tmp_path)
    cloud.publish(KB, packs[:2])
    s.sync_once()
    cloud.fetches.clear()
    cloud.publish(KB, [packs[1], packs[2]])
    assert s.sync_once() == {"default/manuals": 1}
    assert cloud.fetched() == [pack_id(packs[2])]
    assert [seg["pack_id"] for seg in local(tmp_path)["segments"]] == \
        [pack_id(packs[1]), pack_id(packs[2])]


def test_a_partial_transfer_resumes_from_its_offset(cloud, cache, tmp_path, packs):
    pid, half = pack_id(packs[0]), len(packs[0]) // 2
    cache.append(pid, 0, packs[0][:half])  # what a broken earlier transfer left
    cloud.publish(KB, packs[:1])
    assert syncer(cloud, cache, tmp_path).sync_once() == {"default/manuals": 1}
    assert cloud.fetches == [("default", pid, half)]
    assert cache.path(pid).read_bytes() == packs[0] and cache.held(pid) == 0


def test_a_dropped_connection_keeps_what_arrived_and_writes_no_manifest(cloud, cache, tmp_path,
                                                                      packs):
    cloud.publish(KB, packs[:1])
    pid = pack_id(packs[0])
    s = syncer(cloud, cache, tmp_path)
    cloud.break_after = 2
    with pytest.raises(ConnectionError):
        s.sync_once()
    assert cache.held(pid) == 2 * CHUNK and not cache.has(pid)
    assert local(tmp_path) is None
    cloud.break_after = None
    assert s.sync_once() == {"default/manuals": 1}
    assert cloud.fetches[-1] == ("default", pid, 2 * CHUNK)
    assert cache.path(pid).read_bytes() == packs[0] and local(tmp_path) is not None


def test_a_corrupt_pack_is_not_committed_and_no_manifest_is_written(cloud, cache, tmp_path,
                                                                   packs):
    damaged = bytearray(packs[1])
    damaged[len(damaged) // 2] ^= 0xFF
    cloud.publish(KB, packs[:2], served=[packs[0], bytes(damaged)])
    with pytest.raises(PackCorrupt):
        syncer(cloud, cache, tmp_path).sync_once()
    assert not cache.has(pack_id(packs[1])) and cache.held(pack_id(packs[1])) == 0
    assert local(tmp_path) is None


def test_a_corrupt_update_keeps_the_old_manifest(cloud, cache, tmp_path, packs):
    s = syncer(cloud, cache, tmp_path)
    cloud.publish(KB, packs[:1])
    s.sync_once()
    before = local(tmp_path)
    damaged = bytearray(packs[2])
    damaged[-3] ^= 0x01
    cloud.publish(KB, [packs[0], packs[2]], served=[packs[0], bytes(damaged)])
    with pytest.raises(PackCorrupt):
        s.sync_once()
    assert local(tmp_path) == before  # the edge goes on answering from the old version


def test_a_kb_still_ingesting_writes_nothing(cloud, cache, tmp_path):
    cloud.kbs[("default", "manuals", "")] = pb.KBInfo(namespace="default", kb="manuals",
                                                      status="ingesting")
    assert syncer(cloud, cache, tmp_path).sync_once() == {"default/manuals": 0}
    assert cloud.fetches == [] and local(tmp_path) is None


def test_namespace_and_variant_reach_the_cloud(cloud, cache, tmp_path, packs):
    target = Target("tenant-a", "manuals", "contrastkv-0.2-int4+zstd")
    cloud.publish(target, packs[:1])
    syncer(cloud, cache, tmp_path, [target]).sync_once()
    assert cloud.get_kbs == [("tenant-a", "manuals", "contrastkv-0.2-int4+zstd")]
    assert cloud.fetches == [("tenant-a", pack_id(packs[0]), 0)]
    assert local(tmp_path, target)["variant"] == "contrastkv-0.2-int4+zstd"
    assert local(tmp_path, Target("tenant-a", "manuals")) is None


def test_served_packs_are_pinned_and_others_evicted(cloud, tmp_path, packs):
    cache = PackCache(tmp_path / "packs", FP, capacity_bytes=1)  # over capacity with any pack
    stale = pack_id(packs[4])
    cache.append(stale, 0, packs[4])
    cache.commit(stale)
    base, variant = KB, Target("default", "manuals", "int4")
    cloud.publish(base, packs[:2])
    cloud.publish(variant, packs[1:3])
    syncer(cloud, cache, tmp_path, [base, variant]).sync_once()
    assert cache.pinned == {pack_id(p) for p in packs[:3]}
    assert all(cache.has(pid) for pid in cache.pinned)
    assert not cache.has(stale)


def test_one_failing_target_does_not_stop_the_others(cloud, cache, tmp_path, packs):
    gone, ok = Target("default", "removed"), KB
    cloud.publish(ok, packs[:1])
    with contextlib.suppress(Exception):  # reporting the failure is fine; skipping `ok` is not
        syncer(cloud, cache, tmp_path, [gone, ok]).sync_once()
    assert local(tmp_path, ok) is not None


def test_a_kb_no_longer_served_whole_is_evicted_and_keeps_its_manifest(cloud, tmp_path, packs):
    """Its manifest stays (the engine fetches its packs on demand); its packs are in the LRU."""
    cache = PackCache(tmp_path / "packs", FP, capacity_bytes=1)
    old = Target("default", "old")
    cloud.publish(KB, packs[:1])
    cloud.publish(old, packs[1:2])
    syncer(cloud, cache, tmp_path, [KB, old]).sync_once()
    syncer(cloud, cache, tmp_path, [KB]).sync_once()  # restarted serving only KB whole
    assert cache.pinned == {pack_id(packs[0])} and cache.has(pack_id(packs[0]))
    assert not cache.has(pack_id(packs[1]))
    assert local(tmp_path, old)["segments"][0]["pack_id"] == pack_id(packs[1])


# ---------------------------------------------------------------------- on demand
def on_demand(cloud, cache, tmp_path, targets=(KB,), pinned=()) -> Syncer:
    return Syncer(cloud, cache, tmp_path / "state", list(pinned), detokenize,
                  on_demand=list(targets))


def test_on_demand_syncs_the_index_from_each_packs_first_bytes(cloud, cache, tmp_path, packs):
    from kvedge.common.pack.container import HEADER_SIZE, MANIFEST_GUESS

    cloud.publish(KB, packs[:3])
    s = on_demand(cloud, cache, tmp_path)
    assert s.sync_once() == {"default/manuals": 0}
    assert cloud.fetches == [] and not any(cache.has(pack_id(p)) for p in packs)
    assert sorted(pid for _, pid, offset, _ in cloud.ranges if offset == 0) == \
        sorted(pack_id(p) for p in packs[:3])  # one ranged read each: manifests fit the guess
    m = local(tmp_path)
    assert [seg["text"] for seg in m["segments"]] == \
        [detokenize(range(1000 * n, 1000 * n + 8)) for n in (1, 2, 3)]
    assert cache.pinned == set() and s.fetched_packs == 0
    first_read = HEADER_SIZE + MANIFEST_GUESS  # these packs are smaller: each read whole
    assert s.fetched_bytes == sum(min(len(p), first_read) for p in packs[:3])


def test_a_manifest_longer_than_the_first_read_takes_a_second_one(cloud, cache, tmp_path, packs,
                                                                monkeypatch):
    from kvedge.common.pack import container
    from kvedge.common.pack.container import HEADER_SIZE, read_header

    monkeypatch.setattr(container, "MANIFEST_GUESS", 10)
    cloud.publish(KB, packs[:1])
    on_demand(cloud, cache, tmp_path).sync_once()
    m_len = read_header(packs[0])[1]
    assert [(o, n) for _, _, o, n in cloud.ranges] == \
        [(0, HEADER_SIZE + 10), (HEADER_SIZE + 10, m_len - 10)]
    assert local(tmp_path)["segments"][0]["text"] == detokenize(range(1000, 1008))


def test_an_update_reads_only_the_new_packs_manifests(cloud, cache, tmp_path, packs):
    s = on_demand(cloud, cache, tmp_path)
    cloud.publish(KB, packs[:2])
    s.sync_once()
    cloud.ranges.clear()
    assert s.sync_once() == {"default/manuals": 0} and cloud.ranges == []  # up to date
    cloud.publish(KB, [packs[1], packs[2]])
    s.sync_once()
    assert {pid for _, pid, _, _ in cloud.ranges} == {pack_id(packs[2])}
    assert [seg["pack_id"] for seg in local(tmp_path)["segments"]] == \
        [pack_id(packs[1]), pack_id(packs[2])]


def test_a_cached_packs_manifest_is_read_from_disk(cloud, cache, tmp_path, packs):
    cached = pack_id(packs[0])
    cache.append(cached, 0, packs[0])
    cache.commit(cached)
    cloud.publish(KB, packs[:2])
    on_demand(cloud, cache, tmp_path).sync_once()
    assert {pid for _, pid, _, _ in cloud.ranges} == {pack_id(packs[1])}


def test_pinned_kbs_are_fetched_whole_and_the_others_on_demand(cloud, tmp_path, packs):
    cache = PackCache(tmp_path / "packs", FP, capacity_bytes=1)
    hot = Target("default", "hot")
    cloud.publish(KB, packs[:2])
    cloud.publish(hot, packs[2:4])
    s = on_demand(cloud, cache, tmp_path, targets=[KB, hot], pinned=[hot])
    assert s.sync_once() == {"default/hot": 2, "default/manuals": 0}
    assert cache.pinned == {pack_id(p) for p in packs[2:4]}
    assert all(cache.has(pid) for pid in cache.pinned)  # kept, though over capacity
    assert cloud.fetched() == [pack_id(p) for p in packs[2:4]]
    assert s.fetched_packs == 2


@pytest.mark.parametrize("spec, want", [
    ("kb@contrastkv-0.2-int4+zstd", ("default", "kb", "contrastkv-0.2-int4+zstd")),
    ("ns/kb@none-1-fp16", ("ns", "kb", "none-1-fp16")),
    ("kb@kvzip-0.2-kvtc:bits=3,embed=false",  # a job's variant: its codec spec as written
     ("default", "kb", "kvzip-0.2-kvtc:bits=3,embed=false")),
    ("kb@", ("default", "kb", "")),
])
def test_a_kb_is_addressed_ns_name_at_variant(spec, want):
    t = Target.parse(spec)
    assert (t.namespace, t.kb, t.variant) == want


@pytest.mark.parametrize("spec", ["kb@../x", "kb@a/b", "kb@.hidden", "kb@a..b", "kb@a\\n"])
def test_variant_names_cannot_leave_the_manifest_folder(spec):
    with pytest.raises(InvalidName):
        Target.parse(spec)
    with pytest.raises(InvalidName):
        Target.in_namespace("default", spec)


def test_a_poll_with_nothing_new_does_not_parse_the_local_manifest_again(cloud, cache, tmp_path,
                                                                          packs, monkeypatch):
    """Every poll compares the cloud's KB with the local manifest; a large KB's manifest is
    megabytes of JSON, so it is parsed again only when its file changed."""
    import kvedge.edge.sync as sync

    cloud.publish(KB, packs[:2])
    s = on_demand(cloud, cache, tmp_path)
    s.sync_once()
    parsed, loads = [], json.loads
    monkeypatch.setattr(sync.json, "loads", lambda text: parsed.append(1) or loads(text))
    for _ in range(3):
        assert s.sync_once() == {"default/manuals": 0}
    assert len(parsed) <= 1  # at most once, after the sync wrote it
    cloud.publish(KB, packs[:3])
    s.sync_once()
    assert [seg["pack_id"] for seg in s.local(KB)["segments"]] == [pack_id(p) for p in packs[:3]]
