"""Static decode (common/model/static_decode.py): an answer stepped in fixed buffers gives the
logits of the runtime's own unpadded step, to float rounding, and the same tokens — over dense,
ragged (evicted) and gapped caches, sliding windows, GQA and q/k norms (the tiny models)."""
import pytest
import torch

from conftest import TINY, tiny_runtime
from test_batching import REQUESTS, started
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
