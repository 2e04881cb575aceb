"""Pack → the runtime's cache layout at target positions, through the fused kernel.

Per (layer, KV head): keys (n, D) dequantized and rotated to the positions the composed prompt
gives the kept tokens (A3 Eq. 2), values (n, D), and those positions (n,) — what
`kvedge.common.kvcache.RaggedKV` holds. Quantized pieces go through
`kernels.dequant_rope.dequant_rope` (Triton on CUDA); full-precision pieces (fp16 packs,
CacheGen's sink and recent rows) through `kernels.rope.apply_rope_at`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.common.pack.codecs import Piece
from kvedge.common.pack.format import Pack
from kvedge.common.pack.manifest import kv_name
from kvedge.kernels.quant import QuantizedTensor
from kvedge.kernels.dequant_rope import dequant_rope
from kvedge.kernels.rope import apply_rope_at

Heads = list[list[torch.Tensor]]


@dataclass
class RealignedKV:
    """keys[l][h] (n_lh, D) rotated, values[l][h] (n_lh, D), positions[l][h] (n_lh,) int64."""

    keys: Heads
    values: Heads
    positions: Heads


def realign_pack(pack: Pack, inv_freq: torch.Tensor, scaling: float = 1.0,
                 target_positions: torch.Tensor | None = None, device="cpu",
                 dtype: torch.dtype = torch.float32) -> RealignedKV:
    """Decode every head of a pack straight into rotated cache tensors.

    target_positions (T,): the position each context token takes in the composed prompt
    (default: its original position). inv_freq and scaling: `Rope(config).frequencies(seq_len)`.
    """
    m = pack.manifest
    targets = torch.tensor(m.positions) if target_positions is None else target_positions
    if targets.shape != (m.n_tokens,):
        raise ValueError(f"target_positions must be ({m.n_tokens},), got {tuple(targets.shape)}")
    targets = targets.to(device, torch.long)
    index = {p: i for i, p in enumerate(m.positions)}
    keys, values, positions = [], [], []
    for layer in range(m.n_layers):
        ranks = [torch.tensor([index[p] for p in kept], dtype=torch.long, device=device)
                 for kept in m.kept[layer]]
        pos = [targets[r] for r in ranks]
        keys.append([_rows(pack.pieces(kv_name("k", layer, h)), p, inv_freq, scaling, device,
                           dtype) for h, p in enumerate(pos)])
        values.append([_rows(pack.pieces(kv_name("v", layer, h)), None, inv_freq, scaling,
                             device, dtype) for h in range(m.n_kv_heads)])
        positions.append(pos)
    pack.container.verify_payload()
    return RealignedKV(keys, values, positions)


def _rows(pieces: list[Piece], positions: torch.Tensor | None, inv_freq, scaling, device,
          dtype) -> torch.Tensor:
    """Pieces of one head → (n, D) on device, rotated to positions (n,) when given."""
    out, start = [], 0
    for piece in pieces:
        n = piece.n if isinstance(piece, QuantizedTensor) else piece.shape[0]
        pos = None if positions is None else positions[start: start + n]
        if isinstance(piece, QuantizedTensor):
            out.append(dequant_rope(piece.to(device), pos, inv_freq, scaling, dtype))
        else:
            x = piece.to(device, torch.float32)
            out.append((x if pos is None else apply_rope_at(x, pos, inv_freq, scaling)).to(dtype))
        start += n
    return torch.cat(out)
