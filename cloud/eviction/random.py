"""`random`: a seeded uniform-random choice per head — the floor every method must beat."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvedge.cloud.eviction.base import EvictionMethod
from kvedge.cloud.eviction.registry import METHODS
from kvedge.common.registry import option


@METHODS.register
@dataclass
class RandomEviction(EvictionMethod):
    seed: int = option(0, help="seed of the choice")

    name = "random"
    adaptive: ClassVar[bool] = False

    def score(self, rt, ctx):
        gen = torch.Generator().manual_seed(self.seed)
        return [torch.rand(rt.n_kv, ctx.n_tokens, generator=gen) for _ in range(rt.n_layers)]
