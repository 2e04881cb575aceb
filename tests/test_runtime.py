"""The runtime's exactness against the transformers forward, on every supported architecture."""
import pytest
import torch

from conftest import TINY, tiny_runtime
from kvedge.common.errors import ActiveSetError, CacheError

TOL = 1e-4


def reference(rt, ids, positions):
    with torch.no_grad():
        return rt.model(ids[None], position_ids=positions[None]).logits[0]


def random_ids(rt, n, seed=0):
    return torch.randint(0, rt.config.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", TINY)
@pytest.mark.parametrize("offset", [0, 700])  # 700: past llama3's/yarn's original lengths
def test_recompute_all_equals_transformers(name, offset):
    rt = tiny_runtime(name)
    ids = random_ids(rt, 64)
    positions = torch.arange(64) + offset
    res = rt.prefill(ids, positions, logits="all")
    assert (res.logits - reference(rt, ids, positions)).abs().max() <= TOL


@pytest.mark.parametrize("name", TINY)
def test_segments_realigned_and_recomputed_equal_joint_prefill(name):
    rt = tiny_runtime(name)
    ids = random_ids(rt, 90, seed=1)
    bounds = [0, 20, 55, 90]
    parts = [rt.prefill(ids[a:b]) for a, b in zip(bounds, bounds[1:])]  # each from position 0
    keys = [torch.cat([p.keys[i] for p in parts], 1) for i in range(rt.n_layers)]
    values = [torch.cat([p.values[i] for p in parts], 1) for i in range(rt.n_layers)]
    positions = torch.arange(90)
    cache = rt.dense_cache(keys, values, positions)
    out = rt.forward(ids, positions, cache, logits="all")
    joint = rt.prefill(ids, logits="all")
    assert (out.logits - joint.logits).abs().max() <= TOL
    for layer in range(rt.n_layers):  # and the recomputed cache is the joint prefill's cache
        assert torch.allclose(cache[layer].view()[0], joint.cache[layer].view()[0], atol=1e-5)


def test_realignment_alone_is_not_recompute():
    """Realigned segment KV differs from joint KV beyond the first segment (cross-attention is
    missing) — the gap every reuse strategy tries to close; recompute-all closes it fully."""
    rt = tiny_runtime("tiny-llama")
    ids = random_ids(rt, 40, seed=2)
    a, b = rt.prefill(ids[:20]), rt.prefill(ids[20:])
    joint = rt.prefill(ids)
    assert torch.allclose(a.keys[0], joint.keys[0][:, :20], atol=1e-6)  # layer 0 is context-free
    assert not torch.allclose(b.keys[1], joint.keys[1][:, 20:], atol=1e-3)


def nested_active(positions, n_layers, seed, must_keep):
    gen = torch.Generator().manual_seed(seed)
    active, cur = [], positions
    for layer in range(n_layers):
        if layer:
            keep = (torch.rand(cur.numel(), generator=gen) < 0.7) | torch.isin(cur, must_keep)
            cur = cur[keep]
        active.append(cur)
    return active


@pytest.mark.parametrize("name", TINY)
def test_partial_recompute_over_exact_cache_is_exact(name):
    """Recomputing any nested subset against the exact cache reproduces the exact logits —
    only true with a position-based mask (a bottom-right mask lets middle tokens see the future)."""
    rt = tiny_runtime(name)
    n = 80
    ids = random_ids(rt, n, seed=3)
    ref = reference(rt, ids, torch.arange(n))
    subset = torch.tensor([3, 10, 11, 30, 41, 42, 57, 70, 79])
    active = nested_active(subset, rt.n_layers, seed=4, must_keep=torch.tensor([79]))
    cache = rt.prefill(ids).cache
    out = rt.forward(ids[subset], subset, cache, active, logits="all")
    assert torch.equal(out.positions, active[-1])
    assert (out.logits - ref[out.positions]).abs().max() <= TOL


def test_middle_token_does_not_see_future_keys():
    rt = tiny_runtime("tiny-qwen2")
    ids = random_ids(rt, 30, seed=5)
    ref = reference(rt, ids, torch.arange(30))
    cache = rt.prefill(ids).cache
    out = rt.forward(ids[10:11], torch.tensor([10]), cache)
    assert (out.logits[0] - ref[10]).abs().max() <= TOL


def test_partial_recompute_writes_fresh_kv_back():
    """Stale (realigned-only) KV of recomputed tokens is replaced by the exact KV; the rest stays."""
    rt = tiny_runtime("tiny-llama")
    ids = random_ids(rt, 40, seed=6)
    a, b = rt.prefill(ids[:20]), rt.prefill(ids[20:])
    keys = [torch.cat([x, y], 1) for x, y in zip(a.keys, b.keys)]
    values = [torch.cat([x, y], 1) for x, y in zip(a.values, b.values)]
    cache = rt.dense_cache(keys, values, torch.arange(40))
    stale = [layer.view()[0].clone() for layer in cache]
    chosen = torch.tensor([20, 21, 22])  # the head of segment 2: recomputed at every layer
    rt.forward(ids[chosen], chosen, cache, logits="none")
    joint = rt.prefill(ids[:23]).cache
    for layer in range(1, rt.n_layers):
        k = cache[layer].view()[0]
        assert torch.allclose(k[:, 20:23], joint[layer].view()[0][:, 20:23], atol=1e-5)
        assert torch.equal(k[:, 23:], stale[layer][:, 23:])


def test_active_set_rules():
    rt = tiny_runtime("tiny-llama")
    ids = random_ids(rt, 20, seed=7)
    cache = rt.prefill(ids[:16]).cache
    run = torch.tensor([4, 16, 17])  # one recomputed, two new
    ids3 = ids[run]
    with pytest.raises(ActiveSetError, match="subset"):  # a token cannot re-enter
        rt.forward(ids3, run, cache, [run, torch.tensor([16, 17]), run])
    with pytest.raises(ActiveSetError, match="new tokens"):  # new tokens need every layer
        rt.forward(ids3, run, cache, [run, run, torch.tensor([4, 17])])
    with pytest.raises(ActiveSetError, match="layer 0"):
        rt.forward(ids3, run, cache, [torch.tensor([16, 17])] * 3)
    with pytest.raises(ActiveSetError, match="one active set per layer"):
        rt.forward(ids3, run, cache, [run])
    with pytest.raises(CacheError, match="increasing"):
        rt.forward(ids3.flip(0), run.flip(0), cache)
    gap = rt.prefill(ids[:2], torch.tensor([0, 5]))  # its context: 0–5, a dense cache of 0 and 5
    gapped = rt.dense_cache(gap.keys, gap.values, torch.tensor([0, 5]), extent=torch.arange(6))
    with pytest.raises(CacheError, match="not in the cache"):  # a gap is neither held nor new
        rt.forward(ids[:1], torch.tensor([3]), gapped)
    rt.forward(ids3, run, cache, [run, run, torch.tensor([16, 17])])  # valid plan runs


def test_dropped_tokens_keep_cached_kv_in_deeper_layers():
    rt = tiny_runtime("tiny-mistral")
    ids = random_ids(rt, 24, seed=8)
    cache = rt.prefill(ids).cache
    before = cache[2].view()[0].clone()
    run = torch.tensor([5, 23])
    rt.forward(ids[run], run, cache, [run, run, torch.tensor([23])], logits="none")
    assert torch.equal(cache[2].view()[0][:, 5], before[:, 5])


def test_callable_plan_decides_after_observing_a_shallow_layer():
    """The A3/CacheBlend pattern: every token through layers 0–1, a subset chosen at layer 2
    from what layer 1 showed; the same as that plan given up front as a list."""
    rt = tiny_runtime("tiny-llama")
    ids = random_ids(rt, 40, seed=9)
    a, b = rt.prefill(ids[:15]), rt.prefill(ids[15:30])
    keys = [torch.cat([x, y], 1) for x, y in zip(a.keys, b.keys)]
    values = [torch.cat([x, y], 1) for x, y in zip(a.values, b.values)]
    everything = torch.arange(40)
    seen = {}

    def observe(layer, q, pos, cache_layer):
        if layer == 1:  # score context keys by the question's attention at layer 1
            k, _, k_pos = cache_layer.view()
            s = torch.einsum("hgqd,hkd->k", q[:, :, pos >= 30], k[:, k_pos < 30])
            seen["chosen"] = torch.sort(torch.topk(s, 6).indices).values

    def plan(layer, current):
        return None if layer < 2 else torch.cat([seen["chosen"], torch.arange(30, 40)])

    cache = rt.dense_cache(keys, values, torch.arange(30))
    dynamic = rt.forward(ids, everything, cache, plan, observe=observe, logits="all")
    listed_plan = [everything, everything, torch.cat([seen["chosen"], torch.arange(30, 40)])]
    cache = rt.dense_cache(keys, values, torch.arange(30))
    listed = rt.forward(ids, everything, cache, listed_plan, logits="all")
    assert dynamic.positions.numel() == 16
    assert torch.equal(dynamic.logits, listed.logits)
    cache = rt.dense_cache(keys, values, torch.arange(30))
    with pytest.raises(ActiveSetError, match="new tokens"):
        rt.forward(ids, everything, cache, lambda layer, cur: None if layer < 2 else cur[:-1])
    assert [layer.max_pos for layer in cache] == [29] * rt.n_layers  # nothing half-appended
