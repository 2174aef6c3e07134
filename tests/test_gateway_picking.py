"""Endpoint scorers (scores in [0, 1], 1 is best) and the weighted, randomly tie-broken picker."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import pytest

from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.picker import PickingSettings, WeightedScorer, rank, scorers_from_weights
from laneway.routing.scorers import EndpointView, Scorer
from laneway.routing.scorers.in_flight import InFlightScorer
from laneway.routing.scorers.kv_usage import KVUsageScorer
from laneway.routing.scorers.prefill_tokens import PrefillTokensScorer
from laneway.routing.scorers.queue_depth import QueueDepthScorer
from laneway.routing.scorers.ttft_slo import TtftSloScorer


def view(
    url: str,
    in_flight: int = 0,
    prefill: int = 0,
    waiting: float | None = None,
    kv: float = 0.0,
    predicted_ms: float | None = None,
    slo_ms: int | None = None,
) -> EndpointView:
    engine = None if waiting is None else EngineMetrics(waiting=waiting, running=0, kv_usage=kv)
    return EndpointView(url, in_flight, prefill, engine, predicted_ms, slo_ms)


SCORES = [
    # (case, scorer, endpoints, expected scores)
    (
        "queue depth normalised between min and max",
        QueueDepthScorer(),
        [view("a", waiting=0), view("b", waiting=5), view("c", waiting=10)],
        [1.0, 0.5, 0.0],
    ),
    (
        "equal queues are all neutral-best",
        QueueDepthScorer(),
        [view("a", waiting=3), view("b", waiting=3)],
        [1.0, 1.0],
    ),
    (
        "a stale scrape (no engine metrics) scores the unknown middle",
        QueueDepthScorer(),
        [view("a", waiting=0), view("b", waiting=4), view("c")],
        [1.0, 0.0, 0.5],
    ),
    (
        "nothing scraped anywhere: every endpoint in the middle",
        QueueDepthScorer(),
        [view("a"), view("b")],
        [0.5, 0.5],
    ),
    (
        "KV usage is absolute free space",
        KVUsageScorer(),
        [view("a", waiting=0, kv=0.25), view("b", waiting=0, kv=0.9), view("c")],
        [0.75, pytest.approx(0.1), 0.5],
    ),
    (
        "in-flight requests from the gateway's own accounting",
        InFlightScorer(),
        [view("a", in_flight=2), view("b", in_flight=6), view("c", in_flight=4)],
        [1.0, 0.0, 0.5],
    ),
    (
        "one long prefill outweighs many short ones",
        PrefillTokensScorer(),
        [view("a", prefill=64000), view("b", prefill=16000), view("c", prefill=0)],
        [0.0, 0.75, 1.0],
    ),
    (
        "every endpoint predicted within the TTFT SLO scores 1, however close to it",
        TtftSloScorer(),
        [view("a", predicted_ms=20, slo_ms=300), view("b", predicted_ms=300, slo_ms=300)],
        [1.0, 1.0],
    ),
    (
        "a predicted miss scores SLO / prediction: a near miss beats a certain one",
        TtftSloScorer(),
        [view("a", predicted_ms=600, slo_ms=300), view("b", predicted_ms=3000, slo_ms=300)],
        [0.5, 0.1],
    ),
    (
        "no prediction, or no SLO, is the unknown middle",
        TtftSloScorer(),
        [view("a", slo_ms=300), view("b", predicted_ms=10), view("c", predicted_ms=0, slo_ms=1)],
        [0.5, 0.5, 1.0],
    ),
]


@pytest.mark.parametrize(
    ("scorer", "endpoints", "expected"),
    [case[1:] for case in SCORES],
    ids=[case[0] for case in SCORES],
)
def test_scores(scorer: Scorer, endpoints: list[EndpointView], expected: list[float]) -> None:
    scores = scorer.score(endpoints)
    assert scores == expected
    assert all(0.0 <= s <= 1.0 for s in scores)


def ranked(
    endpoints: list[EndpointView], profile: Sequence[WeightedScorer], rng: random.Random
) -> list[tuple[str, float]]:
    """`rank`'s answer as (url, score) best first."""
    order, scores = rank(endpoints, profile, rng)
    return [(endpoints[i].url, scores[i]) for i in order]


def urls(
    endpoints: list[EndpointView], profile: Sequence[WeightedScorer], rng: random.Random
) -> list[str]:
    return [url for url, _ in ranked(endpoints, profile, rng)]


def test_weights_combine_into_a_mean_in_unit_range() -> None:
    profile = (
        WeightedScorer("inFlightRequests", InFlightScorer(), 3),
        WeightedScorer("prefillTokens", PrefillTokensScorer(), 1),
    )
    endpoints = [view("busy", in_flight=4, prefill=0), view("idle", in_flight=0, prefill=8000)]
    # idle: in-flight 1.0 x3 + prefill 0.0 x1 = 0.75; busy: 0.0 x3 + 1.0 x1 = 0.25
    assert ranked(endpoints, profile, random.Random(1)) == [("idle", 0.75), ("busy", 0.25)]


def test_ties_break_at_random_with_the_injected_generator() -> None:
    profile = scorers_from_weights("scored", {"inFlightRequests": 1})
    endpoints = [view(name) for name in "abcd"]
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
    endpoints = [view("a", in_flight=3), view("b", in_flight=1), view("c", in_flight=2)]
    assert urls(endpoints, profile, random.Random(0)) == ["b", "c", "a"]


def test_the_default_profile_steers_away_from_a_predicted_slo_miss() -> None:
    # Same load everywhere; "slow" learned a rate that puts this request past its SLO.
    profile = scorers_from_weights("scored", PickingSettings().weights)
    endpoints = [
        view("slow", prefill=2000, waiting=1, predicted_ms=900, slo_ms=300),
        view("fast", prefill=2000, waiting=1, predicted_ms=120, slo_ms=300),
    ]
    for seed in range(20):
        assert urls(endpoints, profile, random.Random(seed)) == ["fast", "slow"]
