"""Prefer the endpoint with the fewest requests this gateway has in flight on it."""

from __future__ import annotations

from collections.abc import Sequence

from laneway.routing.cycle import IN_FLIGHT, CycleState
from laneway.routing.scorers.base import Scorer, lower_is_better


class InFlightScorer(Scorer):
    needs = frozenset({IN_FLIGHT})

    def scores(self, cycle: CycleState) -> list[float]:
        counts: Sequence[int] = cycle[IN_FLIGHT]
        return lower_is_better(counts)
