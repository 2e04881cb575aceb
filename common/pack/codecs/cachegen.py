"""`cachegen`: CacheGen-style layer-wise bits with full-precision sinks and recent tokens.

CacheGen (arXiv:2310.07240, Sec. 5.2): fewer bits for deeper layers, whose KV matters less,
and full precision (fp16) for the tokens attention leans on most — the first `sinks`
(attention sinks, StreamingLLM) and the last `recent` tokens of the context. Pair with
"+zstd" for CacheGen's entropy stage. CacheGen's token-wise delta step is left out: its own
released codec dropped it (outputs grew), and bench/codec_bench.py measures the same here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.common.pack.codecs.base import CODECS, Codec, Role, expect, header
from kvedge.common.pack.codecs.kivi import (IntCodec, check_widths, layer_width,
                                            literal_option, quantized_piece, schedule_widths)
from kvedge.common.registry import option, validate


@CODECS.register
@dataclass
class CacheGen(Codec):
    """`layer_bits` is either a depth schedule — ((0.25, 4), (1.0, 2)) gives layers in the
    first quarter 4 bits and the rest 2, CacheGen's rule — or one bit width per layer,
    calibrated per model (bench/codec_bench.py measures each layer's sensitivity: on SmolLM2
    it is far from monotone in depth). From a command line it is a Python literal string."""

    sinks: int = option(4, 0, None, "first tokens of the context kept in fp16")
    recent: int = option(32, 0, None, "last tokens of the context kept in fp16")
    layer_bits: tuple = option(((0.25, 4), (1.0, 2)), help="((depth, bits), ...) or per-layer "
                               "bits, e.g. '((0.25,4),(1.0,2))'")
    key_group: int = option(64, 1, None, "tokens per key group (keys: per channel)")
    value_group: int = option(64, 1, None, "channels per value group (values: per token)")

    name = "cachegen"

    def __post_init__(self):
        validate(self)
        if isinstance(self.layer_bits, str):
            self.layer_bits = literal_option(self.name, "layer_bits", self.layer_bits)
        check_widths(self.name, schedule_widths(self.layer_bits))

    def bits_for(self, layer: int, n_layers: int) -> int:
        return layer_width(self.layer_bits, layer, n_layers, "layer_bits")

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
        params = {**header(x), "head": head, "tail": tail,
                  **{k: q_params[k] for k in ("bits", "group", "per_channel")}}
        return parts, params

    def pieces(self, parts, params):
        n, dim = params["shape"]
        head, tail = int(params["head"]), int(params["tail"])
        if not 0 <= head <= n - tail <= n:
            raise ValueError(f"bad row split head={head} tail={tail} of {n}")
        return [expect(parts["head"], (head, dim), torch.float16, "head"),
                quantized_piece(parts, params, n - head - tail, prefix="q_"),
                expect(parts["tail"], (tail, dim), torch.float16, "tail")]

