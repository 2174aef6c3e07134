"""Prefer the engine with the most free KV cache (scraped): score = 1 - usage."""

from __future__ import annotations

from laneway.routing.cycle import ENGINE, CycleState
from laneway.routing.scorers.base import UNKNOWN, Scorer


class KVUsageScorer(Scorer):
    needs = frozenset({ENGINE})

    def scores(self, cycle: CycleState) -> list[float]:
        # Absolute, not relative: two engines at 0.2 and 0.3 are both fine.
        return [1.0 - engine.kv_usage if engine else UNKNOWN for engine in cycle[ENGINE]]
