"""The one registry of reuse strategies: the CLI, the Ask service and the benchmark read it."""
from __future__ import annotations

from kvedge.common.errors import UnknownStrategy
from kvedge.common.registry import Registry

STRATEGIES: Registry = Registry("strategy", UnknownStrategy)
