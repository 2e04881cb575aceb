"""Packs computed on while they arrive (edge/arriving.py): the loader builds layer l as soon as
every segment's layer l is in, the cache equals the one from the decoded packs bit for bit,
and nothing reaches the forward's last layer before each pack is verified whole."""
import threading

import pytest

from conftest import tiny_runtime
from kvedge.common.pack import PackCorrupt, encode_pack, open_pack, pack_id
from kvedge.common.pack.errors import PackUnavailable
from kvedge.common.pack.stream import PackStream
from kvedge.edge.arriving import Arrival, ArrivingSegment
from kvedge.edge.loader import load_cache
from test_loader import assert_same, compose, contexts
from test_pack_stream import layer_end


class Feeder:
    """A transfer stood in for: feeds a pack's bytes to an Arrival as the fetcher does."""

    def __init__(self, data: bytes, fingerprint: str, claimed: str | None = None):
        self.data, self.arrival = data, Arrival(claimed or pack_id(data))
        self.stream = PackStream(fingerprint, claimed or pack_id(data))
        self.sent = 0

    def feed_to(self, end: int) -> None:
        layers = self.stream.feed(self.data[self.sent:end])
        self.sent = end
        if self.stream.manifest is not None:
            self.arrival.front(self.stream.manifest)
            self.arrival.publish(layers)

    def finish(self) -> None:
        self.feed_to(len(self.data))
        try:
            self.arrival.complete(self.stream.finish())
        except PackCorrupt as err:
            self.arrival.fail(err)


def arriving(rt, codec="int4+zstd", ragged=False, claimed=None):
    ctxs = contexts(rt, sizes=(30, 24), ragged=ragged)
    packs = [encode_pack(c, codec) for c in ctxs]
    feeders = [Feeder(p, "ab" * 8, claimed) for p in packs]
    for f in feeders:  # the header and manifest: what composing needs
        f.feed_to(layer_end(f.data, 0) - 1)
    segments = [ArrivingSegment(f.arrival) for f in feeders]
    return feeders, segments, [open_pack(p).context() for p in packs]


@pytest.mark.parametrize("ragged", [False, True])
def test_layers_are_built_as_they_arrive_and_equal_the_decoded_packs(ragged):
    rt = tiny_runtime("tiny-llama")
    feeders, segments, decoded = arriving(rt, ragged=ragged)
    cache = load_cache(rt, compose(rt, segments), reserve=3)
    assert cache._built == 0  # layer 0 is not in yet for either segment
    for f in feeders:
        f.feed_to(layer_end(f.data, 0))
    cache.wait(1)  # layer 0 built, while the rest of both packs is on the wire
    assert cache._built < rt.n_layers and all(f.sent < len(f.data) for f in feeders)
    last = rt.n_layers - 1
    for f in feeders:
        f.feed_to(layer_end(f.data, last))  # every layer in, the packs not checked whole
    waited = threading.Thread(target=cache.wait)
    waited.start()
    waited.join(0.5)
    assert waited.is_alive() and cache._built == last  # the last layer waits for the check
    for f in feeders:
        f.finish()
    waited.join(10)
    assert cache._built == rt.n_layers
    assert_same(cache, load_cache(rt, compose(rt, decoded), reserve=3, stream=False))


def test_a_pack_that_fails_its_whole_check_fails_the_last_layer_only():
    """A consistent pack other than the one asked for (its bytes hash to another id) decodes
    layer by layer; its last layer, and so the first token, never comes."""
    rt = tiny_runtime("tiny-llama")
    feeders, segments, _ = arriving(rt, claimed="0" * 64)
    cache = load_cache(rt, compose(rt, segments))
    for f in feeders:
        f.feed_to(layer_end(f.data, rt.n_layers - 1))
    cache.wait(rt.n_layers - 1)  # computed on ...
    for f in feeders:
        f.finish()
    with pytest.raises(PackCorrupt, match="does not match the pack id"):
        cache[rt.n_layers - 1]  # ... but never acted on


def test_a_transfer_that_breaks_is_pack_unavailable_to_its_readers():
    arrival = Arrival("f" * 64)
    arrival.fail(ConnectionError("the link went down"))
    with pytest.raises(PackUnavailable, match="the link went down") as err:
        arrival.layer(0)
    assert isinstance(err.value.__cause__, ConnectionError)
    with pytest.raises(PackUnavailable):
        arrival.context()


def test_a_transfer_that_stalls_gives_its_readers_up():
    """A reader waits on the scheduler's thread: no byte for `stall_s` is PackUnavailable
    (the engine then fetches the blocking way), not a wait until gRPC's deadline."""
    arrival = Arrival("e" * 64, stall_s=0.2)
    with pytest.raises(PackUnavailable, match="brought no byte"):
        arrival.manifest()
