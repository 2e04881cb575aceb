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

from kvedge.common.model.attention import sdpa, visible
from kvedge.common.model.decoding import Decoding
from kvedge.common.model.kvcache import LayerKV
from kvedge.common.model.quant import ROW_MULTIPLES, linear, padded_rows
from kvedge.common.model.runtime import Runtime, rms_norm

# CPU BLAS (MKL/oneDNN) rounds a row differently by the kernel that computes it: one row is a
# matrix-vector product, and rows of a partial 4-row panel take another path than rows of full
# ones. With the row count padded to a multiple of 4 every row got the same bits whatever the
# count on the machines this was first measured on (1–64 rows on every weight shape of SmolLM2
# and the tiny models, 1 and 2 threads), so an answer is the same alone or in any batch. That
# is the CPU's choice, not a rule: on an AVX-512/AMX Xeon (2026-12-01) MKL's default mode
# needed 16 rows for most shapes and no multiple up to 32 for 576×1536 at 2 threads. MKL's
# strict reproducible mode (`kvedge.common` sets `MKL_CBWR=AUTO,STRICT`) gives every row the
# same bits from 1 row; where the load-time probe finds that (`Runtime.decode_row_multiple`,
# fp32 included) a step pads nothing. fp16 there rounds one row (a matrix-vector product)
# otherwise than every count from 2 on, so its steps pad to 2 (`quant.invariant_multiple`
# finds the least multiple that holds); ROW_MULTIPLE is where none probed does. Padding costs a
# request decoding alone: on 2 CPU cores SmolLM2's matmuls took ~90 ms for 4 rows against
# ~50 ms for the one row of a matrix-vector product. `row_multiple=1` gives that back (one
# request alone then computes exactly what `Runtime.forward` does) and, without the strict
# mode, lets batched rows differ from lone ones in the last bits.
ROW_MULTIPLE = ROW_MULTIPLES[-1]  # 4

# Rows a step may fill with draft tokens (prompt lookup, `kvedge.common.model.speculate`).
# Decode on a CPU reads every weight once per step whatever its row count up to a few rows:
# one pass over SmolLM2's weights in fp32 on 2 cores took 63 ms for 4 rows, 59 ms for 8 and
# 71 ms for 16; Qwen2.5-0.5B's 345, 326 and 374 ms (`python -m kvedge.bench.decode_speed`'s
# row table). So up to 8 rows, padding rows and draft rows cost the same: a lone request
# drafts up to 7 tokens, a batch of 4 one each, a batch of 8 or more none — speculation
# never makes a batched step dearer than the padding already does.
SPEC_ROWS = 8
# With int8 weights (`kvedge.common.model.quant`) a row is dearer: its kernel's pass over the
# weights grows with the rows (SmolLM2 1 / 4 / 8 rows: 27.8 / 45.4 / 72.9 ms at one thread),
# where fp32 BLAS is nearly flat up to 8. On real questions 8 draft rows made SmolLM2's int8
# TPOT worse (77–84 against 55 ms without drafts) and 4 rows about even (51–57 ms), while on
# Qwen2.5-0.5B 4 rows took it from 96 to 80 ms (docs/serving.md).
INT8_SPEC_ROWS = 4


def spec_rows_for(rt: Runtime) -> int:
    """The default draft rows of a step over `rt`'s decode weights: fp32 BLAS is nearly flat
    in rows (SPEC_ROWS), int8's kernel grows slowly (INT8_SPEC_ROWS), and fp16's CPU matmul
    grows about linearly past one row (Qwen2.5-0.5B: 31 ms a served step at 1 row, 86–96 at
    4). Decision for fp16: draft only into rows the step pads anyway (`row_multiple`; none
    where its products were found row-invariant): a 4-row step would have to accept ~1.8
    drafts a step to pay, where int8's 4-row drafts on Qwen gained ~1.3 tokens a step
    (TPOT 96 → 80 ms at 1.1× the step's cost; docs/serving.md). bf16's GEMM is nearly flat
    up to 8 rows as fp32 BLAS is (SmolLM2's layer weights: 22 / 24 / 27 ms at 1 / 4 / 8
    rows, `quant.Bf16Weight`): SPEC_ROWS."""
    if rt.decode_format == "fp16":
        return row_multiple(rt, invariant=True)
    return SPEC_ROWS if rt.decode_format in ("fp32", "bf16") else INT8_SPEC_ROWS


def row_multiple(rt: Runtime, invariant: bool) -> int:
    """The row count a step pads to: 1 when invariance is not asked for; else the least
    multiple the load-time probe found the step's weights batch-invariant at
    (`Runtime.decode_row_multiple`: 1 for int8's kernel, and for fp32, fp16 or bf16 where
    they round every row the same whatever the count), or ROW_MULTIPLE where none held
    (the most padding can do; no invariance is then claimed)."""
    return padded_rows(rt.decode_row_multiple) if invariant else 1


@torch.no_grad()
def decode_step(rt: Runtime, states: list[Decoding], row_multiple: int = ROW_MULTIPLE,
                spec_rows: int = 0) -> list[int]:
    """Run each request's last picked token at its next position through every layer against
    its own cache, then pick each request's next token with its own sampler; returns each
    request's last pick (`Decoding.fresh` holds every token the step picked for it).

    `spec_rows` > 0: requests with a draft (`Decoding.draft`) run it after their token, as
    long as the step's rows stay within max(`spec_rows`, the padded batch); each keeps the
    drafts its own picks agree with (`Decoding.accept`) and forgets the rest's K/V. A draft
    row is a row like any other, so a greedy answer is the one plain steps give (exactly,
    with `row_multiple` = ROW_MULTIPLE; to the matmuls' last bits with 1).

    Equals `Runtime.forward` of each token alone (one fresh token appended to each cache) up
    to the matmuls' row count (see ROW_MULTIPLE). A step that raises leaves every cache as
    it was."""
    for s in states:
        s.check_next_position()
    positions = [s.next_position() for s in states]
    drafts = _drafts(states, positions, row_multiple, spec_rows)
    owners = [s for s, d in zip(states, drafts) for _ in range(1 + len(d))]
    ids = [t for s, d in zip(states, drafts) for t in (s.token, *d)]
    pos = [p + j for p, d in zip(positions, drafts) for j in range(1 + len(d))]
    logits = decode_logits(rt, torch.tensor(ids, device=rt.device),
                           torch.tensor(pos, device=rt.device), owners, row_multiple)
    first = 0
    for s, p, d in zip(states, positions, drafts):
        used = s.accept(logits[first:first + 1 + len(d)], d)
        first += 1 + len(d)
        if used <= len(d):  # the rejected drafts' K/V go
            s.cache.truncate(p + used - 1)
        for q in range(p, p + used):
            s.cache.extent.add_one(q)
    return [s.token for s in states]


def _drafts(states: list[Decoding], positions: list[int], row_multiple: int,
            spec_rows: int) -> list[list[int]]:
    """Each request's drafts: the rows beyond one per request, up to max(`spec_rows`, the
    padded batch), dealt one at a time in turn to the requests that have a guess and decode
    past their cache (a token between held positions takes the general write, one at a
    time)."""
    n = len(states)
    budget = max(spec_rows, -(-n // row_multiple) * row_multiple) - n
    if spec_rows <= 0 or budget <= 0:
        return [[] for _ in states]
    wants = [s.draft(budget) if p >= s.cache.extent.end else []
             for s, p in zip(states, positions)]
    dealt = [0] * n
    while budget > 0 and any(dealt[i] < len(w) for i, w in enumerate(wants)):
        for i, w in enumerate(wants):
            if budget > 0 and dealt[i] < len(w):
                dealt[i], budget = dealt[i] + 1, budget - 1
    return [w[:k] for w, k in zip(wants, dealt)]


@torch.no_grad()
def decode_logits(rt: Runtime, ids: torch.Tensor, pos: torch.Tensor, states: list[Decoding],
                  row_multiple: int = ROW_MULTIPLE) -> torch.Tensor:
    """Tokens `ids` at `pos` (B,), each into the cache of its request `states[b]` → logits
    (B, vocab); the matmuls run on B rows padded to a multiple of `row_multiple`. A request
    may own several rows (its token and its drafts, at increasing positions): per layer its
    rows append and attend in order, so each sees the ones before it, as one step after
    another would. The caches hold the tokens' K/V afterwards; their extents are the
    caller's to extend."""
    from kvedge.kernels.rope import apply_rotary

    n = len(states)
    rows = -(-n // row_multiple) * row_multiple
    cos, sin = _rope(rt, pos, states, rows)                  # (rows, D) each
    x = F.embedding(F.pad(ids, (0, rows - n)), rt.embed)     # (rows, hidden)
    past = [int(p) >= s.cache.extent.end for p, s in zip(pos.tolist(), states)]
    undo: list = []
    try:
        for i, w in enumerate(rt.decode_layers):  # the model's weights, or int8 copies
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
    return linear(rms_norm(x, rt.final_norm, rt.eps), rt.decode_head)[:n]  # padding dropped


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
        out.append(sdpa(q[:, heads], g.keys[None], g.values[None], attn_mask=mask,
                        scale=rt.scale, enable_gqa=group > 1))
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
