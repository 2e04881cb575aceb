"""Which variant's pack a missing segment is fetched from (edge/variants.py)."""
from kvedge.edge.variants import ALT_SAVING_S, choose

OWN = {"index": 3, "pack_id": "own", "pack_bytes": 3_000_000, "text": "t", "n_tokens": 256}
SMALL = {**OWN, "pack_id": "small", "pack_bytes": 1_500_000, "variant": "int4"}
TINY = {**OWN, "pack_id": "tiny", "pack_bytes": 500_000, "variant": "kivi"}
OTHER = {**TINY, "pack_id": "other", "text": "another segment"}


def link(mbit: float, rtt: float = 0.02):
    return lambda n: rtt + n * 8 / (mbit * 1e6)


def test_a_slow_link_fetches_the_smallest_variant_of_the_same_segment():
    assert choose(OWN, [SMALL, TINY, OTHER], lambda pid: False, link(10)) is TINY


def test_a_fast_link_fetches_the_kbs_own_pack():
    saved = link(100)(OWN["pack_bytes"]) - link(100)(TINY["pack_bytes"])
    assert saved < ALT_SAVING_S  # 0.2 s at 100 Mbit/s
    assert choose(OWN, [SMALL, TINY], lambda pid: False, link(100)) is OWN


def test_an_unknown_link_or_no_variant_fetches_the_kbs_own_pack():
    assert choose(OWN, [SMALL], lambda pid: False, lambda n: None) is OWN
    assert choose(OWN, [OTHER], lambda pid: False, link(1)) is OWN  # not the same segment


def test_a_cached_pack_is_taken_the_kbs_own_first():
    assert choose(OWN, [SMALL, TINY], lambda pid: pid == "small", link(1)) is SMALL
    assert choose(OWN, [SMALL], lambda pid: True, link(1)) is OWN
