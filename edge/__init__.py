"""Edge tier: the `kvedge serve` daemon, pack cache, retrieval, reuse strategies, decoding."""

# The reuse strategy when a request names none (kept here, torch-free, for the CLI). Chosen by
# measurement (docs/reuse.md, issue 11 §3-4): on the reuse suite's 100 questions (3 fact
# documents, segments prefilled alone, SmolLM2) legolink answered 35 against a3@0.15's 24 —
# 12 questions only legolink got, 1 only a3 (exact McNemar p = 0.003) — at 0.17 of
# recompute's median TTFT against a3's 0.23; the issue's 48-question KB run agreed (39 against
# 32). Recomputing each segment's ends repairs what prefilling it alone broke (its first tokens
# became an attention sink); question-attention selection does not pick those tokens.
DEFAULT_STRATEGY = "legolink"
