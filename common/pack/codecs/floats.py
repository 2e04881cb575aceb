"""`fp16`, `bf16`, `fp32`: store as a float dtype — lossless for data already in it.

fp16 is the baseline every other codec's bytes are measured against."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvedge.common.pack.codecs.base import CODECS, FLOAT_DTYPES, Codec, Role, expect, header


@dataclass
class FloatCodec(Codec):
    """A float dtype per name; subclasses fix `dtype`."""

    dtype: ClassVar[str] = "float16"

    def encode(self, x, role=Role()):
        return {"data": x.to(FLOAT_DTYPES[self.dtype]).contiguous()}, header(x)

    def pieces(self, parts, params):
        return [expect(parts["data"], params["shape"], FLOAT_DTYPES[self.dtype], "data")]


@CODECS.register
@dataclass
class Fp16(FloatCodec):
    name = "fp16"
    dtype = "float16"


@CODECS.register
@dataclass
class Bf16(FloatCodec):
    name = "bf16"
    dtype = "bfloat16"


@CODECS.register
@dataclass
class Fp32(FloatCodec):
    name = "fp32"
    dtype = "float32"
