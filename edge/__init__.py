"""Edge tier: the `kvedge serve` daemon, pack cache, retrieval, reuse strategies, decoding."""
