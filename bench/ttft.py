"""Where a reuse strategy's time to first token goes, timed around the edge's own calls.

The edge runs a plan to its first token with `Decoding.start` (the strategy's `plan`: cache
assembly, every segment's keys rotated to its composed positions, plus whatever the strategy
decides before running; then one `Runtime.forward` over the plan's tokens, the first token's
pick and the plan's `after_first` step). This runs that same call on the same plan, with
clocks in wrappers around the plan's own per-layer hooks — nothing is re-implemented:

- `plan_s`: `strategy.plan(...)` and the cache's assembly to its last layer (every segment's
  layers realigned: the edge's loader builds them on a thread while the forward runs, so
  without the wait its time would hide in the forward's stalls);
- `forward_s`: `Decoding.start` — the forward through every layer (the recompute), the LM
  head, the first token's pick and `after_first` (A3's SnapKV eviction) — split by layer into
  `full_layers_s` (layers that run every token after the chat prefix — A3's blocks 0..ℓ, all
  of recompute's) and `sparse_layers_s` (layers that run a subset: the chosen tokens and the
  fresh ones — A3 from ℓ+1 on, every layer of a static plan such as legolink's), the last
  layer's span running to the end of the call; `select_s`, inside it, is the strategy's
  selection (its `observe` hook; absent for a plan with none: a static plan's selection is
  position arithmetic inside `plan_s`).

`phases_ttft_s` is their sum, to set beside the engine's own first_token_s of the same
question (the two differ by clock noise, by the plan being built twice, and by the loader's
overlap with the forward, which the split gives up to time assembly on its own).
"""
from __future__ import annotations

import time

from dataclasses import replace

from kvedge.common.model.decoding import Decoding


def _timed_observe(observe, spent: list[float]):
    if observe is None:
        return None

    def run(*args):
        start = time.perf_counter()
        observe(*args)
        spent.append(time.perf_counter() - start)
    return run


def _timed_active(active, marks: list[tuple[float, int]]):
    """The plan's per-layer plan (None, a list or a callable) as a callable noting when each
    layer starts and how many tokens reach it."""
    def ask(layer, current):
        at = time.perf_counter()
        keep = active(layer, current) if callable(active) else (
            None if active is None else active[layer])
        marks.append((at, current.numel() if keep is None else len(keep)))
        return keep
    return ask


def ttft_phases(rt, composed, strategy, max_new_tokens: int) -> dict[str, float]:
    """One question's first token, timed by phase (seconds; see the module docstring)."""
    start = time.perf_counter()
    plan = strategy.plan(rt, composed, reserve=max_new_tokens)
    if hasattr(plan.cache, "wait"):
        plan.cache.wait()  # the loader's layers, all built: assembly is timed in plan_s
    planned = time.perf_counter()
    selecting: list[float] = []
    marks: list[tuple[float, int]] = []
    timed = replace(plan, active=_timed_active(plan.active, marks),
                    observe=_timed_observe(plan.observe, selecting))
    Decoding.start(rt, timed, max_new_tokens)
    done = time.perf_counter()
    phases = {"plan_s": planned - start, "forward_s": done - planned, "phases_ttft_s": done - start}
    if plan.observe is not None:
        phases["select_s"] = sum(selecting)
    after_prefix = composed.seq_len() - composed.n_prefix  # every token but the chat prefix
    return {**phases, **_layer_split(marks, after_prefix, done)}


def _layer_split(marks: list[tuple[float, int]], n_all: int, end: float) -> dict[str, float]:
    """Seconds in layers that ran all `n_all` tokens vs. a subset (from each layer's start,
    `marks`: (time, tokens run); what follows the last layer — the final norm, the LM head, the
    pick and `after_first` — counts with it)."""
    if not marks:
        return {}
    starts = [at for at, _ in marks] + [end]
    spans = [(starts[i + 1] - starts[i], n >= n_all) for i, (_, n) in enumerate(marks)]
    return {"full_layers_s": sum(s for s, full in spans if full),
            "sparse_layers_s": sum(s for s, full in spans if not full)}
