"""One decode step for many requests at once (continuous batching, Orca-style iteration-level
scheduling: Yu et al., OSDI 2022, Sec. 3).

Each request keeps its own cache (dense or ragged, its own extent and RoPE length); only the
linear layers are shared. Per layer: one QKV matmul over the new token of every request, then
each request's token attends over its own cache alone, then one O-projection and one MLP
matmul over all of them, and one LM-head matmul at the end. A request's tokens therefore do
not depend on which other requests share its steps — provided the matmuls round each row the
same whatever the row count, which is what `ROW_MULTIPLE` is for.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kvedge.common.errors import CacheError
from kvedge.common.generate import Decoding
from kvedge.common.runtime import Runtime, Tokens, rms_norm

# CPU BLAS (MKL/oneDNN) rounds a row differently by the kernel that computes it: one row is a
# matrix-vector product, and rows of a partial 4-row panel take another path than rows of full
# ones. With the row count padded to a multiple of 4 every row gets the same bits whatever the
# count (measured for 1–64 rows on every weight shape of SmolLM2 and the tiny models, 1 and 2
# threads), so an answer is the same alone or in any batch. The price is paid by a request
# decoding alone: on 2 CPU cores SmolLM2's matmuls take ~90 ms for 4 rows against ~50 ms for
# the one row of a matrix-vector product. `row_multiple=1` gives that back (one request alone
# then computes exactly what `Runtime.forward` does) and lets batched rows differ from lone
# ones in the last bits.
ROW_MULTIPLE = 4


@torch.no_grad()
def decode_step(rt: Runtime, states: list[Decoding],
                row_multiple: int = ROW_MULTIPLE) -> list[int]:
    """Run each request's last picked token at its next position through every layer against
    its own cache, then pick each request's next token with its own sampler; returns them.

    Equals `Runtime.forward` of each token alone (one fresh token appended to each cache) up
    to the matmuls' row count (see ROW_MULTIPLE). A step that raises leaves every cache as
    it was."""
    pos = torch.tensor([s.next_position() for s in states], device=rt.device)
    for s, p in zip(states, pos):
        if bool(s.cache.extent.covers(p[None]).any()):
            raise CacheError(f"decode position {int(p)} is inside the cache's context")
    ids = torch.tensor([s.token for s in states], device=rt.device)
    logits = decode_logits(rt, ids, pos, states, row_multiple)
    for s, p in zip(states, pos):
        s.cache.extent.add(p[None])
    return [s.advance(row) for s, row in zip(states, logits)]


@torch.no_grad()
def decode_logits(rt: Runtime, ids: torch.Tensor, pos: torch.Tensor, states: list[Decoding],
                  row_multiple: int = ROW_MULTIPLE) -> torch.Tensor:
    """Tokens `ids` at `pos` (B,), one per request's cache → logits (B, vocab); the matmuls
    run on B rows padded to a multiple of `row_multiple`. The caches hold the tokens' K/V
    afterwards; their extents are the caller's to extend."""
    from kvedge.kernels.rope import apply_rotary

    n = len(states)
    rows = -(-n // row_multiple) * row_multiple
    cos, sin = _rope(rt, pos, states, rows)                  # (rows, D) each
    x = F.embedding(F.pad(ids, (0, rows - n)), rt.embed)     # (rows, hidden)
    fresh = torch.ones(1, dtype=torch.bool, device=rt.device)  # a decoded token is new text
    undo: list = []
    try:
        for i, w in enumerate(rt.layers):
            q, k, v = rt.qkv(w, rms_norm(x, w.ln1, rt.eps))     # (Hq|Hkv, rows, D)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            attn = x.new_zeros(rows, rt.n_heads * rt.head_dim)
            for b, state in enumerate(states):  # attention: each request over its own cache
                one = slice(b, b + 1)
                run = Tokens(x[one], pos[one], cos[one], sin[one], fresh)
                private = rt.write_kv(state.cache[i], run, k[:, one], v[:, one], None, undo)
                attn[one] = rt.attend(i, pos[one], q[:, one], k[:, one], v[:, one], private,
                                      state.cache[i])
            x = rt.post_attention(w, x, attn)
    except BaseException:
        for restore in reversed(undo):
            restore()
        raise
    return F.linear(rms_norm(x, rt.final_norm, rt.eps), rt.lm_head)[:n]  # padding dropped


def _rope(rt: Runtime, pos: torch.Tensor, states: list[Decoding], rows: int):
    """Each request's cos/sin at its own RoPE length, zero rows for the padding."""
    pairs = [rt.rope.cos_sin(pos[b:b + 1], s.seq_len) for b, s in enumerate(states)]
    cos, sin = torch.cat([c for c, _ in pairs]), torch.cat([s for _, s in pairs])
    pad = (0, 0, 0, rows - len(states))
    return F.pad(cos, pad), F.pad(sin, pad)
