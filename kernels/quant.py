"""Asymmetric group quantization and bit packing (KIVI, arXiv:2402.02750, Sec. 3).

Keys are quantized per channel — a group runs along the token axis for one channel, because
pre-RoPE keys have outlier *channels* with stable magnitudes — and values per token — a group
runs along the channel axis of one token. Each group stores a scale and a zero point (fp16):
    x ≈ code · scale + zero,  code ∈ [0, 2^bits).

Packing is *planar* along the channel axis: with k = 8 / bits codes per byte, byte j of a row
holds channels j, j + D/k, j + 2D/k, ... at bit offsets 0, bits, 2·bits, ... For int4 the two
halves of a head vector — exactly the halves RoPE pairs up — share a byte, so the fused
kernel (kernels/dequant_rope.py) reads each byte once for both rotation operands. int3, int5
and int6 codes do not tile a byte: they are stored one per byte and left to the entropy stage,
which brings int3 to ~2.5–2.8 bits (measured in bench/codec_bench.py) — use them only with
"+zstd".
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

BITS = (2, 3, 4, 5, 6, 8)


@dataclass
class QuantizedTensor:
    """One (n, D) tensor, quantized. Shapes: packed (n, D / codes_per_byte(bits)) uint8;
    scale, zero fp16, (ceil(n/G), D) per channel or (n, ceil(D/G)) per token."""

    packed: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    bits: int
    group_size: int
    per_channel: bool
    dim: int  # D (the packed width alone cannot tell it)

    @property
    def n(self) -> int:
        return self.packed.shape[0]

    @property
    def layout(self) -> tuple:
        """(bits, group size, per channel, D): tensors alike in it dequantize together."""
        return self.bits, self.group_size, self.per_channel, self.dim

    def to(self, device) -> "QuantizedTensor":
        return replace(self, packed=self.packed.to(device), scale=self.scale.to(device),
                       zero=self.zero.to(device))

    def take(self, rows: torch.Tensor) -> "QuantizedTensor":
        """Rows `rows` (sorted, unique, int64) alone, still quantized: block-granular loading
        dequantizes only what a strategy keeps, to the bit what dequantizing everything and
        indexing would give. Per token, each row keeps its own scales. Per channel, rows
        that make up whole groups (SamKV's 64-token blocks on the codecs' 64-row groups)
        keep those groups' scales; any other choice gets one scale row per row (group 1)."""
        packed = self.packed[rows]
        if not self.per_channel:
            return replace(self, packed=packed, scale=self.scale[rows], zero=self.zero[rows])
        group = rows // self.group_size
        groups, counts = torch.unique_consecutive(group, return_counts=True)
        full = torch.clamp(self.n - groups * self.group_size, max=self.group_size)
        if torch.equal(counts, full):
            return replace(self, packed=packed, scale=self.scale[groups], zero=self.zero[groups])
        return replace(self, packed=packed, scale=self.scale[group], zero=self.zero[group],
                       group_size=1)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Torch reference: (n, D) in `dtype`, math in fp32."""
        return dequantize_many([self]).to(dtype)


def dequantize_many(qs: list[QuantizedTensor]) -> torch.Tensor:
    """QuantizedTensors of one layout (bits, group size, axis, D) → their rows concatenated
    (Σn, D) fp32: one unpack and one `codes · scale + zero` for all of them (the edge's
    loader dequantizes a layer's pieces together; one tensor is the case of one)."""
    q0 = qs[0]
    packed = torch.cat([q.packed for q in qs])
    codes = (packed if q0.bits == 8 else unpack_codes(packed, q0.bits, q0.dim)).to(torch.float32)
    scale, zero = (torch.cat([t.to(torch.float32) for t in ts])
                   for ts in ([q.scale for q in qs], [q.zero for q in qs]))
    if q0.per_channel:  # a group runs along the rows of one tensor: row r → its group's row
        idx = group_rows(torch.tensor([q.n for q in qs]), q0.group_size).to(codes.device)
        scale, zero = scale[idx], zero[idx]
    else:  # a group runs along the channels of one row
        scale, zero = (expand_groups(t, q0.group_size, False, codes.shape[0], q0.dim)
                       for t in (scale, zero))
    return codes * scale + zero


def group_rows(n: torch.Tensor, group: int) -> torch.Tensor:
    """For tensors of n[i] rows stacked, each row's index among their stacked group rows."""
    groups = -(-n // group)
    first_row = torch.cumsum(n, 0) - n
    first_group = torch.cumsum(groups, 0) - groups
    local = torch.arange(int(n.sum())) - first_row.repeat_interleave(n)
    return first_group.repeat_interleave(n) + local // group


def quantize(x: torch.Tensor, bits: int, group_size: int, per_channel: bool) -> QuantizedTensor:
    """x (n, D) float → QuantizedTensor. The last group may be shorter than group_size."""
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits}")
    n, dim = x.shape
    if dim % codes_per_byte(bits):
        raise ValueError(f"int{bits} packing needs head_dim divisible by "
                         f"{codes_per_byte(bits)}, got {dim}")
    x = x.to(torch.float32)
    lo, hi = _group_min_max(x, group_size, per_channel)
    qmax = (1 << bits) - 1
    zero = lo.to(torch.float16)
    scale = ((hi - zero.float()) / qmax).clamp_(min=0).to(torch.float16)
    if not (torch.isfinite(zero).all() and torch.isfinite(scale).all()):
        raise ValueError("values exceed the fp16 range of quantization scales; "
                         "store this tensor with the bf16 or fp32 codec")
    s = expand_groups(scale.float(), group_size, per_channel, n, dim)
    z = expand_groups(zero.float(), group_size, per_channel, n, dim)
    inv = torch.where(s > 0, 1.0 / s, torch.zeros_like(s))  # a constant group is all zero codes
    codes = torch.round((x - z) * inv).clamp_(0, qmax).to(torch.uint8)
    return QuantizedTensor(pack_codes(codes, bits), scale, zero, bits, group_size, per_channel, dim)


def _group_min_max(x: torch.Tensor, group: int, per_channel: bool):
    """Per-group min and max: (ceil(n/G), D) per channel, (n, ceil(D/G)) per token."""
    if not per_channel:
        lo, hi = _group_min_max(x.T, group, True)
        return lo.T.contiguous(), hi.T.contiguous()
    n, dim = x.shape
    if n == 0:
        empty = x.new_empty(0, dim)
        return empty, empty
    groups = -(-n // group)
    pad = groups * group - n
    if pad:  # repeat the last row: it changes no group's min or max
        x = torch.cat([x, x[-1:].expand(pad, dim)])
    x = x.view(groups, group, dim)
    return x.amin(dim=1), x.amax(dim=1)


def expand_groups(t: torch.Tensor, group: int, per_channel: bool, n: int, dim: int):
    """Per-group tensor → (n, D), each element getting its group's value."""
    if per_channel:
        return t.repeat_interleave(group, dim=0)[:n]
    return t.repeat_interleave(group, dim=1)[:, :dim]


def codes_per_byte(bits: int) -> int:
    return 8 // bits if 8 % bits == 0 else 1


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """codes (n, D) uint8 < 2^bits → (n, D / codes_per_byte) uint8, planar (module docstring)."""
    k = codes_per_byte(bits)
    # plane i = channels [i·D/k, (i+1)·D/k)
    planes = codes.reshape(codes.shape[0], k, codes.shape[1] // k)
    out = torch.zeros_like(planes[:, 0])
    for i in range(k):
        out |= planes[:, i] << (i * bits)
    return out


def unpack_codes(packed: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    """Inverse of `pack_codes`: (n, D / codes_per_byte) uint8 → (n, D) uint8."""
    k, mask = codes_per_byte(bits), (1 << bits) - 1
    if packed.shape[1] * k != dim:
        raise ValueError(f"packed width {packed.shape[1]} does not hold {dim} int{bits} codes")
    return torch.cat([(packed >> (i * bits)) & mask for i in range(k)], dim=1)
