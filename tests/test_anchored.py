"""Anchored segment prefill (docs/design.md decision 9, issue 11 §3 (i)): the cloud prefills a
segment behind the chat prefix, keeps only the segment's KV and says so in the pack."""
import pytest
import torch

from kvedge.cloud.catalog import BASE
from kvedge.cloud.gateway import Gateway, GatewayConfig
from kvedge.cloud.ingest import TextSegment
from kvedge.cloud.workers import LocalPool, PrefillEngine, chat_prefix_ids
from kvedge.common.pack.prefill import QUERY_CACHE_TOKENS
from kvedge.common.pack.format import read_pack


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-mistral", "tiny-qwen3"])
def engine(request):
    return PrefillEngine(request.param)


def segment(n: int = 40, seed: int = 0) -> TextSegment:
    ids = torch.randint(0, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()
    return TextSegment(0, "doc.md", "", ids)


def test_an_anchored_pack_holds_the_segments_kv_from_a_joint_prefill(engine):
    """Exactly the segment's rows of a prefill of [anchor + segment]; positions from 0."""
    seg = segment()
    ctx = read_pack(engine.encode(seg, "ns", "fp32", anchored=True).data, engine.loaded.fingerprint)
    anchor = engine.anchor_ids
    assert anchor and ctx.anchor == anchor == chat_prefix_ids(engine.loaded.tokenizer)
    assert ctx.positions == list(range(len(seg.token_ids)))
    joint = engine.rt.prefill(torch.tensor(anchor + seg.token_ids), want_queries=True,
                              logits="none")
    at = slice(len(anchor), None)
    for layer in range(ctx.n_layers):
        for head in range(ctx.n_kv_heads):
            assert (ctx.keys[layer][head] - joint.keys[layer][head, at]).abs().max() <= 1e-4
            assert (ctx.values[layer][head] - joint.values[layer][head, at]).abs().max() <= 1e-4
        want_q = joint.queries[layer][:, at][:, -QUERY_CACHE_TOKENS:].mean(1, keepdim=True)
        assert (ctx.query_cache[layer].float() - want_q).abs().max() <= 1e-2  # fp16 side codec


def test_alone_and_anchored_packs_differ_and_say_how_they_were_made(engine):
    seg = segment(seed=1)
    alone, anchored = (engine.encode(seg, "ns", "fp32", anchored=a) for a in (False, True))
    assert alone.pack_id != anchored.pack_id
    a, b = (read_pack(e.data) for e in (alone, anchored))
    assert a.anchor == [] and b.anchor == engine.anchor_ids
    assert (a.values[1][0] - b.values[1][0]).abs().max() > 1e-3  # the anchor changed the KV


def test_the_anchor_is_the_edges_chat_prefix_so_a_first_segment_is_exact(engine):
    """Behind the edge's prefix, a prompt's only segment is realigned to where it was
    prefilled: PIE then equals full recompute (the segment boundary is repaired)."""
    from kvedge.edge.engine import EdgeEngine
    from kvedge.edge.strategies import get_strategy

    edge = EdgeEngine(engine.loaded)
    assert edge.prefix_ids == engine.anchor_ids
    seg = segment(seed=2)
    logits = {}
    for name, anchored in (("recompute", False), ("pie", True), ("pie-alone", False)):
        ctx = read_pack(engine.encode(seg, "ns", "fp32", anchored=anchored).data)
        composed = edge.compose([ctx], "what is it?")
        plan = get_strategy(name.split("-")[0]).plan(edge.rt, composed, reserve=0)
        # every question token's logits: a sliding window can hide the segment from the last
        out = edge.rt.forward(plan.run_ids, plan.run_positions, plan.cache, plan.active,
                              logits="all")
        logits[name] = out.logits[-len(composed.question_ids):]
    assert (logits["pie"] - logits["recompute"]).abs().max() <= 1e-4
    assert (logits["pie-alone"] - logits["recompute"]).abs().max() > 1e-3


@pytest.mark.parametrize("anchored", [False, True])
def test_the_gateways_anchored_option_reaches_every_pack(tmp_path, anchored):
    engine = PrefillEngine("tiny-llama")
    config = GatewayConfig(tmp_path, model="tiny-llama", segment_tokens=16, anchored=anchored)
    assert GatewayConfig(tmp_path).anchored is False  # off until measured
    gateway = Gateway(config, LocalPool(engine))
    text = "The alpha code is 1234567. " * 8
    gateway.catalog.begin_ingest("ns", "kb", {"a.md": ("0" * 64, len(text))}, mode="rag",
                                 segment_tokens=16, codec="fp16")
    gateway._ingest("ns", "kb", {"a.md": text}, 16, False, "fp16")
    segments = gateway.catalog.get("ns", "kb", BASE).segments
    assert len(segments) > 1
    for s in segments:
        ctx = read_pack(gateway.store.read(s.pack_id))
        assert ctx.anchor == (engine.anchor_ids if anchored else [])


def test_the_benchmark_builds_anchored_packs_on_request():
    from kvedge.bench.suites import Bench

    bench = Bench("tiny-llama", max_new_tokens=2, segment_tokens=16, anchored=True)
    text = "The beta code is 7654321. " * 6
    anchored = bench.packs(text, False)
    alone = bench.packs(text, False, anchored=False)
    assert len(anchored) > 1 and all(ctx.anchor == bench.prefill.anchor_ids
                                     for ctx, _ in anchored)
    assert all(ctx.anchor == [] for ctx, _ in alone)
    assert bench.engine.prefix_ids == bench.prefill.anchor_ids
