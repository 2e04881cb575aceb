"""kvtc's calibrated transform and its file: per (K or V, layer, KV head) a mean, a PCA basis
and the rung tables, stored as safetensors and named by the blake3 of its bytes.

The file is the unit a pack written with `kvtc:embed=false` references (by digest) and an
edge's sync installs; `from_bytes` reads only what `to_bytes` writes, and any other bytes are
`TransformMismatch`.
"""
from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass, field

import blake3
import safetensors.torch
import torch

from kvedge.common.pack.codecs.kvtc.quantizer import RUNGS, allocate, steps_of
from kvedge.common.pack.errors import TransformMismatch

KINDS = ("key", "value")
FORMAT = "kvtc-transform/1"
DIGEST = re.compile(r"^[0-9a-f]{64}$")


@dataclass
class Transform:
    """A model's calibrated transform: per slot (kind, layer, KV head) — slot index
    (kind·L + layer)·H + head — mean (S, D), basis (S, D, D), sd (S, D), error/rate
    (S, D, O). Content-addressed by `digest` (blake3 of `to_bytes()`)."""

    mean: torch.Tensor
    basis: torch.Tensor
    sd: torch.Tensor
    error: torch.Tensor
    rate: torch.Tensor
    n_layers: int
    n_heads: int
    meta: dict = field(default_factory=dict)
    _choices: dict = field(default_factory=dict, repr=False, compare=False)
    _bytes: bytes | None = field(default=None, repr=False, compare=False)

    def slot(self, kind: str, layer: int, head: int) -> int:
        return (KINDS.index(kind) * self.n_layers + layer) * self.n_heads + head

    def choice(self, bits: float, spread: str) -> torch.Tensor:
        """(S, D) option per component for a budget (computed once per budget): one budget
        over the whole model (`model`) or the same for every head (`head`)."""
        if (bits, spread) not in self._choices:
            self._choices[bits, spread] = allocate(self.error, self.rate, bits) \
                if spread == "model" else torch.stack([allocate(e, r, bits) for e, r
                                                       in zip(self.error, self.rate)])
        return self._choices[bits, spread]

    def steps(self, bits: float, spread: str) -> torch.Tensor:
        """(S, D) quantizer steps, 0 = dropped."""
        return steps_of(self.choice(bits, spread), self.sd)

    def head_bits(self, bits: float, spread: str) -> torch.Tensor:
        """(S,) code entropy per element each head gets under the budget."""
        chosen = self.rate.gather(-1, self.choice(bits, spread)[..., None])[..., 0]
        return chosen.mean(-1)

    def to_bytes(self) -> bytes:
        if self._bytes is None:
            meta = {**{k: str(v) for k, v in self.meta.items()}, "format": FORMAT,
                    "n_layers": str(self.n_layers), "n_heads": str(self.n_heads)}
            self._bytes = safetensors.torch.save(
                {"mean": self.mean, "basis": self.basis, "sd": self.sd, "error": self.error,
                 "rate": self.rate}, metadata=dict(sorted(meta.items())))
        return self._bytes

    @property
    def digest(self) -> str:
        return blake3.blake3(self.to_bytes()).hexdigest()

    @classmethod
    def from_bytes(cls, data: bytes, digest: str = "") -> "Transform":
        try:
            n = struct.unpack_from("<Q", data)[0]
            meta = json.loads(data[8: 8 + n])["__metadata__"]
            t = safetensors.torch.load(data)
            out = cls(t["mean"], t["basis"], t["sd"], t["error"], t["rate"],
                      int(meta.pop("n_layers")), int(meta.pop("n_heads")), meta, _bytes=data)
            _check_shapes(out)
            return out
        except (ValueError, KeyError, TypeError, struct.error, RuntimeError) as err:
            raise TransformMismatch(digest, f"not a kvtc transform ({err})") from None


def _check_shapes(t: Transform) -> None:
    s, d = t.mean.shape
    if s != 2 * t.n_layers * t.n_heads or t.basis.shape != (s, d, d) or t.sd.shape != (s, d) \
            or t.error.shape != (s, d, len(RUNGS) + 1) or t.rate.shape != t.error.shape:
        raise ValueError("tensor shapes do not fit its layers and heads")


def check_digest(digest: str, data: bytes, what: str) -> None:
    """TransformMismatch unless `data` (described by `what`) hashes to `digest`."""
    if blake3.blake3(data).hexdigest() != digest:
        raise TransformMismatch(digest, f"{what} do not hash to its name")
