"""InferencePools for gateway tests: a simulator engine, an interactive lane, given endpoints."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from laneway.api import API_VERSION, KIND, InferencePool, parse_pool


def simulated_pool(name: str, endpoints: Sequence[str], **spec: Any) -> InferencePool:
    """Pool `name` serving model `name` unless `spec` overrides it (or any other spec field)."""
    return parse_pool(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": name},
            "spec": {"lane": "interactive", "model": name, "engine": {"kind": "simulator"}, **spec},
            "status": {"endpoints": list(endpoints)},
        }
    )
