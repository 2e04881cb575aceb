"""A shared-context knowledge base asked several follow-up questions, SCBench-style
(Li et al., 2024, "SCBench: A KV Cache-Centric Analysis of Long-Context Methods", Sec. 3).

SCBench's point is that one cached context serves many queries; so one context here holds
three sections, each a share of the length, and the item asks `questions` questions of mixed
kinds, all against that same context:
- `kv`: a JSON record of word keys and 7-digit values; "what is the value of key K?"
  (SCBench's Retr.KV, whose UUIDs are too long for a 135M model to copy);
- `prefix_suffix`: a list of random strings made in groups of four that share prefixes and
  suffixes crosswise, so both ends are needed; "which string starts with P and ends with
  S?" (Retr.Prefix-Suffix);
- `multi_hop`: lines "a -> b" between word nodes, forming disjoint chains of `hops` links,
  shuffled; "start at A, follow the links `hops` times: where do you end?" (multi-hop
  tracing, as in Retr.MultiHop).
"""
from __future__ import annotations

import random
from typing import Callable, Iterator

from .item import Item, Question, single_context
from .length import TokenCounter, estimate_tokens, fill, fit_length
from .values import Uniques, make_rng

FAMILY = "knowledge_base"
KINDS = ("kv", "prefix_suffix", "multi_hop")
WEIGHTS = {"kv": 0.4, "prefix_suffix": 0.3, "multi_hop": 0.3}
HEADERS = {"kv": "Record:", "prefix_suffix": "Strings:", "multi_hop": "Links:"}
PARTS = {"kv": "a record of keys and values", "prefix_suffix": "a list of strings",
         "multi_hop": "a list of links between nodes"}
AFFIX = 4  # prefix and suffix length asked for


def _filled(make: Callable[[], tuple[list[str], object]], budget: float,
            count_tokens: TokenCounter) -> tuple[list[str], list]:
    """Fill a budget with blocks from `make()` -> (lines, entry); returns lines and entries."""
    entries: list = []

    def blocks() -> Iterator[str]:
        while True:
            lines, entry = make()
            entries.append(entry)
            yield "".join(lines)
    pieces, _ = fill(blocks(), budget, count_tokens)
    return [line for p in pieces for line in p.splitlines(keepends=True)], entries[:len(pieces)]


def _record(u: Uniques, rng: random.Random, budget: float, count_tokens: TokenCounter):
    def make():
        key, value = u.key(), u.number(7)
        return [f'  "{key}": "{value}",\n'], (key, value)
    lines, entries = _filled(make, budget, count_tokens)
    body = "".join(lines).rstrip(",\n")
    questions = [Question(f'In the record, what is the value of the key "{k}"?', [v], "kv",
                          "Answer with the value only.") for k, v in entries]
    return "{\n" + body + "\n}", questions


def _strings(u: Uniques, rng: random.Random, budget: float, count_tokens: TokenCounter):
    """Strings in squares: (P1..S1), (P1..S2), (P2..S1), (P2..S2). Each shares its prefix with
    one string and its suffix with another, so only both ends single it out."""
    alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

    def random_text(n: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(n))

    def make():
        p1, p2, s1, s2 = (u.draw(lambda: random_text(AFFIX)) for _ in range(4))
        square = [u.draw(lambda: p + random_text(16 - 2 * AFFIX) + s)
                  for p, s in ((p1, s1), (p1, s2), (p2, s1), (p2, s2))]
        return [x + "\n" for x in square], square
    lines, squares = _filled(make, budget, count_tokens)
    rng.shuffle(lines)
    questions = [Question(f'Which string in the list starts with "{x[:AFFIX]}" and ends with '
                          f'"{x[-AFFIX:]}"?', [x], "prefix_suffix",
                          "Answer with the string only.") for square in squares for x in square]
    return "".join(lines).rstrip("\n"), questions


def _links(hops: int):
    def section(u: Uniques, rng: random.Random, budget: float, count_tokens: TokenCounter):
        def make():
            nodes = [u.key() for _ in range(hops + 1)]
            return [f"{a} -> {b}\n" for a, b in zip(nodes, nodes[1:])], nodes
        lines, chains = _filled(make, budget, count_tokens)
        rng.shuffle(lines)
        questions = [Question(f'Start at "{c[0]}" and follow the links {hops} times. Which '
                              f'node do you reach?', [c[-1]], "multi_hop",
                              "Answer with the node only.") for c in chains]
        return "".join(lines).rstrip("\n"), questions
    return section


def knowledge_base(length: int = 4096, seed: int = 0, *, questions: int = 6,
                   kinds: tuple[str, ...] | list[str] = KINDS, hops: int = 2,
                   count_tokens: TokenCounter = estimate_tokens) -> Item:
    """One context of about `length` tokens with a section per kind in `kinds`, asked
    `questions` questions cycling through the kinds (each about a different entry)."""
    kinds = tuple(kinds)
    if not kinds or any(k not in KINDS for k in kinds):
        raise ValueError(f"kinds must be a non-empty subset of {KINDS}, not {kinds}")
    if questions < 1 or hops < 1:
        raise ValueError("need questions >= 1 and hops >= 1")
    params = dict(questions=questions, kinds=list(kinds), hops=hops)
    sections = {"kv": _record, "prefix_suffix": _strings, "multi_hop": _links(hops)}

    def build(budget: float) -> Item:
        u = Uniques(make_rng(FAMILY, seed, "values"))
        intro = "The knowledge base below has " + _listing([PARTS[k] for k in kinds]) + "."
        rest = budget - count_tokens(intro) - sum(count_tokens(HEADERS[k]) for k in kinds)
        share = sum(WEIGHTS[k] for k in kinds)
        texts, pools = [intro], {}
        for kind in kinds:
            rng = make_rng(FAMILY, seed, kind)
            text, pools[kind] = sections[kind](u, rng, rest * WEIGHTS[kind] / share,
                                               count_tokens)
            texts.append(f"{HEADERS[kind]}\n{text}")
        asked = _pick(pools, [kinds[i % len(kinds)] for i in range(questions)],
                      make_rng(FAMILY, seed, "questions"), length)
        return single_context(FAMILY, seed, length, "\n\n".join(texts), asked, params=params)

    return fit_length(build, length, count_tokens)


def _pick(pools: dict[str, list[Question]], kinds: list[str], rng: random.Random,
          length: int) -> list[Question]:
    distinct = list(dict.fromkeys(kinds))  # ordered: a set's order varies between processes
    chosen = {k: rng.sample(range(len(pools[k])), min(kinds.count(k), len(pools[k])))
              for k in distinct}
    for k in distinct:
        if len(chosen[k]) < kinds.count(k):
            raise ValueError(f"a {length}-token knowledge base holds only {len(pools[k])} "
                             f"{k} entries for {kinds.count(k)} questions: ask for more tokens "
                             f"or fewer questions")
    taken = {k: iter(chosen[k]) for k in chosen}
    return [pools[k][next(taken[k])] for k in kinds]


def _listing(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
