"""Endpoint scorers (scores in [0, 1], 1 is best) and the weighted, randomly tie-broken picker,
on the scoring cycle the ledger plans over."""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Sequence

import pytest
from support.given_facts import GivenFacts, cycle_over
from support.ledger import pool, route_to

from laneway.routing.cycle import CycleState, EndpointLoad
from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.picker import PickingSettings, WeightedScorer, rank, scorers_from_weights
from laneway.routing.scorers import Scorer
from laneway.routing.scorers.in_flight import InFlightScorer
from laneway.routing.scorers.kv_usage import KVUsageScorer
from laneway.routing.scorers.prefill_tokens import PrefillTokensScorer
from laneway.routing.scorers.queue_depth import QueueDepthScorer
from laneway.routing.scorers.ttft_slo import TtftSloScorer
from laneway.routing.slo import PrefillRate

PROMPT_TOKENS = 1000  # every request's, so a learned rate of r ms a token predicts 1,000 x r


@dataclasses.dataclass(frozen=True)
class Endpoint:
    """What the ledger knows of one endpoint: its load, its gauges (None: never scraped or
    stale), its learned prefill rate and how much of the prompt its cache holds."""

    url: str
    in_flight: int = 0
    prefill: int = 0
    waiting: float | None = None
    kv: float = 0.0
    ms_per_token: float | None = None  # None: learned nothing yet
    cached: int = 0


def cycle(endpoints: Sequence[Endpoint], slo_ms: int = 300) -> CycleState:
    """One request of PROMPT_TOKENS on a pool of `endpoints` whose TTFT SLO is `slo_ms`."""
    facts = GivenFacts(
        loads={
            e.url: EndpointLoad(in_flight=e.in_flight, prefill_tokens=e.prefill) for e in endpoints
        },
        gauges={
            e.url: EngineMetrics(waiting=e.waiting, running=0, kv_usage=e.kv)
            for e in endpoints
            if e.waiting is not None
        },
        rates={
            e.url: PrefillRate(ms_per_token=e.ms_per_token, samples=1)
            for e in endpoints
            if e.ms_per_token is not None
        },
        cached={e.url: e.cached for e in endpoints},
    )
    # The route gives the request its prompt and SLO; the candidates are the endpoints.
    route = route_to(pool(slo={"ttftMillis": slo_ms}), PROMPT_TOKENS)
    return cycle_over(route, [e.url for e in endpoints], facts)


SCORES = [
    # (case, scorer, endpoints, expected scores)
    (
        "queue depth normalised between min and max",
        QueueDepthScorer(),
        [Endpoint("a", waiting=0), Endpoint("b", waiting=5), Endpoint("c", waiting=10)],
        [1.0, 0.5, 0.0],
    ),
    (
        "equal queues are all neutral-best",
        QueueDepthScorer(),
        [Endpoint("a", waiting=3), Endpoint("b", waiting=3)],
        [1.0, 1.0],
    ),
    (
        "a stale scrape (no engine metrics) scores the unknown middle",
        QueueDepthScorer(),
        [Endpoint("a", waiting=0), Endpoint("b", waiting=4), Endpoint("c")],
        [1.0, 0.0, 0.5],
    ),
    (
        "nothing scraped anywhere: every endpoint in the middle",
        QueueDepthScorer(),
        [Endpoint("a"), Endpoint("b")],
        [0.5, 0.5],
    ),
    (
        "KV usage is absolute free space",
        KVUsageScorer(),
        [Endpoint("a", waiting=0, kv=0.25), Endpoint("b", waiting=0, kv=0.9), Endpoint("c")],
        [0.75, pytest.approx(0.1), 0.5],
    ),
    (
        "in-flight requests from the gateway's own accounting",
        InFlightScorer(),
        [Endpoint("a", in_flight=2), Endpoint("b", in_flight=6), Endpoint("c", in_flight=4)],
        [1.0, 0.0, 0.5],
    ),
    (
        "one long prefill outweighs many short ones",
        PrefillTokensScorer(),
        [Endpoint("a", prefill=64000), Endpoint("b", prefill=16000), Endpoint("c", prefill=0)],
        [0.0, 0.75, 1.0],
    ),
    (
        "every endpoint predicted within the TTFT SLO scores 1, however close to it",
        TtftSloScorer(),
        # 1,000 prompt tokens at 0.02 and 0.3 ms each: 20 and 300 ms against 300
        [Endpoint("a", ms_per_token=0.02), Endpoint("b", ms_per_token=0.3)],
        [1.0, 1.0],
    ),
    (
        "a predicted miss scores SLO / prediction: a near miss beats a certain one",
        TtftSloScorer(),
        # 600 and 3,000 ms against 300
        [Endpoint("a", ms_per_token=0.6), Endpoint("b", ms_per_token=3.0)],
        [0.5, 0.1],
    ),
    (
        "nothing to prefill ahead of the first token predicts 0 ms: within even a 1 ms SLO",
        TtftSloScorer(),
        [Endpoint("c", ms_per_token=0.1, cached=PROMPT_TOKENS)],
        [1.0],
    ),
]


@pytest.mark.parametrize(
    ("scorer", "endpoints", "expected"),
    [case[1:] for case in SCORES],
    ids=[case[0] for case in SCORES],
)
def test_scores(scorer: Scorer, endpoints: list[Endpoint], expected: list[float]) -> None:
    scores = scorer.scores(cycle(endpoints))
    assert scores == expected
    assert all(0.0 <= s <= 1.0 for s in scores)


def ranked(
    endpoints: list[Endpoint], profile: Sequence[WeightedScorer], rng: random.Random
) -> list[tuple[str, float]]:
    """`rank`'s answer as (url, score) best first."""
    order, scores = rank(cycle(endpoints), profile, rng)
    return [(endpoints[i].url, scores[i]) for i in order]


def urls(
    endpoints: list[Endpoint], profile: Sequence[WeightedScorer], rng: random.Random
) -> list[str]:
    return [url for url, _ in ranked(endpoints, profile, rng)]


def test_weights_combine_into_a_mean_in_unit_range() -> None:
    profile = (
        WeightedScorer("inFlightRequests", InFlightScorer(), 3),
        WeightedScorer("prefillTokens", PrefillTokensScorer(), 1),
    )
    endpoints = [
        Endpoint("busy", in_flight=4, prefill=0),
        Endpoint("idle", in_flight=0, prefill=8000),
    ]
    # idle: in-flight 1.0 x3 + prefill 0.0 x1 = 0.75; busy: 0.0 x3 + 1.0 x1 = 0.25
    assert ranked(endpoints, profile, random.Random(1)) == [("idle", 0.75), ("busy", 0.25)]


def test_ties_break_at_random_with_the_injected_generator() -> None:
    profile = scorers_from_weights("scored", {"inFlightRequests": 1})
    endpoints = [Endpoint(name) for name in "abcd"]
    winners = Counter(urls(endpoints, profile, random.Random(seed))[0] for seed in range(400))
    assert set(winners) == set("abcd")
    assert min(winners.values()) > 60  # roughly uniform, never stuck on the first
    first = urls(endpoints, profile, random.Random(42))
    again = urls(endpoints, profile, random.Random(42))
    assert first == again


def test_random_policy_has_no_scorers_and_weight_zero_turns_a_scorer_off() -> None:
    assert scorers_from_weights("random", {"queueDepth": 5}) == ()
    profile = scorers_from_weights("scored", {"queueDepth": 0, "kvCacheUsage": 2})
    assert [(s.name, s.weight) for s in profile] == [("kvCacheUsage", 2)]


def test_the_ranking_keeps_every_candidate_for_the_retry() -> None:
    profile = scorers_from_weights("scored", {"inFlightRequests": 1})
    endpoints = [Endpoint("a", in_flight=3), Endpoint("b", in_flight=1), Endpoint("c", in_flight=2)]
    assert urls(endpoints, profile, random.Random(0)) == ["b", "c", "a"]


def test_the_default_profile_steers_away_from_a_predicted_slo_miss() -> None:
    # Same load everywhere; "slow" learned a rate that puts this request past its SLO:
    # 2,000 queued + 1,000 of its own at 0.3 ms a token is 900 ms, at 0.04 ms 120 ms.
    profile = scorers_from_weights("scored", PickingSettings().weights)
    endpoints = [
        Endpoint("slow", prefill=2000, waiting=1, ms_per_token=0.3),
        Endpoint("fast", prefill=2000, waiting=1, ms_per_token=0.04),
    ]
    for seed in range(20):
        assert urls(endpoints, profile, random.Random(seed)) == ["fast", "slow"]
