"""A3's extension (Sec. 2, "Extention"): SnapKV eviction to capacity C after the first token."""
import pytest
import torch

from conftest import tiny_runtime
from kvedge.common.errors import InvalidOption
from kvedge.common.model.generate import generate
from kvedge.common.model.kvcache import cache_nbytes
from kvedge.edge.strategies import get_strategy
from test_strategies import composed_prompt, interleaved_prompt

STEPS = 6


def answer(rt, composed, options):
    """(tokens, plan) of a greedy answer through the engine's path: plan, then `generate`
    with the plan's hooks (the eviction runs after the first token)."""
    plan = get_strategy("a3", options).plan(rt, composed, reserve=STEPS)
    tokens = list(generate(rt, plan.cache, plan.run_ids, plan.run_positions, STEPS,
                           active=plan.active, observe=plan.observe,
                           after_first=plan.after_first))
    return tokens, plan


def rows_per_head(cache, keep=lambda pos: torch.ones_like(pos, dtype=torch.bool)):
    """[layer][kv head] how many rows the head holds (of those `keep` marks)."""
    return [[int(keep(g.positions).sum()) for g in layer.heads() for _ in range(g.keys.shape[0])]
            for layer in cache]


@pytest.mark.parametrize("model", ["tiny-llama", "tiny-qwen3"])
def test_capacity_at_least_the_prompt_changes_nothing(model):
    rt = tiny_runtime(model)
    composed = composed_prompt(rt, seed=5)
    base, plain = answer(rt, composed, {})
    same, roomy = answer(rt, composed, {"capacity": composed.seq_len()})
    assert same == base and len(base) == STEPS
    assert cache_nbytes(roomy.cache) == cache_nbytes(plain.cache)
    assert all(layer.__class__ is other.__class__
               for layer, other in zip(roomy.cache, plain.cache))  # nothing became ragged


@pytest.mark.parametrize("cloud_evicted", [False, True])
def test_small_capacity_keeps_exactly_c_rows_per_head_and_decodes_over_them(cloud_evicted):
    """Every (layer, KV head) holds C prompt rows after the first token: the prefix and the
    question whole, the top C − |S| − |Q| document tokens; then the decoded tokens. Also
    over a segment the cloud evicted (a ragged cache before A3 evicts)."""
    rt = tiny_runtime("tiny-llama")
    composed = composed_prompt(rt, seed=6)
    if cloud_evicted:
        seg = composed.segments[1]
        composed.segments[1] = seg.select([[p[h::3] for h, p in enumerate(layer)]
                                           for layer in seg.kept_positions])
    capacity = composed.n_prefix + len(composed.question_ids) + 20
    _, full = answer(rt, composed, {})
    tokens, plan = answer(rt, composed, {"capacity": capacity})
    assert len(tokens) == STEPS
    end = composed.seq_len()
    prompt = rows_per_head(plan.cache, lambda pos: pos < end)
    assert all(n == capacity for layer in prompt for n in layer)
    context = rows_per_head(plan.cache, lambda pos: (pos >= composed.n_prefix)
                            & (pos < composed.question_start))
    assert all(n == 20 for layer in context for n in layer)
    protected = torch.cat([torch.arange(composed.n_prefix), composed.question_positions()])
    for layer in plan.cache:
        for g in layer.heads():
            assert torch.isin(protected, g.positions).all()
            # the decoded tokens' K/V (all but the last pick's) follow the kept rows
            assert g.positions[g.positions >= end].tolist() == list(range(end, end + STEPS - 1))
    assert cache_nbytes(plan.cache) < 0.5 * cache_nbytes(full.cache)
    heads = [tuple(g.positions.tolist()) for layer in plan.cache for g in layer.heads()]
    assert len(set(heads)) > 1  # per-head selection: not one set shared by every head


def test_kept_rows_are_the_questions_snapkv_votes():
    """The kept document rows of a head are its top C − |S| − |Q| by the question's
    attention at that layer (summed over its query heads), max-pooled over 7 neighbours."""
    import torch.nn.functional as F

    from kvedge.common.model.attention import attention_probs_reference as attention_probs

    rt = tiny_runtime("tiny-llama")
    composed = composed_prompt(rt, seed=7)
    budget = 15
    capacity = composed.n_prefix + len(composed.question_ids) + budget
    strategy = get_strategy("a3", {"capacity": capacity})
    plan = strategy.plan(rt, composed, reserve=1)
    seen = {}

    def observe(layer, q, q_pos, cache_layer):
        plan.observe(layer, q, q_pos, cache_layer)
        if layer == rt.n_layers - 1:
            is_q = q_pos >= composed.question_start
            k, _, pos = cache_layer.view()  # dense: every head holds every position
            probs = attention_probs(q[:, :, is_q], k, q_pos[is_q], pos, rt.scale)
            seen["votes"] = torch.zeros(rt.n_kv, composed.seq_len())
            seen["votes"][:, pos] = probs.sum(dim=(1, 2))
    rt.forward(plan.run_ids, plan.run_positions, plan.cache, plan.active, observe=observe)
    plan.after_first(plan.cache)
    doc = torch.zeros(composed.seq_len(), dtype=torch.bool)
    doc[composed.reused_positions()] = True
    votes = F.max_pool1d((seen["votes"] * doc)[None], 7, 1, 3)[0]
    for g in plan.cache[-1].heads():
        kept = g.positions[doc[g.positions]]
        want = torch.topk(votes[g.first][doc], budget).indices + composed.n_prefix
        assert set(kept.tolist()) == set(want.tolist())


def test_interleaved_fresh_text_is_kept_like_the_prefix():
    rt = tiny_runtime("tiny-llama")
    composed = interleaved_prompt(rt)
    fresh = composed.fresh_positions()
    capacity = composed.n_prefix + fresh.numel() + 10
    tokens, plan = answer(rt, composed, {"capacity": capacity})
    assert len(tokens) == STEPS
    end = composed.seq_len()
    for layer in plan.cache:
        for g in layer.heads():
            prompt = g.positions[g.positions < end]
            assert prompt.numel() == capacity and torch.isin(fresh, prompt).all()


def test_bad_capacities_are_named_errors():
    rt = tiny_runtime("tiny-llama")
    composed = composed_prompt(rt, seed=8)
    with pytest.raises(InvalidOption, match="capacity"):
        get_strategy("a3", {"capacity": -1})
    with pytest.raises(InvalidOption, match="capacity"):
        get_strategy("a3", {"capacity": "many"})
    too_small = composed.n_prefix + len(composed.question_ids) - 1
    with pytest.raises(InvalidOption, match="raise it, or use 0"):
        get_strategy("a3", {"capacity": too_small}).plan(rt, composed, reserve=1)


def test_the_engines_answer_reports_the_evicted_kv_bytes():
    """Through `EdgeEngine.answer` (the benchmark's path): the final costs' kv_bytes is the
    evicted cache's, well below a3's without eviction, and sequence_ratio follows it."""
    from kvedge.common.model.models import load_model
    from kvedge.edge.engine import EdgeEngine

    engine = EdgeEngine(load_model("tiny-llama"))
    try:
        composed = composed_prompt(engine.rt, seed=9)
        composed = engine.compose(composed.segments, "what is it?", "")
        costs = {}
        for capacity in (0, composed.n_prefix + len(composed.question_ids) + 16):
            *_, stats = engine.answer(composed, get_strategy("a3", {"capacity": capacity}), 4)
            costs[capacity] = stats
        plain, evicted = costs.values()
        assert evicted["kv_bytes"] < 0.5 * plain["kv_bytes"]
        assert evicted["sequence_ratio"] == pytest.approx(16 / composed.n_context)
        assert plain["sequence_ratio"] == 1.0
    finally:
        engine.close()
