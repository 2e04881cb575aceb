"""Reuse strategies against the recompute ceiling on a tiny model, through the engine's types."""
import dataclasses

import pytest
import torch

from conftest import tiny_runtime
from kvedge.common.model.generate import generate
from kvedge.common.model.kvcache import cache_nbytes
from kvedge.common.pack.context import KVContext
from kvedge.edge.strategies import STRATEGIES, Composed, get_strategy, UnknownStrategy
from kvedge.edge.strategies.a3 import A3


def composed_prompt(rt, seed=0, sizes=(30, 24, 40)):
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, 250, (6,), generator=gen)
    pre = rt.prefill(prefix)
    segments = []
    for n in sizes:
        ids = torch.randint(0, 250, (n,), generator=gen)
        res = rt.prefill(ids)  # each segment alone, from position 0, as the cloud does
        segments.append(KVContext.from_dense(res.keys, res.values, ids.tolist(),
                                             model_fingerprint="x", tokenizer_id="y"))
    question = torch.randint(0, 250, (7,), generator=gen).tolist()
    return Composed(prefix.tolist(), pre.keys, pre.values, segments, question)


def first_logits_and_tokens(rt, strategy, composed, steps=6):
    plan = strategy.plan(rt, composed, reserve=steps)
    out = rt.forward(plan.run_ids, plan.run_positions, plan.cache, plan.active,
                     observe=plan.observe)
    tokens = list(generate(rt, plan.cache,
                           torch.tensor([int(out.logits[-1].argmax())]),
                           torch.tensor([composed.question_start + len(composed.question_ids)]),
                           steps))
    return out.logits[-1], tokens, plan


# the option value that makes a selective strategy recompute every context token
RECOMPUTE_ALL = {"ratio": 1.0, "tokens": 1000, "p": 1.0, "cut": False, "fusion": False}
SELECTIVE = sorted(name for name, cls in STRATEGIES.items()
                   if {f.name for f in dataclasses.fields(cls)} & set(RECOMPUTE_ALL))


def recompute_all(name):
    fields = {f.name for f in dataclasses.fields(STRATEGIES[name])}
    return get_strategy(name, {k: v for k, v in RECOMPUTE_ALL.items() if k in fields})


def test_every_strategy_is_a_dataclass_of_checked_options():
    from kvedge.common.errors import InvalidOption
    from kvedge.common.registry import describe

    assert SELECTIVE == ["a3", "cacheblend", "legolink", "samkv", "sparsex"]  # epic: k ≤ 32
    for name, cls in STRATEGIES.items():
        assert dataclasses.is_dataclass(cls) and cls.name == name
        assert len(describe(cls)) == len(dataclasses.fields(cls))
        with pytest.raises(InvalidOption, match="no option"):
            get_strategy(name, {"no_such_knob": 1})


@pytest.mark.parametrize("name", SELECTIVE)
def test_recomputing_everything_equals_the_ceiling(name):
    """At full ratio every selective strategy is exactly full recompute (the prefix's KV is
    exact, every context token is recomputed at every layer)."""
    strategy = recompute_all(name)
    rt = tiny_runtime("tiny-llama")
    composed = composed_prompt(rt)
    ceiling, ceiling_tokens, _ = first_logits_and_tokens(rt, get_strategy("recompute"), composed)
    logits, tokens, plan = first_logits_and_tokens(rt, strategy, composed)
    assert plan.recomputed == composed.n_context
    assert (logits - ceiling).abs().max() <= 1e-4
    assert tokens == ceiling_tokens


def test_reuse_without_recompute_differs_and_full_reuse_is_worse_than_pie():
    rt = tiny_runtime("tiny-llama")
    composed = composed_prompt(rt, seed=1)
    ceiling, _, _ = first_logits_and_tokens(rt, get_strategy("recompute"), composed)
    pie, _, _ = first_logits_and_tokens(rt, get_strategy("pie"), composed)
    full_reuse, _, _ = first_logits_and_tokens(rt, get_strategy("full-reuse"), composed)
    assert (pie - ceiling).abs().max() > 1e-3  # cross-segment attention is missing
    assert (full_reuse - ceiling).abs().max() > (pie - ceiling).abs().max()


@pytest.mark.parametrize("name", SELECTIVE)
def test_selective_strategies_recompute_a_bounded_subset(name):
    rt = tiny_runtime("tiny-qwen3")
    composed = composed_prompt(rt, seed=2, sizes=(60, 50, 80))
    strategy = get_strategy(name)
    _, tokens, plan = first_logits_and_tokens(rt, strategy, composed)
    assert 0 < plan.recomputed < composed.n_context
    assert len(tokens) == 6


def test_a3_picks_what_the_question_attends_to():
    """A3 Eq. 3: the chosen tokens are the top question-attention tokens at layer 1."""
    from kvedge.edge.strategies.a3 import question_attention

    rt = tiny_runtime("tiny-llama")
    composed = composed_prompt(rt, seed=3)
    plan = A3(ratio=0.2).plan(rt, composed, reserve=0)
    seen = {}

    def observe(layer, q, q_pos, cache_layer):
        plan.observe(layer, q, q_pos, cache_layer)
        if layer == 1:
            is_q = q_pos >= composed.question_start
            seen["scores"] = question_attention(q[:, :, is_q], q_pos[is_q], cache_layer, rt.scale,
                                                None, composed.question_start + 7)

    out = rt.forward(plan.run_ids, plan.run_positions, plan.cache, plan.active, observe=observe)
    context = seen["scores"][composed.n_prefix:composed.question_start]
    want = torch.topk(context, plan.recomputed).indices + composed.n_prefix
    kept = out.positions[out.positions < composed.question_start]
    assert set(kept.tolist()) == set(want.tolist())


def test_ragged_segments_assemble_a_smaller_ragged_cache():
    rt = tiny_runtime("tiny-llama")
    composed = composed_prompt(rt, seed=4)
    dense = get_strategy("pie").plan(rt, composed, 0).cache
    keep = [[p[::3] for p in layer] for layer in composed.segments[1].kept_positions]
    composed.segments[1] = composed.segments[1].select(keep)
    for name in STRATEGIES:
        plan = get_strategy(name).plan(rt, composed, 4)
        out = rt.forward(plan.run_ids, plan.run_positions, plan.cache, plan.active,
                         observe=plan.observe)
        assert torch.isfinite(out.logits).all(), name
    ragged = get_strategy("pie").plan(rt, composed, 0).cache
    assert cache_nbytes(ragged) < cache_nbytes(dense)


def context_run(plan, composed) -> set[int]:
    """The segment positions a plan runs at layer 0 (the fresh tokens left out)."""
    reused = set(composed.reused_positions().tolist())
    return set(plan.run_positions.tolist()) & reused


def test_epic_recomputes_the_first_k_tokens_of_every_segment_and_legolink_both_ends():
    from kvedge.common.errors import InvalidOption

    rt = tiny_runtime("tiny-llama")
    composed = composed_prompt(rt, seed=9, sizes=(60, 10, 80))
    fresh = set(composed.fresh_positions().tolist())
    for strategy, local in ((get_strategy("epic"), lambda n: range(min(16, n))),
                            (get_strategy("epic", {"k": 4}), lambda n: range(4)),
                            (get_strategy("legolink"),
                             lambda n: {*range(min(20, n)), *range(max(n - 20, 0), n)}),
                            (get_strategy("legolink", {"first": 4}),
                             lambda n: {*range(min(4, n)), *range(max(n - 20, 0), n)}),
                            (get_strategy("legolink", {"first": 0, "tokens": 8}),
                             lambda n: set(range(max(n - 8, 0), n)))):
        plan = strategy.plan(rt, composed, reserve=0)
        want = {off + i for seg, off in zip(composed.segments, composed.offsets)
                for i in local(seg.n_tokens)}
        assert context_run(plan, composed) == want and plan.recomputed == len(want)
        assert fresh <= set(plan.run_positions.tolist())
    with pytest.raises(InvalidOption, match="'k' must be in"):
        get_strategy("epic", {"k": 33})  # EPIC recomputes at most 32 tokens per chunk


@pytest.mark.parametrize("texts", [(), ([], [5, 6, 7], [8, 9])])
def test_epic_at_k_32_over_short_segments_equals_the_ceiling(texts):
    """Segments of ≤ 32 tokens are recomputed whole: exactly full recompute, fresh text
    between segments included."""
    rt = tiny_runtime("tiny-llama")
    base = composed_prompt(rt, seed=10, sizes=(20, 32, 12))
    composed = Composed(base.prefix_ids, base.prefix_keys, base.prefix_values, base.segments,
                        base.question_ids, texts=texts)
    ceiling, ceiling_tokens, _ = first_logits_and_tokens(rt, get_strategy("recompute"), composed)
    logits, tokens, plan = first_logits_and_tokens(rt, get_strategy("epic", {"k": 32}), composed)
    assert plan.recomputed == composed.n_context
    assert (logits - ceiling).abs().max() <= 1e-4 and tokens == ceiling_tokens


def test_unknown_strategy_is_named():
    with pytest.raises(UnknownStrategy, match="choose one of"):
        get_strategy("oracle")


@pytest.mark.parametrize("boundary", [0.0, 0.34])
def test_sparsex_recomputing_everything_equals_the_ceiling_with_and_without_hybrid(boundary):
    rt = tiny_runtime("tiny-qwen2")
    composed = composed_prompt(rt, seed=5)
    ceiling, ceiling_tokens, _ = first_logits_and_tokens(rt, get_strategy("recompute"), composed)
    logits, tokens, plan = first_logits_and_tokens(
        rt, get_strategy("sparsex", {"ratio": 1.0, "boundary": boundary}), composed)
    assert plan.recomputed == composed.n_context
    assert (logits - ceiling).abs().max() <= 1e-4 and tokens == ceiling_tokens


def test_sparsex_recompute_set_is_topk_plus_overflow_plus_segment_heads():
    """Alg. 1 lines 14–17 on a 3-segment prompt: R = top-k ∪ the block before the question
    ∪ the first tokens of every segment; only R (and the question) run after ℓ*."""
    from kvedge.edge.strategies.sparsex import SparseX, intervals

    assert intervals(torch.tensor([3, 4, 5, 9, 10, 20])) == [(3, 6), (9, 11), (20, 21)]
    rt = tiny_runtime("tiny-llama")  # 3 layers: boundary 0.34 → ℓ* = 1
    composed = composed_prompt(rt, seed=6)
    strategy = SparseX(ratio=0.1, boundary=0.34, block=4, segment_head=2)
    plan = strategy.plan(rt, composed, reserve=0)
    out = rt.forward(plan.run_ids, plan.run_positions, plan.cache, plan.active,
                     observe=plan.observe)
    context = out.positions[out.positions < composed.question_start]
    q0 = composed.question_start
    overflow = set(range(q0 - 4, q0))
    heads = {off + i for off in composed.offsets for i in range(2)}
    assert overflow | heads <= set(context.tolist())
    assert context.numel() == plan.recomputed == round(0.1 * composed.n_context) + len(overflow | heads)


@pytest.mark.parametrize("name", ["a3", "cacheblend"])
def test_shallow_selection_recomputes_segment_heads_on_top_of_its_top_k(name):
    """`segment_head`: every segment's first tokens run at every layer, and the ratio's top-k
    is still taken whole from the other tokens; 0 leaves the papers' selection."""
    rt = tiny_runtime("tiny-llama")
    composed = composed_prompt(rt, seed=6)
    heads = {off + i for off in composed.offsets for i in range(3)}
    top_k = round(0.1 * composed.n_context)
    for segment_head, expected in [(3, top_k + len(heads)), (0, top_k)]:
        strategy = get_strategy(name, {"ratio": 0.1, "segment_head": segment_head})
        plan = strategy.plan(rt, composed, reserve=0)
        out = rt.forward(plan.run_ids, plan.run_positions, plan.cache, plan.active,
                         observe=plan.observe)
        context = set(out.positions[out.positions < composed.question_start].tolist())
        assert len(context) == plan.recomputed == expected
        assert (heads <= context) == (segment_head == 3)


def interleaved_prompt(rt, seed=7):
    """[prefix][seg 0][text][seg 1][text][seg 2][question]: fresh text between segments."""
    composed = composed_prompt(rt, seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    texts = ([], torch.randint(0, 250, (5,), generator=gen).tolist(),
             torch.randint(0, 250, (3,), generator=gen).tolist())
    return Composed(composed.prefix_ids, composed.prefix_keys, composed.prefix_values,
                    composed.segments, composed.question_ids, texts=texts)


@pytest.mark.parametrize("name", SELECTIVE)
def test_selective_strategies_at_full_ratio_are_exact_on_interleaved_prompts(name):
    """Fresh text between cached segments runs in the same forward (SparseX Sec. 3–4)."""
    rt = tiny_runtime("tiny-llama")
    composed = interleaved_prompt(rt)
    ceiling, ceiling_tokens, _ = first_logits_and_tokens(rt, get_strategy("recompute"), composed)
    logits, tokens, plan = first_logits_and_tokens(rt, recompute_all(name), composed)
    assert plan.recomputed == composed.n_context
    assert (logits - ceiling).abs().max() <= 1e-4 and tokens == ceiling_tokens


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_every_strategy_runs_interleaved_and_with_an_evicted_segment_tail(name):
    """A segment whose last tokens every head evicted is still context (issue 11, fix a)."""
    rt = tiny_runtime("tiny-llama")
    composed = interleaved_prompt(rt, seed=8)
    last = composed.segments[-1]
    composed.segments[-1] = last.select([[p[p < last.n_tokens - 5] for p in layer]
                                         for layer in last.kept_positions])
    logits, tokens, plan = first_logits_and_tokens(rt, get_strategy(name), composed)
    assert torch.isfinite(logits).all() and len(tokens) == 6
    if name == "sparsex":  # overflow widens the text before the last segment into both sides
        assert plan.recomputed > 0
