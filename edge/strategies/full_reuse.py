"""`full-reuse`: concatenate the segments' caches as prefilled — no realignment, no recompute.

The lower bound of reuse (A3's "FullReuse" baseline): every segment's keys keep the RoPE of
positions 0..n-1 they were prefilled at, whatever their place in the prompt.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvedge.edge.strategies.pie import Pie
from kvedge.edge.strategies.registry import STRATEGIES


@STRATEGIES.register
@dataclass
class FullReuse(Pie):
    name = "full-reuse"
    realign: ClassVar[bool] = False
