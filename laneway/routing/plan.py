"""A request's routing plan, as data: its pool, its endpoints best first, and why.

Made by two pure functions, each once per request. `lanes.classify` chooses the pool (and
fixes the prefill estimate) before the request joins that pool's line, since the line is
per pool; `make_plan` ranks the pool's endpoints once the request holds a slot, by the load
of that moment. The shell then executes the plan: it tries the endpoints in order and
recomputes nothing. The gateway, the virtual-time runner and the benchmarks all call these.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from laneway.api import InferencePool, Lane
from laneway.routing.lanes import Route
from laneway.routing.picker import WeightedScorer, rank
from laneway.routing.scorers import EndpointView
from laneway.routing.slo import PRIOR, PrefillRate


# Slotted, not frozen: one is built per endpoint per request, and a frozen dataclass's
# __init__ costs several times more. Nothing assigns to one after it is built.
@dataclass(slots=True)
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
    rates = _with_peer_rates(endpoints, rates)
    slo_ms = route.pool.spec.slo.ttft_millis
    # Built by position in one pass: `dataclasses.replace` per endpoint and a dict per
    # quantity cost more than the ranking itself.
    views = []
    planned = []  # by position: backlog, prediction, own prefill
    for e in endpoints:
        # What the prefix cache likely holds of this prompt needs no prefill there.
        own = route.prefill_tokens - (e.cached_prompt_tokens or 0)
        backlog = e.prefill_tokens + own
        predicted = elapsed_ms + rates[e.url].predict_ttft_ms(backlog)
        planned.append((backlog, predicted, own))
        views.append(
            EndpointView(
                e.url,
                e.in_flight,
                e.prefill_tokens,
                e.engine,
                predicted,
                slo_ms,
                e.cached_prompt_tokens,
                e.session_key,
                backlog,
            )
        )
    order, scores = rank(views, profile, rng)
    return RoutingPlan(
        route, tuple(PlannedEndpoint(views[i].url, scores[i], *planned[i]) for i in order)
    )


def _with_peer_rates(
    endpoints: Sequence[EndpointView], rates: Mapping[str, PrefillRate]
) -> dict[str, PrefillRate]:
    """Each endpoint's rate; one that has learned nothing yet gets its pool peers' mean.

    The prior is deliberately slow, so an unproven replica predicts a late first token and
    the ttftSlo scorer steers work away from it, which is also what keeps it unproven: in a
    pool of two document replicas the first one used kept every new document. A replica of
    the same pool runs the same engine on the same GPU, so its peers' rate is the better guess.
    """
    learned = [rate for e in endpoints if (rate := rates.get(e.url)) and rate.samples]
    if not learned:
        return {e.url: rates.get(e.url, PRIOR) for e in endpoints}
    peers = PrefillRate(sum(r.ms_per_token for r in learned) / len(learned), samples=0)
    return {
        e.url: rate if (rate := rates.get(e.url)) and rate.samples else peers for e in endpoints
    }
