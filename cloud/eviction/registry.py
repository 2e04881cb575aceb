"""The one registry of eviction methods: batch jobs, the CLI and the benchmark read it."""
from __future__ import annotations

from kvedge.common.errors import UnknownMethod
from kvedge.common.registry import Registry

METHODS: Registry = Registry("eviction method", UnknownMethod)
