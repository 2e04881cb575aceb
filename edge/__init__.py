"""Edge tier: the `kvedge serve` daemon, pack cache, retrieval, reuse strategies, decoding."""

# Used when a request names none (kept here, torch-free, for the CLI). LegoLink (first and
# last 20 tokens of every segment), chosen on real questions (docs/results.md, hotpot-fixed):
# on 100 HotpotQA questions epic lost F1 to recompute beyond chance on both models (Qwen2.5-0.5B
# -0.084 [-0.16, -0.01]; SmolLM2 -0.029 [-0.06, -0.00]) and legolink did not; legolink beat epic
# by +0.059 F1 [+0.020, +0.106] on Qwen, at 0.37 of recompute's TTFT against epic's 0.20.
# At 300 Qwen questions (hotpot-fixed and hotpot-kb) no strategy is ahead of it on any metric,
# and samkv and full-reuse fall behind it beyond chance on both suites.
DEFAULT_STRATEGY = "legolink"

# bytes of conversation-prefix KV an edge keeps (edge.sessions; ~5.7K SmolLM2 tokens in fp32)
DEFAULT_SESSION_BYTES = 256 * 2**20
