"""Static decode (common/model/static_decode.py): an answer stepped in fixed buffers gives the
logits of the runtime's own unpadded step, to float rounding, and the same tokens — over dense,
ragged (evicted) and gapped caches, sliding windows, GQA and q/k norms (the tiny models); handed
back to its own cache, it decodes on with `decode_step` as if every step had been one."""
import pytest
import torch

from conftest import TINY, tiny_runtime
from test_batching import REQUESTS, cache_state, same, started
from kvedge.common.errors import CacheError
from kvedge.common.model.batch import decode_step
from kvedge.common.model.static_decode import StaticDecode, static_decode

STEPS = 7


@pytest.mark.parametrize("name", TINY)
def test_static_steps_equal_the_runtime_step(name):
    rt = tiny_runtime(name)
    for seed, (kind, n) in enumerate(REQUESTS):
        ref, static = started(rt, kind, n, seed), started(rt, kind, n, seed)
        run = StaticDecode(rt, static, steps=STEPS)
        for _ in range(STEPS):
            if ref.finished:
                break
            decode_step(rt, [ref], row_multiple=1)
            token = run.advance()
            torch.testing.assert_close(static.logits, ref.logits, atol=1e-5, rtol=1e-5)
            assert token == ref.token, (name, kind, n)


def test_static_decode_yields_the_answer_decode_gives():
    from kvedge.common.model.generate import decode
    from kvedge.common.model.decoding import Prompt

    rt = tiny_runtime("tiny-qwen2")
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(3))

    def prompt():
        return Prompt(rt.empty_cache(reserve=60), ids, torch.arange(40))

    from kvedge.common.model.decoding import Decoding

    expected = list(decode(rt, prompt(), 12))
    state = Decoding.start(rt, prompt(), 12)
    assert list(static_decode(rt, state)) == expected and len(expected) == 12


def test_a_full_buffer_and_a_graph_off_cuda_are_named_errors():
    rt = tiny_runtime("tiny-llama")
    run = StaticDecode(rt, started(rt, "dense", 9, 0), steps=1)
    run.advance()
    with pytest.raises(CacheError, match="full"):
        run.advance()
    with pytest.raises(CacheError, match="CUDA"):
        run.graph()


@pytest.mark.parametrize("name", TINY)
def test_a_handed_back_answer_decodes_on_as_if_every_step_were_decode_step(name):
    """3 static steps, hand back, 4 `decode_step`s: the logits and greedy tokens of 7
    `decode_step`s, and the same cache — positions and extent exactly, K/V to rounding."""
    rt = tiny_runtime(name)
    for seed, (kind, n) in enumerate(REQUESTS):
        ref, state = started(rt, kind, n, seed), started(rt, kind, n, seed)
        run = StaticDecode(rt, state)
        for _ in range(3):
            decode_step(rt, [ref], row_multiple=1)
            run.advance()
        run.hand_back()
        for _ in range(4):
            decode_step(rt, [ref], row_multiple=1)
            decode_step(rt, [state], row_multiple=1)
            torch.testing.assert_close(state.logits, ref.logits, atol=1e-5, rtol=1e-5)
            assert state.token == ref.token, (name, kind, n)
        (layers, *rest), (ref_layers, *ref_rest) = cache_state(state), cache_state(ref)
        assert rest == ref_rest  # extent, position, token
        for groups, ref_groups in zip(layers, ref_layers):
            assert len(groups) == len(ref_groups)
            for (k, v, pos), (ref_k, ref_v, ref_pos) in zip(groups, ref_groups):
                assert torch.equal(pos, ref_pos)
                torch.testing.assert_close(k, ref_k, atol=1e-5, rtol=1e-5)
                torch.testing.assert_close(v, ref_v, atol=1e-5, rtol=1e-5)


def test_handing_back_nothing_changes_nothing_and_a_spent_run_refuses_to_step():
    rt = tiny_runtime("tiny-mistral")
    state, ref = started(rt, "ragged", 31, 0), started(rt, "ragged", 31, 0)
    before = cache_state(state)
    run = StaticDecode(rt, state)
    run.hand_back()
    assert same(cache_state(state), before)
    with pytest.raises(CacheError, match="handed back"):
        run.advance()
    with pytest.raises(CacheError, match="handed back"):
        run.hand_back()
    decode_step(rt, [state], row_multiple=1)  # the answer goes on in its own cache
    decode_step(rt, [ref], row_multiple=1)
    assert torch.equal(state.logits, ref.logits)


def test_a_position_inside_the_context_is_refused_as_decode_step_refuses_it():
    rt = tiny_runtime("tiny-llama")
    state = started(rt, "dense", 9, 0)
    run = StaticDecode(rt, state)
    last = state.position
    state.position = 2  # its next token would land inside its context
    with pytest.raises(CacheError, match="inside the cache's context"):
        run.advance()
    with pytest.raises(CacheError, match="inside the cache's context"):
        decode_step(rt, [state])
    with pytest.raises(CacheError, match="inside the cache's context"):
        StaticDecode(rt, state)
    state.position = last
    run.advance()
    assert run.ran == 1
