"""A request's routing plan, as data: its pool, its endpoints best first, and why.

Made in two steps, each once per request. `lanes.classify` chooses the pool (and fixes the
prefill estimate) before the request joins that pool's line, since the line is per pool;
`plan_cycle` ranks the cycle's candidates (`cycle.py`: the pool's endpoints that pass the
filters, with the data the scorers asked for) once the request holds a slot, by the load of
that moment. The shell then executes the plan: it tries the endpoints in order and
recomputes nothing. The ledger makes every plan, for the gateway and the virtual runner.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from laneway.api import InferencePool, Lane
from laneway.routing.cycle import BACKLOG_TOKENS, OWN_PREFILL, PREDICTED_TTFT_MS, CycleState
from laneway.routing.lanes import Route
from laneway.routing.picker import WeightedScorer, rank


@dataclass(frozen=True, slots=True)
class PlannedEndpoint:
    url: str
    score: float  # the profile's weighted mean, in [0, 1]
    # Prompt tokens the endpoint works through before this request's first token, its own
    # included: what the TTFT prediction is made from, and what the first token teaches.
    backlog_tokens: int
    predicted_ttft_ms: float  # counted from the request's arrival
    # Of this prompt, the tokens the endpoint computes (those its prefix cache is not
    # estimated to hold): what the request adds to its prefill backlog until the first token.
    prefill_tokens: int


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


def plan_cycle(
    cycle: CycleState, profile: Sequence[WeightedScorer], rng: random.Random
) -> RoutingPlan:
    """Rank the cycle's candidates for its request's route."""
    order, scores = rank(cycle, profile, rng)
    backlog, predicted, own = cycle[BACKLOG_TOKENS], cycle[PREDICTED_TTFT_MS], cycle[OWN_PREFILL]
    endpoints = tuple(
        PlannedEndpoint(
            url=cycle.urls[i],
            score=scores[i],
            backlog_tokens=backlog[i],
            predicted_ttft_ms=predicted[i],
            prefill_tokens=own[i],
        )
        for i in order
    )
    return RoutingPlan(route=cycle.request.route, endpoints=endpoints)
