"""`snapkv`: SnapKV (Li et al. 2024) made query-agnostic with a generic proxy question.

The proxy (a chat-wrapped, task-agnostic question) is appended after the context; its tokens
are the observation window. Each context key's vote is the attention it receives summed over
the window's queries and the grouped heads, smoothed by max-pooling over neighbouring tokens
(kernel 7, as SnapKV clusters: `kvedge.common.model.snapkv`, shared with A3's eviction at the
edge), and every head keeps the same number of pairs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from kvedge.cloud.eviction.base import EvictionMethod
from kvedge.cloud.eviction.registry import METHODS
from kvedge.cloud.eviction.scoring import context_cache, probe_scores
from kvedge.common.registry import option
from kvedge.common.model.snapkv import KERNEL, cluster

PROXY = "What are the key facts in the text above? Answer the question about them."


@METHODS.register
@dataclass
class SnapKV(EvictionMethod):
    kernel: int = option(KERNEL, 1, None, "odd width of the max-pooling over neighbouring tokens")
    proxy: str = option(PROXY, help="the generic question whose tokens vote")

    name = "snapkv"
    adaptive: ClassVar[bool] = False

    def score(self, rt, ctx):
        ids = rt.loaded.tokenizer.apply_chat_template(
            [{"role": "user", "content": self.proxy}], add_generation_prompt=True,
            return_dict=False)
        votes = probe_scores(rt, context_cache(rt, ctx), ctx.n_tokens, list(ids), reduce="sum",
                             window=len(ids))
        return [cluster(v, self.kernel) for v in votes]
