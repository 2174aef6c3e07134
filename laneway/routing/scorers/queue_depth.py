"""Prefer the engine with the fewest requests waiting in its own queue (scraped)."""

from __future__ import annotations

from collections.abc import Sequence

from laneway.routing.scorers.base import EndpointView, lower_is_better


class QueueDepthScorer:
    def score(self, endpoints: Sequence[EndpointView]) -> list[float]:
        return lower_is_better([e.engine.waiting if e.engine else None for e in endpoints])
