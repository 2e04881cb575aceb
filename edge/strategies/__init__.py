"""Reuse strategies, chosen by name from one registry (CLI, services and benchmark read it).

Adding one is a small class in its own module and one line here.
"""
from __future__ import annotations

from kvedge.common.errors import InvalidRequest
from kvedge.edge.strategies.a3 import A3
from kvedge.edge.strategies.base import Composed, Plan, ReuseStrategy, assemble_cache
from kvedge.edge.strategies.cacheblend import CacheBlend
from kvedge.edge.strategies.epic import Epic
from kvedge.edge.strategies.full_reuse import FullReuse
from kvedge.edge.strategies.pie import Pie
from kvedge.edge.strategies.recompute import Recompute

STRATEGIES: dict[str, type[ReuseStrategy]] = {cls.name: cls for cls in (
    Recompute, FullReuse, Pie, A3, CacheBlend, Epic,
)}


class UnknownStrategy(InvalidRequest):
    """No reuse strategy by that name."""


def get_strategy(name: str, ratio: float | None = None) -> ReuseStrategy:
    if name not in STRATEGIES:
        raise UnknownStrategy(f"unknown strategy {name!r}; choose one of {sorted(STRATEGIES)}")
    cls = STRATEGIES[name]
    return cls(ratio=ratio) if ratio and "ratio" in getattr(cls, "__dataclass_fields__", {}) \
        else cls()


__all__ = ["STRATEGIES", "UnknownStrategy", "get_strategy", "Composed", "Plan", "ReuseStrategy", "assemble_cache"]
