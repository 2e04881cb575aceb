"""RoPE at per-token target positions: the realignment hot path.

Keys are stored pre-RoPE (docs/design.md decision 1; A3 Eq. 2), so realigning a cached segment to
the positions a composed prompt gives it is one rotation per key. `rope_reference` is the
plain-torch oracle and the CPU path; `rope_triton` is the fused kernel; `apply_rope_at`
dispatches (Triton on CUDA, the reference elsewhere).

Convention is Hugging Face's "rotate_half" layout: a head vector is [x1 | x2] with
    out1 = x1·cos θ − x2·sin θ,  out2 = x2·cos θ + x1·sin θ,  θ_i = pos · inv_freq_i,
and cos/sin are multiplied by the rope type's `attention_scaling` (1 except yarn/longrope).
"""
from __future__ import annotations

import os

import torch


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float = 1.0):
    """cos, sin of shape (T, D) in fp32 for integer positions (T,) — as transformers computes them."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq.to(positions.device, torch.float32)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)  # (T, D)
    return emb.cos() * scaling, emb.sin() * scaling


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., T, D) rotated by fp32 cos/sin (T, D); arithmetic in x's dtype, like transformers."""
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def rope_reference(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                   scaling: float = 1.0) -> torch.Tensor:
    """Torch reference: x (..., T, D) pre-RoPE → rotated at positions (T,)."""
    return apply_rotary(x, *rope_cos_sin(positions, inv_freq, scaling))


def _triton_kernel():
    """Build the kernel on first use: importing triton is slow and must not happen at import."""
    import triton
    import triton.language as tl

    @triton.jit
    def rope_kernel(x_ptr, out_ptr, pos_ptr, inv_freq_ptr, scaling, n_rows, T,
                    HALF: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        cols = tl.arange(0, BLOCK_H)
        rmask = rows < n_rows
        mask = rmask[:, None] & (cols < HALF)[None, :]
        # a row is one (leading index, token): its token is row % T
        pos = tl.load(pos_ptr + rows % T, mask=rmask, other=0).to(tl.float32)
        freq = tl.load(inv_freq_ptr + cols, mask=cols < HALF, other=0.0)
        theta = pos[:, None] * freq[None, :]
        cos = tl.cos(theta) * scaling
        sin = tl.sin(theta) * scaling
        offs = rows[:, None] * (2 * HALF) + cols[None, :]
        # cast after load: the interpreter mishandles bf16 arithmetic
        x1 = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + offs + HALF, mask=mask, other=0.0).to(tl.float32)
        out_ty = out_ptr.dtype.element_ty
        tl.store(out_ptr + offs, (x1 * cos - x2 * sin).to(out_ty), mask=mask)
        tl.store(out_ptr + offs + HALF, (x2 * cos + x1 * sin).to(out_ty), mask=mask)

    return rope_kernel


_KERNEL = None


def rope_triton(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                scaling: float = 1.0, block_rows: int = 16) -> torch.Tensor:
    """Triton kernel: same contract as `rope_reference` (math in fp32, output in x's dtype)."""
    global _KERNEL
    if _KERNEL is None:
        _KERNEL = _triton_kernel()
    D, T = x.shape[-1], x.shape[-2]
    assert D % 2 == 0 and positions.shape == (T,), (x.shape, positions.shape)
    x = x.contiguous()
    out = torch.empty_like(x)
    n_rows = x.numel() // D
    if n_rows == 0:
        return out
    half = D // 2
    block_h = 1 << (half - 1).bit_length()
    grid = ((n_rows + block_rows - 1) // block_rows,)
    _KERNEL[grid](x, out, positions.to(x.device, torch.int64).contiguous(),
                  inv_freq.to(x.device, torch.float32).contiguous(), float(scaling), n_rows, T,
                  HALF=half, BLOCK_R=block_rows, BLOCK_H=block_h)
    return out


def use_triton(x: torch.Tensor) -> bool:
    """Triton on CUDA tensors (unless KVEDGE_NO_TRITON=1); the torch reference everywhere else."""
    if not x.is_cuda or os.environ.get("KVEDGE_NO_TRITON") == "1":
        return False
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def apply_rope_at(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor,
                  scaling: float = 1.0) -> torch.Tensor:
    """Rotate pre-RoPE x (..., T, D) to positions (T,), on the best path for x's device."""
    if use_triton(x):
        return rope_triton(x, positions, inv_freq, scaling)
    return rope_reference(x, positions, inv_freq, scaling)
