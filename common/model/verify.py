"""`kvctl model verify`: the runtime against the transformers reference forward on one model.

Users run this before trusting a new model: if the runtime is not exact on it, every
strategy's measured quality would be partly a runtime bug.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from kvedge.common.model.batch import decode_step
from kvedge.common.model.decoding import Decoding, Prompt
from kvedge.common.model.runtime import Runtime

TOLERANCE = 1e-4  # max |Δlogits| in fp32


@dataclass(frozen=True)
class Check:
    name: str
    max_abs_diff: float
    tolerance: float

    @property
    def ok(self) -> bool:
        return self.max_abs_diff <= self.tolerance


def _reference_logits(model, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids[None], position_ids=positions[None]).logits[0].float()


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def verify_runtime(rt: Runtime, n_tokens: int = 96, decode_steps: int = 8, seed: int = 0,
                   tolerance: float = TOLERANCE) -> list[Check]:
    """Max |Δlogits| for: full prefill, segments + realignment + recompute-all, the same with
    fresh text between the segments, partial recompute of a random nested subset over an
    exact cache, and greedy decode steps."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, rt.config.vocab_size, (n_tokens,), generator=gen)
    positions = torch.arange(n_tokens)
    ref = _reference_logits(rt.model, ids, positions)
    checks = []

    full = rt.prefill(ids, logits="all")
    checks.append(Check("full prefill", _diff(full.logits, ref), tolerance))

    cut = [0, n_tokens // 3, 2 * n_tokens // 3, n_tokens]
    parts = [rt.prefill(ids[a:b]) for a, b in zip(cut, cut[1:])]  # each from position 0
    keys = [torch.cat([p.keys[i] for p in parts], 1) for i in range(rt.n_layers)]
    values = [torch.cat([p.values[i] for p in parts], 1) for i in range(rt.n_layers)]
    cache = rt.dense_cache(keys, values, positions)
    out = rt.forward(ids, positions, cache, logits="all")
    checks.append(Check("segments + realign + recompute-all", _diff(out.logits, ref), tolerance))
    checks.append(Check("interleaved: fresh text between segments + recompute-all",
                        _interleaved_diff(rt, ids, ref), tolerance))

    subset = torch.randperm(n_tokens, generator=gen)[: n_tokens // 4]
    subset = torch.unique(torch.cat([subset, torch.tensor([n_tokens - 1])]))
    active, cur = [], subset
    for layer in range(rt.n_layers):  # the set narrows twice: a third, then two thirds deep
        if layer in (rt.n_layers // 3, 2 * rt.n_layers // 3) and layer > 0:
            keep = (torch.rand(cur.numel(), generator=gen) < 0.6) | (cur == n_tokens - 1)
            cur = cur[keep]
        active.append(cur)
    exact = rt.prefill(ids).cache
    out = rt.forward(ids[subset], subset, exact, active, logits="all")
    checks.append(Check(f"partial recompute ({subset.numel()} → {out.positions.numel()} tokens)",
                        _diff(out.logits, ref[out.positions]), tolerance))

    checks.append(Check(f"first token + {decode_steps} greedy decode steps (the served path)",
                        _decode_diff(rt, ids, decode_steps), tolerance))
    checks.append(Check(f"first token + {decode_steps} static decode steps (the CUDA-graph "
                        f"layout)", _decode_diff(rt, ids, decode_steps, static=True), tolerance))
    return checks


def _interleaved_diff(rt: Runtime, ids: torch.Tensor, ref: torch.Tensor) -> float:
    """SparseX Sec. 3–4 layout: [text][doc A][text][doc B][question], the docs prefilled alone
    and cached at their offsets, the texts not cached at all. Recompute-all inserts the fresh
    tokens between the cached ones in the same forward and must equal the joint prefill."""
    n = ids.numel()
    docs = [(n // 8, n // 2), (5 * n // 8, 7 * n // 8)]
    parts = [rt.prefill(ids[a:b]) for a, b in docs]  # each from position 0
    keys = [torch.cat([p.keys[i] for p in parts], 1) for i in range(rt.n_layers)]
    values = [torch.cat([p.values[i] for p in parts], 1) for i in range(rt.n_layers)]
    held = torch.cat([torch.arange(a, b) for a, b in docs])
    cache = rt.dense_cache(keys, values, held, seq_len=n)
    out = rt.forward(ids, torch.arange(n), cache, logits="all")
    return _diff(out.logits, ref)


def _decode_diff(rt: Runtime, ids: torch.Tensor, steps: int, static: bool = False) -> float:
    """Decode greedily the way the edge serves — `Decoding.start` over a prefilled cache, then
    the scheduler's batched `decode_step` (its padded rows included), or (`static`) the
    fixed-buffer step a CUDA graph captures (`kvedge.common.model.static_decode`) — and
    compare each step's logits to transformers decoding the same tokens with its own
    cache."""
    from transformers import DynamicCache

    from kvedge.common.model.static_decode import StaticDecode

    n = ids.numel()
    cache = rt.prefill(ids[:-1], logits="none").cache
    state = Decoding.start(rt, Prompt(cache, ids[-1:], torch.tensor([n - 1])), steps + 1)
    run = StaticDecode(rt, state) if static else None
    hf_cache = DynamicCache(config=rt.config)
    with torch.no_grad():
        hf = rt.model(ids[None], past_key_values=hf_cache, use_cache=True).logits[0, -1]
    worst = _diff(state.logits, hf)
    for step in range(steps):
        token = state.token
        if run is not None:
            run.advance()
        else:
            decode_step(rt, [state])
        with torch.no_grad():
            hf = rt.model(torch.tensor([[token]]), past_key_values=hf_cache, use_cache=True,
                          position_ids=torch.tensor([[n + step]])).logits[0, -1]
        worst = max(worst, _diff(state.logits, hf))
    return worst
