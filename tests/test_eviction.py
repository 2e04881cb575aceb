"""Query-agnostic eviction: budgets, protected tokens, ContrastKV's fusion, exact scoring."""
import pytest
import torch

from conftest import tiny_runtime
from kvedge.cloud.eviction import METHODS, UnknownMethod, evict_context, get_method
from kvedge.cloud.eviction import scoring
from kvedge.cloud.eviction.contrastkv import fuse, head_fusion, noise_sequence
from kvedge.common.errors import InvalidRequest
from kvedge.common.model.generate import generate
from kvedge.common.model.kvcache import cache_nbytes
from kvedge.common.pack.context import KVContext
from kvedge.edge.strategies import Composed, get_strategy


def context(rt, n=120, seed=0):
    ids = torch.randint(0, 250, (n,), generator=torch.Generator().manual_seed(seed))
    res = rt.prefill(ids)
    return KVContext.from_dense(res.keys, res.values, ids.tolist(), model_fingerprint="m",
                                tokenizer_id="t")


EVICTING = sorted(m for m in METHODS if m != "none")  # `none` keeps all: tested on its own


@pytest.mark.parametrize("name", EVICTING)
@pytest.mark.parametrize("budget", [0.1, 0.5])
def test_every_method_keeps_exactly_its_budget_and_the_sinks(name, budget):
    rt = tiny_runtime("tiny-llama")
    ctx = context(rt)
    result = get_method(name, budget).evict(rt, ctx)
    total = rt.n_layers * rt.n_kv * ctx.n_tokens
    assert result.kept_pairs == round(budget * total)
    for layer in result.kept:
        for kept in layer:
            assert torch.equal(kept, torch.unique(kept))  # sorted, no repeats
            assert int(kept.min()) >= 0 and int(kept.max()) < ctx.n_tokens
            assert set(range(4)) <= set(kept.tolist())  # attention sinks stay
    again = get_method(name, budget).evict(rt, ctx)
    assert all(torch.equal(a, b) for la, lb in zip(result.kept, again.kept)
               for a, b in zip(la, lb))


def test_none_keeps_every_pair_whatever_the_budget():
    rt = tiny_runtime("tiny-llama")
    ctx = context(rt, n=40)
    small = evict_context(rt, ctx, "contrastkv", 0.5)
    assert ctx.block_summaries is not None and small.block_summaries is None  # not shipped
    for whole in (ctx, small):
        same = evict_context(rt, whole, "none", 0.1)
        assert all(torch.equal(a, b) for la, lb in zip(same.kept_positions, whole.kept_positions)
                   for a, b in zip(la, lb))
        assert all(torch.equal(a, b) for la, lb in zip(same.keys, whole.keys)
                   for a, b in zip(la, lb))


def test_scores_once_then_keep_each_budget_is_evict():
    """The benchmark's path (score a context once, keep several budgets) is `evict`'s."""
    rt = tiny_runtime("tiny-llama")
    ctx = context(rt, seed=5)
    scores = get_method("kvzip", 0.5).scores(rt, ctx)
    for budget in (0.5, 0.2):
        method = get_method("kvzip", budget)
        assert all(torch.equal(a, b) for la, lb in zip(method.keep(scores, ctx),
                                                       method.evict(rt, ctx).kept)
                   for a, b in zip(la, lb))


def test_method_options_come_from_the_registry_checked():
    from kvedge.common.errors import InvalidOption

    assert get_method("contrastkv", 0.2, beta="0.1", t_neg="32").t_neg == 32  # a CLI's strings
    with pytest.raises(InvalidOption, match="beta"):
        get_method("contrastkv", 0.2, beta=0.9)
    with pytest.raises(InvalidOption, match="no option"):
        get_method("kvzip", 0.2, gamma=0.1)


def test_adaptive_methods_spread_budgets_unevenly_and_uniform_ones_do_not():
    rt = tiny_runtime("tiny-qwen3")
    ctx = context(rt, seed=1)
    counts = lambda name: {k.numel() for layer in get_method(name, 0.2).evict(rt, ctx).kept
                           for k in layer}
    assert len(counts("contrastkv")) > 1 and len(counts("kvzip")) > 1
    assert len(counts("snapkv")) == 1 and len(counts("streamingllm")) == 1


def test_protected_prefix_is_never_evicted():
    rt = tiny_runtime("tiny-llama")
    ctx = context(rt, seed=2)
    kept = get_method("contrastkv", 0.1, protect=20).evict(rt, ctx).kept
    assert all(set(range(20)) <= set(k.tolist()) for layer in kept for k in layer)


def test_streamingllm_keeps_sinks_and_the_most_recent():
    rt = tiny_runtime("tiny-llama")
    ctx = context(rt, n=100)
    kept = get_method("streamingllm", 0.2).evict(rt, ctx).kept[0][0].tolist()
    assert kept == [0, 1, 2, 3] + list(range(84, 100))


def test_head_and_layer_fusion_follow_eq_9_and_10():
    pos = torch.tensor([[0.9, 0.1, 0.5, 0.02, 0.4]])
    neg = torch.tensor([[0.95, 0.05, 0.1, 0.01, 0.9]])
    gated, undecided = head_fusion(pos, neg, beta=0.2)
    # token 0 is top in both → 1.0; token 3 bottom in both → 0.0; others keep S_pos
    assert torch.allclose(gated, torch.tensor([[1.0, 0.1, 0.5, 0.0, 0.4]]))
    assert undecided.tolist() == [[False, True, True, False, True]]
    fused = fuse(pos, neg, beta=0.2, gamma=0.12)
    neg_hat = (neg - 0.01) / (0.95 - 0.01)
    expect = [1.0, 0.1 + 0.12 * neg_hat[0, 1], 0.5 + 0.12 * neg_hat[0, 2], 0.0,
              min(0.4 + 0.12 * neg_hat[0, 4].item(), 0.9)]
    assert torch.allclose(fused[0], torch.tensor(expect))


def test_noise_is_seeded_and_uniform_over_the_vocabulary():
    a, b = noise_sequence(1000, 4096, 3), noise_sequence(1000, 4096, 3)
    assert a == b and a != noise_sequence(1000, 4096, 4)
    assert len(set(a)) > 900  # max entropy: close to every id appears


def test_probe_scores_are_eq8_and_do_not_depend_on_chunking(monkeypatch):
    """Max attention over groups and probe positions, sliced to the context, equals a direct
    computation from the joint prefill's layer-0 queries and keys."""
    rt = tiny_runtime("tiny-llama")
    ctx = context(rt, n=40, seed=3)
    probe = list(range(100, 130))
    scores = scoring.probe_scores(rt, scoring.context_cache(rt, ctx), 40, probe)
    monkeypatch.setattr(scoring, "QUERY_CHUNK", 7)
    assert all(torch.allclose(a, b) for a, b in zip(
        scores, scoring.probe_scores(rt, scoring.context_cache(rt, ctx), 40, probe)))
    joint = rt.prefill(torch.tensor(ctx.token_ids + probe), want_queries=True)
    pos = torch.arange(70)
    q = rt.realign(joint.queries[0], pos).view(rt.n_kv, rt.group, 70, -1)
    k = rt.realign(joint.keys[0], pos)
    att = torch.einsum("hgqd,hkd->hgqk", q, k) * rt.scale
    att = att.masked_fill(pos[None, :] > pos[:, None], float("-inf")).softmax(-1)
    direct = att[:, :, 40:, :40].amax(dim=(1, 2))
    assert torch.allclose(scores[0], direct, atol=1e-5)


def test_evicted_context_answers_from_a_smaller_ragged_cache():
    rt = tiny_runtime("tiny-llama")
    ctx = context(rt, seed=4)
    prefix = rt.prefill(torch.tensor([257, 5, 6]))
    sizes = {}
    for budget in (1.0, 0.5, 0.2):
        small = ctx if budget == 1.0 else evict_context(rt, ctx, "contrastkv", budget)
        composed = Composed([257, 5, 6], prefix.keys, prefix.values, [small], [7, 8, 9])
        plan = get_strategy("pie").plan(rt, composed, reserve=4)
        sizes[budget] = cache_nbytes(plan.cache)
        tokens = list(generate(rt, plan.cache, plan.run_ids, plan.run_positions, 4))
        assert len(tokens) == 4
    assert sizes[0.2] < sizes[0.5] < sizes[1.0]
    assert sizes[0.2] < 0.35 * sizes[1.0]


def test_bad_method_requests_are_named():
    with pytest.raises(UnknownMethod, match="choose one of"):
        get_method("psychic", 0.2)
    with pytest.raises(InvalidRequest, match="budget"):
        get_method("kvzip", 0.0)


def test_kvzip_reconstructs_chunk_by_chunk_in_its_own_words():
    """KVzip's `self_task`: chunk 0 asks to repeat the context, chunk i to repeat the part
    starting with chunk i−1's last tokens; then the assistant header and the chunk itself."""
    from kvedge.cloud.eviction.kvzip import REPEAT, REPEAT_PART, reconstruction_prompts

    rt = tiny_runtime("tiny-llama")
    tok = rt.loaded.tokenizer
    ids = list(range(10, 50))
    prompts = reconstruction_prompts(tok, ids, chunk=16, seed_tokens=4)
    assert [span for _, span in prompts] == [(0, 16), (16, 32), (32, 40)]
    ask = tok(REPEAT, add_special_tokens=False)["input_ids"]
    part = tok(REPEAT_PART, add_special_tokens=False)["input_ids"]
    first, second = prompts[0][0], prompts[1][0]
    assert first[:len(ask)] == ask and first[-16:] == ids[:16]
    assert second[:len(part) + 4] == part + ids[12:16] and second[-16:] == ids[16:32]
    header = first[len(ask):-16]
    assert header and second[len(part) + 4:-16] == header  # the same assistant header


def test_a_chunks_probe_is_normalized_over_the_sink_its_chunk_and_itself():
    """KVzip's `_get_score`: the softmax runs over the sink, the chunk's keys and the probe's
    own; keys of other chunks neither vote nor take attention."""
    rt = tiny_runtime("tiny-llama")
    ctx = context(rt, n=40, seed=5)
    probe = list(range(100, 120))
    scores = scoring.probe_scores(rt, scoring.context_cache(rt, ctx), 40, probe,
                                  span=(16, 32), sink=4)
    joint = rt.prefill(torch.tensor(ctx.token_ids + probe), want_queries=True)
    pos = torch.arange(60)
    q = rt.realign(joint.queries[0], pos).view(rt.n_kv, rt.group, 60, -1)
    k = rt.realign(joint.keys[0], pos)
    seen = (pos < 4) | ((pos >= 16) & (pos < 32)) | (pos >= 40)
    att = torch.einsum("hgqd,hkd->hgqk", q, k) * rt.scale
    hidden = (pos[None, :] > pos[:, None]) | ~seen[None, :]
    att = att.masked_fill(hidden, float("-inf")).softmax(-1)
    direct = att[:, :, 40:, :40].amax(dim=(1, 2))
    assert torch.allclose(scores[0], direct, atol=1e-5)
    assert scores[0][:, 4:16].abs().sum() == 0 and scores[0][:, 32:].abs().sum() == 0
    assert (scores[0][:, 16:32] > 0).all()


def test_kvzip_and_contrastkv_share_one_reconstruction_probe_where_asked(monkeypatch):
    """KVzip's reconstruction is ContrastKV's positive signal (ContrastKV Sec. 4.1): inside
    `sharing_signals` the second method reuses it (same scores, one probe fewer) and the
    memo charges the probe's seconds to the reuse; outside, every method probes alone."""
    rt = tiny_runtime("tiny-llama")
    ctx = context(rt, n=60, seed=6)
    alone = {name: get_method(name, 0.2).scores(rt, ctx) for name in ("kvzip", "contrastkv")}
    probes = []
    real = scoring.probe_scores
    monkeypatch.setattr(scoring, "probe_scores",
                        lambda *a, **kw: probes.append(len(a[3])) or real(*a, **kw))
    import kvedge.cloud.eviction.contrastkv as contrastkv
    import kvedge.cloud.eviction.kvzip as kvzip
    monkeypatch.setattr(kvzip, "probe_scores", scoring.probe_scores)
    monkeypatch.setattr(contrastkv, "probe_scores", scoring.probe_scores)
    memo = scoring.SignalMemo()
    with scoring.sharing_signals(memo):
        shared = {name: get_method(name, 0.2).scores(rt, ctx) for name in ("kvzip", "contrastkv")}
    assert len(probes) == 2 and probes[1] == 64  # the reconstruction, then only the noise
    assert memo.reused_s > 0
    for name in alone:
        assert all(torch.equal(a, b) for a, b in zip(alone[name], shared[name]))
    probes.clear()
    get_method("kvzip", 0.2).scores(rt, ctx)
    get_method("kvzip", 0.2).scores(rt, ctx)
    assert len(probes) == 2  # no memo: each scoring probes
    other = context(rt, n=60, seed=7)
    with scoring.sharing_signals(memo):  # another context's tokens miss
        get_method("kvzip", 0.2).scores(rt, other)
    assert len(probes) == 3
