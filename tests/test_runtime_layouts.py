"""Interleaved layouts, write sets and the runtime's edge cases (issue 11, section 1)."""
import pytest
import torch

from conftest import TINY, tiny_runtime
from kvedge.common.errors import ActiveSetError, CacheError
from kvedge.common.model.decoding import Sampler
from kvedge.common.model.generate import generate
from kvedge.common.model.kvcache import Extent, KVCache
from kvedge.common.pack.context import KVContext
from kvedge.common.model.runtime import LayerCapture, Runtime
from kvedge.common.model.verify import verify_runtime
from kvedge.edge.strategies.base import Composed, assemble_cache

TOL = 1e-4


def random_ids(n, seed):
    return torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(seed))


def per_head(keys, values, keep):
    """K/V per layer (Hkv, T, D) split per head, keeping positions keep[layer][head]."""
    def split(xs):
        return [[x[h, keep[i][h]] for h in range(x.shape[0])] for i, x in enumerate(xs)]
    return split(keys), split(values)


def stale_cache(rt, ids, cut, kind="dense"):
    """Two segments prefilled alone, realigned side by side: recompute changes their K/V."""
    a, b = rt.prefill(ids[:cut]), rt.prefill(ids[cut:])
    keys = [torch.cat([x, y], 1) for x, y in zip(a.keys, b.keys)]
    values = [torch.cat([x, y], 1) for x, y in zip(a.values, b.values)]
    n = ids.numel()
    if kind == "dense":
        return rt.dense_cache(keys, values, torch.arange(n))
    keep = [[torch.arange(0, n, 2), torch.arange(n)] for _ in range(rt.n_layers)]
    return rt.ragged_cache(*per_head(keys, values, keep), keep)


def snapshot(cache):
    return [[(g.keys.clone(), g.values.clone(), g.positions.clone()) for g in layer.heads()]
            for layer in cache], list(cache.extent.spans), cache.seq_len


def same(a, b):
    (layers_a, *rest_a), (layers_b, *rest_b) = a, b
    return rest_a == rest_b and all(
        all(torch.equal(x, y) for x, y in zip(ga, gb))
        for la, lb in zip(layers_a, layers_b) for ga, gb in zip(la, lb, strict=True))


# ---------------------------------------------------------------- interleaved layouts

@pytest.mark.parametrize("name", TINY)
def test_fresh_text_between_cached_segments_runs_in_the_same_forward(name):
    """SparseX Sec. 3–4, [doc A][user text][doc B][question]: over the docs' exact KV the text
    between them and the question run in one forward and every logit is exact — a middle
    text token sees no later key, and the question sees the text's fresh KV."""
    rt = tiny_runtime(name)
    ids = random_ids(60, seed=10)
    joint = rt.prefill(ids, logits="all")
    docs = torch.cat([torch.arange(0, 20), torch.arange(32, 50)])
    cache = rt.dense_cache([k[:, docs] for k in joint.keys], [v[:, docs] for v in joint.values],
                           docs)
    run = torch.cat([torch.arange(20, 32), torch.arange(50, 60)])
    out = rt.forward(ids[run], run, cache, logits="all")
    assert (out.logits - joint.logits[run]).abs().max() <= TOL
    assert cache.extent.spans == [(0, 60)]
    for layer, exact in zip(cache, joint.cache):  # the text's K/V went in between the docs
        k, v, pos = layer.view()
        assert pos.tolist() == list(range(60))
        assert torch.allclose(k, exact.view()[0], atol=1e-5)
        assert torch.allclose(v, exact.view()[1], atol=1e-5)


def test_fresh_text_goes_into_every_head_of_a_ragged_cache():
    rt = tiny_runtime("tiny-qwen2")
    ids = random_ids(40, seed=11)
    joint = rt.prefill(ids, logits="all")
    docs = torch.cat([torch.arange(0, 15), torch.arange(25, 40)])
    keep = [[docs[::2], docs] for _ in range(rt.n_layers)]
    keys, values = per_head(joint.keys, joint.values, keep)
    cache = rt.ragged_cache(keys, values, keep)
    text = torch.arange(15, 25)
    rt.forward(ids[text], text, cache, logits="none")
    for layer in cache:
        head0, head1 = (g.positions.tolist() for g in layer.heads())
        assert head0 == sorted(docs[::2].tolist() + text.tolist())
        assert head1 == list(range(40))


@pytest.mark.parametrize("name", TINY)
def test_recompute_all_over_an_interleaved_cache_equals_the_joint_prefill(name):
    """`kvctl model verify`'s interleaved check: segments prefilled alone, fresh text between."""
    checks = verify_runtime(tiny_runtime(name), n_tokens=64, decode_steps=1)
    interleaved = [c for c in checks if c.name.startswith("interleaved")]
    assert len(interleaved) == 1 and interleaved[0].ok, interleaved


def test_composed_texts_place_segments_and_assemble_an_extent_without_them():
    rt = tiny_runtime("tiny-llama")
    pre = rt.prefill(torch.tensor([1, 2, 3]))
    segs = []
    for n, seed in ((5, 1), (4, 2)):
        res = rt.prefill(random_ids(n, seed))
        segs.append(KVContext.from_dense(res.keys, res.values, random_ids(n, seed).tolist(),
                                         model_fingerprint="x", tokenizer_id="y"))
    composed = Composed([1, 2, 3], pre.keys, pre.values, segs, [7, 8], texts=([], [9, 9]))
    assert composed.offsets == [3, 10]
    assert composed.question_start == 14 and len(composed.all_ids()) == 16
    assert composed.fresh_positions().tolist() == [8, 9, 14, 15]
    assert composed.seq_len(max_new_tokens=4) == 20
    cache = assemble_cache(rt, composed, reserve=2 + 4)
    assert cache.extent.spans == [(0, 8), (10, 14)] and cache.seq_len == 20
    with pytest.raises(ValueError, match="before a segment"):
        Composed([], [], [], segs[:1], [7], texts=([1], [2]))


# ---------------------------------------------------------------- review fixes

def test_a_segment_whose_tail_every_head_evicted_is_recomputed_not_new():
    """(a) The last segment's last tokens, evicted in every head of every layer, are context:
    an A3-style plan that recomputes them through layer 1 and drops some from layer 2 used to
    raise ActiveSetError (they were taken for new tokens); they are computed, never stored."""
    rt = tiny_runtime("tiny-llama")
    prefix, seg_ids, question = random_ids(6, 20), random_ids(30, 21), random_ids(5, 22)
    pre, res = rt.prefill(prefix), rt.prefill(seg_ids)
    seg = KVContext.from_dense(res.keys, res.values, seg_ids.tolist(), model_fingerprint="x",
                               tokenizer_id="y")
    seg = seg.select([[p[:-4] for p in layer] for layer in seg.kept_positions])
    composed = Composed(prefix.tolist(), pre.keys, pre.values, [seg], question.tolist())
    cache = assemble_cache(rt, composed, reserve=len(question))
    run = torch.arange(6, 41)
    chosen = torch.tensor([10, 33, 34, 35])  # 32–35: the evicted tail
    active = [run, run] + [torch.cat([chosen, composed.question_positions()])] * (rt.n_layers - 2)
    out = rt.forward(torch.tensor(composed.all_ids())[run], run, cache, active)
    assert torch.isfinite(out.logits).all()
    tail = torch.arange(32, 36)
    assert not any(torch.isin(tail, g.positions).any() for layer in cache for g in layer.heads())


def test_a_recomputed_token_a_head_evicted_attends_to_its_own_fresh_key():
    """(b) Head 0 evicted position 20 everywhere; recomputing 20 over otherwise exact KV gives
    the exact logits only if its query sees its own fresh key there (it is not stored back)."""
    rt = tiny_runtime("tiny-qwen3")
    ids = random_ids(32, seed=30)
    joint = rt.prefill(ids, logits="all")
    others = torch.cat([torch.arange(20), torch.arange(21, 32)])
    keep = [[others] + [torch.arange(32)] * (rt.n_kv - 1) for _ in range(rt.n_layers)]
    keys, values = per_head(joint.keys, joint.values, keep)
    cache = rt.ragged_cache(keys, values, keep)
    out = rt.forward(ids[20:21], torch.tensor([20]), cache)
    assert (out.logits[0] - joint.logits[20]).abs().max() <= TOL
    assert all(20 not in layer.heads()[0].positions.tolist() for layer in cache)


def scaled_runtime(rope_type):
    """A tiny Llama whose RoPE depends on the sequence length past 32 tokens."""
    from kvedge.common.model.models import LoadedModel, _tiny_config, build_random_model

    params = {"dynamic": {"rope_type": "dynamic", "factor": 2.0},
              "longrope": {"rope_type": "longrope", "rope_theta": 10000.0,
                           "short_factor": [1.0] * 8, "long_factor": [1.0 + i for i in range(8)],
                           "original_max_position_embeddings": 32}}[rope_type]
    max_pos = 32 if rope_type == "dynamic" else 128
    config = _tiny_config("llama", max_position_embeddings=max_pos, rope_parameters=params)
    return Runtime(LoadedModel(f"tiny-{rope_type}", build_random_model(config), None, "random"))


def decode_logits(rt, cache, ids, positions, steps):
    """Every step's logits (prompt, then each decoded token) of greedy `generate`."""
    seen = []

    class Recording(Sampler):
        def pick(self, logits, gen=None):
            seen.append(logits.clone())
            return super().pick(logits, gen)

    list(generate(rt, cache, ids, positions, steps, sampler=Recording()))
    return torch.stack(seen)


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
@pytest.mark.parametrize("build", ["assembled", "dense"])
def test_one_rope_length_per_request_makes_exact_reuse_exact(rope_type, build):
    """(c) The context's exact KV reused (assembled from prefix + segment, or a dense cache),
    the question and 8 decode steps: the same logits as full recompute at every step, on
    RoPE that depends on the sequence length — assemble, forward and generate share one."""
    rt = scaled_runtime(rope_type)
    P, N, Q, new = 6, 18, 6, 8  # a 30-token prompt, a 38-token request: 32 lies between
    ids = random_ids(P + N + Q, seed=40)
    full = decode_logits(rt, rt.empty_cache(), ids, torch.arange(P + N + Q), new)
    capture = LayerCapture()  # the context's exact K/V, computed at the request's RoPE length
    rt.forward(ids[:P + N], torch.arange(P + N), rt.empty_cache(), capture=capture,
               seq_len=P + N + Q + new, logits="none")
    if build == "dense":
        cache = rt.dense_cache(capture.keys, capture.values, torch.arange(P + N), reserve=Q + new)
    else:
        segment = KVContext.from_dense([k[:, P:] for k in capture.keys],
                                       [v[:, P:] for v in capture.values], ids[P:P + N].tolist(),
                                       model_fingerprint="x", tokenizer_id="y")
        composed = Composed(ids[:P].tolist(), [k[:, :P] for k in capture.keys],
                            [v[:, :P] for v in capture.values], [segment], ids[P + N:].tolist())
        cache = assemble_cache(rt, composed, reserve=Q + new)
    reused = decode_logits(rt, cache, ids[P + N:], torch.arange(P + N, P + N + Q), new)
    assert (reused - full).abs().max() <= TOL


@pytest.mark.parametrize("rope_type", ["dynamic", "longrope"])
def test_generate_rotates_prompt_and_every_decoded_token_for_one_length(rope_type):
    """(c) Each decode step's logits equal a prefill of everything so far at the request's
    length (prompt + max_new_tokens), not at a length that grows step by step."""
    rt = scaled_runtime(rope_type)
    ids, new = random_ids(30, seed=41), 8
    steps = decode_logits(rt, rt.empty_cache(), ids, torch.arange(30), new)
    tokens = torch.cat([ids, steps[:-1].argmax(-1)])
    for i, logits in enumerate(steps):
        ref = rt.prefill(tokens[:30 + i], seq_len=30 + new).logits[-1]
        assert (logits - ref).abs().max() <= TOL, i


def failing_at(layer):
    def observe(i, q, pos, cache_layer):
        if i == layer:
            raise RuntimeError("observer failed")
    return observe


@pytest.mark.parametrize("kind", ["dense", "ragged"])
def test_a_failed_forward_leaves_the_cache_exactly_as_before(kind):
    """(d) Recompute (overwrites) and new tokens (appends), failing at the last layer after
    every layer wrote: the cache is restored bit for bit and then answers as a fresh one."""
    rt = tiny_runtime("tiny-llama")
    ids = random_ids(30, seed=50)
    cache, twin = stale_cache(rt, ids[:24], 12, kind), stale_cache(rt, ids[:24], 12, kind)
    before = snapshot(cache)
    run = torch.tensor([3, 12, 13, 20, 24, 25])
    with pytest.raises(RuntimeError, match="observer failed"):
        rt.forward(ids[run], run, cache, observe=failing_at(rt.n_layers - 1))
    assert same(snapshot(cache), before)
    again, fresh = rt.forward(ids[run], run, cache), rt.forward(ids[run], run, twin)
    assert torch.equal(again.logits, fresh.logits)


def test_a_failed_forward_undoes_insertions_between_held_positions():
    rt = tiny_runtime("tiny-mistral")
    ids = random_ids(30, seed=51)
    joint = rt.prefill(ids)
    docs = torch.cat([torch.arange(0, 10), torch.arange(16, 30)])
    keep = [[docs[1::2], docs] for _ in range(rt.n_layers)]
    keys, values = per_head(joint.keys, joint.values, keep)
    for cache in (rt.dense_cache([k[:, docs] for k in joint.keys],
                                 [v[:, docs] for v in joint.values], docs),
                  rt.ragged_cache(keys, values, keep)):
        before = snapshot(cache)
        run = torch.tensor([5, 10, 11, 12, 13, 14, 15, 29, 30])  # recomputed, inserted, appended
        with pytest.raises(RuntimeError):
            rt.forward(torch.cat([ids, ids[:1]])[run], run, cache, observe=failing_at(1))
        assert same(snapshot(cache), before)


# ---------------------------------------------------------------- write sets

def test_a_token_computed_but_not_stored_sees_its_own_kv_and_leaves_the_cache():
    """SamKV Sec. 3.3 write sets: a recomputed token stored at no layer yields what storing it
    yields (it attends to its own fresh K/V either way); the cache keeps its stale K/V."""
    rt = tiny_runtime("tiny-llama")
    ids = random_ids(40, seed=60)
    stored, kept = stale_cache(rt, ids, 20), stale_cache(rt, ids, 20)
    before = snapshot(kept)
    p = torch.tensor([25])
    nowhere = [torch.tensor([], dtype=torch.long)] * rt.n_layers
    a = rt.forward(ids[p], p, stored).logits
    b = rt.forward(ids[p], p, kept, write=nowhere).logits
    assert (a - b).abs().max() <= 1e-5
    assert same(snapshot(kept), before)
    assert not same(snapshot(stored), before)


def test_a_fresh_token_not_stored_at_a_layer_is_invisible_there_to_later_tokens():
    rt = tiny_runtime("tiny-qwen2")
    ids = random_ids(24, seed=61)
    full, partial = rt.prefill(ids[:20]).cache, rt.prefill(ids[:20]).cache
    p = torch.tensor([20])
    a = rt.forward(ids[20:21], p, full).logits
    not_at_1 = lambda layer, current: current[:0] if layer == 1 else None  # noqa: E731
    b = rt.forward(ids[20:21], p, partial, write=not_at_1).logits
    assert (a - b).abs().max() <= 1e-5  # it saw its own key at layer 1 anyway
    assert [20 in layer.view()[2].tolist() for layer in partial] == [True, False, True]
    assert partial.extent.spans == [(0, 21)]  # context now, held or not
    nxt = torch.tensor([21])  # the next token does not see it at layer 1
    assert (rt.forward(ids[21:22], nxt, full).logits
            - rt.forward(ids[21:22], nxt, partial).logits).abs().max() > 1e-4


def test_write_sets_must_be_subsets_of_the_active_set():
    rt = tiny_runtime("tiny-llama")
    ids = random_ids(20, seed=62)
    cache = rt.prefill(ids[:16]).cache
    run = torch.tensor([4, 16])
    active = [run, run, torch.tensor([16])]
    with pytest.raises(ActiveSetError, match="write positions"):  # 4 is not computed at layer 2
        rt.forward(ids[run], run, cache, active, write=[run, run, run])
    rt.forward(ids[run], run, cache, active, write=[run, torch.tensor([16]), torch.tensor([16])])


# ---------------------------------------------------------------- the cache's extent

def test_extent_spans_cover_add_and_truncate():
    extent = Extent.of(torch.tensor([0, 1, 2, 5, 6, 9]))
    assert extent.spans == [(0, 3), (5, 7), (9, 10)] and extent.end == 10
    hits = extent.covers(torch.tensor([2, 3, 6, 9, 10]))
    assert hits.tolist() == [True, False, True, True, False]
    extent.add(torch.tensor([3, 4, 10]))
    assert extent.spans == [(0, 7), (9, 11)]
    extent.truncate(5)
    assert extent.spans == [(0, 6)]
    assert Extent([(4, 6), (0, 2), (2, 3), (7, 7)]).spans == [(0, 3), (4, 6)]


def test_truncate_forgets_the_turn_in_the_extent_too():
    rt = tiny_runtime("tiny-llama")
    ids = random_ids(30, seed=70)
    cache = rt.prefill(ids[:20]).cache
    first = list(generate(rt, cache, ids[20:24], torch.arange(20, 24), 3))
    assert cache.extent.spans == [(0, 26)]  # the last decoded token never ran
    cache.truncate(19)
    assert cache.extent.spans == [(0, 20)]
    assert list(generate(rt, cache, ids[20:24], torch.arange(20, 24), 3)) == first


def test_forward_needs_a_kvcache():
    rt = tiny_runtime("tiny-llama")
    cache = rt.prefill(random_ids(8, seed=71)).cache
    with pytest.raises(CacheError, match="KVCache"):
        rt.forward(torch.tensor([1]), torch.tensor([8]), list(cache))
    assert isinstance(KVCache(list(cache)).extent, Extent)
