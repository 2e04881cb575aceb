"""`+zstd`: the entropy stage, zstd over each part of any inner codec.

Single-threaded (faster than threads on 2 cores). Multi-byte parts (fp16 scales,
full-precision rows) are split into byte planes, one zstd frame each: sign/exponent bytes
compress well, mantissa bytes hardly at all, and inside one frame zstd would code both with
one Huffman table whenever they share a 128 KB block (bench/codec_bench.py measures the
difference). On raw fp16 KV it gains little (~1.1×, docs/design.md, reference points); it
pays after quantization.
"""
from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

import numpy as np
import torch
import zstandard

from kvedge.common.pack.codecs.base import FLOAT_DTYPES, STAGES, Codec, Role, header
from kvedge.common.registry import option, validate

_PART_DTYPES = {"uint8": torch.uint8, **FLOAT_DTYPES}


@STAGES.register
@dataclass
class Zstd(Codec):
    inner: Codec
    level: int = option(3, 1, 22, "zstd compression level")
    _cctx: object = field(default=None, init=False, repr=False)

    name = "zstd"  # the stage's registry name; an instance is named after its spec

    def __post_init__(self):
        validate(self)
        self.name = f"{self.inner.name}+zstd"  # what the manifest records: "int4+zstd"

    def encode(self, x, role=Role()):
        inner_parts, inner_params = self.inner.encode(x, role)
        self._cctx = self._cctx or zstandard.ZstdCompressor(level=self.level)
        parts, layout = {}, {}
        for name, t in inner_parts.items():
            frames = [self._cctx.compress(plane) for plane in to_planes(t)]
            parts[name] = bytes_tensor(b"".join(frames))
            layout[name] = [str(t.dtype).removeprefix("torch."), list(t.shape),
                            [len(f) for f in frames]]
        return parts, {**header(x), "inner": inner_params, "layout": layout}

    def pieces(self, parts, params):
        return self.inner.pieces(self._inner_parts(parts, params), params["inner"])

    def take(self, parts, params, rows):
        return self.inner.take(self._inner_parts(parts, params), params["inner"], rows)

    def _inner_parts(self, parts, params) -> dict:
        """The inner codec's parts, each decompressed (bounded by the tensor's size)."""
        budget = 8 * math.prod(params["shape"]) + 4096  # no garbage param can allocate more
        dctx = _decompressor()
        inner = {}
        for name, (dtype_name, shape, frames) in params["layout"].items():
            dtype = _PART_DTYPES[dtype_name]
            size = dtype.itemsize * math.prod(shape)
            if size > budget or len(frames) != dtype.itemsize:
                raise ValueError(f"part {name}: {size} bytes in {len(frames)} planes do not fit")
            data = memoryview(parts[name].numpy())  # zstd reads it in place
            if sum(frames) != len(data):
                raise ValueError(f"part {name}: frames {frames} do not add up to {len(data)}")
            planes, start = [], 0
            for n in frames:
                planes.append(dctx.decompress(data[start: start + n],
                                              max_output_size=max(size, 1)))
                start += n
            raw = b"".join(planes)
            if len(raw) != size:
                raise ValueError(f"part {name} decompressed to {len(raw)} bytes, expected {size}")
            inner[name] = from_planes(raw, dtype, shape)
        return inner


_THREAD = threading.local()


def _decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompressor: making one per tensor was a third of a pack's entropy
    decoding (bench/pack_read.py), and one must not serve two threads at once."""
    if not hasattr(_THREAD, "dctx"):
        _THREAD.dctx = zstandard.ZstdDecompressor()
    return _THREAD.dctx


def to_planes(t: torch.Tensor) -> list[bytes]:
    """Byte i of every element of t, for each i: one plane per byte of the dtype."""
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().reshape(-1, t.element_size())
    return [raw[:, i].tobytes() for i in range(t.element_size())]


def from_planes(raw: bytes, dtype: torch.dtype, shape) -> torch.Tensor:
    """Inverse of `to_planes`, from the planes' concatenation."""
    if not raw:
        return torch.empty(shape, dtype=dtype)
    planes = np.frombuffer(raw, np.uint8).reshape(dtype.itemsize, -1)
    rows = planes.T.copy() if dtype.itemsize > 1 else planes[0].copy()
    return torch.from_numpy(rows).view(dtype).reshape(shape)


def bytes_tensor(data: bytes) -> torch.Tensor:
    """A writable uint8 tensor holding a copy of `data` (empty allowed)."""
    return torch.from_numpy(np.frombuffer(data, np.uint8).copy())
