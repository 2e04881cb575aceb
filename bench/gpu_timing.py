"""Timing and error measures the device check's sections share (`kvedge.bench.gpu_check`,
`kvedge.bench.gpu_runtime`)."""
from __future__ import annotations

import statistics
import time

import torch


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def median_ms(call, device, repeats: int = 20, warmup: int = 3) -> float:
    """Median wall time of `call()` in ms, synchronized around each call."""
    for _ in range(warmup):
        call()
    sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def poison(device, n_bytes: int = 1 << 30) -> None:
    """Fill freed allocator blocks with NaN so an output element nobody writes stays NaN."""
    if torch.device(device).type == "cuda":
        torch.full((n_bytes // 4,), float("nan"), device=device)  # freed at once


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in float64; inf if anything is not finite."""
    out, ref = out.double().cpu(), ref.double().cpu()
    if not bool(torch.isfinite(out).all()):
        return float("inf")
    return float((out - ref).norm() / ref.norm().clamp_min(1e-300))
