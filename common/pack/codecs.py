"""Codecs for pack tensors: one small class each, chosen by name from one registry.

A codec spec is a base codec followed by stages: "fp16", "int4", "int4+zstd",
"cachegen+zstd". Base codecs turn one (n, D) tensor into named parts (tensors the payload
stores) plus JSON params; a stage wraps any codec (`Zstd(inner)`). Decoding reads everything
it needs from the params, so a reader only needs the spec string from the manifest.

Decoding goes through `pieces()`: the tensor's rows in order, each piece either a dense
tensor or a `QuantizedTensor`. `decode()` dequantizes them with the torch reference; the
edge's realignment hands quantized pieces to the fused dequantize+RoPE kernel instead.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Union

import numpy as np
import torch
import zstandard

from kvedge.common.pack.errors import UnknownCodec
from kvedge.common.pack.quant import QuantizedTensor, codes_per_byte, quantize

Piece = Union[torch.Tensor, QuantizedTensor]
Parts = dict[str, torch.Tensor]
FLOAT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Role:
    """What a tensor is, for codecs whose choices depend on it.

    kind: "key" (quantized per channel), "value" (per token) or "side";
    ranks (n,): each row's index among the context's tokens, n_tokens: the context length
    (CacheGen keeps the first and last tokens of the context in full precision).
    """

    kind: str = "side"
    layer: int = 0
    n_layers: int = 1
    ranks: torch.Tensor | None = None
    n_tokens: int | None = None


class Codec:
    """Base class: `encode` (n, D) → (parts, params); `pieces` → rows back, in order."""

    name: str = ""

    def encode(self, x: torch.Tensor, role: Role = Role()) -> tuple[Parts, dict]:
        raise NotImplementedError

    def pieces(self, parts: Parts, params: dict) -> list[Piece]:
        raise NotImplementedError

    def decode(self, parts: Parts, params: dict) -> torch.Tensor:
        """The tensor back, in the dtype it was encoded from (torch reference path)."""
        dtype = FLOAT_DTYPES[params["dtype"]]
        rows = [p.dequantize(dtype) if isinstance(p, QuantizedTensor) else p.to(dtype)
                for p in self.pieces(parts, params)]
        return torch.cat(rows).reshape(params["shape"])


def _header(x: torch.Tensor) -> dict:
    return {"shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch.")}


def _expect(t: torch.Tensor, shape, dtype, what: str) -> torch.Tensor:
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
        raise ValueError(f"part {what} is {tuple(t.shape)} {t.dtype}, params say {shape} {dtype}")
    return t


# ---------------------------------------------------------------------- registry
BASES: dict[str, Callable[..., Codec]] = {}
STAGES: dict[str, Callable[[Codec], Codec]] = {}


def get_codec(spec: str, **options) -> Codec:
    """"int4+zstd" → Zstd(IntCodec(4, **options)). Options go to the base codec."""
    base, *stages = spec.split("+")
    if base not in BASES or any(s not in STAGES for s in stages):
        raise UnknownCodec(f"unknown codec {spec!r}: bases {sorted(BASES)}, "
                           f"stages {sorted(STAGES)} (join with '+', e.g. 'int4+zstd')")
    try:
        codec = BASES[base](**options)
    except TypeError as err:
        raise UnknownCodec(f"codec {base!r} does not take these options: {err}") from None
    for stage in stages:
        codec = STAGES[stage](codec)
    return codec


def codec_names() -> list[str]:
    """Every base alone and with each stage — what the CLI and the benchmark offer."""
    return sorted(BASES) + [f"{b}+{s}" for b in sorted(BASES) for s in sorted(STAGES)]


# ---------------------------------------------------------------------- base codecs
@dataclass
class FloatCodec(Codec):
    """Store as a float dtype: lossless for data already in it (fp16 is the baseline)."""

    dtype: str = "float16"

    @property
    def name(self) -> str:
        return {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}[self.dtype]

    def encode(self, x, role=Role()):
        return {"data": x.to(FLOAT_DTYPES[self.dtype]).contiguous()}, _header(x)

    def pieces(self, parts, params):
        return [_expect(parts["data"], params["shape"], FLOAT_DTYPES[self.dtype], "data")]


for _name, _dtype in (("fp16", "float16"), ("bf16", "bfloat16"), ("fp32", "float32")):
    BASES[_name] = lambda _d=_dtype: FloatCodec(_d)


@dataclass
class IntCodec(Codec):
    """KIVI-style asymmetric int8/4/3/2: keys per channel, values (and side) per token."""

    bits: int = 4
    key_group: int = 64    # tokens per key group (per channel)
    value_group: int = 64  # channels per value group (per token)

    @property
    def name(self) -> str:
        return f"int{self.bits}"

    def encode(self, x, role=Role()):
        per_channel = role.kind == "key"
        group = self.key_group if per_channel else self.value_group
        q = quantize(x, self.bits, group, per_channel)
        params = {**_header(x), "bits": self.bits, "group": group, "per_channel": per_channel}
        return {"packed": q.packed, "scale": q.scale, "zero": q.zero}, params

    def pieces(self, parts, params):
        return [quantized_piece(parts, params, params["shape"][0])]


def quantized_piece(parts: Parts, params: dict, n: int, prefix: str = "") -> QuantizedTensor:
    """Rebuild a QuantizedTensor of n rows from parts, checking every shape against params."""
    bits, group, per_channel = int(params["bits"]), int(params["group"]), params["per_channel"]
    dim = int(params["shape"][1])
    if bits not in (2, 3, 4, 8) or group < 1 or not isinstance(per_channel, bool):
        raise ValueError(f"bad quantization params {params}")
    groups = (math.ceil(n / group), dim) if per_channel else (n, math.ceil(dim / group))
    packed = _expect(parts[prefix + "packed"], (n, dim // codes_per_byte(bits)), torch.uint8,
                     "packed")
    scale = _expect(parts[prefix + "scale"], groups, torch.float16, "scale")
    zero = _expect(parts[prefix + "zero"], groups, torch.float16, "zero")
    return QuantizedTensor(packed, scale, zero, bits, group, per_channel, dim)


for _bits in (8, 4, 3, 2):  # int3: one code per byte, for use with "+zstd"
    BASES[f"int{_bits}"] = lambda _b=_bits, **kw: IntCodec(_b, **kw)


@dataclass
class CacheGen(Codec):
    """CacheGen-style (arXiv:2310.07240, Sec. 5.2): fewer bits for deeper layers, whose KV
    matters less, and full precision (fp16) for the tokens attention leans on most — the
    first `sinks` (attention sinks, StreamingLLM) and the last `recent` tokens of the context.

    `layer_bits` is either a depth schedule — ((0.25, 4), (1.0, 2)) gives layers in the first
    quarter 4 bits and the rest 2, CacheGen's rule — or one bit width per layer, calibrated per
    model (bench/codec_bench.py measures each layer's sensitivity: on SmolLM2 it is far from
    monotone in depth). Pair with "+zstd" for CacheGen's entropy stage. CacheGen's token-wise
    delta step is left out: its own released codec dropped it (outputs grew), and
    bench/codec_bench.py measures the same here.
    """

    sinks: int = 4
    recent: int = 32
    layer_bits: tuple = ((0.25, 4), (1.0, 2))
    key_group: int = 64
    value_group: int = 64

    name = "cachegen"

    def bits_for(self, layer: int, n_layers: int) -> int:
        if all(isinstance(b, int) for b in self.layer_bits):
            if len(self.layer_bits) != n_layers:
                raise ValueError(f"layer_bits lists {len(self.layer_bits)} layers, the model "
                                 f"has {n_layers}")
            return self.layer_bits[layer]
        depth = (layer + 1) / n_layers
        return next(b for limit, b in self.layer_bits if depth <= limit + 1e-9)

    def encode(self, x, role=Role()):
        n = x.shape[0]
        ranks = role.ranks if role.ranks is not None else torch.arange(n)
        n_tokens = role.n_tokens if role.n_tokens is not None else n
        head = int((ranks < self.sinks).sum())
        tail = min(int((ranks >= n_tokens - self.recent).sum()), n - head)
        bits = self.bits_for(role.layer, role.n_layers)
        inner = IntCodec(bits, self.key_group, self.value_group)
        q_parts, q_params = inner.encode(x[head: n - tail], role)
        parts = {"head": x[:head].to(torch.float16), "tail": x[n - tail:].to(torch.float16),
                 **{f"q_{k}": v for k, v in q_parts.items()}}
        params = {**_header(x), "head": head, "tail": tail,
                  **{k: q_params[k] for k in ("bits", "group", "per_channel")}}
        return parts, params

    def pieces(self, parts, params):
        n, dim = params["shape"]
        head, tail = int(params["head"]), int(params["tail"])
        if not 0 <= head <= n - tail <= n:
            raise ValueError(f"bad row split head={head} tail={tail} of {n}")
        return [_expect(parts["head"], (head, dim), torch.float16, "head"),
                quantized_piece(parts, params, n - head - tail, prefix="q_"),
                _expect(parts["tail"], (tail, dim), torch.float16, "tail")]


BASES["cachegen"] = CacheGen


# ---------------------------------------------------------------------- stages
@dataclass
class Zstd(Codec):
    """Entropy stage: zstd over each part of the inner codec, single-threaded (faster than
    threads on 2 cores). Multi-byte parts (fp16 scales, full-precision rows) are split into
    byte planes, one zstd frame each: sign/exponent bytes compress well, mantissa bytes hardly
    at all, and inside one frame zstd would code both with one Huffman table whenever they
    share a 128 KB block (bench/codec_bench.py measures the difference)."""

    inner: Codec
    level: int = 3
    _cctx: object = field(default=None, init=False, repr=False)

    @property
    def name(self) -> str:
        return f"{self.inner.name}+zstd"

    def encode(self, x, role=Role()):
        inner_parts, inner_params = self.inner.encode(x, role)
        self._cctx = self._cctx or zstandard.ZstdCompressor(level=self.level)
        parts, layout = {}, {}
        for name, t in inner_parts.items():
            frames = [self._cctx.compress(plane) for plane in to_planes(t)]
            parts[name] = bytes_tensor(b"".join(frames))
            layout[name] = [str(t.dtype).removeprefix("torch."), list(t.shape),
                            [len(f) for f in frames]]
        return parts, {**_header(x), "inner": inner_params, "layout": layout}

    def pieces(self, parts, params):
        budget = 8 * math.prod(params["shape"]) + 4096  # no garbage param can allocate more
        dctx = zstandard.ZstdDecompressor()
        inner = {}
        for name, (dtype_name, shape, frames) in params["layout"].items():
            dtype = _PART_DTYPES[dtype_name]
            size = dtype.itemsize * math.prod(shape)
            if size > budget or len(frames) != dtype.itemsize:
                raise ValueError(f"part {name}: {size} bytes in {len(frames)} planes do not fit")
            data = parts[name].numpy().tobytes()
            if sum(frames) != len(data):
                raise ValueError(f"part {name}: frames {frames} do not add up to {len(data)}")
            ends = np.cumsum(frames).tolist()
            raw = b"".join(dctx.decompress(data[end - n: end], max_output_size=max(size, 1))
                           for n, end in zip(frames, ends))
            if len(raw) != size:
                raise ValueError(f"part {name} decompressed to {len(raw)} bytes, expected {size}")
            inner[name] = from_planes(raw, dtype, shape)
        return self.inner.pieces(inner, params["inner"])


STAGES["zstd"] = Zstd


def to_planes(t: torch.Tensor) -> list[bytes]:
    """Byte i of every element of t, for each i: one plane per byte of the dtype."""
    raw = t.contiguous().reshape(-1).view(torch.uint8).numpy().reshape(-1, t.element_size())
    return [raw[:, i].tobytes() for i in range(t.element_size())]


def from_planes(raw: bytes, dtype: torch.dtype, shape) -> torch.Tensor:
    """Inverse of `to_planes`, from the planes' concatenation."""
    if not raw:
        return torch.empty(shape, dtype=dtype)
    planes = np.frombuffer(raw, np.uint8).reshape(dtype.itemsize, -1)
    return bytes_tensor(planes.T.tobytes()).view(dtype).reshape(shape)


def bytes_tensor(data: bytes) -> torch.Tensor:
    """A writable uint8 tensor holding a copy of `data` (empty allowed)."""
    return torch.from_numpy(np.frombuffer(data, np.uint8).copy())


_PART_DTYPES = {"uint8": torch.uint8, **FLOAT_DTYPES}
