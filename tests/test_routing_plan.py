"""The routing plan: one pure function ranks a pool's endpoints and predicts each TTFT."""

from __future__ import annotations

import random

import pytest
from support.pools import simulated_pool

from laneway.api import Lane
from laneway.routing.admission import AdmissionLine
from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.lanes import Route, RouteRequest, classify, prefill_estimate
from laneway.routing.picker import PickingSettings, scorers_from_weights
from laneway.routing.plan import make_plan
from laneway.routing.scorers import EndpointView
from laneway.routing.slo import PRIOR_MS_PER_TOKEN, PrefillRate
from laneway.tokens import TokenBounds

POOL = simulated_pool(
    "chat",
    ["http://a", "http://b"],
    model="m",
    routing={"models": ["llama"]},
    slo={"ttftMillis": 200},
)


def route(tokens: TokenBounds) -> Route:
    decision = classify(RouteRequest("llama", tokens, 10), [POOL])
    assert isinstance(decision, Route)
    return decision


@pytest.mark.parametrize(
    ("bounds", "estimate"),
    [
        (TokenBounds(700, 700), 700),  # exact: the count itself
        (TokenBounds(100, 4000), 1000),  # about four bytes a token, within the bounds
        (TokenBounds(3000, 4000), 3000),  # never under the lower bound
    ],
)
def test_the_prefill_estimate_is_made_once_at_classification(
    bounds: TokenBounds, estimate: int
) -> None:
    assert prefill_estimate(bounds) == estimate
    assert route(bounds).prefill_tokens == estimate


def test_the_plan_predicts_each_ttft_from_the_backlog_and_the_learned_rate() -> None:
    views = [
        EndpointView(url="http://a", in_flight=1, prefill_tokens=3000, engine=None),
        EndpointView(url="http://b", in_flight=0, prefill_tokens=0, engine=None),
    ]
    rates = {"http://a": PrefillRate(ms_per_token=0.05, samples=3)}
    plan = make_plan(route(TokenBounds(1000, 1000)), views, rates, (), random.Random(0), 40.0)
    by_url = {e.url: e for e in plan.endpoints}
    assert by_url["http://a"].backlog_tokens == 4000
    assert by_url["http://a"].predicted_ttft_ms == pytest.approx(40.0 + 0.05 * 4000)
    assert by_url["http://b"].backlog_tokens == 1000
    # b has learned nothing yet: it is taken to be as fast as its peers, not as the prior.
    assert by_url["http://b"].predicted_ttft_ms == pytest.approx(40.0 + 0.05 * 1000)
    assert (plan.pool, plan.lane, plan.prefill_tokens) == (POOL, Lane.INTERACTIVE, 1000)


def test_before_any_endpoint_has_learned_the_prior_predicts() -> None:
    views = [
        EndpointView(url="http://a", in_flight=0, prefill_tokens=0, engine=None),
        EndpointView(url="http://b", in_flight=0, prefill_tokens=0, engine=None),
    ]
    rates = {"http://a": PrefillRate()}  # present but without samples: still the prior
    plan = make_plan(route(TokenBounds(1000, 1000)), views, rates, (), random.Random(0))
    assert [e.predicted_ttft_ms for e in plan.endpoints] == [PRIOR_MS_PER_TOKEN * 1000] * 2


def test_the_cached_prefix_is_neither_prefilled_nor_queued() -> None:
    views = [
        EndpointView(
            url="http://a", in_flight=1, prefill_tokens=500, engine=None, cached_prompt_tokens=3000
        ),
        EndpointView(
            url="http://b", in_flight=0, prefill_tokens=0, engine=None, cached_prompt_tokens=0
        ),
    ]
    profile = scorers_from_weights("scored", {"prefixAffinity": 1})
    plan = make_plan(route(TokenBounds(4000, 4000)), views, {}, profile, random.Random(0))
    a, b = plan.endpoints  # a: 500 queued + 1,000 uncached beats b's 4,000
    assert (a.url, a.prefill_tokens, a.backlog_tokens) == ("http://a", 1000, 1500)
    assert (b.url, b.prefill_tokens, b.backlog_tokens) == ("http://b", 4000, 4000)
    assert (a.score, b.score) == pytest.approx((1.0, 1 - 2500 / 4000))


def test_the_plan_ranks_by_the_weighted_profile() -> None:
    views = [
        EndpointView(
            url="http://a",
            in_flight=4,
            prefill_tokens=9000,
            engine=EngineMetrics(waiting=6, running=4, kv_usage=0.9),
        ),
        EndpointView(
            url="http://b",
            in_flight=1,
            prefill_tokens=500,
            engine=EngineMetrics(waiting=0, running=1, kv_usage=0.1),
        ),
    ]
    profile = PickingSettings().profile()
    plan = make_plan(route(TokenBounds(100, 100)), views, {}, profile, random.Random(0))
    assert [e.url for e in plan.endpoints] == ["http://b", "http://a"]
    assert plan.endpoints[0].score > 0.9  # best everywhere but KV, which scores absolutely
    assert plan.endpoints[1].score < 0.1


def test_ties_break_by_the_seeded_random_and_reach_every_endpoint() -> None:
    views = [
        EndpointView(url=f"http://{n}", in_flight=0, prefill_tokens=0, engine=None) for n in "abcd"
    ]
    profile = scorers_from_weights("scored", {"inFlightRequests": 1})
    firsts = [
        make_plan(route(TokenBounds(10, 10)), views, {}, profile, random.Random(seed))
        .endpoints[0]
        .url
        for seed in range(40)
    ]
    assert set(firsts) == {"http://a", "http://b", "http://c", "http://d"}
    again = make_plan(route(TokenBounds(10, 10)), views, {}, profile, random.Random(7))
    assert again.endpoints[0].url == firsts[7]


def test_the_admission_line_serves_interactive_first_then_batch_in_fair_share() -> None:
    line: AdmissionLine[str] = AdmissionLine()
    big = [f"big-{index}" for index in range(3)]
    for item in big:
        line.join(item, Lane.BATCH, "big", 1000)
    line.join("small-0", Lane.BATCH, "small", 1000)
    line.join("chat", Lane.INTERACTIVE)
    assert line.remove(big[2])  # its waiter gave up
    assert not line.remove("absent")
    assert len(line) == 4
    assert [line.next() for _ in range(4)] == ["chat", "big-0", "small-0", "big-1"]
    with pytest.raises(IndexError):
        line.next()
