"""Query-agnostic KV eviction: ContrastKV and its baselines, chosen by name from one registry
(batch jobs, the benchmark and the CLI all read METHODS)."""
from __future__ import annotations

from kvedge.cloud.eviction.base import EvictionMethod, EvictionResult, UnknownMethod, select
from kvedge.cloud.eviction.contrastkv import ContrastKV
from kvedge.cloud.eviction.kvzip import KVzip
from kvedge.cloud.eviction.snapkv import SnapKV
from kvedge.cloud.eviction.streaming import StreamingLLM
from kvedge.cloud.eviction.uniform import RandomEviction

METHODS: dict[str, type[EvictionMethod]] = {cls.name: cls for cls in (
    ContrastKV, KVzip, SnapKV, StreamingLLM, RandomEviction,
)}


def get_method(name: str, budget: float, **params) -> EvictionMethod:
    if name not in METHODS:
        raise UnknownMethod(f"unknown eviction method {name!r}; choose one of {sorted(METHODS)}")
    return METHODS[name](budget=budget, **params)


def evict_context(rt, ctx, method: str, budget: float, **params):
    """The context with only the KV pairs `method` keeps at `budget` (a ragged KVContext)."""
    return ctx.select(get_method(method, budget, **params).evict(rt, ctx).kept)


__all__ = ["METHODS", "EvictionMethod", "EvictionResult", "UnknownMethod", "evict_context",
           "get_method", "select"]
