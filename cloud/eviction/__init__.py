"""Query-agnostic KV eviction: ContrastKV and its baselines, one module per method, chosen by
name from one registry (batch jobs, the benchmark and the CLI all read METHODS).

Adding a method is a dataclass in its own module (its fields are its hyperparameters,
declared with `kvedge.common.registry.option`), registered with `@METHODS.register`, and one
import line here.
"""
from __future__ import annotations

from kvedge.cloud.eviction.base import EvictionMethod, EvictionResult, select
from kvedge.cloud.eviction.registry import METHODS
from kvedge.cloud.eviction import (  # noqa: F401 - each module registers its method
    none, contrastkv, kvzip, snapkv, streamingllm, random,
)
from kvedge.cloud.eviction.none import NoEviction
from kvedge.common.errors import UnknownMethod


def get_method(name: str, budget: float, **params) -> EvictionMethod:
    """The method `name` keeping `budget` of the KV, its options (strings or values) checked."""
    return METHODS.create(name, {"budget": budget, **params})


def evict_context(rt, ctx, method: str, budget: float, **params):
    """The context with only the KV pairs `method` keeps at `budget` (a ragged KVContext,
    shipped without block summaries: `KVContext.evicted`)."""
    return ctx.evicted(get_method(method, budget, **params).evict(rt, ctx).kept)


__all__ = ["METHODS", "EvictionMethod", "EvictionResult", "NoEviction", "UnknownMethod",
           "evict_context", "get_method", "select"]
