"""Cloud tier: gateway, Ray prefill workers, eviction methods, batch compression jobs."""
