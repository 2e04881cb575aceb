"""Per-layer bit allocation for CacheGen-style codecs, from measured sensitivities. Torch-free.

CacheGen (arXiv:2310.07240, Sec. 5.2) gives shallow layers more bits on the premise that
their KV matters more. Measured on SmolLM2-135M the premise does not hold — a handful of
middle and deep layers dominate the damage (docs/codecs.md) — so the allocation is made from
a per-layer sensitivity instead: how much the model's answers move when only that layer is
quantized coarsely (bench/codec_bench.py measures it as teacher-forced KL).
"""
from __future__ import annotations


def allocate_layer_bits(sensitivity: list[float], sizes: dict[int, list[int]],
                        budget: int) -> tuple[int, ...]:
    """One bit width per layer, total size within `budget` bytes, damage kept low.

    sensitivity[l]: damage when layer l alone uses the fewest bits; at b more bits it is
    modelled as sensitivity[l] / 4^b (quantization noise power falls 4× per bit).
    sizes[bits][l]: bytes layer l takes at that width. Every layer starts at the fewest bits;
    then the upgrade (one layer, one width up) that removes the most damage per extra byte is
    taken, while the total fits. Raises ValueError if even the fewest bits do not fit.
    """
    widths = sorted(sizes)
    n = len(sensitivity)
    if any(len(sizes[b]) != n for b in widths):
        raise ValueError("sizes must list every layer for every bit width")
    level = [0] * n  # index into widths
    total = sum(sizes[widths[0]])
    if total > budget:
        raise ValueError(f"even {widths[0]} bits everywhere takes {total} bytes > {budget}")

    def damage(layer: int, lv: int) -> float:
        return sensitivity[layer] / 4 ** (widths[lv] - widths[0])

    while True:
        best, best_gain = None, 0.0
        for layer in range(n):
            if level[layer] + 1 == len(widths):
                continue
            extra = sizes[widths[level[layer] + 1]][layer] - sizes[widths[level[layer]]][layer]
            gain = (damage(layer, level[layer]) - damage(layer, level[layer] + 1)) / max(extra, 1)
            if total + extra <= budget and gain > best_gain:
                best, best_gain, best_extra = layer, gain, extra
        if best is None:
            return tuple(widths[lv] for lv in level)
        level[best] += 1
        total += best_extra
