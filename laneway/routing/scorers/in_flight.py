"""Prefer the endpoint with the fewest requests this gateway has in flight on it."""

from __future__ import annotations

from collections.abc import Sequence

from laneway.routing.scorers.base import EndpointView, lower_is_better


class InFlightScorer:
    def score(self, endpoints: Sequence[EndpointView]) -> list[float]:
        return lower_is_better([e.in_flight for e in endpoints])
