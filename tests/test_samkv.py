"""SamKV (arXiv:2508.11661 Sec. 3): the equations on hand-built vectors, the sparse cache,
recombination rules 1–2 slot by slot, and exactness when everything is kept and recomputed."""
import math

import pytest
import torch

from conftest import tiny_runtime
from kvedge.common.pack.context import KVContext
from kvedge.edge.strategies import Composed, get_strategy
from kvedge.edge.strategies.base import sequence_ratio
from kvedge.edge.strategies.samkv import (consolidated_p, fuse, personalized_queries,
                                          sparse_segments, top_p)


def prompt(rt, sizes=(40, 36, 48), block=8, seed=0, queries=True):
    """[prefix][docs][question], each doc prefilled alone with 8-token blocks and its pooled
    local query (the pack's query cache)."""
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, 250, (5,), generator=gen)
    pre = rt.prefill(prefix)
    docs = []
    for n in sizes:
        ids = torch.randint(0, 250, (n,), generator=gen)
        res = rt.prefill(ids, want_queries=True)
        pooled = [q[:, -2 * block:].mean(1, keepdim=True) for q in res.queries]
        docs.append(KVContext.from_dense(res.keys, res.values, ids.tolist(), model_fingerprint="0",
                                         tokenizer_id="0", block_size=block,
                                         queries=pooled if queries else None, query_tokens=1))
    question = torch.randint(0, 250, (6,), generator=gen).tolist()
    return Composed(prefix.tolist(), pre.keys, pre.values, docs, question)


def answer_logits(rt, strategy, composed, reserve=4):
    plan = strategy.plan(rt, composed, reserve=reserve)
    out = rt.forward(plan.run_ids, plan.run_positions, plan.cache, plan.active)
    return out.logits[-1], plan


# ------------------------------------------------------------------------- the equations

def test_eq1_personalized_query_by_hand():
    q_que = torch.tensor([[[1.0, 0.0]]])                      # (L=1, Hq=1, D=2)
    locs = [torch.tensor([[[0.0, 2.0]]]), torch.tensor([[[3.0, 3.0]]]), None]
    out = personalized_queries(q_que, locs)
    c = 1 / math.sqrt(2)                                      # |cos| of (1,0) and (3,3)
    assert torch.allclose(out[0], q_que + (c * torch.tensor([3.0, 3.0])) / 2)
    assert torch.allclose(out[1], q_que + (0 * torch.tensor([0.0, 2.0])) / 2)  # orthogonal
    assert torch.allclose(out[2], q_que + (c * torch.tensor([3.0, 3.0])) / 2)
    alone = personalized_queries(q_que, [locs[0]])            # D = 1: no others, no 1/0
    assert torch.equal(alone[0], q_que)


def test_eq2_and_eq3_top_p_by_hand():
    s_anc = torch.tensor([2.0, 5.0, 0.0, 1.0])
    s_max = torch.tensor([4.0, 4.0, 4.0, 1.0])
    s_min = torch.tensor([0.0, 0.0, 0.0, 1.0])
    p = top_p(s_anc, s_max, s_min)
    assert p.tolist() == [0.5, 0.0, 0.0, 0.0]  # above max, at min, flat: 0 (no division)
    assert consolidated_p(torch.tensor([0.9, 0.2, 0.4, 0.6]), [1, 2, 3]) == pytest.approx(0.4)
    assert consolidated_p(torch.tensor([0.9]), []) == 0.0


def test_eq4_fusion_blends_by_cosine():
    old = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    new = torch.tensor([[[1.0, 1.0], [-1.0, 0.0]]])
    out = fuse(old, new)
    theta = 1 / math.sqrt(2)
    assert torch.allclose(out[0, 0], theta * new[0, 0] + (1 - theta) * old[0, 0])
    assert torch.equal(out[0, 1], old[0, 1])  # cos = −1 → θ clipped to 0: the old entry


# ------------------------------------------------------------------------- the strategy

def test_everything_kept_and_recomputed_by_overwrite_equals_recompute():
    """P ≡ 1, no cut, every context token recombined and overwritten: the full ceiling."""
    rt = tiny_runtime("tiny-llama")
    composed = prompt(rt)
    ceiling, _ = answer_logits(rt, get_strategy("recompute"), composed)
    everything = get_strategy("samkv", {"p": 1.0, "cut": False, "ratio": 1.0, "fusion": False})
    logits, plan = answer_logits(rt, everything, composed)
    assert plan.recomputed == composed.n_context
    assert (logits - ceiling).abs().max() <= 1e-4


def test_the_cache_holds_exactly_the_kept_rows_with_initial_and_local_blocks_at_every_layer():
    rt = tiny_runtime("tiny-qwen2")
    composed = prompt(rt, sizes=(64, 72, 56), seed=3)
    strategy = get_strategy("samkv", {"p": 0.3})
    plan = strategy.plan(rt, composed, reserve=4)
    prefix = set(range(composed.n_prefix))
    for layer in plan.cache:
        for group in layer.heads():
            held = set(group.positions.tolist()) - prefix
            for seg, off in zip(composed.segments, composed.offsets):
                n_blocks = -(-seg.n_tokens // 8)
                first = set(range(off, off + 8))
                last = set(range(off + (n_blocks - 2) * 8, off + seg.n_tokens))
                assert first | last <= held  # block 0 and the 2 local blocks, every layer
            # nothing else than whole blocks of the documents (no question yet, no padding)
            assert held <= set(composed.reused_positions().tolist())
    ratio = sequence_ratio(plan.cache, composed)
    assert 0 < ratio < 1
    pie = get_strategy("pie").plan(rt, composed, reserve=4)
    assert sum(layer.nbytes() for layer in plan.cache) < sum(layer.nbytes() for layer in pie.cache)
    logits, _ = answer_logits(rt, strategy, composed)
    assert torch.isfinite(logits).all()


def test_dynamic_top_p_and_the_cut_keep_fewer_blocks_than_candidates():
    rt = tiny_runtime("tiny-llama")
    composed = prompt(rt, sizes=(96, 96, 96), seed=4)
    no_cut = get_strategy("samkv", {"cut": False, "recombine": False})
    cut = get_strategy("samkv", {"recombine": False})
    r_no_cut = sequence_ratio(no_cut.plan(rt, composed, 4).cache, composed)
    r_cut = sequence_ratio(cut.plan(rt, composed, 4).cache, composed)
    fixed = 3 * 8 / 96  # initial + 2 local blocks of 12
    assert fixed <= r_cut <= r_no_cut <= 1


def recombined(strategy, rt, composed, kept, chosen):
    docs = [strategy.regions(seg, off) for seg, off in zip(composed.segments, composed.offsets)]
    return strategy.recombination(rt, composed, docs, kept, chosen, 4)


def per_head(layer):
    """(keys, values, positions) of each KV head, dense or ragged alike."""
    return [(g.keys[h], g.values[h], g.positions) for g in layer.heads()
            for h in range(g.keys.shape[0])]


def changed_slots(base, after, layers):
    out = set()
    for layer in layers:
        for (ka, va, pa), (kb, vb, pb) in zip(per_head(base[layer]), per_head(after[layer])):
            assert torch.equal(pa, pb)
            diff = ((ka - kb).abs().amax(1) > 1e-6) | ((va - vb).abs().amax(1) > 1e-6)
            out |= {(int(p), layer) for p in pa[diff]}
    return out


def test_recombination_rules_change_exactly_the_recomputed_slots():
    """Fig. 5 on layers 1 and 2 (layer 0's K/V depend on the token alone: recomputing them
    changes nothing), 8-token blocks. The document keeps blocks {0, 3, 4} at both layers,
    block 1 only at layer 1, block 2 only at layer 2. Recombined tokens: 9 (block 1), 18
    (block 2), 33 (block 4). Rule 1: 18 runs at layer 1 (its block padded in there) to reach
    layer 2. Rule 2: a slot changes only where its token is recombined and its block kept."""
    from kvedge.edge.strategies.samkv import SamKV

    rt = tiny_runtime("tiny-llama")
    composed = prompt(rt, sizes=(40,), seed=5)
    kept = torch.zeros(3, 5, dtype=torch.bool)
    kept[0] = True
    kept[1:, [0, 3, 4]] = True
    kept[1, 1] = kept[2, 2] = True
    off = composed.offsets[0]
    chosen = torch.tensor([9, 18, 33]) + off
    base = recombined(SamKV(fusion=False), rt, composed, [kept], chosen[:0])
    after = recombined(SamKV(fusion=False), rt, composed, [kept], chosen)
    for layer in range(3):  # padding removed after the pass: exactly the kept blocks
        rows = set(after[layer].heads()[0].positions.tolist()) - set(range(composed.n_prefix))
        assert {(p - off) // 8 for p in rows} == set(kept[layer].nonzero().flatten().tolist())
    assert changed_slots(base, after, range(3)) == {(9 + off, 1), (18 + off, 2), (33 + off, 1),
                                                    (33 + off, 2)}
    # without its block padded in at layer 1, token 18 reaches layer 2 with another input
    unpadded = recombined(SamKV(fusion=False, pad=False), rt, composed, [kept], chosen)
    assert (18 + off, 2) in changed_slots(after, unpadded, [2])


def test_fusion_writes_theta_blend_of_the_recomputed_and_cached_entries():
    from kvedge.edge.strategies.samkv import SamKV

    rt = tiny_runtime("tiny-llama")
    composed = prompt(rt, sizes=(32,), seed=6)
    kept = torch.ones(3, 4, dtype=torch.bool)
    chosen = torch.tensor([composed.offsets[0] + 5])
    none, over, fused = (recombined(s, rt, composed, [kept], c) for s, c in (
        (SamKV(), chosen[:0]), (SamKV(fusion=False), chosen), (SamKV(fusion=True), chosen)))
    slot = int((per_head(none[1])[0][2] == chosen[0]).nonzero())  # layer 1: same input
    old, new, got = (torch.stack([k[slot] for k, _, _ in per_head(c[1])])
                     for c in (none, over, fused))
    assert torch.allclose(got, fuse(old, new), atol=1e-6)
    assert not torch.allclose(got, new)


def test_sparse_segments_keep_whole_blocks_of_what_each_head_holds():
    rt = tiny_runtime("tiny-llama")
    composed = prompt(rt, sizes=(40,), seed=7)
    seg = composed.segments[0]
    evicted = seg.select([[p[p % 3 != 0] for p in layer] for layer in seg.kept_positions])
    from kvedge.edge.strategies.samkv import SamKV

    d = SamKV().regions(evicted, composed.offsets[0])
    blocks = torch.zeros(rt.n_layers, d.n_blocks, dtype=torch.bool)
    blocks[:, 1] = True
    out, = sparse_segments(Composed(composed.prefix_ids, composed.prefix_keys,
                                    composed.prefix_values, [evicted], composed.question_ids),
                           [d], [blocks])
    for layer in out.kept_positions:
        for held in layer:
            assert held.tolist() == [p for p in range(8, 16) if p % 3 != 0]


# ------------------------------------------------------------------------- block-granular loading

@pytest.mark.parametrize("codec", ["int4:key_group=8", "int8+zstd", "fp16"])
def test_over_packs_only_the_kept_rows_are_decoded_and_the_answer_is_unchanged(codec):
    """SamKV over opened packs (`PackSegment`) gives the logits it gives over the same packs
    decoded whole, without decoding any pack whole: only the kept rows are dequantized (key
    groups of 8 rows align with the 8-token blocks: whole groups; int8's 64-row groups do
    not: one scale row per row). Both paths are bit-equal by construction."""
    from kvedge.common.pack.format import encode_pack, open_pack
    from kvedge.common.pack.segment import PackSegment
    from kvedge.kernels import quant

    rt = tiny_runtime("tiny-llama")
    base = prompt(rt)
    packs = [encode_pack(doc, codec) for doc in base.segments]
    decoded = Composed(base.prefix_ids, base.prefix_keys, base.prefix_values,
                       [open_pack(p).context() for p in packs], base.question_ids)
    opened = Composed(base.prefix_ids, base.prefix_keys, base.prefix_values,
                      [PackSegment.open(p) for p in packs], base.question_ids)
    strategy = get_strategy("samkv", {"p": 0.5})
    want, _ = answer_logits(rt, strategy, decoded)
    rows = []
    real = quant.dequantize_many
    quant.dequantize_many = lambda qs: rows.append(sum(q.n for q in qs)) or real(qs)
    try:
        got, plan = answer_logits(rt, strategy, opened)
    finally:
        quant.dequantize_many = real
    assert torch.equal(got, want)
    assert all(seg._decoded is None for seg in opened.segments)  # no pack decoded whole
    if codec != "fp16":
        stored = sum(seg.n_tokens * seg.n_layers * seg.n_kv_heads * 2 for seg in opened.segments)
        assert 0 < sum(rows) < stored  # kept rows (and the recompute scoring's) only


def test_over_evicted_packs_the_block_summaries_come_from_the_kept_keys():
    """An evicted pack ships no block summaries (`KVContext.evicted`): SamKV derives them
    from the kept keys, over the opened pack as over its decoded context, and answers alike."""
    from kvedge.common.pack.context import ragged_block_summaries
    from kvedge.common.pack.format import encode_pack, open_pack
    from kvedge.common.pack.segment import PackSegment
    from kvedge.edge.strategies.samkv import summaries_of

    rt = tiny_runtime("tiny-llama")
    base = prompt(rt)
    packs = [encode_pack(doc.evicted([[p[p % 3 != 0] for p in layer]
                                      for layer in doc.kept_positions]), "int8+zstd")
             for doc in base.segments]
    opened = [PackSegment.open(p) for p in packs]
    decoded = [open_pack(p).context() for p in packs]
    assert all(seg.block_summaries is None for seg in opened + decoded)
    for seg, ctx in zip(opened, decoded):
        for got, want in zip(summaries_of(seg), ragged_block_summaries(ctx), strict=True):
            assert torch.equal(got, want)
    strategy = get_strategy("samkv", {"p": 0.5})
    want, _ = answer_logits(rt, strategy, Composed(base.prefix_ids, base.prefix_keys,
                                                   base.prefix_values, decoded, base.question_ids))
    got, _ = answer_logits(rt, strategy, Composed(base.prefix_ids, base.prefix_keys,
                                                  base.prefix_values, opened, base.question_ids))
    assert torch.equal(got, want)


def test_over_packs_without_side_tensors_samkv_answers_as_without_eq1s_local_term():
    """A gateway's default packs carry no side tensors (`GatewayConfig.side_tensors`): SamKV
    derives the block summaries from the keys and, with no local query, scores with Q_que
    alone — the logits its `bias=false` gives over packs that carry them. (Blocks of 64
    tokens, the gateway's: a pack without summaries does not record another block size.)"""
    from kvedge.common.pack.format import encode_pack
    from kvedge.common.pack.segment import PackSegment

    rt = tiny_runtime("tiny-llama")
    sizes = (260, 200, 300)
    base = prompt(rt, sizes, block=64)
    bare = prompt(rt, sizes, block=64, queries=False)
    for doc in bare.segments:
        doc.block_summaries = None
    with_side = [PackSegment.open(encode_pack(doc, "int8+zstd")) for doc in base.segments]
    without = [PackSegment.open(encode_pack(doc, "int8+zstd")) for doc in bare.segments]
    assert all(seg.query_cache is None and seg.block_summaries is None for seg in without)
    parts = (base.prefix_ids, base.prefix_keys, base.prefix_values)
    want, _ = answer_logits(rt, get_strategy("samkv", {"p": 0.5, "bias": False}),
                            Composed(*parts, with_side, base.question_ids))
    got, _ = answer_logits(rt, get_strategy("samkv", {"p": 0.5}),
                           Composed(*parts, without, base.question_ids))
    assert torch.equal(got, want)


def test_quantized_take_equals_indexing_the_dequantized_tensor():
    from kvedge.kernels.quant import quantize

    gen = torch.Generator().manual_seed(0)
    for per_channel in (True, False):
        q = quantize(torch.randn(150, 16, generator=gen), 4, 64, per_channel)
        full = q.dequantize()
        for rows in (torch.arange(64, 150), torch.arange(0, 64), torch.tensor([3, 64, 149]),
                     torch.arange(150), torch.empty(0, dtype=torch.long)):
            taken = q.take(rows)
            assert torch.equal(taken.dequantize(), full[rows])
            if per_channel:  # whole groups keep their group size; scattered rows get 1
                assert taken.group_size == (64 if rows.numel() in (86, 64, 150) else 1) \
                    or rows.numel() == 0


@pytest.mark.parametrize("options", [{}, {"pad": False}, {"recombine": False}])
def test_the_sparse_cache_is_dense_per_layer_and_answers_as_the_ragged_one(options, monkeypatch):
    """SamKV's selection is per layer, shared by its KV heads: each layer of the final cache
    is one dense block of the kept rows (one attention call per layer in decoding), and the
    answer's logits are those over the same rows held head by head."""
    from kvedge.common.model import kvcache
    from kvedge.common.model.kvcache import DenseKV, RaggedKV
    from kvedge.edge.strategies import samkv

    rt = tiny_runtime("tiny-llama")
    strategy = get_strategy("samkv", {"p": 0.5, **options})
    dense, plan = answer_logits(rt, strategy, prompt(rt))
    assert all(isinstance(layer, DenseKV) for layer in plan.cache)
    assert sequence_ratio(plan.cache, prompt(rt)) < 1
    for module in (samkv, kvcache):  # held head by head, as before `aligned`
        monkeypatch.setattr(module, "aligned", lambda layer, reserve=0: layer)
    ragged, plan = answer_logits(rt, strategy, prompt(rt))
    assert any(isinstance(layer, RaggedKV) for layer in plan.cache)
    assert torch.allclose(dense, ragged, atol=1e-5)


# ------------------------------------------------------------------------- issue 30: the paper's rules

def test_shared_normalization_cuts_a_document_whose_blocks_all_score_low():
    """Sec. 3.2: one normalization across contexts. Document 1's blocks all score below
    document 0's; per-document min–max would give its best block 1.0 and keep it."""
    from kvedge.edge.strategies.samkv import Regions, SamKV, shared_minmax

    assert shared_minmax([(2.0, 0, 1), (4.0, 0, 2), (-1.0, 1, 1), (0.0, 1, 2)]) == \
        [(0.6, 0, 1), (1.0, 0, 2), (0.0, 1, 1), (0.2, 1, 2)]
    fixed = torch.tensor([True, False, False, False, False, True])
    docs = [Regions(0, 48, 8, fixed), Regions(48, 48, 8, fixed)]
    high = torch.tensor([[0.0, 5.0, 6.0, 7.0, 8.0, 0.0]])   # (L=1, nb)
    low = torch.tensor([[0.0, -4.0, -3.0, -2.0, -1.0, 0.0]])
    kept = SamKV(p=1.0).select([high, low], docs, [0])
    assert kept[0][0].all()                        # ⌈8 candidates / 2⌉ = 4: all of doc 0's
    assert kept[1][0].tolist() == fixed.tolist()                          # none of doc 1


def test_rope_scores_are_the_mean_attention_logit_of_the_composed_prompt():
    """`rope=true`: s_b = ⟨Q_que, K̄_b⟩/√d is the mean over query heads, question tokens and
    block b's tokens of the attention logit the model computes in the composed prompt (keys
    rotated to their composed positions). Layer 0's queries depend on the token alone, so the
    generic query's prefill and a full prefill agree there; the pre-RoPE means do not."""
    from kvedge.edge.strategies.base import assemble_cache
    from kvedge.edge.strategies.samkv import SamKV, block_scores

    rt = tiny_runtime("tiny-qwen2")
    composed = replace_query(prompt(rt, sizes=(40, 48), seed=8), (1, 4))
    want = attention_logits_per_block(rt, composed, assemble_cache)
    for rope in (True, False):
        strategy = SamKV(rope=rope)
        docs = strategy.regions_of(composed)
        q_que = strategy.generic_query(rt, composed, docs, 4)
        got = torch.cat([block_scores(q_que, strategy.summaries(rt, seg, d, composed.seq_len(4)),
                                      rt.group, rt.scale)[0]
                         for seg, d in zip(composed.segments, docs)])
        assert torch.allclose(got, want, atol=1e-4) == rope


def replace_query(composed, span):
    from dataclasses import replace

    return replace(composed, query=span)


def attention_logits_per_block(rt, composed, assemble_cache):
    """Layer 0: mean logit of the query-span tokens over each 8-token context block."""
    cache = assemble_cache(rt, composed, reserve=len(composed.question_ids) + 4)
    fresh, span = composed.fresh_positions(), composed.query_positions()
    out = []

    def observe(layer, q, q_pos, cache_layer):
        if layer:
            return
        group, = cache_layer.heads()
        logits = torch.einsum("hgnd,htd->hgnt", q[:, :, torch.isin(q_pos, span)].float(),
                              group.keys.float()) * rt.scale
        per_token = logits.mean((0, 1, 2))
        for off, seg in zip(composed.offsets, composed.segments):
            for b in range(0, seg.n_tokens, 8):
                inside = (group.positions >= off + b) & (group.positions < off + b + 8)
                out.append(per_token[inside].mean())

    rt.forward(torch.tensor(composed.all_ids())[fresh], fresh, cache, observe=observe,
               logits="none")
    return torch.stack(out)


def test_the_generic_query_pools_the_user_query_not_the_template():
    """Sec. 3.1 pools "the Q Matrix of user queries": with `query=question` the tokens after
    the query span (instruction, assistant header) do not move Q_que, a token inside it does;
    `query=all` pools them all."""
    from kvedge.edge.strategies.samkv import SamKV

    rt = tiny_runtime("tiny-llama")
    base = replace_query(prompt(rt, seed=9), (1, 4))
    tail = replace_query(base, (1, 4))
    tail.question_ids = base.question_ids[:4] + [(t + 7) % 250 for t in base.question_ids[4:]]
    inside = replace_query(base, (1, 4))
    inside.question_ids = base.question_ids[:2] + [(base.question_ids[2] + 7) % 250] + \
        base.question_ids[3:]

    def q_que(options, composed):
        strategy = SamKV(**options)
        return strategy.generic_query(rt, composed, strategy.regions_of(composed), 4)

    question = q_que({}, base)
    assert torch.allclose(q_que({}, tail), question, atol=1e-6)
    assert not torch.allclose(q_que({}, inside), question, atol=1e-4)
    assert not torch.allclose(q_que({"query": "all"}, tail), q_que({"query": "all"}, base),
                              atol=1e-4)


def test_selection_follows_the_question_when_query_vectors_are_swapped():
    """Issue 30's swap diagnostic on a tiny model: over the same documents, question B's
    generic query selects other blocks than question A's, and the same blocks whichever
    prompt (A's or B's) it is applied to — the selection depends on the query, nothing else."""
    from kvedge.edge.strategies.samkv import SamKV

    rt = tiny_runtime("tiny-qwen2")
    a = prompt(rt, sizes=(96, 96, 96), seed=10)
    b = replace_query(a, None)
    b.question_ids = torch.randint(0, 250, (6,), generator=torch.Generator().manual_seed(1)
                                   ).tolist()
    strategy = SamKV(p=0.3)
    q_a = strategy.generic_query(rt, a, strategy.regions_of(a), 4)
    q_b = strategy.generic_query(rt, b, strategy.regions_of(b), 4)
    _, own = strategy.select_blocks(rt, a, q_a, 4)
    _, swapped = strategy.select_blocks(rt, a, q_b, 4)
    _, theirs = strategy.select_blocks(rt, b, q_b, 4)
    assert any(not torch.equal(x, y) for x, y in zip(own, swapped))
    assert all(torch.equal(x, y) for x, y in zip(swapped, theirs))


def test_options_n_star_heads_query_and_force_docs():
    from kvedge.common.errors import InvalidOption

    s = get_strategy("samkv", {"stable_from": "3", "stable_to": "5"})
    assert s.stable_layers(30) == [3, 4, 5] and s.stable_layers(4) == [3]
    assert get_strategy("samkv").stable_layers(30) == list(range(2, 30))
    assert get_strategy("samkv", {"force_docs": "0+2"}).forced() == [0, 2]
    assert get_strategy("samkv", {"force_docs": "1,3"}).forced() == [1, 3]
    for bad in ({"heads": "sum"}, {"query": "last"}, {"force_docs": "gold"}):
        with pytest.raises(InvalidOption):
            get_strategy("samkv", bad)


def test_force_docs_keeps_every_block_of_the_forced_document_at_every_layer():
    """The oracle diagnostic: the forced document's rows are all in the final cache (the
    recombined answer path then sees the gold paragraph whole); the others stay sparse."""
    from kvedge.common.errors import InvalidOption

    rt = tiny_runtime("tiny-llama")
    composed = prompt(rt, sizes=(64, 72, 56), seed=11)
    plan = get_strategy("samkv", {"p": 0.2, "force_docs": "1"}).plan(rt, composed, reserve=4)
    off, n = composed.offsets[1], composed.segments[1].n_tokens
    for layer in plan.cache:
        for group in layer.heads():
            assert set(range(off, off + n)) <= set(group.positions.tolist())
    assert sequence_ratio(plan.cache, composed) < 1
    with pytest.raises(InvalidOption):
        get_strategy("samkv", {"force_docs": "3"}).plan(rt, composed, reserve=4)


def test_through_the_engine_the_query_span_is_the_question_and_costs_are_reported():
    """`EdgeEngine.compose` marks the question's own tokens (not "Question:", the instruction
    or the assistant header) for SamKV's Q_que; the answer's costs report the kept KV's bytes
    and sequence ratio, as `kvctl ask --strategy samkv` prints them."""
    from kvedge.common.model.models import load_model
    from kvedge.edge.engine import EdgeEngine

    engine = EdgeEngine(load_model("tiny-llama"))
    try:
        base = prompt(engine.rt, sizes=(64, 72, 56), seed=12)
        composed = engine.compose(base.segments, "Which is older, the mill or the bridge?",
                                  "Answer briefly.")
        start, end = composed.query
        assert engine.tok.decode(composed.question_ids[start:end]).strip() == \
            "Which is older, the mill or the bridge?"
        *_, stats = engine.answer(composed, get_strategy("samkv", {"p": 0.2}), 4)
        *_, full = engine.answer(composed, get_strategy("recompute"), 4)
        assert 0 < stats["sequence_ratio"] < 1 and stats["kv_bytes"] < full["kv_bytes"]
    finally:
        engine.close()


def test_adjacent_scores_every_document_as_if_it_ended_at_the_question():
    """`adjacent`: the document next to the question scores as before; an earlier one scores
    as the same document would if it were the last (its keys shifted, not its content)."""
    from kvedge.edge.strategies.samkv import SamKV, block_scores

    rt = tiny_runtime("tiny-qwen2")
    composed = prompt(rt, sizes=(40, 48), seed=3)
    seq_len = composed.seq_len(4)

    q = SamKV().generic_query(rt, composed, SamKV().regions_of(composed), 4)  # one query

    def scores(strategy, c, i):
        d = strategy.regions_of(c)[i]
        return block_scores(q, strategy.summaries(rt, c.segments[i], strategy.scored_at(c, d),
                                                  seq_len), rt.group, rt.scale, strategy.heads)

    plain, adjacent = SamKV(), SamKV(adjacent=True)
    assert torch.equal(scores(plain, composed, 1), scores(adjacent, composed, 1))
    assert not torch.allclose(scores(plain, composed, 0), scores(adjacent, composed, 0))
    swapped = Composed(composed.prefix_ids, composed.prefix_keys, composed.prefix_values,
                       composed.segments[::-1], composed.question_ids)
    assert swapped.seq_len(4) == seq_len
    torch.testing.assert_close(scores(adjacent, composed, 0), scores(plain, swapped, 1),
                               rtol=1e-4, atol=1e-4)
    assert get_strategy("samkv", {"adjacent": "true"}).adjacent
