"""What every pack codec shares: the tensor's role, the codec contract, the two registries.

A codec turns one (n, D) tensor into named parts (tensors the payload stores) plus JSON
params, and back. Decoding reads everything it needs from the params, so a reader needs only
the spec string the manifest records. Decoding goes through `pieces()`: the tensor's rows in
order, each a dense tensor or a `QuantizedTensor`; `decode()` dequantizes them with the torch
reference, the edge's realignment hands quantized pieces to the fused dequantize+RoPE kernel.

Base codecs (one family per module) register in `CODECS` by name; stages that wrap any codec
(`zstd`) in `STAGES`. A codec's options are its dataclass fields, declared with
`kvedge.common.registry.option`, so a command line sets them as strings, checked by range.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Union

import torch

from kvedge.common.pack.errors import UnknownCodec
from kvedge.kernels.quant import QuantizedTensor, dequantize_many
from kvedge.common.registry import Registry

Piece = Union[torch.Tensor, QuantizedTensor]
Parts = dict[str, torch.Tensor]
FLOAT_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}

CODECS: Registry = Registry("codec", UnknownCodec)        # base codecs: "fp16", "int4", ...
STAGES: Registry = Registry("codec stage", UnknownCodec)  # wrappers: "zstd"


@dataclass(frozen=True)
class Role:
    """What a tensor is, for codecs whose choices depend on it.

    kind: "key" (quantized per channel), "value" (per token) or "side";
    ranks (n,): each row's index among the context's tokens, n_tokens: the context length
    (CacheGen keeps the first and last tokens of the context in full precision);
    head: the KV head (kvtc's transform is per head).
    """

    kind: str = "side"
    layer: int = 0
    n_layers: int = 1
    ranks: torch.Tensor | None = None
    n_tokens: int | None = None
    head: int = 0


class Codec:
    """Base class: `encode` (n, D) → (parts, params); `pieces` → rows back, in order."""

    name: ClassVar[str] = ""

    def encode(self, x: torch.Tensor, role: Role = Role()) -> tuple[Parts, dict]:
        raise NotImplementedError

    def pieces(self, parts: Parts, params: dict) -> list[Piece]:
        raise NotImplementedError

    def take(self, parts: Parts, params: dict, rows: torch.Tensor) -> list[Piece]:
        """Only rows `rows` (sorted indices) as pieces, for block-granular loading; a codec
        that can skip the other rows' work (kvtc's inverse transform) overrides it."""
        return take_rows(self.pieces(parts, params), rows)

    def decode(self, parts: Parts, params: dict) -> torch.Tensor:
        """The tensor back, in the dtype it was encoded from (torch reference path)."""
        return decode_pieces(self.pieces(parts, params),
                             FLOAT_DTYPES[params["dtype"]]).reshape(params["shape"])


def decode_pieces(pieces: list[Piece], dtype: torch.dtype) -> torch.Tensor:
    """Pieces → their rows (n, D) in `dtype`, quantized ones dequantized (torch reference)."""
    return torch.cat([p.dequantize(dtype) if isinstance(p, QuantizedTensor) else p.to(dtype)
                      for p in pieces])


def decode_tensors(tensors: list[tuple[list[Piece], torch.dtype]]) -> list[torch.Tensor]:
    """Several tensors, each given as its pieces and the dtype it was encoded from → each
    tensor's rows (n, D), to the bit as `decode_pieces` gives them, but with the quantized
    pieces of one layout and dtype dequantized together: a Qwen2.5-0.5B pack's 96 quantized
    K/V heads in two `dequantize_many` calls, not 96. Fewer, larger torch calls matter most
    where the cores are contended (bench/pack_read.py). Dense pieces are cast one by one,
    as `decode_pieces` casts them (mostly a no-op: no copy)."""
    groups: dict[tuple, list[tuple[int, int]]] = {}
    out = [list(pieces) for pieces, _ in tensors]
    for t, (pieces, dtype) in enumerate(tensors):
        for i, piece in enumerate(pieces):
            if isinstance(piece, QuantizedTensor):
                groups.setdefault((piece.layout, dtype), []).append((t, i))
            else:
                out[t][i] = piece.to(dtype)
    for (_, dtype), members in groups.items():
        batch = [out[t][i] for t, i in members]
        rows = dequantize_many(batch).to(dtype).split([q.n for q in batch])
        for (t, i), x in zip(members, rows):
            out[t][i] = x
    return [parts[0] if len(parts) == 1 else torch.cat(parts) for parts in out]


def piece_rows(piece: Piece) -> int:
    """How many rows a piece holds."""
    return piece.n if isinstance(piece, QuantizedTensor) else piece.shape[0]


def take_rows(pieces: list[Piece], rows: torch.Tensor) -> list[Piece]:
    """Rows `rows` (sorted, unique indices into the whole tensor) of a tensor given as
    pieces in row order, each piece cut to its share and quantized pieces left quantized
    (`QuantizedTensor.take`). No row at all: one empty piece (the last, cut to nothing)."""
    out, start = [], 0
    for piece in pieces:
        n = piece_rows(piece)
        lo, hi = torch.searchsorted(rows, torch.tensor([start, start + n])).tolist()
        if hi > lo or (not out and piece is pieces[-1]):
            local = rows[lo:hi] - start
            out.append(piece.take(local) if isinstance(piece, QuantizedTensor) else piece[local])
        start += n
    return out


def header(x: torch.Tensor) -> dict:
    """The params every codec records: the tensor's shape and dtype."""
    return {"shape": list(x.shape), "dtype": str(x.dtype).removeprefix("torch.")}


def expect(t: torch.Tensor, shape, dtype, what: str) -> torch.Tensor:
    """`t` if it has the shape and dtype the params promise, else ValueError (corruption)."""
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
        raise ValueError(f"part {what} is {tuple(t.shape)} {t.dtype}, params say {shape} {dtype}")
    return t
