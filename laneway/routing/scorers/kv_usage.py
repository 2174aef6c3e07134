"""Prefer the engine with the most free KV cache (scraped): score = 1 - usage."""

from __future__ import annotations

from collections.abc import Sequence

from laneway.routing.scorers.base import UNKNOWN, EndpointView


class KVUsageScorer:
    def score(self, endpoints: Sequence[EndpointView]) -> list[float]:
        # Absolute, not relative: two engines at 0.2 and 0.3 are both fine.
        return [1.0 - e.engine.kv_usage if e.engine else UNKNOWN for e in endpoints]
