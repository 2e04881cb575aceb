"""Edge tier: the `kvedge serve` daemon, pack cache, retrieval, reuse strategies, decoding."""

# The reuse strategy when a request names none (kept here, torch-free, for the CLI). Chosen by
# measurement (docs/reuse.md, issue 11 §3-4), SmolLM2, segments prefilled alone, 100 paired
# questions per run: in the edge's own order (retrieved, best segment last) EPIC (first 16
# tokens of each segment recomputed) answered 86 of recompute's 86 at 6.3x lower TTFT on 3
# documents — the only default meeting the 3-document target — and 77 of 83 at 12x on
# 8 documents (legolink: 87 at 4.3x, 79 at 6.4x). Over those runs and the given order (answer
# anywhere; epic 49, legolink 53 of recompute's 68) legolink answered 13 questions epic did
# not and epic 6 legolink did not (exact McNemar p = 0.17, 300 questions) at 1.5-1.9x epic's
# TTFT. Both beat a3@0.15 (legolink vs a3: 12 against 1, p = 0.003); `legolink` stays
# selectable for who would trade that speed for the ~2 % of answers it may keep.
DEFAULT_STRATEGY = "epic"
