"""The `kvtc` codec: one (n, D) head → fp16 sinks, quantizer steps and zstd-coded
zig-zagged PCA coefficients; binding it to a model's calibrated transform (`for_model`), and
the transforms a pack's kvtc tensors reference.

Staniszewski & Łańcucki, "KV Cache Transform Coding for Compact Storage in LLM Inference"
(arXiv:2511.01815): y = (x − μ)·Bᵀ, round(y/step) per kept component, entropy-coded; decoding
is one (n, k)·(k, D) matmul plus μ.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
import zstandard

from kvedge.common.errors import InvalidOption
from kvedge.common.pack.codecs.base import CODECS, Codec, Role, expect, header
from kvedge.common.pack.codecs.kvtc.fit import fit_head
from kvedge.common.pack.codecs.kvtc.quantizer import allocate, quantize, steps_of
from kvedge.common.pack.codecs.kvtc.store import TransformStore, default_store, model_transform
from kvedge.common.pack.codecs.kvtc.transform import DIGEST, KINDS, Transform
from kvedge.common.pack.codecs.zstd import bytes_tensor
from kvedge.common.pack.errors import TransformMismatch
from kvedge.common.registry import option, validate


@CODECS.register
@dataclass
class Kvtc(Codec):
    bits: float = option(2.0, 0.01, 8.0, "code entropy per KV element, averaged (fp16: 16)")
    sinks: int = option(4, 0, None, "first tokens of the context kept in fp16")
    embed: bool = option(True, help="each head carries its own mean and basis rows (decodes "
                                    "anywhere); false: packs reference the transform file")
    allocate: str = option("model", help="model: one budget over all heads, fewest relative "
                                         "error in sum; head: the same budget for each head")
    transform: str = option("", help="blake3 of a calibrated transform (a cloud worker sets "
                                     "it); '' fits each head on its own rows")
    level: int = option(3, 1, 22, "zstd level")

    name = "kvtc"

    def __post_init__(self):
        validate(self)
        if self.allocate not in ("model", "head"):
            raise InvalidOption(f"'kvtc' option 'allocate' must be model or head, "
                                f"got {self.allocate!r}")
        if self.transform and not DIGEST.match(self.transform):
            raise InvalidOption(f"'kvtc' option 'transform' must be a blake3 hex digest, "
                                f"got {self.transform!r}")

    def encode(self, x, role=Role()):
        ranks = role.ranks if role.ranks is not None else torch.arange(x.shape[0])
        head = int((ranks < self.sinks).sum())
        rows = x[head:]
        embedded = self.embed or not self.transform
        params = {**header(x), "sinks": head, "transform": self.transform, "embedded": embedded}
        bits = self.bits
        if self.transform:
            t = default_store().load(self.transform)
            s = params["slot"] = self._slot(t, x, role)
            bits = float(t.head_bits(self.bits, self.allocate)[s])
        if embedded:  # the basis travels anyway: fit it to these rows, spend the head's bits
            mean, basis, error, rate, sd = fit_head(rows, table_rows=512)
            steps = steps_of(allocate(error, rate, bits), sd)
        else:
            mean, basis, steps = t.mean[s], t.basis[s], t.steps(self.bits, self.allocate)[s]
        keep = steps > 0
        if embedded and int(keep.sum()) + 1 >= rows.shape[0]:
            head, rows, keep = x.shape[0], rows[:0], torch.zeros_like(keep)  # fp16 is smaller
            params["sinks"] = head
        parts = {"sink": x[:head].to(torch.float16), "step": (steps * keep).half(),
                 "codes": self._codes(rows, mean, basis[keep], steps[keep])}
        if embedded:
            parts.update(mean=mean, basis=basis[keep])
        return parts, params

    def _slot(self, t: Transform, x, role: Role) -> int:
        if role.kind not in KINDS or (t.n_layers, t.basis.shape[-1]) != (role.n_layers,
                                                                         x.shape[1]) \
                or not 0 <= role.head < t.n_heads:
            raise TransformMismatch(self.transform, f"it fits {t.n_layers} layers × {t.n_heads}"
                                    f" heads × {t.basis.shape[-1]} dims, not {role.kind} head "
                                    f"{role.head} of {role.n_layers} layers × {x.shape[1]}")
        return t.slot(role.kind, role.layer, role.head)

    def _codes(self, rows, mean, basis, steps) -> torch.Tensor:
        y = (rows.float() - mean.float()) @ basis.float().T             # (n, k)
        q = quantize(y, steps.float()).to(torch.int16)
        symbols = torch.where(q >= 0, 2 * q, -2 * q - 1).to(torch.uint8).T.contiguous()
        cctx = zstandard.ZstdCompressor(level=self.level)
        return bytes_tensor(cctx.compress(symbols.numpy().tobytes()))

    def pieces(self, parts, params):
        return self.take(parts, params, None)

    def take(self, parts, params, rows):
        """The sinks and the inverse transform of only the coded rows asked for (all if
        `rows` is None): the codes are entropy-decoded whole, the matrix product is not."""
        (n, dim), head = params["shape"], int(params["sinks"])
        if not 0 <= head <= n:
            raise ValueError(f"bad sink count {head} of {n} rows")
        steps = expect(parts["step"], (dim,), torch.float16, "step").float()
        if not torch.isfinite(steps).all() or (steps < 0).any():
            raise ValueError("quantizer steps must be finite and non-negative")
        keep = steps > 0
        k, m = int(keep.sum()), n - head
        if params["embedded"]:
            mean = expect(parts["mean"], (dim,), torch.float16, "mean")
            basis = expect(parts["basis"], (k, dim), torch.float16, "basis")
        else:
            t = default_store().load(params["transform"])
            s = int(params["slot"])
            if not 0 <= s < t.mean.shape[0] or t.mean.shape[1] != dim:
                raise TransformMismatch(params["transform"], f"it has no slot {s} of {dim} dims")
            mean, basis = t.mean[s], t.basis[s][keep]
        q = _symbols(parts["codes"], k, m)                              # (m, k)
        sink = expect(parts["sink"], (head, dim), torch.float16, "sink")
        if rows is not None:
            sink, q = sink[rows[rows < head]], q[rows[rows >= head] - head]
        return [sink, (q * steps[keep]) @ basis.float() + mean.float()]

    def for_model(self, rt, store: TransformStore | None = None) -> "Kvtc":
        """A copy bound to the calibrated transform of `rt`'s model (calibrated on first
        use); itself if it names a transform already."""
        if self.transform:
            return self
        return replace(self, transform=model_transform(rt, store).digest)


def _symbols(codes: torch.Tensor, k: int, m: int) -> torch.Tensor:
    """The zstd frame of zig-zagged codes, component by component → codes (m, k) float."""
    if k * m == 0:
        return torch.zeros(m, k)
    raw = zstandard.ZstdDecompressor().decompress(codes.numpy().tobytes(), max_output_size=k * m)
    if len(raw) != k * m:
        raise ValueError(f"codes hold {len(raw)} symbols, expected {k}×{m}")
    return torch.from_numpy(_UNZIGZAG[np.frombuffer(raw, np.uint8)]).reshape(k, m).T


_UNZIGZAG = np.array([s // 2 if s % 2 == 0 else -(s + 1) // 2 for s in range(256)], np.float32)


def referenced_transforms(manifest) -> set[str]:
    """The transforms a pack (its `Manifest`) needs from the transforms folder: the digests
    its embed=false kvtc tensors name, also under stages ("kvtc+zstd": params["inner"])."""
    found = set()
    for entry in manifest.tensors.values():
        base, *stages = entry.codec.split("+")
        if base != Kvtc.name:
            continue
        params = entry.params
        for _ in stages:
            params = params["inner"]
        if not params["embedded"]:
            found.add(params["transform"])
    return found
