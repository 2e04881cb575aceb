"""Where a reuse strategy's time to first token goes, timed around the edge's own calls.

`EdgeEngine.answer` times the first token as one span: the strategy's `plan` (cache assembly:
every segment's keys rotated to its composed positions, plus whatever the strategy decides
before running) and `generate`'s first step (one `Runtime.forward` over the plan's tokens,
then the first token's pick). This replays that first step call by call — the same plan, the
same forward arguments, the same greedy pick — with a clock between the calls:

- `plan_s`: `strategy.plan(...)`;
- `forward_s`: the forward through every layer (the recompute), split by the plan's own
  per-layer callback into `full_layers_s` (layers that run every token of the run span, A3's
  blocks 0..ℓ) and `sparse_layers_s` (layers that run the chosen tokens and the question);
  `select_s`, inside it, is the strategy's selection (its `observe` hook);
- `first_token_s`: the LM head on the last position and the greedy pick.

`phases_ttft_s` is their sum, to set beside the engine's own first_token_s of the same
question (the two differ by clock noise and by the plan being built twice).
"""
from __future__ import annotations

import time

from kvedge.common.generate import GREEDY


def _timed_observe(observe, spent: list[float]):
    if observe is None:
        return None

    def run(*args):
        start = time.perf_counter()
        observe(*args)
        spent.append(time.perf_counter() - start)
    return run


def _timed_active(active, marks: list[tuple[float, int]]):
    """The plan's per-layer callback, noting when each layer starts and how many tokens
    reach it (a list or None plan is left as it is: no per-layer split then)."""
    if not callable(active):
        return active

    def ask(layer, current):
        at = time.perf_counter()
        keep = active(layer, current)
        marks.append((at, current.numel() if keep is None else len(keep)))
        return keep
    return ask


def ttft_phases(rt, composed, strategy, max_new_tokens: int) -> dict[str, float]:
    """One question's first token, timed by phase (seconds; see the module docstring)."""
    start = time.perf_counter()
    plan = strategy.plan(rt, composed, reserve=max_new_tokens)
    planned = time.perf_counter()
    selecting: list[float] = []
    marks: list[tuple[float, int]] = []
    seq_len = plan.cache.seq_len or int(plan.run_positions[-1]) + 1 + max_new_tokens
    out = rt.forward(plan.run_ids, plan.run_positions, plan.cache,
                     _timed_active(plan.active, marks), logits="none",
                     observe=_timed_observe(plan.observe, selecting), seq_len=seq_len)
    forwarded = time.perf_counter()
    GREEDY.pick(rt._logits(out.hidden, "last")[-1])  # as forward(logits="last") would
    done = time.perf_counter()
    phases = {"plan_s": planned - start, "forward_s": forwarded - planned,
              "select_s": sum(selecting), "first_token_s": done - forwarded,
              "phases_ttft_s": done - start}
    return {**phases, **_layer_split(marks, plan.run_ids.numel(), forwarded)}


def _layer_split(marks: list[tuple[float, int]], n_run: int, end: float) -> dict[str, float]:
    """Seconds in layers that ran the whole run span vs. a subset (from each layer's start,
    `marks`: (time, tokens run); the final norm counts with the last layer)."""
    if not marks:
        return {}
    starts = [at for at, _ in marks] + [end]
    full = sum(starts[i + 1] - starts[i] for i, (_, n) in enumerate(marks) if n >= n_run)
    return {"full_layers_s": full, "sparse_layers_s": end - starts[0] - full}
