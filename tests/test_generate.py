"""Decoding over runtime caches: greedy matches transformers; sampling is seeded."""
import pytest
import torch

from conftest import TINY, tiny_runtime
from kvedge.common.model.decoding import Sampler
from kvedge.common.model.generate import generate, greedy_answer
from kvedge.common.model.verify import _decode_diff


@pytest.mark.parametrize("name", TINY)
def test_greedy_equals_transformers_generate(name):
    rt = tiny_runtime(name)
    ids = torch.randint(0, 300, (30,), generator=torch.Generator().manual_seed(0))
    ours = greedy_answer(rt, ids.tolist(), max_new_tokens=12)
    with torch.no_grad():
        theirs = rt.model.generate(ids[None], max_new_tokens=12, do_sample=False,
                                   eos_token_id=None, pad_token_id=0)[0, 30:].tolist()
    assert ours == theirs


@pytest.mark.parametrize("name", TINY)
def test_decode_logits_match_transformers_step_by_step(name):
    rt = tiny_runtime(name)
    ids = torch.randint(0, 300, (20,), generator=torch.Generator().manual_seed(1))
    assert _decode_diff(rt, ids, steps=8) <= 1e-4


def test_generate_stops_at_stop_token_and_respects_budget():
    rt = tiny_runtime("tiny-llama")
    ids = torch.arange(10)
    first = greedy_answer(rt, ids.tolist(), max_new_tokens=5)
    assert len(first) == 5
    stopped = greedy_answer(rt, ids.tolist(), max_new_tokens=5, stop_ids=(first[1],))
    assert stopped == first[: first.index(first[1]) + 1]


def test_sampling_is_seeded_and_topk1_is_greedy():
    rt = tiny_runtime("tiny-qwen2")
    ids = torch.arange(12)

    def run(sampler):
        return list(generate(rt, rt.empty_cache(), ids, torch.arange(12), 10, sampler=sampler))

    hot = Sampler(temperature=1.5, seed=7)
    assert run(hot) == run(hot)
    assert run(hot) != run(Sampler(temperature=1.5, seed=8))
    assert run(Sampler(temperature=1.0, top_k=1, seed=3)) == greedy_answer(rt, ids.tolist(), 10)
    assert run(Sampler(temperature=1.0, top_p=1e-6, seed=3)) == greedy_answer(rt, ids.tolist(), 10)
    from kvedge.common.errors import InvalidRequest

    with pytest.raises(InvalidRequest):
        Sampler(temperature=-1)
