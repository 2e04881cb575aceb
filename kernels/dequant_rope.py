"""Fused dequantize + RoPE: a pack's quantized pre-RoPE keys → rotated keys, in one pass.

Keys are stored pre-RoPE and quantized per channel (docs/design.md decision 1; KIVI Sec. 3); the
edge needs them rotated to whatever positions the composed prompt gives them (A3 Eq. 2).
Doing both in one kernel reads each packed byte once and writes the runtime's cache layout —
per head (n, D) float, keys rotated — directly. Values take the same path without rotation.

Layout (kvedge.kernels.quant): packed (n, W) uint8, W = D / codes per byte (8 // bits, or
1 for int3), planar — byte j of a row holds channels j, j + W, j + 2W, ... at bit offsets
0, bits, 2·bits, ...; scale and zero fp16, (ceil(n/G), D) per channel or (n, ceil(D/G)) per token.

`dequant_rope_reference` is the torch oracle and the CPU path, `dequant_rope_triton` the
kernel (`dequant_rope_many`: several tensors of one layout in one launch), `dequant_rope`
dispatches (Triton on CUDA, the reference elsewhere).
"""
from __future__ import annotations

import torch

from kvedge.kernels.quant import QuantizedTensor, group_rows
from kvedge.kernels.rope import rope_reference, use_triton


def dequant_rope_reference(q: QuantizedTensor, positions: torch.Tensor | None = None,
                           inv_freq: torch.Tensor | None = None, scaling: float = 1.0,
                           out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(n, D) dequantized, rotated to positions (n,) when given; math in fp32."""
    x = q.dequantize(torch.float32)
    if positions is not None:
        x = rope_reference(x, positions, inv_freq, scaling)
    return x.to(out_dtype)


def _build_kernel():
    """Compile on first use: importing triton is slow and must not happen at import."""
    import triton
    import triton.language as tl

    @triton.jit
    def dequant_rope_kernel(packed_ptr, scale_ptr, zero_ptr, srow_ptr, pos_ptr, inv_freq_ptr,
                            out_ptr, scaling, n_rows, n_scale_cols,
                            D: tl.constexpr, BITS: tl.constexpr, WIDTH: tl.constexpr,
                            GROUP: tl.constexpr, PER_CHANNEL: tl.constexpr,
                            INDEXED: tl.constexpr, ROTATE: tl.constexpr,
                            BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
        half: tl.constexpr = D // 2
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_H)
        # tile (rows, c, 2): channel c of the first half and its RoPE pair c + D/2
        r3 = rows[:, None, None]
        ch = cols[None, :, None] + half * tl.arange(0, 2)[None, None, :]
        mask = (r3 < n_rows) & (cols < half)[None, :, None]
        byte = tl.load(packed_ptr + r3 * WIDTH + ch % WIDTH, mask=mask, other=0).to(tl.int32)
        code = (byte >> ((ch // WIDTH) * BITS)) & ((1 << BITS) - 1)
        if PER_CHANNEL:
            if INDEXED:  # several tensors stacked: each row's group row is given
                srow = tl.load(srow_ptr + r3, mask=r3 < n_rows, other=0)
                idx = srow * D + ch
            else:
                idx = (r3 // GROUP) * D + ch
        else:
            idx = r3 * n_scale_cols + ch // GROUP
        # cast after load: the interpreter mishandles fp16/bf16 arithmetic
        scale = tl.load(scale_ptr + idx, mask=mask, other=0.0).to(tl.float32)
        zero = tl.load(zero_ptr + idx, mask=mask, other=0.0).to(tl.float32)
        x = code.to(tl.float32) * scale + zero
        if ROTATE:
            x1, x2 = tl.split(x)
            pos = tl.load(pos_ptr + rows, mask=rows < n_rows, other=0).to(tl.float32)
            freq = tl.load(inv_freq_ptr + cols, mask=cols < half, other=0.0)
            theta = pos[:, None] * freq[None, :]
            cos = tl.cos(theta) * scaling
            sin = tl.sin(theta) * scaling
            x = tl.join(x1 * cos - x2 * sin, x2 * cos + x1 * sin)
        tl.store(out_ptr + r3 * D + ch, x.to(out_ptr.dtype.element_ty), mask=mask)

    return dequant_rope_kernel


_KERNEL = None


def dequant_rope_triton(q: QuantizedTensor, positions: torch.Tensor | None = None,
                        inv_freq: torch.Tensor | None = None, scaling: float = 1.0,
                        out_dtype: torch.dtype = torch.float32,
                        block_rows: int = 16) -> torch.Tensor:
    """Triton kernel: same contract as `dequant_rope_reference`."""
    return dequant_rope_many([q], positions, inv_freq, scaling, out_dtype, block_rows)


def dequant_rope_many(qs: list[QuantizedTensor], positions: torch.Tensor | None = None,
                      inv_freq: torch.Tensor | None = None, scaling: float = 1.0,
                      out_dtype: torch.dtype = torch.float32,
                      block_rows: int = 16) -> torch.Tensor:
    """Tensors of one layout (bits, group size, axis, D) → their rows stacked (Σn, D),
    rotated to positions (Σn,) when given, in ONE launch: what `dequant_rope_triton` of each
    then `torch.cat` gives, without a launch per tensor (a loader's layer is ~8 heads × 20
    segments of pieces; launched one by one on an H200 they cost more than the batched torch
    pass, `python -m kvedge.bench.gpu_check`). Stacked per-channel tensors pass each row's
    scale row (`kvedge.kernels.quant.group_rows`), since a tensor's last group may be short."""
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _build_kernel()
    q0, device = qs[0], qs[0].packed.device
    n, dim = sum(q.n for q in qs), q0.dim
    if dim % 2:
        raise ValueError(f"head_dim must be even, got {dim}")
    if any(q.layout != q0.layout for q in qs):
        raise ValueError("dequant_rope_many needs tensors of one layout (bits, group, axis, D)")
    out = torch.empty(n, dim, dtype=out_dtype, device=device)
    if n == 0:
        return out
    stack = (lambda ts: ts[0].contiguous()) if len(qs) == 1 else torch.cat  # noqa: E731
    packed, scale, zero = (stack([getattr(q, a) for q in qs]) for a in ("packed", "scale",
                                                                          "zero"))
    indexed = q0.per_channel and len(qs) > 1
    srow = (group_rows(torch.tensor([q.n for q in qs]), q0.group_size).to(device)
            if indexed else torch.zeros(1, dtype=torch.int64, device=device))
    rotate = positions is not None
    pos = (positions.to(device, torch.int64).contiguous() if rotate
           else torch.zeros(1, dtype=torch.int64, device=device))
    freq = (inv_freq.to(device, torch.float32).contiguous() if rotate
            else torch.zeros(1, dtype=torch.float32, device=device))
    block_h = 1 << (dim // 2 - 1).bit_length()
    grid = ((n + block_rows - 1) // block_rows,)
    _KERNEL[grid](packed, scale, zero, srow, pos, freq, out, float(scaling), n, scale.shape[1],
                  D=dim, BITS=q0.bits, WIDTH=packed.shape[1], GROUP=q0.group_size,
                  PER_CHANNEL=q0.per_channel, INDEXED=indexed,
                  ROTATE=rotate, BLOCK_R=block_rows, BLOCK_H=block_h)
    return out


def dequant_rope(q: QuantizedTensor, positions: torch.Tensor | None = None,
                 inv_freq: torch.Tensor | None = None, scaling: float = 1.0,
                 out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantize (and rotate, when positions are given) on the best path for the device."""
    if use_triton(q.packed):
        return dequant_rope_triton(q, positions, inv_freq, scaling, out_dtype)
    return dequant_rope_reference(q, positions, inv_freq, scaling, out_dtype)
