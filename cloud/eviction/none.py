"""`none`: keeps every KV pair — a batch job that only re-encodes a KB with another codec.

The budget is ignored (a variant's name still records it); the context comes back whole."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.cloud.eviction.base import EvictionMethod
from kvedge.cloud.eviction.registry import METHODS


@METHODS.register
@dataclass
class NoEviction(EvictionMethod):
    name = "none"

    def score(self, rt, ctx):
        return [torch.zeros(len(heads), ctx.n_tokens) for heads in ctx.kept_positions]

    def keep(self, scores, ctx):
        return [list(layer) for layer in ctx.kept_positions]
