"""kvtc's quantizer ladder: the rungs a principal component may be quantized at, what each
costs (MSE and code entropy), and the choice of one rung per component under a bit budget.

Staniszewski & Łańcucki, "KV Cache Transform Coding for Compact Storage in LLM Inference"
(arXiv:2511.01815), bit allocation over the principal components — here by measured error
and entropy per rung rather than the paper's fixed code widths.
"""
from __future__ import annotations

import torch

from kvedge.common.pack.calibrate import allocate_components

RUNGS = torch.arange(-2, 12, dtype=torch.float32)  # step = sd·2^(−j/2); option 0 drops
MAX_CODE = 127  # codes are stored as one zig-zagged byte


def rung_steps(sd: torch.Tensor) -> torch.Tensor:
    """(..., D, R) quantizer steps of every rung, as fp16 stores them (0 where sd is 0)."""
    return (sd[..., None] * 2.0 ** (-RUNGS / 2)).clamp(max=6e4).half().float()


def ladder(y: torch.Tensor, sd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """error, rate (D, 1 + R) of coefficients y (N, D) at the rungs of sd (D,); option 0
    drops the component."""
    n, d = y.shape
    if n == 0:
        return torch.zeros(d, len(RUNGS) + 1), torch.zeros(d, len(RUNGS) + 1)
    steps = rung_steps(sd).T[:, None]                         # (R, 1, D)
    q = quantize(y[None], steps)                            # (R, N, D)
    error = (q * steps - y).square().mean(1)
    counts = torch.zeros(len(RUNGS), d, 2 * MAX_CODE + 1).scatter_add_(
        2, (q.long() + MAX_CODE).transpose(1, 2), torch.ones(len(RUNGS), d, n))
    p = counts / n
    rate = -(p * torch.log2(p.clamp(min=1e-30))).sum(-1)
    drop = y.square().mean(0)[None]
    return torch.cat([drop, error]).T.contiguous(), torch.cat([torch.zeros_like(drop), rate]).T


def quantize(y: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """round(y / step), clamped to the codes a byte holds; a 0 step gives code 0."""
    safe = torch.where(steps > 0, steps, torch.ones_like(steps))
    return torch.where(steps > 0, (y / safe).round().clamp(-MAX_CODE, MAX_CODE), 0.0)


def allocate(error, rate, bits: float) -> torch.Tensor:
    """Option per component (..., D), 0 = dropped, for the rung tables of one or more heads
    under `bits` of code entropy per element, minimizing the sum of each head's relative
    error."""
    variance = error[..., 0].sum(-1, keepdim=True).clamp(min=1e-30)[..., None]
    relative = error / variance
    # components whose variance is rounding noise (rank-deficient heads) are not worth a bit
    relative = torch.where(relative[..., :1] < 1e-9, relative[..., :1], relative)
    budget = bits * error.shape[-2] * (error[..., 0, 0].numel())
    return torch.from_numpy(allocate_components(relative.numpy(), rate.numpy(), budget))


def steps_of(choice: torch.Tensor, sd: torch.Tensor) -> torch.Tensor:
    """Quantizer steps (..., D) of the chosen options, 0 where a component is dropped."""
    steps = rung_steps(sd)                                     # (..., D, R)
    padded = torch.cat([torch.zeros_like(steps[..., :1]), steps], -1)
    return padded.gather(-1, choice[..., None])[..., 0]
