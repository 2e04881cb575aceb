"""Fused dequantize + RoPE: a pack's quantized pre-RoPE keys → rotated keys, in one pass.

Keys are stored pre-RoPE and quantized per channel (docs/design.md decision 1; KIVI Sec. 3); the
edge needs them rotated to whatever positions the composed prompt gives them (A3 Eq. 2).
Doing both in one kernel reads each packed byte once and writes the runtime's cache layout —
per head (n, D) float, keys rotated — directly. Values take the same path without rotation.

Layout (kvedge.kernels.quant): packed (n, W) uint8, W = D / codes per byte (8 // bits, or
1 for int3), planar — byte j of a row holds channels j, j + W, j + 2W, ... at bit offsets
0, bits, 2·bits, ...; scale and zero fp16, (ceil(n/G), D) per channel or (n, ceil(D/G)) per token.

`dequant_rope_reference` is the torch oracle and the CPU path, `dequant_rope_triton` the
kernel, `dequant_rope` dispatches (Triton on CUDA, the reference elsewhere).
"""
from __future__ import annotations

import torch

from kvedge.kernels.quant import QuantizedTensor
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
    def dequant_rope_kernel(packed_ptr, scale_ptr, zero_ptr, pos_ptr, inv_freq_ptr, out_ptr,
                            scaling, n_rows, n_scale_cols,
                            D: tl.constexpr, BITS: tl.constexpr, WIDTH: tl.constexpr,
                            GROUP: tl.constexpr, PER_CHANNEL: tl.constexpr,
                            ROTATE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
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
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _build_kernel()
    n, dim = q.n, q.dim
    if dim % 2:
        raise ValueError(f"head_dim must be even, got {dim}")
    out = torch.empty(n, dim, dtype=out_dtype, device=q.packed.device)
    if n == 0:
        return out
    rotate = positions is not None
    device = q.packed.device
    pos = (positions.to(device, torch.int64).contiguous() if rotate
           else torch.zeros(1, dtype=torch.int64, device=device))
    freq = (inv_freq.to(device, torch.float32).contiguous() if rotate
            else torch.zeros(1, dtype=torch.float32, device=device))
    block_h = 1 << (dim // 2 - 1).bit_length()
    grid = ((n + block_rows - 1) // block_rows,)
    _KERNEL[grid](q.packed.contiguous(), q.scale.contiguous(), q.zero.contiguous(), pos, freq,
                  out, float(scaling), n, q.scale.shape[1],
                  D=dim, BITS=q.bits, WIDTH=q.packed.shape[1], GROUP=q.group_size,
                  PER_CHANNEL=q.per_channel,
                  ROTATE=rotate, BLOCK_R=block_rows, BLOCK_H=block_h)
    return out


def dequant_rope(q: QuantizedTensor, positions: torch.Tensor | None = None,
                 inv_freq: torch.Tensor | None = None, scaling: float = 1.0,
                 out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantize (and rotate, when positions are given) on the best path for the device."""
    if use_triton(q.packed):
        return dequant_rope_triton(q, positions, inv_freq, scaling, out_dtype)
    return dequant_rope_reference(q, positions, inv_freq, scaling, out_dtype)
