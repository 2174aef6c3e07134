"""Prefer the engine with the fewest requests waiting in its own queue (scraped)."""

from __future__ import annotations

from laneway.routing.cycle import ENGINE, CycleState
from laneway.routing.scorers.base import Scorer, lower_is_better


class QueueDepthScorer(Scorer):
    needs = frozenset({ENGINE})

    def scores(self, cycle: CycleState) -> list[float]:
        return lower_is_better([engine.waiting if engine else None for engine in cycle[ENGINE]])
