"""Edge tier: the `kvedge serve` daemon, pack cache, retrieval, reuse strategies, decoding."""

# Used when a request names none (kept here, torch-free, for the CLI). EPIC: ≥ 0.93 of
# recompute's answers at 6-12x lower TTFT in the edge's order (docs/reuse.md, "Headline").
DEFAULT_STRATEGY = "epic"

# bytes of conversation-prefix KV an edge keeps (edge.sessions; ~5.7K SmolLM2 tokens in fp32)
DEFAULT_SESSION_BYTES = 256 * 2**20
