"""What both tiers share: model registry, the exact transformer runtime, RoPE math, errors."""
