"""edge/lru.py: the byte-budgeted LRU behind the session cache and the computed segments."""
from kvedge.edge.lru import ByteLRU


def test_least_recently_used_go_first_beyond_the_bytes_or_the_count():
    lru = ByteLRU(budget_bytes=10, max_entries=3)
    assert lru.put("a", 1, 4) == 0 and lru.put("b", 2, 4) == 0
    assert lru.get("a") == 1                # a is now the most recent
    assert lru.put("c", 3, 4) == 1          # 12 bytes > 10: b, the least recent, goes
    assert lru.keys() == ["a", "c"] and "b" not in lru and lru.get("b") is None
    assert lru.put("a", 9, 1) == 0          # replaced: its old bytes no longer count
    assert lru.put("d", 4, 1) == 0 and lru.put("e", 5, 1) == 1  # 4 entries > 3: c goes
    assert lru.keys() == ["a", "d", "e"] and lru.evictions == 2
    lru.clear()
    assert lru.keys() == [] and lru.put("f", 6, 10) == 0  # the byte total restarted at 0
