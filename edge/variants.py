"""Which variant of a KB to fetch a missing segment's pack from (issue 26, 3).

A KB's variants (`kvctl job submit`: the same segments re-compressed with another codec or
evicted) hold the same segment in packs of other sizes. An edge told it may use a variant in
place of the KB it serves (`kvedge serve --kb KB --alternate KB@VARIANT`: the operator accepts
that variant's answers) fetches, for each segment whose pack is missing, the pack that
arrives soonest by its link meter, counted as the meter predicts a transfer, RTT + bytes /
throughput (`edge.meters.LinkMeter`). Decisions, and why:

- **The KB's own pack unless an alternate is at least ALT_SAVING_S sooner.** A lossy variant
  is the operator's fallback, not a preference. On a LAN the variants differ by milliseconds,
  so the KB's own pack is fetched; at 10 Mbit/s a SmolLM2 int8 pack (~3 MB) and its int4
  variant (~1.6 MB) differ by ~1 s, so the variant is. A quarter second is about what a warm
  answer's start costs on a 2-core edge: below that a user's wait barely changes.
- **Cached first.** A segment whose pack, of any of these variants, is cached costs nothing
  and is taken, the KB's own first. So a segment fetched once as a variant answers from it
  until evicted.
- **Unknown link: the KB's own pack**, as fetch-or-compute fetches when unsure.
- **The same segment only.** An alternate's entry stands in only where its index holds the
  same text with the same token count.

What this chose is in each answer's stats (`AskResult.variants`).
"""
from __future__ import annotations

from typing import Callable

ALT_SAVING_S = 0.25  # an alternate's pack is fetched instead when it arrives this much sooner


def same_segment(meta: dict, other: dict) -> bool:
    return other["text"] == meta["text"] and other["n_tokens"] == meta["n_tokens"]


def choose(meta: dict, alternates: list[dict], cached: Callable[[str], bool],
           seconds: Callable[[int], float | None]) -> dict:
    """`meta` (the KB's own entry for a segment) or one of `alternates` (the same segment's
    entries in the variants allowed, each marked with its "variant"), by the rules above."""
    options = [meta] + [a for a in alternates if same_segment(meta, a)]
    for option in options:
        if cached(option["pack_id"]):
            return option
    own = seconds(meta["pack_bytes"])
    if own is None or len(options) == 1:
        return meta
    best = min(options[1:], key=lambda a: a["pack_bytes"])
    return best if own - seconds(best["pack_bytes"]) >= ALT_SAVING_S else meta
