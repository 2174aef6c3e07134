"""A request's routing plan, as data: its pool, its endpoints best first, and why.

Made by two pure functions, each once per request. `lanes.classify` chooses the pool (and
fixes the prefill estimate) before the request joins that pool's line, since the line is
per pool; `make_plan` ranks the pool's endpoints once the request holds a slot, by the load
of that moment. The shell then executes the plan: it tries the endpoints in order and
recomputes nothing. The gateway, the virtual-time runner and the benchmarks all call these.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from laneway.api import InferencePool, Lane
from laneway.routing.lanes import Route
from laneway.routing.picker import WeightedScorer, rank
from laneway.routing.scorers import EndpointView
from laneway.routing.slo import PrefillRate


@dataclass(frozen=True)
class PlannedEndpoint:
    url: str
    score: float  # the profile's weighted mean, in [0, 1]
    # Prompt tokens the endpoint works through before this request's first token, its own
    # included: what the TTFT prediction is made from, and what the first token teaches.
    backlog_tokens: int
    predicted_ttft_ms: float  # counted from the request's arrival


@dataclass(frozen=True)
class RoutingPlan:
    route: Route
    endpoints: tuple[PlannedEndpoint, ...]  # best first; empty when none is available

    @property
    def pool(self) -> InferencePool:
        return self.route.pool

    @property
    def lane(self) -> Lane:
        return self.route.lane

    @property
    def prefill_tokens(self) -> int:
        return self.route.prefill_tokens

    @property
    def reason(self) -> str:
        return self.route.reason


def make_plan(
    route: Route,
    endpoints: Sequence[EndpointView],
    rates: Mapping[str, PrefillRate],
    profile: Sequence[WeightedScorer],
    rng: random.Random,
    elapsed_ms: float = 0.0,
) -> RoutingPlan:
    """Rank `endpoints` (the pool's available ones, with their load) for `route`'s request.

    `rates` holds each endpoint's learned prefill rate (the prior where absent);
    `elapsed_ms` is how long the request has been in the gateway already (its wait in line).
    """
    # What the prefix cache likely holds of this prompt needs no prefill there.
    backlogs = {
        e.url: e.prefill_tokens + route.prefill_tokens - (e.cached_prompt_tokens or 0)
        for e in endpoints
    }
    predicted = {
        e.url: elapsed_ms + rates.get(e.url, PrefillRate()).predict_ttft_ms(backlogs[e.url])
        for e in endpoints
    }
    slo_ms = route.pool.spec.slo.ttft_millis
    views = [
        dataclasses.replace(e, predicted_ttft_ms=predicted[e.url], ttft_slo_ms=slo_ms)
        for e in endpoints
    ]
    ranked = rank(views, profile, rng)
    return RoutingPlan(
        route,
        tuple(PlannedEndpoint(r.url, r.score, backlogs[r.url], predicted[r.url]) for r in ranked),
    )
