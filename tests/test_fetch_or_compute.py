"""Fetch or compute, per segment (edge.fetch_or_compute, edge.meters, edge.local_prefill):
the meters' fits and the choice alone (torch-free), the edge's segment prefill against the
cloud's, then a real gateway (anchored packs, fp32: exact KV) and edges behind an emulated
link, the tiny random model.

What equality holds: a computed segment is the exact prefill the cloud runs before its codec,
so over a KB stored in fp32 (lossless) an answer from computed segments equals the answer
from fetched ones — same text, same segments (the strategy, EPIC, reads keys and values; the
fp16 side tensors SamKV reads are the only lossy part of an fp32 pack).
"""
import logging
import time

import pytest
import torch

from kvedge.bench.link import LinkEmulator
from kvedge.common.net.cloud_client import CloudClient
from kvedge.edge.fetch_or_compute import FetchOrCompute
from kvedge.edge.meters import Line, LinkMeter, PrefillMeter, theil_sen
from kvedge.edge.sync import encode_ids
from test_on_demand import DOCS, KB, MODEL, QUESTIONS, cached, edge


# ---------------------------------------------------------------------- meters


def test_theil_sen_finds_the_round_trip_and_the_bandwidth_past_an_outlier():
    rtt, rate = 0.02, 1.25e6  # 10 Mbit/s
    points = [(b, rtt + b / rate) for b in (2**20, 3 * 2**20, 40_000, 2**21, 700_000)]
    points.append((2**20, 5.0))  # one transfer stalled
    line = theil_sen(points)
    assert line.fixed == pytest.approx(rtt, abs=1e-3)
    assert 1 / line.per_unit == pytest.approx(rate, rel=1e-3)


def test_theil_sen_with_sizes_alike_goes_through_the_origin():
    assert theil_sen([]) is None
    line = theil_sen([(1000, 0.5), (1010, 0.52), (990, 0.49)])
    assert not line.split and line.fixed == 0 and line.at(1000) == pytest.approx(0.5, rel=0.02)


def transfer(meter: LinkMeter, chunks: list[tuple[int, float]], complete: bool = True):
    """A transfer whose chunks arrive (bytes, seconds since its start)."""
    timing = meter.begin()
    for n, at in chunks:
        timing.arrived(n)
        timing.last_s = at
        if timing.chunks == 1:
            timing.first_s = at
    return lambda: meter.end(timing, complete)


def test_the_link_meter_measures_transfers_that_had_the_link_alone():
    meter = LinkMeter()
    assert meter.seconds(10**6) is None and meter.throughput is None  # nothing fetched
    transfer(meter, [(20_000, 0.036)])()  # one small pack, one chunk: RTT not told apart
    assert meter.rtt_s is None and meter.seconds(20_000) == pytest.approx(0.036)
    transfer(meter, [(2**20, 0.02 + 2**20 / 1.25e6), (2**20, 0.02 + 2**21 / 1.25e6)])()
    assert meter.rtt_s == pytest.approx(0.02, abs=1e-6)  # two chunks: two points
    assert meter.throughput == pytest.approx(1.25e6, rel=1e-6)
    # overlapping transfers share the bandwidth, a broken one ends early: neither counts
    ends = [transfer(meter, [(2**20, 9.0)]), transfer(meter, [(2**20, 9.0)])]
    for end in ends:
        end()
    transfer(meter, [(2**20, 9.0)], complete=False)()
    assert meter.seconds(2**21) == pytest.approx(0.02 + 2**21 / 1.25e6)


def choose(link: Line | None, prefill: Line | None, meta: dict, held=()) -> bool:
    """The choice for one segment, the meters fitted to the given lines."""
    links, prefills = LinkMeter(), PrefillMeter()
    for size in ((1e5, 1e6) if link else ()):
        transfer(links, [(size, link.at(size))])()
    for size in ((64, 256) if prefill else ()):
        prefills.add(size, prefill.at(size))
    (c,) = FetchOrCompute(links, prefills, held=lambda pid: pid in held).choose([meta])
    return c.compute


SEGMENT = {"index": 3, "pack_id": "p3", "n_tokens": 256, "pack_bytes": 2 * 2**20,
           "token_ids": encode_ids(list(range(256)))}
SLOW, FAST = Line(0.02, 8 / 10e6), Line(0.02, 8 / 1e9)    # 10 Mbit/s and 1 Gbit/s, 20 ms
PREFILL = Line(0.05, 1 / 1500)                             # ~0.22 s for 256 tokens


def test_the_choice_is_the_sooner_side_and_fetch_when_unsure():
    assert choose(SLOW, PREFILL, SEGMENT)        # 1.7 s fetch against 0.22 s prefill
    assert not choose(FAST, PREFILL, SEGMENT)    # 0.037 s fetch
    assert not choose(None, PREFILL, SEGMENT)    # the link unknown
    assert not choose(SLOW, None, SEGMENT)       # the prefill unknown
    no_ids = {k: v for k, v in SEGMENT.items() if k != "token_ids"}
    assert not choose(SLOW, PREFILL, no_ids)     # a manifest synced before ids were kept
    assert choose(FAST, PREFILL, SEGMENT, held={"p3"})  # computed before, still in memory


# ---------------------------------------------------------------------- the segment prefill


@pytest.fixture(scope="module")
def prefill_engine():
    from kvedge.cloud.workers import PrefillEngine

    return PrefillEngine(MODEL)


@pytest.mark.parametrize("anchored", [False, True])
def test_the_edges_segment_prefill_is_the_clouds(prefill_engine, anchored):
    """The edge's anchor (its own chat prefix KV) is the cloud's: the shared prefill
    (`kvedge.common.pack.prefill`) behind it gives the cloud's tensors and pack content."""
    from kvedge.cloud.ingest import TextSegment
    from kvedge.common.pack import prefill
    from kvedge.common.pack.format import read_pack
    from kvedge.edge.engine import EdgeEngine

    ids = torch.randint(0, 250, (150,), generator=torch.Generator().manual_seed(3)).tolist()
    edge_engine = EdgeEngine(prefill_engine.loaded)
    anchor = prefill.Anchor(edge_engine.prefix_ids, edge_engine.prefix_keys,
                            edge_engine.prefix_values) if anchored else None
    mine = prefill.prefill_segment(prefill_engine.rt, ids, anchor)
    theirs = prefill_engine.prefill_segment(ids, anchored)
    assert all(torch.equal(a, b) for x, y in zip(mine, theirs) for a, b in zip(x, y))
    ctx = prefill.segment_context(
        prefill_engine.rt, ids, fingerprint=prefill_engine.loaded.fingerprint,
        tokenizer_id=prefill_engine.loaded.tokenizer_id, namespace="ns", anchor=anchor)
    pack = read_pack(prefill_engine.encode(TextSegment(0, "d.md", "", ids), "ns", "fp32",
                                           anchored).data)
    assert (ctx.anchor, ctx.positions, ctx.token_ids) == (pack.anchor, pack.positions, ids)
    for layer in range(ctx.n_layers):
        for head in range(ctx.n_kv_heads):
            assert torch.equal(ctx.keys[layer][head], pack.keys[layer][head])
            assert torch.equal(ctx.values[layer][head], pack.values[layer][head])
        # the side tensors travel in fp16
        assert torch.allclose(ctx.query_cache[layer], pack.query_cache[layer].float(),
                              atol=1e-3)
    edge_engine.close()


# ---------------------------------------------------------------------- over a link


@pytest.fixture(scope="module")
def cloud(tmp_path_factory):
    """A gateway prefilling anchored packs; the KB stored in fp32, so packs hold exact KV."""
    from kvedge.cloud.gateway import GatewayConfig, serve
    from kvedge.cloud.workers import start_ray

    data, folder = tmp_path_factory.mktemp("cloud"), tmp_path_factory.mktemp("kb")
    start_ray(num_cpus=2)
    server, gateway, port = serve(GatewayConfig(data, model=MODEL, segment_tokens=24,
                                                anchored=True), "127.0.0.1:0")
    address, token = f"127.0.0.1:{port}", (data / "admin.token").read_text().strip()
    for file, text in DOCS.items():
        (folder / file).write_text(text)
    with CloudClient(address, token) as client:
        client.upload(folder, "default", KB.kb, codec="fp32")
        info = client.wait_ready("default", KB.kb, timeout=180)
    gateway.pool.shutdown()  # its CPU back to the tests
    yield {"address": address, "token": token, "info": info}
    server.stop(0)


def ask(e, question: str, top_k: int = 2):
    """In process: the AskResult's fetch-or-compute fields are not on the gRPC wire."""
    *_, done = e.engine.ask(KB, question, top_k=top_k, max_new_tokens=6)
    return done


def ready(e):
    """The edge idle, its prefill calibrated."""
    assert e.engine.scheduler.settle(30) and e.engine.local.meter.line() is not None


def test_over_a_slow_link_a_cold_ask_computes_its_segments(cloud, tmp_path, caplog):
    started = time.monotonic()
    with LinkEmulator(cloud["address"], mbit_s=1, rtt_ms=40) as link, \
            edge(cloud, tmp_path / "slow", address=link.address, fetch_or_compute=True) as e:
        assert all(s["anchored"] for s in e.local["segments"])
        ready(e)
        first = ask(e, QUESTIONS[0], top_k=1)  # the link unknown: fetched, which measures it
        assert first.fetched_segments == first.segments and first.computed_segments == []
        assert e.engine.chooser.link.seconds(first.bytes_loaded) > 0.04  # at least the RTT
        packs, transfers = cached(e), sum(e.client.transfers.values())
        with caplog.at_level(logging.INFO, "kvedge.edge"):
            done = ask(e, QUESTIONS[3])
        assert done.computed_segments == done.segments and done.fetched_segments == []
        assert "computed (compute" in caplog.text and "Mbit/s" in caplog.text
        # nothing fetched, nothing written to the pack cache
        assert cached(e) == packs and sum(e.client.transfers.values()) == transfers
        assert not list(e.cache.root.glob("*.part"))
        prefills = e.engine.local.prefills
        again = ask(e, QUESTIONS[3])  # from the computed segments kept in memory
        assert again.computed_segments == done.segments and e.engine.local.prefills == prefills
        assert again.answer == done.answer
        computed = [ask(e, q) for q in QUESTIONS[1:]]
    with edge(cloud, tmp_path / "exact") as fetching:  # fetches the lossless packs
        exact = [ask(fetching, q) for q in QUESTIONS[1:]]
    assert all(a.fetched_segments == a.segments for a in exact)
    assert all(a.computed_segments == a.segments for a in computed)
    # (a segment prefilled alone instead of behind the anchor changed 4 of these 5 answers)
    assert [(a.answer, a.tokens, a.segments) for a in computed] == \
        [(a.answer, a.tokens, a.segments) for a in exact]
    assert time.monotonic() - started < 20


def test_over_a_fast_link_the_edge_fetches(cloud, tmp_path):
    """No emulator: loopback. The tiny model prefills a segment in milliseconds, about what
    loopback fetches take, so the edge's prefill is set slow (as a large model's would be)."""
    with edge(cloud, tmp_path, fetch_or_compute=True) as e:
        ready(e)
        ask(e, QUESTIONS[0], top_k=1)  # measures the link
        meter = e.engine.local.meter
        meter.clear()
        meter.add(24, 1.0)
        meter.add(48, 2.0)
        done = ask(e, QUESTIONS[3])
        assert done.fetched_segments == done.segments and done.computed_segments == []
        assert {e.local["segments"][i]["pack_id"] for i in done.segments} <= cached(e)


def test_always_fetch_is_the_engines_default_and_a_serve_flag():
    from click.testing import CliRunner

    from kvedge.edge.cli import main

    out = CliRunner().invoke(main, ["serve", "--help"]).output
    assert "--fetch-or-compute / --always-fetch" in out


def test_with_the_cloud_unreachable_a_missing_segment_is_computed(cloud, tmp_path, caplog):
    """The edge chose to fetch (a measured link, a slow prefill), but the fetch fails: the
    segment is prefilled here instead, and the answer is the one the lossless packs give."""
    with edge(cloud, tmp_path / "exact") as fetching:
        want = ask(fetching, QUESTIONS[3])
    with edge(cloud, tmp_path / "down", fetch_or_compute=True) as e:
        ready(e)
        ask(e, QUESTIONS[0], top_k=1)  # measures the link
        e.engine.local.meter.clear()
        e.engine.local.meter.add(24, 1.0)  # prefill "slow": fetching is the choice
        e.engine.local.meter.add(48, 2.0)

        def unreachable(*args, **kwargs):
            raise ConnectionError("the cloud is down")
            yield  # a generator, as the client's is
        e.client.fetch_pack = unreachable
        missing = {i for i in want.segments
                   if e.local["segments"][i]["pack_id"] not in cached(e)}
        with caplog.at_level(logging.WARNING, "kvedge.edge"):
            done = ask(e, QUESTIONS[3])
    assert missing and set(done.computed_segments) == missing and not done.fetched_segments
    assert (done.answer, done.segments) == (want.answer, want.segments)
    assert "the cloud is down); computing it on this edge instead" in caplog.text
