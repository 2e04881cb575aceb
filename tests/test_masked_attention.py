"""The masked path's key cut (`attention._query_chunks`): scattered queries attend only to the
keys up to their chunk's last one, with the same function as one call over every key."""
import torch

from kvedge.bench import masked_attention
from kvedge.common.model import attention
from kvedge.common.model.attention import attention_probs_reference, gqa_attention


def _tensors(n_q: int, n_k: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 3, n_q, 16, generator=g), torch.randn(2, n_k, 16, generator=g),
            torch.randn(2, n_k, 16, generator=g))


def test_scattered_queries_are_cut_and_equal_the_reference():
    """legolink's positions (first and last tokens of each segment) over a dense cache: calls
    of CUT_CHUNK queries, each over the keys up to its last query; the output is softmax·V
    written plainly, and within rounding of the one call over all keys."""
    positions = masked_attention.legolink_positions(segments=8, tokens=60, boundary=10)
    q_pos, k_pos = torch.tensor(positions), torch.arange(480)
    chunks = list(attention._query_chunks(q_pos, k_pos, True))
    assert [stop - start for start, stop, _ in chunks][0] == attention.CUT_CHUNK
    for start, stop, cut in chunks:
        assert cut == int(q_pos[start:stop].max()) + 1  # keys up to the chunk's last query
    assert sum(cut * (stop - start) for start, stop, cut in chunks) < 0.75 * 160 * 480

    q, k, v = _tensors(len(positions), 480)
    out = gqa_attention(q, k, v, q_pos, k_pos, 0.25)
    probs = attention_probs_reference(q, k, q_pos, k_pos, 0.25)
    assert (out - torch.einsum("hgqk,hkd->hgqd", probs, v)).abs().max() <= 1e-5
    with masked_attention.uncut():
        assert list(attention._query_chunks(q_pos, k_pos, True)) == [(0, 160, None)]
        whole = gqa_attention(q, k, v, q_pos, k_pos, 0.25)
    assert (out - whole).abs().max() <= 1e-6


def test_a_run_at_the_end_of_its_cache_is_not_cut():
    """A question after its context, a decode step: every key is visible to nearly every
    query, so the calls (and their bits) stay as they were; nor are unsorted keys, a private
    key (SamKV's write sets) or a cache of at most CUT_CHUNK keys cut."""
    k_pos = torch.arange(1000)
    tail = torch.arange(900, 1000)
    assert list(attention._query_chunks(tail, k_pos, True)) == [(0, 100, None)]
    scattered = torch.arange(0, 1000, 5)
    assert list(attention._query_chunks(scattered, k_pos.flip(0), True)) == [(0, 200, None)]
    assert list(attention._query_chunks(scattered, k_pos, False)) == [(0, 200, None)]
    small = torch.arange(attention.CUT_CHUNK)
    assert list(attention._query_chunks(small[::2], small, True))[0][2] is None


def test_a_cut_chunk_whose_queries_see_no_key_gets_zeros():
    """An evicted head may hold no key at or before a chunk's queries: the cut keeps one key
    (masked), and the queries are blind (zeros), as in the uncut call."""
    k_pos = torch.arange(200, 400)
    q_pos = torch.cat([torch.arange(0, 100), torch.arange(300, 400, 2)])
    q, k, v = _tensors(len(q_pos), 200, seed=1)
    out = gqa_attention(q, k, v, q_pos, k_pos, 0.25)
    assert torch.equal(out[:, :, :100], torch.zeros_like(out[:, :, :100]))
    with masked_attention.uncut():
        whole = gqa_attention(q, k, v, q_pos, k_pos, 0.25)
    assert (out - whole).abs().max() <= 1e-6


def test_the_bench_prints_both_paths_side_by_side(capsys):
    masked_attention.main(["--segments", "3", "--tokens", "100", "--repeats", "1",
                           "--threads", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 2 * len(masked_attention.SHAPES)  # header, one per shape × set
    assert all(float(r.split("|")[-2]) <= 1e-5 for r in rows[1:])  # max |Δ| column
