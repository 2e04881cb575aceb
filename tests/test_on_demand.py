"""Packs on demand (docs/design.md, decision 10): a real gateway and edges over gRPC on
loopback, the tiny random model.

A KB served on demand syncs its manifest and retrieval index only (ranged reads of each
pack's first bytes); a question's missing packs are fetched inside its ask, one transfer per
pack however many asks wait on it; a pack damaged on the edge's disk is fetched again inside
the ask; the cloud down leaves cached packs answering and names the missing ones; the disk
stays within --cache-bytes; the prefetcher fetches the segment ranked just below top_k.
"""
import logging
import threading
import time
from collections import Counter
from contextlib import contextmanager
from types import SimpleNamespace

import pytest

from daemons import EdgeProcess, in_process_gateway
from kvedge.common.errors import BadInput
from kvedge.common.model.models import load_model
from kvedge.common.net.cloud_client import CloudClient
from kvedge.common.net.edge_client import EdgeClient
from kvedge.common.pack.container import HEADER_SIZE, read_header, read_manifest
from kvedge.common.pack import read_pack
from kvedge.common.pack.errors import PackCorrupt, PackUnavailable
from kvedge.edge.engine import EdgeEngine
from kvedge.edge.fetcher import Fetcher
from kvedge.edge.packcache import PackCache
from kvedge.edge.prefetch import Prefetcher
from kvedge.edge.server import serve as serve_edge
from kvedge.edge.sync import Syncer, Target
from test_pack_stream import assert_equal, layer_end

MODEL = "tiny-llama"
KB = Target("default", "towns")
TOWNS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
DOCS = {f"{town}.md": f"The {town} code is {1000 + 7 * i}. {town.title()} has a bridge of "
        f"{['copper', 'stone', 'oak', 'glass', 'iron', 'salt'][i]} and a tower. " * 2
        for i, town in enumerate(TOWNS)}
QUESTIONS = [f"What is the {town} code?" for town in TOWNS]


def upload(client, folder, name="towns"):
    for file, text in DOCS.items():
        (folder / file).write_text(text)
    client.upload(folder, "default", name)
    return client.wait_ready("default", name, timeout=180)


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    server, gateway, address, token = in_process_gateway(tmp_path_factory.mktemp("cloud"),
                                                         MODEL, 24)
    with CloudClient(address, token) as client:
        info = upload(client, tmp_path_factory.mktemp("kb"))
    yield {"address": address, "token": token, "info": info, "gateway": gateway,
           "server": server}
    server.stop(0)


class Recording(CloudClient):
    """The edge's cloud client, counting whole-pack transfers per pack (ranged reads of a
    pack's first bytes aside) and holding each one `delay` seconds before its first byte."""

    def __init__(self, address, token, delay: float = 0.0):
        super().__init__(address, token)
        self.transfers, self.delay, self._lock = Counter(), delay, threading.Lock()
        self.garble: set[str] = set()  # packs whose next transfer arrives with a byte flipped

    def fetch_pack(self, namespace, pack_id, offset=0, length=0):
        if not length:
            with self._lock:
                self.transfers[pack_id] += 1
            time.sleep(self.delay)
        for chunk in super().fetch_pack(namespace, pack_id, offset, length):
            if not length and pack_id in self.garble:
                self.garble.discard(pack_id)
                data = bytearray(chunk.data)
                data[-1] ^= 0x01
                chunk.data = bytes(data)
            yield chunk


@contextmanager
def edge(cloud, state, *, pin=False, cache_bytes=0, prefetch=0, delay=0.0, address=None,
         **engine_kw):
    """An edge as `kvedge serve` builds it (one fetcher for sync, answers and prefetch),
    serving KB on demand (or `pin`: whole), synced once, its gRPC service on loopback;
    `engine_kw` go to EdgeEngine (fetch_or_compute=True: as `kvedge serve` by default)."""
    loaded = load_model(MODEL)
    client = Recording(address or cloud["address"], cloud["token"], delay)
    cache = PackCache(state / "packs", loaded.fingerprint, cache_bytes)
    fetcher = Fetcher(client, cache)
    prefetcher = Prefetcher(fetcher, cache, depth=prefetch) if prefetch else None
    syncer = Syncer(client, cache, state, [KB] if pin else [], loaded.tokenizer.decode,
                    on_demand=[KB], fetcher=fetcher)
    synced = syncer.sync_once()
    engine = EdgeEngine(loaded, cache, state, fetcher=fetcher, prefetcher=prefetcher,
                        **engine_kw)
    server, port = serve_edge(engine, state, "127.0.0.1:0")
    if prefetcher:
        prefetcher.start()
    asker = EdgeClient(f"127.0.0.1:{port}", (state / "edge.token").read_text().strip())

    def ask(question, **kw):
        kw = {"top_k": 2, "max_new_tokens": 6, **kw}
        return list(asker.ask("default", KB.kb, question, **kw))[-1]

    try:
        yield SimpleNamespace(client=client, cache=cache, fetcher=fetcher, syncer=syncer,
                              engine=engine, prefetcher=prefetcher, synced=synced, ask=ask,
                              local=syncer.local(KB))
    finally:
        asker.close()
        server.stop(0)
        engine.close()
        if prefetcher:
            prefetcher.stop()
        client.close()


def cached(e) -> set[str]:
    return {p.stem for p in e.cache.root.glob("*.kvp")}


def disk_bytes(e) -> int:
    return sum(p.stat().st_size for p in e.cache.root.glob("*.kvp"))


def pack_of(e, question: str, top_k: int = 1) -> list[str]:
    """The packs retrieval picks for `question` (best last)."""
    return [m["pack_id"] for m in e.engine.pick(KB, question, top_k, 6)[0]]


# ---------------------------------------------------------------------- the ranged fetch


def test_a_ranged_fetch_reads_the_header_and_manifest_alone(cloud):
    pid = cloud["info"].segments[0].pack_id
    with CloudClient(cloud["address"], cloud["token"]) as c:
        whole = b"".join(ch.data for ch in c.fetch_pack("default", pid))
        read = lambda offset, length: b"".join(  # noqa: E731
            ch.data for ch in c.fetch_pack("default", pid, offset, length))
        assert read(0, HEADER_SIZE) == whole[:HEADER_SIZE]
        end = HEADER_SIZE + read_header(whole)[1]
        prefix = read(0, HEADER_SIZE) + read(HEADER_SIZE, end - HEADER_SIZE)
        assert prefix == whole[:end] and len(prefix) < len(whole)
        assert read_manifest(prefix) == read_manifest(whole)  # no payload needed
        assert read(len(whole) - 5, 1000) == whole[-5:]  # past the end: to the end
        assert read(10, 0) == whole[10:]  # 0: to the end, as old clients ask
        with pytest.raises(BadInput, match="negative"):
            read(0, -1)


# ---------------------------------------------------------------------- on demand


def test_a_fresh_edge_answers_before_all_packs_are_fetched(cloud, tmp_path):
    with edge(cloud, tmp_path) as e:
        assert e.synced == {KB.key: 0} and cached(e) == set()  # manifest and index only
        assert len(e.local["segments"]) == len(cloud["info"].segments) > 4
        assert "alpha code" in " ".join(s["text"] for s in e.local["segments"])
        done = e.ask(QUESTIONS[0])
        assert done.tokens == 6 and len(done.segments) == 2
        picked = {e.local["segments"][i]["pack_id"] for i in done.segments}
        assert cached(e) == picked  # just the question's packs
        assert dict(e.client.transfers) == {p: 1 for p in picked}
        assert e.syncer.fetched_packs == 2


@pytest.mark.parametrize("strategy", ["epic", "samkv"])
def test_on_demand_answers_equal_the_pinned_edges(cloud, tmp_path, strategy):
    with edge(cloud, tmp_path / "pinned", pin=True) as whole:
        assert whole.synced == {KB.key: len({s.pack_id for s in cloud["info"].segments})}
        assert whole.cache.pinned == {s.pack_id for s in cloud["info"].segments}
        eager = [whole.ask(q, strategy=strategy) for q in QUESTIONS]
    with edge(cloud, tmp_path / "demand") as lazy:
        answers = [lazy.ask(q, strategy=strategy) for q in QUESTIONS]
        assert lazy.cache.pinned == set()
    assert [(a.answer, list(a.segments)) for a in answers] == \
        [(a.answer, list(a.segments)) for a in eager]


def test_recompute_fetches_no_pack_and_answers_as_the_pinned_edge(cloud, tmp_path):
    """recompute reads the segments' token ids, which the sync keeps in the local manifest:
    an on-demand edge answers it with no transfer, as the pinned edge answers it."""
    with edge(cloud, tmp_path / "pinned", pin=True) as whole:
        eager = [whole.ask(q, strategy="recompute") for q in QUESTIONS[:2]]
    with edge(cloud, tmp_path / "demand") as lazy:
        answers = [lazy.ask(q, strategy="recompute") for q in QUESTIONS[:2]]
        assert lazy.client.transfers == Counter() and cached(lazy) == set()
        assert all(a.bytes_loaded == 0 for a in answers)  # no pack read
    assert [(a.answer, list(a.segments), a.recomputed_tokens) for a in answers] == \
        [(a.answer, list(a.segments), a.recomputed_tokens) for a in eager]


def test_sixteen_asks_missing_the_same_pack_share_one_transfer(cloud, tmp_path):
    with edge(cloud, tmp_path, delay=1.0) as e:
        (pid,) = pack_of(e, QUESTIONS[1])
        answers = [None] * 16

        def one(i):
            answers[i] = e.ask(QUESTIONS[1], top_k=1)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert e.client.transfers == Counter({pid: 1}) and e.fetcher.transfers == 1
        assert len({a.answer for a in answers}) == 1 and all(a.tokens == 6 for a in answers)


@pytest.mark.parametrize("strategy", ["pie", "samkv"])
@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_a_pack_damaged_on_disk_is_fetched_again_inside_the_ask(cloud, tmp_path, strategy, damage,
                                                                caplog):
    """pie decodes each pack whole before the answer starts (damage found at load); samkv
    opens it and decodes rows in the scheduler (damage found there: the answer runs again)."""
    with edge(cloud, tmp_path) as e:
        before = e.ask(QUESTIONS[2], strategy=strategy)
        (pid,) = {e.local["segments"][i]["pack_id"] for i in before.segments[-1:]}
    path = tmp_path / "packs" / f"{pid}.kvp"
    good = path.read_bytes()
    if damage == "flip":
        broken = bytearray(good)
        broken[-100] ^= 0x20  # a payload byte: same name, same size
        path.write_bytes(bytes(broken))
    else:
        path.unlink()
    with edge(cloud, tmp_path) as e, caplog.at_level(logging.WARNING, "kvedge.edge"):
        after = e.ask(QUESTIONS[2], strategy=strategy)  # restarted: nothing decoded in memory
        assert (after.answer, list(after.segments)) == (before.answer, list(before.segments))
        assert e.client.transfers == Counter({pid: 1}) and path.read_bytes() == good
    found = {"pie": "fetching it again", "samkv": "found damaged while answering"}[strategy]
    assert (found in caplog.text) == (damage == "flip")  # a deleted pack is simply missing


def test_a_transfer_damaged_on_the_wire_is_fetched_again_inside_the_ask(cloud, tmp_path):
    with edge(cloud, tmp_path) as e:
        (pid,) = pack_of(e, QUESTIONS[0])
        e.client.garble.add(pid)
        assert e.ask(QUESTIONS[0], top_k=1).tokens == 6
        assert e.client.transfers == Counter({pid: 2}) and e.fetcher.fetched_packs == 1


def test_the_cloud_down_cached_packs_answer_and_missing_ones_are_named(cloud, tmp_path):
    data = tmp_path / "own-cloud"
    server, gateway, address, token = in_process_gateway(data, MODEL, 24)
    own = {"address": address, "token": token}
    try:
        with CloudClient(own["address"], own["token"]) as c:
            upload(c, tmp_path)
        gateway.pool.shutdown()  # its CPU back to the other tests' actors
        with edge(own, tmp_path / "edge") as e:
            first = e.ask(QUESTIONS[3], top_k=1)
            server.stop(0)
            assert e.ask(QUESTIONS[3], top_k=1).answer == first.answer  # cached: answers
            (missing,) = pack_of(e, QUESTIONS[4])
            assert missing not in cached(e)
            (index,) = [s["index"] for s in e.local["segments"] if s["pack_id"] == missing]
            with pytest.raises(PackUnavailable) as err:
                e.ask(QUESTIONS[4], top_k=1)
            assert f"segment {index} (epsilon.md, pack {missing[:12]}" in str(err.value)
            assert "unreachable" in str(err.value) and "default/towns" in str(err.value)
            # recompute needs the segment's token ids alone, which the sync kept: it answers
            assert e.ask(QUESTIONS[4], top_k=1, strategy="recompute").tokens == 6
            assert missing not in cached(e)
    finally:
        server.stop(0)


def test_the_disk_stays_within_cache_bytes_on_a_kb_larger_than_the_cache(cloud, tmp_path):
    sizes = [s.pack_bytes for s in cloud["info"].segments]
    budget = 3 * max(sizes)  # a third of the KB or less: room for one answer's 2 packs
    assert sum(sizes) > 3 * budget
    with edge(cloud, tmp_path, cache_bytes=budget) as e:
        for question in QUESTIONS * 2:
            assert e.ask(question).tokens == 6
            assert disk_bytes(e) <= budget
        assert e.cache.stats.disk_evictions > 0
        assert not list(e.cache.root.glob("*.part"))


def test_prefetch_fetches_the_segment_ranked_just_below_top_k(cloud, tmp_path):
    with edge(cloud, tmp_path, prefetch=1) as e:
        first, below = pack_of(e, QUESTIONS[5], top_k=2)[::-1]  # best first
        e.ask(QUESTIONS[5], top_k=1)
        deadline = time.monotonic() + 30
        # the pack is in the cache when the fetch returns, and counted just after: wait for both
        while below not in cached(e) or not e.prefetcher.fetched:
            assert time.monotonic() < deadline, "the next-ranked pack was not prefetched"
            time.sleep(0.05)
        assert cached(e) == {first, below} and e.prefetcher.fetched == 1
        assert e.client.transfers == Counter({first: 1, below: 1})


def test_a_cache_too_small_for_prefetch_prefetches_nothing(cloud, tmp_path):
    budget = 4 * max(s.pack_bytes for s in cloud["info"].segments)  # < 32 packs
    with edge(cloud, tmp_path, prefetch=2, cache_bytes=budget) as e:
        (first,) = pack_of(e, QUESTIONS[0])
        e.ask(QUESTIONS[0], top_k=1)
        time.sleep(0.5)
        assert cached(e) == {first} and e.prefetcher.fetched == 0


def test_kvedge_serve_kb_is_on_demand_and_pin_is_whole(cloud, tmp_path):
    """The daemons as a user starts them: `--kb` fetches nothing until asked, `--pin` every
    pack; both answer alike."""
    packs = {s.pack_id for s in cloud["info"].segments}
    lazy = EdgeProcess(tmp_path / "lazy", cloud["address"], cloud["token"], [KB.key], MODEL,
                       "--prefetch", "0", "--always-fetch")  # packs, not prefills
    whole = EdgeProcess(tmp_path / "whole", cloud["address"], cloud["token"], [], MODEL,
                        "--pin", KB.key)
    try:
        for daemon in (lazy, whole):
            daemon.start(synced=False)
        held = lambda d: {p.stem for p in (d.state / "packs").glob("*.kvp")}  # noqa: E731
        whole.wait_for(lambda: held(whole) == packs and whole.manifest(KB.key).exists(), 90,
                       "every pack of the pinned KB")
        lazy.wait_for(lazy.manifest(KB.key).exists, 90, "the on-demand KB's manifest")
        assert held(lazy) == set()
        answers = []
        for daemon in (lazy, whole):
            with EdgeClient(daemon.address, daemon.token) as c:
                answers.append(list(c.ask("default", KB.kb, QUESTIONS[0], top_k=2,
                                          max_new_tokens=6))[-1])
        assert answers[0].answer == answers[1].answer
        assert len(held(lazy)) == 2 and held(lazy) < packs
        assert lazy.stop() == 0 and whole.stop() == 0
    finally:
        lazy.kill()
        whole.kill()


# ---------------------------------------------------------------------- layer-wise streaming


class Chopped(Recording):
    """Whole-pack transfers in `piece`-byte chunks (as a slow link hands them over); a
    transfer breaks after byte `cut` (ConnectionError) or arrives with the byte at `flip`
    damaged. `pulled`: the end of the last chunk handed over; `offsets`: where each whole
    transfer started."""

    def __init__(self, address, token, piece: int = 256):
        super().__init__(address, token)
        self.piece, self.cut, self.flip, self.pulled, self.offsets = piece, None, None, 0, []

    def fetch_pack(self, namespace, pack_id, offset=0, length=0):
        if length:
            yield from super().fetch_pack(namespace, pack_id, offset, length)
            return
        self.offsets.append(offset)
        for chunk in super().fetch_pack(namespace, pack_id, offset, length):
            for start in range(0, len(chunk.data), self.piece):
                yield from self._piece(chunk.offset + start,
                                       bytearray(chunk.data[start:start + self.piece]),
                                       chunk.total)

    def _piece(self, at: int, data: bytearray, total: int):
        if self.cut is not None and at + len(data) > self.cut:
            cut, self.cut = self.cut, None
            yield SimpleNamespace(offset=at, data=bytes(data[:cut - at]), total=total)
            raise ConnectionError("connection reset mid-layer")
        if self.flip is not None and at <= self.flip < at + len(data):
            data[self.flip - at] ^= 0x10
            self.flip = None
        self.pulled = at + len(data)
        yield SimpleNamespace(offset=at, data=bytes(data), total=total)


def whole_pack(cloud, pid: str) -> bytes:
    with CloudClient(cloud["address"], cloud["token"]) as c:
        return b"".join(ch.data for ch in c.fetch_pack("default", pid))


def test_a_pack_decoded_while_it_arrives_equals_fetch_then_load(cloud, tmp_path):
    """The edge's cold path (decoding each pack as it arrives) against fetch-then-load:
    the same files, the same contexts bit for bit, the same answers."""
    with edge(cloud, tmp_path / "streamed") as s, \
            edge(cloud, tmp_path / "whole", stream=False) as w:
        streamed, whole = s.ask(QUESTIONS[3]), w.ask(QUESTIONS[3])
        assert (streamed.answer, list(streamed.segments)) == (whole.answer, list(whole.segments))
        assert s.cache.stats.misses == 0 and w.cache.stats.misses == 2  # none read back
        for pid in pack_of(s, QUESTIONS[3], 2):
            assert s.cache.path(pid).read_bytes() == w.cache.path(pid).read_bytes()
            assert_equal(s.cache.load(pid), read_pack(w.cache.path(pid)))


def test_an_idle_edge_computes_on_the_packs_as_they_arrive(cloud, tmp_path, monkeypatch):
    """The ask submits its answer once the missing packs' manifests are in (the transfers
    under way together, once the link is measured) and answers as an edge that fetches
    first does. (Loopback brings the tiny packs in far under OVERLAP_MIN_S: lowered here.)"""
    import kvedge.edge.engine as engine

    monkeypatch.setattr(engine, "OVERLAP_MIN_S", 0.0)
    with edge(cloud, tmp_path / "overlap") as o, \
            edge(cloud, tmp_path / "first", overlap=False) as f:
        started = []
        arriving = o.fetcher.arriving
        o.fetcher.arriving = lambda ns, pid: started.append(pid) or arriving(ns, pid)
        o.ask(QUESTIONS[0], top_k=1), f.ask(QUESTIONS[0], top_k=1)
        assert started == pack_of(o, QUESTIONS[0])  # one pack alone: the link measured
        assert o.fetcher.link.seconds(1) is not None
        missing = [p for p in pack_of(o, QUESTIONS[5], 2) if p not in cached(o)]
        started.clear()
        overlapped, fetched_first = o.ask(QUESTIONS[5]), f.ask(QUESTIONS[5])
        assert len(missing) == 2 and sorted(started) == sorted(missing)
        assert (overlapped.answer, list(overlapped.segments)) == \
            (fetched_first.answer, list(fetched_first.segments))
        assert o.client.transfers == f.client.transfers  # one transfer a pack either way
        again = o.ask(QUESTIONS[5])  # cached now: nothing arrives
        assert sorted(started) == sorted(missing) and again.answer == overlapped.answer


def test_packs_the_link_brings_in_quickly_are_fetched_first(cloud, tmp_path):
    with edge(cloud, tmp_path) as e:
        started = []
        arriving = e.fetcher.arriving
        e.fetcher.arriving = lambda ns, pid: started.append(pid) or arriving(ns, pid)
        e.ask(QUESTIONS[0], top_k=1)  # one pack, the link not known yet: it arrives alone
        assert len(started) == 1 and e.fetcher.link.seconds(1) is not None
        e.ask(QUESTIONS[5])  # loopback: two packs in well under OVERLAP_MIN_S
        assert len(started) == 1


def test_a_stream_cut_mid_layer_resumes_where_it_broke(cloud, tmp_path):
    pid = cloud["info"].segments[0].pack_id
    data, fp = whole_pack(cloud, pid), load_model(MODEL).fingerprint
    cut = layer_end(data, 1) - 7  # inside layer 1's last value head
    client = Chopped(cloud["address"], cloud["token"])
    client.cut = cut
    with pytest.raises(ConnectionError):
        Fetcher(client, PackCache(tmp_path, fp)).fetch("default", pid, decode=True)
    cache = PackCache(tmp_path, fp)  # the edge restarted: what arrived is on disk alone
    assert cache.held(pid) == cut and not cache.has(pid)
    assert Fetcher(client, cache).fetch("default", pid, decode=True)
    assert client.offsets == [0, cut] and cache.path(pid).read_bytes() == data
    assert_equal(cache.load(pid), read_pack(data))
    assert cache.stats.misses == 0  # the context decoded while it arrived, not read back
    client.close()


def test_a_damaged_byte_in_layer_k_is_found_before_later_layers_arrive(cloud, tmp_path):
    pid = cloud["info"].segments[0].pack_id
    data, fp = whole_pack(cloud, pid), load_model(MODEL).fingerprint
    client, cache = Chopped(cloud["address"], cloud["token"]), PackCache(tmp_path, fp)
    end = layer_end(data, 1)
    client.flip = end - 7
    with pytest.raises(PackCorrupt, match="checksum mismatch") as err:
        Fetcher(client, cache).fetch("default", pid, decode=True)
    assert err.value.tensor.startswith("v.1.")  # the tensor it hit, in layer 1
    assert client.pulled < end + client.piece < len(data)  # the stream stopped there
    assert cache.held(pid) == 0 and not cache.has(pid)  # nothing kept to resume from
    assert Fetcher(client, cache).fetch("default", pid, decode=True)
    assert cache.path(pid).read_bytes() == data
    client.close()
