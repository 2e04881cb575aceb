"""Where do a quantized KV pack's bits go furthest? Relative error and stored bits of each
quantization layout on a real model's KV (issue 30: "keys and values at different bit widths",
measured one by one).

`python -m kvedge.bench.quant_error [--model M] [--tokens 2048] [--bits 2,3,4]`: the KV of one
SQuAD v2 tuning article (`entropy_bound.article_kv`), each (layer, KV head) tensor quantized
as `kvedge.kernels.quant.quantize` does — per channel (groups of tokens: KIVI's layout for
keys) or per token (groups of channels: values') — with groups of 64 or 32, plain or after a
random-sign Walsh–Hadamard rotation of the head dimension (the rotation TurboQuant and QuaRot
apply before quantizing, so outlier channels spread over all of them; orthogonal, so decoding
multiplies by its transpose and nothing else changes). Per row: ‖x̂ − x‖² / ‖x‖², the mean
over the kind's (layer, head) tensors, and bits per element as `int<b>+zstd` would store them (zstd level 3 over
the packed codes, plus the fp16 scale and zero of each group).

The relative error says how far a layout moves the tensor, not how far it moves an answer
(keys enter a softmax, whose input is shifted by a constant per query at no cost): rank
layouts of one kind with it, and judge codecs with the bench's paired F1.
"""
from __future__ import annotations

import math

import torch
import zstandard

SEED = 0
ZSTD_LEVEL = 3


def rotation(dim: int, seed: int = SEED) -> torch.Tensor:
    """A random-sign Walsh–Hadamard matrix (dim a power of two), orthogonal: R Rᵀ = I."""
    if dim & (dim - 1):
        raise ValueError(f"the Hadamard rotation needs a power-of-two head dim, got {dim}")
    h = torch.ones(1, 1)
    while h.shape[0] < dim:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    gen = torch.Generator().manual_seed(seed)
    signs = torch.randint(0, 2, (dim,), generator=gen).float() * 2 - 1
    return signs[:, None] * h / math.sqrt(dim)


def layout_error(layers: list[torch.Tensor], bits: int, group: int, per_channel: bool,
                 rotate: bool) -> tuple[float, float]:
    """(relative squared error, stored bits per element) of one layout over every (layer,
    head) tensor of `layers`, each (H, T, D): the error is the mean over tensors of each one's
    ‖x̂ − x‖² / ‖x‖² (pooled sums would be the few largest tensors' alone)."""
    from kvedge.kernels.quant import dequantize_many, quantize

    zstd = zstandard.ZstdCompressor(level=ZSTD_LEVEL)
    r = rotation(layers[0].shape[-1]) if rotate else None
    errors, stored, n = [], 0.0, 0
    for layer in layers:
        for x in layer.float():
            q = quantize(x @ r if rotate else x, bits, group, per_channel)
            y = dequantize_many([q])
            y = y @ r.T if rotate else y
            errors.append(float(((y - x) ** 2).sum() / (x ** 2).sum().clamp(min=1e-30)))
            stored += 8 * len(zstd.compress(q.packed.numpy().tobytes())) + 32 * q.scale.numel()
            n += x.numel()
    return sum(errors) / len(errors), stored / n


def measure(model: str, tokens: int, widths: list[int]) -> tuple[int, list[dict]]:
    from kvedge.bench.entropy_bound import article_kv

    ids, keys, values = article_kv(model, tokens)
    rows = []
    for kind, layers in (("key", keys), ("value", values)):
        for bits in widths:
            for per_channel in (True, False):
                for group in (64, 32):
                    for rotate in (False, True):
                        err, stored = layout_error(layers, bits, group, per_channel, rotate)
                        rows.append({"kind": kind, "bits": bits, "per_channel": per_channel,
                                     "group": group, "rotate": rotate, "rel_error": err,
                                     "bits_per_element": stored})
    return len(ids), rows


def main(argv: list[str] | None = None) -> None:
    from kvedge.bench.entropy_bound import article_options

    model, tokens, widths = article_options(argv, __doc__, 2048, "2,3,4")
    n, rows = measure(model, tokens, widths)
    print(f"{model}, {n} tokens of a SQuAD tuning article")
    print("| kind | bits | groups | group | rotated | ‖x̂ − x‖² / ‖x‖² | bits per element "
          "(+zstd, scales) |\n|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']}s | {r['bits']} | per {'channel' if r['per_channel'] else 'token'}"
              f" | {r['group']} | {'yes' if r['rotate'] else 'no'} | {r['rel_error']:.5f} "
              f"| {r['bits_per_element']:.3f} |")


if __name__ == "__main__":
    main()
