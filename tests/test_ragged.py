"""Ragged (evicted) KV: per-(layer, KV head) kept positions, attention without the full cache."""
import torch

from conftest import tiny_runtime
from kvedge.common.model.attention import gqa_attention
from kvedge.common.model.generate import generate
from kvedge.common.model.kvcache import DenseKV, RaggedKV, cache_nbytes


def per_head(res, keep):
    """Split prefill K/V into per-head lists, keeping positions keep[layer][head]."""
    keys = [[k[h, keep[l][h]] for h in range(k.shape[0])] for l, k in enumerate(res.keys)]
    values = [[v[h, keep[l][h]] for h in range(v.shape[0])] for l, v in enumerate(res.values)]
    return keys, values


def test_ragged_with_everything_kept_equals_dense():
    rt = tiny_runtime("tiny-qwen3")
    ids = torch.randint(0, 300, (50,), generator=torch.Generator().manual_seed(0))
    res = rt.prefill(ids[:40])
    everything = [[torch.arange(40)] * rt.n_kv for _ in range(rt.n_layers)]
    keys, values = per_head(res, everything)
    ragged = rt.ragged_cache(keys, values, everything)
    dense = rt.dense_cache(res.keys, res.values, torch.arange(40))
    a = rt.forward(ids[40:], torch.arange(40, 50), ragged, logits="all").logits
    b = rt.forward(ids[40:], torch.arange(40, 50), dense, logits="all").logits
    assert (a - b).abs().max() <= 1e-5
    assert list(generate(rt, ragged, ids[49:], torch.tensor([50]), 6)) == \
        list(generate(rt, dense, ids[49:], torch.tensor([50]), 6))


def test_ragged_attention_equals_masked_dense_attention():
    """Each KV head sees only its own kept keys: the same as dense attention with the evicted
    keys masked out per head."""
    gen = torch.Generator().manual_seed(1)
    n_kv, group, dim, n = 3, 2, 8, 30
    k, v = torch.randn(n_kv, n, dim, generator=gen), torch.randn(n_kv, n, dim, generator=gen)
    kept = [torch.sort(torch.randperm(n, generator=gen)[:m]).values for m in (5, 17, 30)]
    layer = RaggedKV([k[h, p] for h, p in enumerate(kept)], [v[h, p] for h, p in enumerate(kept)],
                     kept)
    q = torch.randn(n_kv, group, 4, dim, generator=gen)
    q_pos = torch.tensor([2, 11, 25, 29])
    out = layer.attend(q, q_pos, 0.3)
    for h, p in enumerate(kept):
        ref = torch.zeros(group, 4, dim)
        for i, qp in enumerate(q_pos):
            vis = p[p <= qp]
            if vis.numel():
                w = torch.softmax(q[h, :, i] @ k[h, vis].T * 0.3, -1)
                ref[:, i] = w @ v[h, vis]
        assert torch.allclose(out[h], ref, atol=1e-5), h


def test_ragged_cache_holds_only_kept_tokens():
    rt = tiny_runtime("tiny-llama")
    ids = torch.randint(0, 300, (64,), generator=torch.Generator().manual_seed(2))
    res = rt.prefill(ids)
    gen = torch.Generator().manual_seed(3)
    keep = [[torch.sort(torch.randperm(64, generator=gen)[:13]).values for _ in range(rt.n_kv)]
            for _ in range(rt.n_layers)]
    keys, values = per_head(res, keep)
    ragged = rt.ragged_cache(keys, values, keep)
    assert all(layer.kept() == [13] * rt.n_kv for layer in ragged)
    dense = rt.dense_cache(res.keys, res.values, torch.arange(64))
    assert cache_nbytes(ragged) * 4 < cache_nbytes(dense)  # ~20% kept → ~5× fewer bytes
    for layer in ragged:  # no buffer has room for the full length
        assert all(head.k.shape[1] < 64 for head in layer.head_buffers)


def test_ragged_decode_appends_to_every_head_and_recompute_skips_evicted():
    rt = tiny_runtime("tiny-llama")
    ids = torch.randint(0, 300, (24,), generator=torch.Generator().manual_seed(4))
    res = rt.prefill(ids[:20])
    keep = [[torch.tensor([0, 1, 7]), torch.arange(20)] for _ in range(rt.n_layers)]
    keys, values = per_head(res, keep)
    cache = rt.ragged_cache(keys, values, keep)
    run = torch.tensor([7, 9, 20, 21])  # 9 is evicted from head 0: its fresh K/V is not re-added
    out = rt.forward(ids[[7, 9, 20, 21]], run, cache)
    assert torch.isfinite(out.logits).all()
    assert cache[0].head_buffers[0].positions.tolist() == [0, 1, 7, 20, 21]
    assert cache[0].head_buffers[1].positions.tolist() == list(range(22))


def test_blind_query_gets_zero_not_nan():
    q = torch.randn(1, 1, 1, 4)
    out = gqa_attention(q, torch.randn(1, 2, 4), torch.randn(1, 2, 4), torch.tensor([0]),
                        torch.tensor([3, 5]), 0.5)
    assert torch.equal(out, torch.zeros_like(out))


def test_causal_fast_path_equals_the_explicit_mask():
    """Queries that are exactly the keys take the fused kernel's causal mode; a gap in the
    positions (not 0..n-1) or a different query order must still mean position ≤ position."""
    from kvedge.common.model import attention

    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(s, generator=g) for s in ((2, 3, 70, 8), (2, 70, 8), (2, 70, 8)))
    pos = torch.cat([torch.arange(30), torch.arange(50, 90)])
    fast = gqa_attention(q, k, v, pos, pos, 0.3)
    assert attention._self_causal(pos, pos)
    slow = torch.empty_like(q)
    for i in range(70):  # one query at a time never takes the fast path
        slow[:, :, i: i + 1] = gqa_attention(q[:, :, i: i + 1], k, v, pos[i: i + 1], pos, 0.3)
    assert (fast - slow).abs().max() <= 1e-5
    assert not attention._self_causal(pos.flip(0), pos.flip(0))  # not increasing: mask path


def test_dense_cache_grows_and_keeps_contents():
    layer = DenseKV.empty(2, 4, torch.float32, "cpu")
    for p in range(40):
        layer.append(torch.tensor([p]), torch.full((2, 1, 4), float(p)), torch.zeros(2, 1, 4))
    k, _, pos = layer.view()
    assert pos.tolist() == list(range(40)) and torch.equal(k[0, :, 0], torch.arange(40.0))


def test_truncate_forgets_a_turn_and_answers_again_identically():
    from kvedge.common.model.kvcache import truncate_cache

    rt = tiny_runtime("tiny-qwen2")
    ids = torch.randint(0, 300, (30,), generator=torch.Generator().manual_seed(5))
    res = rt.prefill(ids[:20])
    keep = [[torch.arange(0, 20, 2), torch.arange(20)] for _ in range(rt.n_layers)]
    keys, values = per_head(res, keep)
    for cache in (res.cache, rt.ragged_cache(keys, values, keep)):
        first = list(generate(rt, cache, ids[20:25], torch.arange(20, 25), 4))
        truncate_cache(cache, 19)
        assert max(layer.max_pos for layer in cache) == 19
        assert list(generate(rt, cache, ids[20:25], torch.arange(20, 25), 4)) == first
