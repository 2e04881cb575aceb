"""Reuse strategies, chosen by name from one registry (CLI, services and benchmark read it).

Adding one is a dataclass in its own module (its fields are its options, declared with
`kvedge.common.registry.option`), registered with `@STRATEGIES.register`, and one import
line here; `kvctl ask --opt key=value`, the Ask RPC and the benchmark reach its options
with no other change.
"""
from __future__ import annotations

from typing import Any, Mapping

from kvedge.common.errors import UnknownStrategy
from kvedge.edge import DEFAULT_STRATEGY
from kvedge.edge.strategies.base import Composed, Plan, ReuseStrategy, assemble_cache
from kvedge.edge.strategies.registry import STRATEGIES
from kvedge.edge.strategies import (  # noqa: F401 - each module registers its strategy
    recompute, full_reuse, pie, a3, cacheblend, epic, legolink, sparsex, samkv,
)



def get_strategy(name: str, options: Mapping[str, Any] | None = None) -> ReuseStrategy:
    """The strategy `name` with `options` (strings or values) checked against its fields."""
    return STRATEGIES.create(name, options)


__all__ = ["DEFAULT_STRATEGY", "STRATEGIES", "UnknownStrategy", "get_strategy", "Composed", "Plan",
           "ReuseStrategy", "assemble_cache"]
