"""The fetcher alone: single-flight transfers, errors shared with waiters, stop, eviction
after a transfer. Against the in-process fake cloud of tests/test_sync.py; the real gRPC path
is tests/test_on_demand.py."""
import threading
import time

import pytest

from kvedge.common.pack import pack_id
from kvedge.edge.fetcher import Fetcher, FetchStopped
from kvedge.edge.packcache import PackCache
from test_sync import FP, KB, FakeCloud, make_pack


@pytest.fixture(scope="module")
def packs() -> list[bytes]:
    return [make_pack(seed) for seed in range(1, 4)]


class GatedCloud(FakeCloud):
    """Every transfer waits at `gate` before its first chunk; `fail` makes it break there."""

    def __init__(self):
        super().__init__()
        self.gate, self.fail, self.calls = threading.Event(), None, 0

    def fetch_pack(self, namespace, pack_id, offset=0, length=0):
        self.calls += 1
        stream = super().fetch_pack(namespace, pack_id, offset, length)
        self.gate.wait(30)
        if self.fail is not None:
            raise self.fail
        yield from stream


def fetch_together(fetcher, pid, n=16) -> list:
    """n threads fetch `pid` at once; each one's result or error."""
    results, started = [None] * n, threading.Barrier(n + 1)

    def one(i):
        started.wait()
        try:
            results[i] = fetcher.fetch("default", pid)
        except Exception as err:  # noqa: BLE001 - the test looks at it
            results[i] = err

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    started.wait()
    while fetcher.in_flight(pid) < n:  # every one joined the transfer before it may end
        time.sleep(0.001)
    return threads, results


def test_concurrent_fetches_of_one_pack_share_one_transfer(tmp_path, packs):
    cloud, cache = GatedCloud(), PackCache(tmp_path, FP)
    cloud.publish(KB, packs[:1])
    fetcher, pid = Fetcher(cloud, cache), pack_id(packs[0])
    threads, results = fetch_together(fetcher, pid)
    cloud.gate.set()
    for t in threads:
        t.join(30)
    assert cloud.calls == 1 and fetcher.transfers == 1 and fetcher.fetched_packs == 1
    assert sorted(results) == [False] * 15 + [True]  # one transferred, the others waited
    assert cache.path(pid).read_bytes() == packs[0]
    assert fetcher.fetch("default", pid) is False and cloud.calls == 1  # cached now


def test_waiters_get_the_transfers_error_and_a_later_fetch_tries_again(tmp_path, packs):
    cloud, cache = GatedCloud(), PackCache(tmp_path, FP)
    cloud.publish(KB, packs[:1])
    fetcher, pid = Fetcher(cloud, cache), pack_id(packs[0])
    cloud.fail = ConnectionError("connection reset")
    threads, results = fetch_together(fetcher, pid)
    cloud.gate.set()
    for t in threads:
        t.join(30)
    assert cloud.calls == 1
    assert all(isinstance(r, ConnectionError) for r in results) and not cache.has(pid)
    cloud.fail = None
    assert fetcher.fetch("default", pid) is True and cloud.calls == 2


def test_a_stopped_fetcher_keeps_what_arrived(tmp_path, packs):
    cloud, cache = FakeCloud(), PackCache(tmp_path, FP)
    cloud.publish(KB, packs[:1])
    fetcher, pid = Fetcher(cloud, cache), pack_id(packs[0])
    fetcher.stop()
    with pytest.raises(FetchStopped):
        fetcher.fetch("default", pid)
    assert 0 < cache.held(pid) < len(packs[0]) and not cache.has(pid)


def test_a_transfer_keeps_the_cache_in_budget_but_never_drops_a_held_pack(tmp_path, packs):
    cloud = FakeCloud()
    cloud.publish(KB, packs)
    cache = PackCache(tmp_path, FP, capacity_bytes=len(packs[0]) + 8)  # about one pack
    fetcher = Fetcher(cloud, cache)
    a, b, c = (pack_id(p) for p in packs)
    with cache.hold([a, b]):
        fetcher.fetch("default", a)
        fetcher.fetch("default", b)
        assert cache.has(a) and cache.has(b)  # over budget while an answer reads both
    assert sum(cache.has(p) for p in (a, b)) == 1  # the hold ended: back within budget
    fetcher.fetch("default", c)
    assert cache.has(c) and not cache.has(a) and not cache.has(b)


class TimedCloud(FakeCloud):
    """Each whole-pack transfer takes `seconds` before its first chunk; when each started and
    ended is recorded."""

    def __init__(self, seconds: float):
        super().__init__()
        self.seconds, self.spans = seconds, []

    def fetch_pack(self, namespace, pack_id, offset=0, length=0):
        start = time.perf_counter()
        time.sleep(self.seconds)
        yield from super().fetch_pack(namespace, pack_id, offset, length)
        self.spans.append((pack_id, start, time.perf_counter()))


def test_fetch_in_order_runs_one_transfer_after_another_and_fetch_joins_them(tmp_path, packs):
    cloud, cache = TimedCloud(0.2), PackCache(tmp_path, FP)
    cloud.publish(KB, packs)
    fetcher, ids = Fetcher(cloud, cache), [pack_id(p) for p in packs]
    fetcher.fetch_in_order("default", ids, decode=True)
    for pid in ids:  # joins the transfer under way (or leads it, if it comes first)
        fetcher.fetch("default", pid, decode=True)
    assert [pid for pid, *_ in cloud.spans] == ids and fetcher.transfers == 3
    assert all(a[2] <= b[1] for a, b in zip(cloud.spans, cloud.spans[1:]))  # never two at once
    assert all(cache.path(pid).read_bytes() == p for pid, p in zip(ids, packs))
    assert cache.stats.misses == 0 and all(cache.load(pid) for pid in ids)  # decoded on arrival
