"""The edge's loader (kvedge.edge.loader): packs → the runtime's cache, streamed layer by layer.

The oracle is the cache assembly the edge had before the loader (decode every pack whole,
then rotate per layer), kept here verbatim as `reference_assemble_cache`: the loader's cache
must equal it bit for bit for every codec, dense and ragged, realigned or not, from packs
(decoded layer by layer) and from decoded contexts alike.
"""
import numpy as np
import pytest
import torch

from conftest import tiny_runtime
from kvedge.common.model.generate import generate
from kvedge.common.model.kvcache import DenseKV, Extent, KVCache, RaggedKV
from kvedge.common.pack import DEFAULT_CODEC, KVContext, PackCorrupt, encode_pack, open_pack
from kvedge.common.pack.container import open_container
from kvedge.common.pack.segment import PackSegment
from kvedge.edge.loader import StreamingCache, load_cache
from kvedge.edge.strategies import STRATEGIES, Composed, get_strategy

CODECS = ["fp16", DEFAULT_CODEC, "int4+zstd", "kvtc", "cachegen+zstd"]


def reference_assemble_cache(rt, composed, *, realign=True, reserve=0, seq_len=None):
    """`assemble_cache` as it was before the loader (decoded contexts in, one cache out)."""
    offsets = composed.offsets
    n_prefix = composed.n_prefix
    prefix_pos = torch.arange(n_prefix)
    seq_len = seq_len or composed.question_start + reserve
    ranks = [torch.tensor(seg.positions) for seg in composed.segments]
    layers = []
    for layer in range(rt.n_layers):
        heads_k, heads_v, heads_pos, heads_rope = [], [], [], []
        for head in range(rt.n_kv):
            ks, vs = [composed.prefix_keys[layer][head]], [composed.prefix_values[layer][head]]
            ps, rope = [prefix_pos], [prefix_pos]
            for seg, off, seg_ranks in zip(composed.segments, offsets, ranks):
                kept = seg.kept_positions[layer][head].to(torch.long)
                local = torch.searchsorted(seg_ranks, kept)
                ks.append(seg.keys[layer][head].to(rt.dtype))
                vs.append(seg.values[layer][head].to(rt.dtype))
                ps.append(local + off)
                rope.append(local + off if realign else local)
            heads_k.append(torch.cat(ks))
            heads_v.append(torch.cat(vs))
            heads_pos.append(torch.cat(ps))
            heads_rope.append(torch.cat(rope))
        full = n_prefix + composed.n_context
        if all(p.numel() == full for p in heads_pos) and \
                all(torch.equal(r, heads_rope[0]) for r in heads_rope[1:]):
            keys = rt.realign(torch.stack(heads_k), heads_rope[0], seq_len)
            layers.append(DenseKV(keys, torch.stack(heads_v), heads_pos[0], reserve))
        else:
            keys = [rt.realign(k, r, seq_len) for k, r in zip(heads_k, heads_rope)]
            layers.append(RaggedKV(keys, heads_v, heads_pos, reserve))
    segments = [(off, off + seg.n_tokens) for seg, off in zip(composed.segments, offsets)]
    return KVCache(layers, Extent([(0, n_prefix)] + segments), seq_len)


# ---------------------------------------------------------------------- fixtures
def contexts(rt, sizes=(30, 24, 41), seed=0, ragged=False):
    gen = torch.Generator().manual_seed(seed)
    out = []
    for n in sizes:
        ids = torch.randint(0, 250, (n,), generator=gen)
        res = rt.prefill(ids, want_queries=True)
        ctx = KVContext.from_dense(res.keys, res.values, ids.tolist(), queries=res.queries,
                                   model_fingerprint="ab" * 8, tokenizer_id="cd",
                                   query_tokens=8, block_size=8)
        if ragged:  # head h keeps every (h+2)-th token, and the last one
            ctx = ctx.select([[torch.unique(torch.cat([p[:: h + 2], p[-1:]]))
                               for h, p in enumerate(layer)] for layer in ctx.kept_positions])
        out.append(ctx)
    return out


def compose(rt, segments, seed=0, texts=True):
    gen = torch.Generator().manual_seed(seed + 100)
    prefix = torch.randint(0, 250, (6,), generator=gen)
    pre = rt.prefill(prefix)
    fresh = ([], torch.randint(0, 250, (5,), generator=gen).tolist()) if texts else ()
    question = torch.randint(0, 250, (7,), generator=gen).tolist()
    return Composed(prefix.tolist(), pre.keys, pre.values, segments, question, fresh)


def packed(ctxs, codec):
    """Each context through a pack: (the pack's segment, the pack decoded whole)."""
    packs = [encode_pack(c, codec) for c in ctxs]
    return [PackSegment.open(p) for p in packs], [open_pack(p).context() for p in packs]


def assert_same(got: KVCache, want: KVCache):
    assert got.extent == want.extent and got.seq_len == want.seq_len
    assert [type(layer) for layer in got] == [type(layer) for layer in want]
    for mine, theirs in zip(got, want):
        for a, b in zip(mine.heads(), theirs.heads(), strict=True):
            assert a.first == b.first
            for x, y in ((a.keys, b.keys), (a.values, b.values), (a.positions, b.positions)):
                assert x.dtype == y.dtype and torch.equal(x, y)


# ---------------------------------------------------------------------- exactness
@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3"])
@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("ragged", [False, True])
def test_the_loaded_cache_is_the_old_assembly_bit_for_bit(model, codec, ragged):
    rt = tiny_runtime(model)
    segments, decoded = packed(contexts(rt, ragged=ragged), codec)
    for realign in (True, False):
        want = reference_assemble_cache(rt, compose(rt, decoded), realign=realign, reserve=9)
        for segs in (segments, decoded):  # streamed from the packs, or from decoded contexts
            assert_same(load_cache(rt, compose(rt, segs), realign=realign, reserve=9), want)


def test_streaming_builds_what_building_at_once_does():
    rt = tiny_runtime("tiny-mistral")
    segments, _ = packed(contexts(rt, ragged=True), DEFAULT_CODEC)
    composed = compose(rt, segments)
    streamed = load_cache(rt, composed, reserve=4)
    assert isinstance(streamed, StreamingCache)
    assert_same(streamed, load_cache(rt, composed, reserve=4, stream=False))


def test_a_pack_segment_reads_as_its_context():
    rt = tiny_runtime("tiny-qwen2")
    (ctx,) = contexts(rt, sizes=(33,), ragged=True)
    seg = PackSegment.open(encode_pack(ctx, "fp16"))
    for name in ("token_ids", "positions", "segments", "block_size", "n_layers", "n_kv_heads",
                 "head_dim", "n_tokens"):
        assert getattr(seg, name) == getattr(ctx, name), name
    for layer in range(ctx.n_layers):
        for h in range(ctx.n_kv_heads):
            assert torch.equal(seg.kept_positions[layer][h], ctx.kept_positions[layer][h])
            assert torch.equal(seg.ranks(layer, h), ctx.ranks(layer, h))
            assert torch.equal(seg.keys[layer][h], ctx.keys[layer][h].half().float())
    for side in ("block_summaries", "query_cache"):
        for mine, theirs in zip(getattr(seg, side), getattr(ctx, side), strict=True):
            assert torch.allclose(mine, theirs, atol=1e-2)
    keep = [[p[::2] for p in layer] for layer in ctx.kept_positions]
    assert seg.select(keep).n_tokens == 33


def test_the_fused_kernel_path_matches_the_torch_path(monkeypatch):
    """The CUDA path (Triton's dequantize+RoPE, one launch per quantization layout, here in
    its CPU interpreter) against the batched torch path it falls back to: fp32 math in a
    different order, ≤ 1e-5. cachegen's pieces mix layouts (full-precision first and last
    tokens), so the rows of several launches are put back in order."""
    pytest.importorskip("triton")
    import kvedge.common.pack.realign as realign
    import kvedge.kernels.dequant_rope as dequant
    import kvedge.kernels.rope as rope

    rt = tiny_runtime("tiny-llama")
    segments, _ = packed(contexts(rt, sizes=(20, 17), ragged=True), "cachegen+zstd")
    composed = compose(rt, segments)
    want = load_cache(rt, composed, reserve=3, stream=False)
    for module in (realign, dequant, rope):
        monkeypatch.setattr(module, "use_triton", lambda x: True)
    got = load_cache(rt, composed, reserve=3, stream=False)
    for mine, theirs in zip(got, want):
        for a, b in zip(mine.heads(), theirs.heads(), strict=True):
            assert torch.equal(a.positions, b.positions)
            torch.testing.assert_close(a.keys, b.keys, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(a.values, b.values, atol=1e-6, rtol=1e-6)


# ---------------------------------------------------------------------- strategies
@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_answers_the_same_from_packs_as_from_decoded_contexts(name):
    """Strategies read the cache (and the segments) before their forward in different ways —
    CacheBlend layer 1's values, SamKV whole keys and side tensors — and must not care
    whether a segment is still a pack."""
    rt = tiny_runtime("tiny-qwen3")
    segments, decoded = packed(contexts(rt, sizes=(40, 33, 48), seed=5), DEFAULT_CODEC)
    answers = []
    for segs in (segments, decoded):
        composed = compose(rt, segs, seed=5)
        plan = get_strategy(name).plan(rt, composed, reserve=5)
        tokens = list(generate(rt, plan.cache, plan.run_ids, plan.run_positions, 5,
                               active=plan.active, observe=plan.observe))
        answers.append((tokens, plan.recomputed))
    assert answers[0] == answers[1]


# ---------------------------------------------------------------------- damage
def corrupt(data: bytes, tensor: str) -> bytes:
    """The pack with one byte of `tensor`'s first part flipped (its checksum fails)."""
    container = open_container(data)
    part = next(raw for name, raw in container.parts.items() if name.startswith(tensor + "/"))
    at = np.frombuffer(part.data, np.uint8).ctypes.data - np.frombuffer(data, np.uint8).ctypes.data
    out = bytearray(data)
    out[at + part.data.nbytes // 2] ^= 0x10
    return bytes(out)


@pytest.mark.parametrize("name", ["a3", "pie"])
def test_a_damaged_layer_met_while_streaming_fails_the_request_by_name(name):
    """Layer 1 of 3 of the second pack is damaged: the forward has used layer 0 when the
    loader meets it; the request fails with PackCorrupt naming the tensor, and layer 0 is
    left as the loader built it (the forward's writes undone)."""
    rt = tiny_runtime("tiny-llama")
    good = [encode_pack(c, DEFAULT_CODEC) for c in contexts(rt)]
    bad = [good[0], corrupt(good[1], "k.1.1"), good[2]]
    plans = [get_strategy(name).plan(rt, compose(rt, [PackSegment.open(p) for p in packs]),
                                     reserve=4) for packs in (good, bad)]
    plan = plans[1]
    with pytest.raises(PackCorrupt, match="checksum") as err:
        list(generate(rt, plan.cache, plan.run_ids, plan.run_positions, 4, active=plan.active,
                      observe=plan.observe))
    assert err.value.tensor == "k.1.1"
    with pytest.raises(PackCorrupt):
        plan.cache[2]  # every later layer says so too
    assert plan.cache.extent == plans[0].cache.extent  # the failed forward added nothing
    for a, b in zip(plan.cache[0].heads(), plans[0].cache[0].heads(), strict=True):
        for x, y in ((a.keys, b.keys), (a.values, b.values), (a.positions, b.positions)):
            assert torch.equal(x, y)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("ragged", [False, True])
def test_block_granular_loading_equals_decoding_whole_then_selecting(codec, ragged):
    """A selection of a pack's rows (`PackSegment.select`: blocks, scattered rows, nothing)
    loads to the bit what decoding the pack whole and selecting gives, through the loader
    and through `held_rows` — kvtc's inverse transform of the chosen rows alone included."""
    rt = tiny_runtime("tiny-llama")
    segments, decoded = packed(contexts(rt, ragged=ragged), codec)
    gen = torch.Generator().manual_seed(3)
    keep = [[[held[torch.rand(held.numel(), generator=gen) < share]
              for held in layer] for layer in seg.kept_positions]
            for seg, share in zip(segments, (0.5, 0.0, 1.0))]
    keep[0][0][0] = segments[0].kept_positions[0][0][:8]  # one whole block
    picked = [seg.select(k) for seg, k in zip(segments, keep)]
    want = [ctx.select(k) for ctx, k in zip(decoded, keep)]
    assert_same(load_cache(rt, compose(rt, picked), reserve=4),
                reference_assemble_cache(rt, compose(rt, want), reserve=4))
    assert all(seg._decoded is None for seg in segments + picked)
    for layer in range(rt.n_layers):
        rows = torch.arange(0, segments[2].kept_positions[layer][1].numel(), 3)
        for kind, held in (("k", decoded[2].keys), ("v", decoded[2].values)):
            assert torch.equal(segments[2].held_rows(layer, 1, kind, rows), held[layer][1][rows])
