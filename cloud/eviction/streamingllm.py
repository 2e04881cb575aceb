"""`streamingllm`: StreamingLLM (Xiao et al. 2024): the attention sinks and the most recent tokens."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from kvedge.cloud.eviction.base import EvictionMethod
from kvedge.cloud.eviction.registry import METHODS


@METHODS.register
@dataclass
class StreamingLLM(EvictionMethod):
    name = "streamingllm"
    adaptive: ClassVar[bool] = False

    def score(self, rt, ctx):
        recency = torch.arange(ctx.n_tokens, dtype=torch.float32)  # later = kept first
        return [recency.expand(rt.n_kv, -1).clone() for _ in range(rt.n_layers)]
