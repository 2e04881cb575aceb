"""`common.model.attention.attention_probs` (eviction's and A3's scoring) equals its plain
reference: probes after a context, queries among their keys, sliding windows, keys in any
order, and queries that see no key (zeros, not NaN)."""
import pytest
import torch

from kvedge.common.model.attention import attention_probs, attention_probs_reference

CASES = {  # name: (query positions, key positions, window)
    "probe after its context": (torch.arange(40, 52), torch.arange(52), None),
    "queries among their keys": (torch.arange(0, 30, 3), torch.arange(30), None),
    "sliding window": (torch.arange(40, 52), torch.arange(52), 16),
    "keys with gaps, window": (torch.tensor([9, 20, 33]),
                               torch.tensor([0, 1, 5, 9, 18, 31, 33]), 12),
    "no key seen": (torch.tensor([2, 3, 35]), torch.tensor([4, 5, 30, 31]), 8),
    "unsorted keys": (torch.arange(10, 14), torch.tensor([12, 3, 0, 13, 7, 11, 10]), None),
    "no query": (torch.arange(0), torch.arange(5), None),
    "no key": (torch.arange(3), torch.arange(0), None),
}


@pytest.mark.parametrize("name", CASES)
def test_attention_probs_equal_the_reference(name):
    q_pos, k_pos, window = CASES[name]
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, q_pos.numel(), 8, generator=gen)
    k = torch.randn(2, k_pos.numel(), 8, generator=gen)
    fast = attention_probs(q, k, q_pos, k_pos, 0.35, window)
    reference = attention_probs_reference(q, k, q_pos, k_pos, 0.35, window)
    torch.testing.assert_close(fast, reference, atol=1e-6, rtol=1e-5)
    assert not fast.isnan().any() and fast.shape == (2, 3, q_pos.numel(), k_pos.numel())
    if name == "no key seen":
        assert fast[:, :, :2].abs().sum() == 0 and (fast[:, :, 2].sum(-1) > 0.99).all()


def test_key_votes_in_chunks_take_the_same_maximum():
    """`key_votes(chunk=)` (eviction's max votes on the CPU, `scoring.MAX_CHUNK`): the
    queries through the softmax a few at a time take the maximum of the same values as one
    pass — the very bits at the chunk used, on SmolLM2's and Qwen2.5-0.5B's head shapes
    (a single query's row may come from another matmul kernel: within an ulp) — with a probe
    after its context, a span of seen keys, and the probe's own keys left out; a sum refuses
    chunks (its additions' order would change)."""
    from kvedge.cloud.eviction.scoring import MAX_CHUNK
    from kvedge.common.model.attention import key_votes
    from kvedge.common.model.kvcache import DenseKV

    n_ctx, n_probe = 300, 77
    seen = torch.zeros(n_ctx, dtype=torch.bool)
    seen[:4] = seen[200:] = True
    for group in (3, 7):
        gen = torch.Generator().manual_seed(group)
        layer = DenseKV(torch.randn(2, n_ctx + n_probe, 64, generator=gen),
                        torch.randn(2, n_ctx + n_probe, 64, generator=gen),
                        torch.arange(n_ctx + n_probe))
        q = torch.randn(2, group, n_probe, 64, generator=gen)
        q_pos = torch.arange(n_ctx, n_ctx + n_probe)
        for span in (None, seen):
            whole = key_votes(q, q_pos, layer, 0.125, None, n_ctx, "max", span)
            assert torch.equal(key_votes(q, q_pos, layer, 0.125, None, n_ctx, "max", span,
                                         MAX_CHUNK), whole)
            for chunk in (1, 5, 64):
                torch.testing.assert_close(key_votes(q, q_pos, layer, 0.125, None, n_ctx,
                                                     "max", span, chunk), whole,
                                           atol=1e-7, rtol=1e-6)
            assert (whole > 0).sum() == (n_ctx if span is None else 104) * 2
    assert torch.equal(key_votes(q[:, :, :0], q_pos[:0], layer, 0.125, None, n_ctx, "max",
                                 None, 8), torch.zeros(2, n_ctx))
    with pytest.raises(ValueError, match="only for reduce='max'"):
        key_votes(q, q_pos, layer, 0.125, None, n_ctx, "sum", None, 8)
