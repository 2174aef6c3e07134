"""The routing plan: one pure function ranks a cycle's endpoints and predicts each TTFT."""

from __future__ import annotations

import random

import pytest
from support.given_facts import GivenFacts, cycle_over
from support.pools import simulated_pool

from laneway.api import Lane
from laneway.routing.admission import AdmissionLine
from laneway.routing.cycle import EndpointLoad
from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.lanes import Route, RouteRequest, classify, prefill_estimate
from laneway.routing.picker import PickingSettings, scorers_from_weights
from laneway.routing.plan import plan_cycle
from laneway.routing.slo import PRIOR_MS_PER_TOKEN, PrefillRate
from laneway.tokens import TokenBounds

A, B = URLS = ("http://a", "http://b")
POOL = simulated_pool(
    "chat",
    list(URLS),
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
    facts = GivenFacts(
        loads={A: EndpointLoad(in_flight=1, prefill_tokens=3000)},
        rates={A: PrefillRate(ms_per_token=0.05, samples=3)},
    )
    cycle = cycle_over(route(TokenBounds(1000, 1000)), URLS, facts, elapsed_ms=40.0)
    plan = plan_cycle(cycle, (), random.Random(0))
    by_url = {e.url: e for e in plan.endpoints}
    assert by_url["http://a"].backlog_tokens == 4000
    assert by_url["http://a"].predicted_ttft_ms == pytest.approx(40.0 + 0.05 * 4000)
    assert by_url["http://b"].backlog_tokens == 1000
    # b has learned nothing yet: it is taken to be as fast as its peers, not as the prior.
    assert by_url["http://b"].predicted_ttft_ms == pytest.approx(40.0 + 0.05 * 1000)
    assert (plan.pool, plan.lane, plan.prefill_tokens) == (POOL, Lane.INTERACTIVE, 1000)


def test_before_any_endpoint_has_learned_the_prior_predicts() -> None:
    facts = GivenFacts(rates={A: PrefillRate()})  # present but without samples: still the prior
    plan = plan_cycle(cycle_over(route(TokenBounds(1000, 1000)), URLS, facts), (), random.Random(0))
    assert [e.predicted_ttft_ms for e in plan.endpoints] == [PRIOR_MS_PER_TOKEN * 1000] * 2


def test_the_cached_prefix_is_neither_prefilled_nor_queued() -> None:
    facts = GivenFacts(
        loads={A: EndpointLoad(in_flight=1, prefill_tokens=500)}, cached={A: 3000, B: 0}
    )
    profile = scorers_from_weights("scored", {"prefixAffinity": 1})
    cycle = cycle_over(route(TokenBounds(4000, 4000)), URLS, facts)
    plan = plan_cycle(cycle, profile, random.Random(0))
    a, b = plan.endpoints  # a: 500 queued + 1,000 uncached beats b's 4,000
    assert (a.url, a.prefill_tokens, a.backlog_tokens) == ("http://a", 1000, 1500)
    assert (b.url, b.prefill_tokens, b.backlog_tokens) == ("http://b", 4000, 4000)
    assert (a.score, b.score) == pytest.approx((1.0, 1 - 2500 / 4000))


def test_the_plan_ranks_by_the_weighted_profile() -> None:
    facts = GivenFacts(
        loads={
            A: EndpointLoad(in_flight=4, prefill_tokens=9000),
            B: EndpointLoad(in_flight=1, prefill_tokens=500),
        },
        gauges={
            A: EngineMetrics(waiting=6, running=4, kv_usage=0.9),
            B: EngineMetrics(waiting=0, running=1, kv_usage=0.1),
        },
    )
    profile = PickingSettings().profile()
    cycle = cycle_over(route(TokenBounds(100, 100)), URLS, facts)
    plan = plan_cycle(cycle, profile, random.Random(0))
    assert [e.url for e in plan.endpoints] == ["http://b", "http://a"]
    assert plan.endpoints[0].score > 0.9  # best everywhere but KV, which scores absolutely
    assert plan.endpoints[1].score < 0.1


def test_ties_break_by_the_seeded_random_and_reach_every_endpoint() -> None:
    urls = [f"http://{n}" for n in "abcd"]
    profile = scorers_from_weights("scored", {"inFlightRequests": 1})

    def first(seed: int) -> str:
        cycle = cycle_over(route(TokenBounds(10, 10)), urls, GivenFacts())
        return plan_cycle(cycle, profile, random.Random(seed)).endpoints[0].url

    firsts = [first(seed) for seed in range(40)]
    assert set(firsts) == {"http://a", "http://b", "http://c", "http://d"}
    assert first(7) == firsts[7]


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
    assert line.next() is None  # empty
