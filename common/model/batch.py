"""One decode step for many requests at once (continuous batching, Orca-style iteration-level
scheduling: Yu et al., OSDI 2022, Sec. 3).

Each request keeps its own cache (dense or ragged, its own extent and RoPE length); only the
linear layers are shared. Per layer: one QKV matmul over the new token of every request, then
each request's token attends over its own cache alone, then one O-projection and one MLP
matmul over all of them, and one LM-head matmul at the end. A request's tokens therefore do
not depend on which other requests share its steps — provided the matmuls round each row the
same whatever the row count, which is what `ROW_MULTIPLE` is for.

The per-request part runs B × layers times a step (480 at 16 requests on SmolLM2), so it is
kept to the kernel call: a token past everything its cache holds (every decoded token after
a prompt) is appended to each head group's buffer and attends with the very kernel call
`gqa_attention` makes, without the general write's search and mask bookkeeping; a token
between held positions takes the runtime's general write and attention.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kvedge.common.model.attention import visible
from kvedge.common.errors import CacheError
from kvedge.common.model.decoding import Decoding
from kvedge.common.model.kvcache import LayerKV
from kvedge.common.model.runtime import Runtime, rms_norm

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
    positions = [s.next_position() for s in states]
    for s, p in zip(states, positions):
        if p in s.cache.extent:
            raise CacheError(f"decode position {p} is inside the cache's context")
    ids = torch.tensor([s.token for s in states], device=rt.device)
    logits = decode_logits(rt, ids, torch.tensor(positions, device=rt.device), states,
                           row_multiple)
    for s, p in zip(states, positions):
        s.cache.extent.add_one(p)
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
    past = [int(p) >= s.cache.extent.end for p, s in zip(pos.tolist(), states)]
    undo: list = []
    try:
        for i, w in enumerate(rt.layers):
            q, k, v = rt.qkv(w, rms_norm(x, w.ln1, rt.eps))     # (Hq|Hkv, rows, D)
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
            attn = [(_attend_past if fast else _attend_within)(rt, i, s.cache[i], *one, undo)
                    for s, fast, *one in zip(states, past, pos.split(1), q[None].split(1, 2),
                                             k.split(1, 1), v.split(1, 1))]  # (1, Hq·D) each
            attn.append(x.new_zeros(rows - n, rt.n_heads * rt.head_dim))  # the padding rows
            x = rt.post_attention(w, x, torch.cat(attn))
    except BaseException:
        for restore in reversed(undo):
            restore()
        raise
    return F.linear(rms_norm(x, rt.final_norm, rt.eps), rt.lm_head)[:n]  # padding dropped


def _attend_past(rt: Runtime, i: int, layer: LayerKV, pos: torch.Tensor, q: torch.Tensor,
                 k: torch.Tensor, v: torch.Tensor, undo: list) -> torch.Tensor:
    """A token past everything its layer holds: append its rotated k, v (Hkv, 1, D), then its q
    (1, Hq, 1, D) attends over each head group → (1, Hq·D). `gqa_attention`'s numbers exactly
    (its kernel call per group), without its general bookkeeping: every held key is at or
    before the token, so only a sliding window masks, and its own key is always seen."""
    undo.append(layer.extend(pos, k, v))
    window, group = rt.layers[i].window, rt.group
    out = []
    for g in layer.heads():
        # no mask where every key is visible: the fused kernel gives an all-true mask's bits
        # (checked for fp32/bf16/fp16, 1-1100 keys, 1 and 2 threads; the tests compare the
        # step with Runtime.forward exactly) and skips building and converting one
        mask = None if window is None else visible(pos, g.positions, window)
        heads = slice(g.first * group, (g.first + g.keys.shape[0]) * group)
        out.append(F.scaled_dot_product_attention(q[:, heads], g.keys[None], g.values[None],
                                                  attn_mask=mask, scale=rt.scale,
                                                  enable_gqa=group > 1))
    return (out[0] if len(out) == 1 else torch.cat(out, 1)).reshape(1, -1)


def _attend_within(rt: Runtime, i: int, layer: LayerKV, pos: torch.Tensor, q: torch.Tensor,
                   k: torch.Tensor, v: torch.Tensor, undo: list) -> torch.Tensor:
    """A token at a position inside its cache's span (fresh text between held ones): the
    runtime's general write and attention, as `Runtime.layer` runs them → (1, Hq·D)."""
    restore, held = layer.write(pos, k, v, torch.ones_like(pos, dtype=torch.bool))
    undo.append(restore)
    return rt.attend(i, pos, q[0], k, v, None if held is None else ~held, layer)


def _rope(rt: Runtime, pos: torch.Tensor, states: list[Decoding], rows: int):
    """Each request's cos/sin at its own RoPE length, zero rows for the padding."""
    pairs = [rt.rope.cos_sin(pos[b:b + 1], s.seq_len) for b, s in enumerate(states)]
    cos, sin = torch.cat([c for c, _ in pairs]), torch.cat([s for _, s in pairs])
    pad = (0, 0, 0, rows - len(states))
    return F.pad(cos, pad), F.pad(sin, pad)
