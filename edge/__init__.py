"""Edge tier: the `kvedge serve` daemon, pack cache, retrieval, reuse strategies, decoding."""

# Used when a request names none (kept here, torch-free, for the CLI). EPIC: ≥ 0.93 of
# recompute's answers at 6-12x lower TTFT in the edge's order (docs/reuse.md, "Headline").
DEFAULT_STRATEGY = "epic"
