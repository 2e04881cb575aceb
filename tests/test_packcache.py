"""The edge's pack cache alone: resumable transfers, verification before entry, LRU eviction."""
import os
import time
import tracemalloc

import pytest
import torch

from kvedge.common.pack import KVContext, ModelMismatch, PackCorrupt, encode_pack, pack_id
from kvedge.edge.packcache import PackCache

FP, OTHER_FP, TOK = "ab" * 32, "ef" * 32, "cd" * 32


def make_pack(seed: int, fingerprint: str = FP, tokens: int = 12, head_dim: int = 8) -> bytes:
    """A real pack of a small random context (2 layers, 2 KV heads of `head_dim`)."""
    g = torch.Generator().manual_seed(seed)
    keys = [torch.randn(2, tokens, head_dim, generator=g) for _ in range(2)]
    values = [torch.randn(2, tokens, head_dim, generator=g) for _ in range(2)]
    ctx = KVContext.from_dense(keys, values, [1000 + 20 * seed + t for t in range(tokens)],
                               model_fingerprint=fingerprint, tokenizer_id=TOK,
                               summaries=False)
    return encode_pack(ctx, "fp16")


@pytest.fixture(scope="module")
def packs() -> list[bytes]:
    return [make_pack(seed) for seed in range(4)]


@pytest.fixture
def cache(tmp_path):
    return PackCache(tmp_path / "packs", FP)


def put(cache: PackCache, data: bytes) -> str:
    pid = pack_id(data)
    cache.append(pid, 0, data)
    cache.commit(pid)
    return pid


def leftovers(cache: PackCache) -> list[str]:
    return sorted(p.name for p in cache.root.iterdir())


def test_append_resume_and_commit(cache, packs):
    data = packs[0]
    pid = pack_id(data)
    assert not cache.has(pid) and cache.held(pid) == 0
    cache.append(pid, 0, data[:100])
    cache.append(pid, 100, data[100:250])
    assert cache.held(pid) == 250 and not cache.has(pid)  # a transfer is not in the cache yet
    # a fresh cache over the same folder (a restarted edge) resumes from what is held
    again = PackCache(cache.root, FP)
    assert again.held(pid) == 250
    again.append(pid, again.held(pid), data[250:])
    assert again.commit(pid) == len(data)
    assert again.has(pid) and again.held(pid) == 0
    assert again.path(pid).read_bytes() == data and again.size(pid) == len(data)
    assert leftovers(again) == [f"{pid}.kvp"]


@pytest.mark.parametrize("offset", [0, 99, 101, 10_000])
def test_a_chunk_at_the_wrong_offset_is_refused_and_changes_nothing(cache, packs, offset):
    pid = pack_id(packs[0])
    cache.append(pid, 0, packs[0][:100])
    with pytest.raises(PackCorrupt, match=f"offset {offset} .* 100 bytes held"):
        cache.append(pid, offset, packs[0][100:200])
    assert cache.held(pid) == 100


def test_a_corrupted_transfer_is_deleted(cache, packs):
    data = bytearray(packs[0])
    pid = pack_id(data)
    data[-5] ^= 0x01
    cache.append(pid, 0, bytes(data))
    with pytest.raises(PackCorrupt, match="content hash"):
        cache.commit(pid)
    assert not cache.has(pid) and cache.held(pid) == 0 and leftovers(cache) == []


def test_a_truncated_transfer_is_deleted(cache, packs):
    pid = pack_id(packs[0])
    cache.append(pid, 0, packs[0][:-1])
    with pytest.raises(PackCorrupt):
        cache.commit(pid)
    assert leftovers(cache) == []


def test_a_damaged_pack_under_its_own_hash_fails_its_checksums(cache, packs):
    """Bytes that match their id but not their checksums (damaged before they were hashed)."""
    data = bytearray(packs[0])
    data[-5] ^= 0x01  # in the payload: only the tensor checksums and payload hash notice
    with pytest.raises(PackCorrupt):
        put(cache, bytes(data))
    assert leftovers(cache) == []


def test_committing_a_big_pack_verifies_it_in_place(cache):
    """Every check (content hash, model, checksums) reads the fetched file mapped from disk:
    committing a 4 MB pack allocates a small fraction of it (the manifest, the hashers)."""
    data = make_pack(0, tokens=1024, head_dim=256)
    assert len(data) > 4 << 20
    pid = pack_id(data)
    cache.append(pid, 0, data)
    tracemalloc.start()
    try:
        assert cache.commit(pid) == len(data)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < len(data) // 8, peak
    assert cache.path(pid).read_bytes() == data and leftovers(cache) == [f"{pid}.kvp"]
    bad = bytearray(data)
    bad[-5] ^= 0x01  # under its own hash: only the checksums, read in place too, notice
    cache.append(pack_id(bad), 0, bytes(bad))
    with pytest.raises(PackCorrupt, match="checksum mismatch"):
        cache.commit(pack_id(bad))
    assert leftovers(cache) == [f"{pid}.kvp"]


def test_a_pack_of_another_model_is_refused_and_deleted(cache):
    data = make_pack(0, fingerprint=OTHER_FP)
    with pytest.raises(ModelMismatch):
        put(cache, data)
    assert not cache.has(pack_id(data)) and leftovers(cache) == []


@pytest.mark.parametrize("bad", ["", "../etc/passwd", "A" * 64, "0" * 63, "0" * 64 + "/x"])
def test_paths_take_only_pack_ids(cache, bad):
    with pytest.raises(PackCorrupt, match="not a pack id"):
        cache.path(bad)
    with pytest.raises(PackCorrupt):
        cache.append(bad, 0, b"x")
    assert leftovers(cache) == []


def test_load_decodes_a_cached_pack_and_keeps_a_small_lru(tmp_path, packs):
    cache = PackCache(tmp_path, FP, memory_entries=2)
    ids = [put(cache, data) for data in packs[:3]]
    ctx = cache.load(ids[0])
    assert ctx.token_ids == list(range(1000, 1012)) and ctx.model_fingerprint == FP
    assert cache.load(ids[0]) is ctx  # from memory
    cache.load(ids[1])
    cache.load(ids[0])  # refresh: ids[1] is now the oldest in memory
    cache.load(ids[2])
    assert list(cache._decoded) == [ids[0], ids[2]]


def age(cache: PackCache, pid: str, atime: float) -> None:
    """Set a cached pack's last access (eviction reads access times)."""
    path = cache.path(pid)
    os.utime(path, (atime, path.stat().st_mtime))


def filled(tmp_path, packs, capacity: int) -> tuple[PackCache, list[str]]:
    """A cache holding packs[0..3], packs[0] the least recently used."""
    cache = PackCache(tmp_path, FP, capacity_bytes=capacity)
    ids = [put(cache, data) for data in packs]
    for n, pid in enumerate(ids):
        age(cache, pid, 1_000_000 + n)
    return cache, ids


def test_evict_drops_least_recently_used_until_within_capacity(tmp_path, packs):
    # room for exactly the two survivors (packs differ by a few bytes: compressed manifests)
    cache = PackCache(tmp_path, FP, capacity_bytes=len(packs[0]) + len(packs[3]))
    ids = [put(cache, data) for data in packs]
    cache.load(ids[1])  # decoded in memory: dropped with its file
    for pid, atime in zip(ids, (4, 1, 2, 3)):  # least recently used first: 1, 2, 3, 0
        age(cache, pid, 1_000_000 + atime)
    assert cache.evict() == [ids[1], ids[2]]
    assert [cache.has(p) for p in ids] == [True, False, False, True]
    assert ids[1] not in cache._decoded
    assert cache.evict() == []  # already within capacity


def test_a_pack_used_from_memory_counts_as_recently_used(tmp_path, packs):
    cache = PackCache(tmp_path, FP, capacity_bytes=len(packs[0]))
    first, second = put(cache, packs[0]), put(cache, packs[1])
    cache.load(first)
    age(cache, first, 1_000_000)  # its last read from disk was before the other pack's
    age(cache, second, 2_000_000)
    cache.load(first)  # used now, from memory
    assert cache.evict() == [second]


def test_every_use_records_its_time_on_the_file(tmp_path, packs):
    """Reads from disk set the access time themselves (relatime/noatime mounts would not),
    for whole loads and for block-granular opens alike."""
    cache = PackCache(tmp_path, FP, memory_entries=0)
    a, b = put(cache, packs[0]), put(cache, packs[1])
    age(cache, a, 1_000_000)
    age(cache, b, 1_000_000)
    cache.load(a)
    cache.segment(b)
    now = time.time()
    assert all(now - cache.path(p).stat().st_atime < 60 for p in (a, b))


def test_evict_never_drops_pinned_packs(tmp_path, packs):
    size = len(packs[0])
    cache, ids = filled(tmp_path, packs, capacity=size)
    cache.pinned = {ids[0], ids[2]}
    assert cache.evict() == [ids[1], ids[3]]
    assert [cache.has(p) for p in ids] == [True, False, True, False]
    assert cache.evict() == []  # still over capacity, but only pinned packs are left
    assert cache.has(ids[0]) and cache.has(ids[2])


def test_evict_never_drops_a_held_pack_and_catches_up_when_the_hold_ends(tmp_path, packs):
    """An answer holds the packs it reads; what eviction had to leave is evicted after."""
    cache, ids = filled(tmp_path, packs, capacity=max(map(len, packs)))  # room for one
    with cache.hold(ids[:2]):
        with cache.hold(ids[:1]):
            assert cache.evict() == [ids[2], ids[3]]  # the oldest two are held
        assert cache.has(ids[0]) and cache.has(ids[1])  # still held by the outer answer
    assert [cache.has(p) for p in ids] == [False, True, False, False]


def test_evict_ignores_unfinished_transfers(tmp_path, packs):
    cache, ids = filled(tmp_path, packs[:2], capacity=max(map(len, packs[:2])))
    cache.append(pack_id(packs[2]), 0, packs[2][:50])
    assert cache.evict() == [ids[0]]
    assert cache.held(pack_id(packs[2])) == 50


def test_a_transfer_makes_room_before_its_bytes_land(tmp_path, packs):
    """Disk stays within the capacity while a transfer runs: reserving a pack's size evicts
    for it first; the reservation becomes the pack's size on commit and goes on failure."""
    room = max(map(len, packs))
    cache, ids = filled(tmp_path, packs[:2], capacity=2 * room)
    new = pack_id(packs[2])
    assert cache.reserve(new, len(packs[2])) == [ids[0]]  # the least recently used
    cache.append(new, 0, packs[2])
    disk = sum(p.stat().st_size for p in cache.root.iterdir())
    assert disk <= 2 * room
    cache.commit(new)
    assert cache.evict() == [] and cache._reserved == {}
    gone = pack_id(packs[3])
    assert cache.reserve(gone, len(packs[3])) == [ids[1]]
    cache.release(gone)  # the transfer failed: nothing more is evicted for it
    assert cache.reserve(pack_id(packs[0]), 1) == [] and cache.has(new)


def test_eviction_lists_the_folder_once_per_cacheful_not_per_fetch(tmp_path):
    """Steady state behind a full cache: each fetch commits a pack and evicts one. The cache
    keeps its byte total and the candidates of its last listing, so it lists its folder
    once per `room` packs evicted (a listing per fetch was O(cache) stats on every miss)
    and still evicts exactly the least recently used."""
    room = 8
    data = [make_pack(seed) for seed in range(3 * room)]
    cache = PackCache(tmp_path, FP, capacity_bytes=room * max(map(len, data)))
    ids = [put(cache, d) for d in data[:room]]
    for n, pid in enumerate(ids):
        age(cache, pid, 1_000_000 + n)
    assert cache.evict() == [] and cache.listings == 1  # within budget: counted, not listed
    for n, d in enumerate(data[room:]):
        ids.append(put(cache, d))
        age(cache, ids[-1], 2_000_000 + n)
        cache.load(ids[n + 1]) if n == 0 else None  # used: newer than the listing's order
        assert len(cache.evict()) == 1
        assert cache.evict() == []
    assert cache.listings <= 1 + len(data[room:]) // (room - 1) + 1
    kept = [pid for pid in ids if cache.has(pid)]
    assert len(kept) == room and ids[1] not in kept  # used once, then the oldest again
    assert kept == ids[-room:]


def test_the_byte_total_follows_packs_deleted_as_damaged(tmp_path, packs):
    cache = PackCache(tmp_path, FP, capacity_bytes=sum(map(len, packs)))
    ids = [put(cache, d) for d in packs]
    assert cache.evict() == []
    cache.path(ids[0]).write_bytes(b"damaged")
    with pytest.raises(PackCorrupt):
        cache.load(ids[0])
    assert cache._total == sum(map(len, packs[1:]))


def test_a_cache_without_capacity_never_evicts(tmp_path, packs):
    cache, ids = filled(tmp_path, packs, capacity=0)
    assert cache.evict() == [] and all(cache.has(p) for p in ids)


def test_segment_opens_a_cold_pack_without_decoding_it_and_recheck_drops_damage(tmp_path, packs):
    """`segment` (for block-granular strategies): a pack decoded in memory is handed as is,
    a cold one opened (nothing decoded, the memory LRU untouched); `recheck` keeps a sound
    pack and deletes one damaged on disk since it was verified."""
    from kvedge.common.pack.segment import PackSegment

    cache = PackCache(tmp_path, FP)
    ids = [put(cache, data) for data in packs[:2]]
    warm = cache.load(ids[0])
    assert cache.segment(ids[0]) is warm
    cold = cache.segment(ids[1])
    assert isinstance(cold, PackSegment) and cold._decoded is None
    assert list(cache._decoded) == [ids[0]]
    assert cache.recheck(ids[1]) and cache.has(ids[1])
    data = bytearray(cache.path(ids[1]).read_bytes())
    data[-40] ^= 0x01
    cache.path(ids[1]).write_bytes(bytes(data))
    assert not cache.recheck(ids[1]) and not cache.has(ids[1])
    assert not cache.recheck(ids[1])  # gone: nothing to keep


def test_clear_forgets_every_pack_file_and_decoded_context(tmp_path):
    cache = PackCache(tmp_path, "fp")
    for name in ("a" * 64, "b" * 64):
        cache.path(name).write_bytes(b"pack")
    cache._decoded["a" * 64] = object()  # as a load would have left it
    cache.clear()
    assert not list(tmp_path.glob("*.kvp")) and not cache._decoded
