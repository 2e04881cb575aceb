"""Variable tracking: RULER's multi-hop tracing task (Hsieh et al., 2024, "RULER", Sec. 3.2).

Chains of assignments are scattered through a haystack in order: "VAR QWXYZ = 12345." then
"VAR ABCDE = VAR QWXYZ." and so on for `hops` links. The question gives the first chain's
value; the answer is every variable that ends up holding it. Further chains (`chains > 1`)
hold other values and act as distractors.
"""
from __future__ import annotations

from . import haystack as hay
from .item import Item, Question, single_context
from .length import TokenCounter, estimate_tokens, fit_length
from .values import Uniques, make_rng

FAMILY = "variable_tracking"
INTRO = "Memorize and track the chain(s) of variable assignment hidden in the following text."


def chain(names: list[str], value: str) -> list[str]:
    """The assignments of one chain, in the order they must appear."""
    return [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in
                                             zip(names, names[1:])]


def variable_tracking(length: int = 2048, seed: int = 0, *, chains: int = 1, hops: int = 4,
                      haystack: str = "noise",
                      count_tokens: TokenCounter = estimate_tokens) -> Item:
    """A haystack of about `length` tokens holding `chains` chains of `hops` assignments after
    the first; asks which variables hold the first chain's value (all of them must be named)."""
    if chains < 1 or hops < 1:
        raise ValueError("need chains >= 1 and hops >= 1")
    params = dict(chains=chains, hops=hops, haystack=haystack)

    def build(budget: float) -> Item:
        u = Uniques(make_rng(FAMILY, seed, "chains"))
        avoid = hay.vocabulary(haystack) + " " + INTRO
        named = [([u.var_name(avoid) for _ in range(hops + 1)], u.number(5))
                 for _ in range(chains)]
        statements = [[s + " " for s in chain(names, value)] for names, value in named]
        rest = budget - count_tokens(INTRO) - sum(count_tokens(s) for c in statements for s in c)
        pieces, counts = hay.haystack(haystack, make_rng(FAMILY, seed, "haystack"), rest,
                                      count_tokens)
        rng = make_rng(FAMILY, seed, "depths")
        placements = [(d, s) for c in statements
                      for d, s in zip(sorted(rng.random() for _ in c), c)]
        merged, achieved = hay.insert_at_depths(pieces, counts, placements)
        names, value = named[0]
        question = Question(f"Find all variables that are assigned the value {value} in the "
                            f"text above.", list(names), "variable_tracking",
                            "Answer with the variable names only, separated by commas.")
        return single_context(FAMILY, seed, length, INTRO + "\n\n" + hay.join(merged),
                              [question], params=params,
                              depths=[round(d, 4) for d in achieved[:hops + 1]])

    return fit_length(build, length, count_tokens)
