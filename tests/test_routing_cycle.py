"""A request's scoring cycle: filters before scoring, each scorer's data produced once and
only when read, and a new scorer with data of its own written in one place."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
from support.given_facts import GivenFacts
from support.pools import simulated_pool

from laneway.routing.cycle import (
    BACKLOG_TOKENS,
    ENGINE,
    PREDICTED_TTFT_MS,
    CycleRequest,
    CycleState,
    DataKey,
    EndpointLoad,
    candidates,
)
from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.lanes import Route, RouteRequest, classify
from laneway.routing.picker import PickingSettings, WeightedScorer, rank, wants_prefix_blocks
from laneway.routing.plan import plan_cycle
from laneway.routing.scorers.base import Scorer, lower_is_better
from laneway.routing.slo import PrefillRate
from laneway.simulator.prefix_experiment import picker_settings
from laneway.tokens import TokenBounds

A, B, C = URLS = ("http://a", "http://b", "http://c")
POOL = simulated_pool("chat", list(URLS), routing={"models": ["llama"]}, slo={"ttftMillis": 200})


def route(tokens: int = 1000) -> Route:
    decision = classify(RouteRequest("llama", TokenBounds(tokens, tokens), 10), [POOL])
    assert isinstance(decision, Route)
    return decision


@pytest.mark.parametrize(
    ("case", "ejected", "subset", "kept"),
    [
        ("every endpoint", frozenset(), None, URLS),
        ("an ejected endpoint is no candidate", frozenset({B}), None, (A, C)),
        ("a caller's subset, in the pool's order", frozenset(), {C, A}, (A, C)),
        ("both", frozenset({A}), {A, B}, (B,)),
        ("a subset naming no endpoint of the pool", frozenset(), {"http://x"}, ()),
    ],
)
def test_the_filter_stage(
    case: str, ejected: frozenset[str], subset: set[str] | None, kept: tuple[str, ...]
) -> None:
    request = CycleRequest(route=route(), subset=None if subset is None else frozenset(subset))
    cycle = candidates(request, URLS, GivenFacts(ejected=ejected))
    assert cycle.urls == kept, case


def test_data_is_produced_once_and_only_when_a_scorer_reads_it() -> None:
    facts = GivenFacts(gauges={"http://a": EngineMetrics(waiting=1, running=1, kv_usage=0.5)})
    cycle = candidates(CycleRequest(route=route()), URLS, facts)
    profile = PickingSettings(weights={"inFlightRequests": 1, "prefillTokens": 1}).profile()
    rank(cycle, profile, random.Random(0))
    assert facts.reads == [f"load {url}" for url in URLS]  # no scorer asked for gauges
    assert cycle[ENGINE][0] is not None
    cycle[ENGINE]
    assert facts.reads.count("engine http://a") == 1


class FewestRunning(Scorer):
    """A scorer with data of its own: its key and producer live beside it."""

    RUNNING = DataKey(
        "running",
        lambda c: [e.running if e else None for e in c[ENGINE]],
    )
    needs = frozenset({RUNNING})

    def scores(self, cycle: CycleState) -> list[float]:
        running: Sequence[float | None] = cycle[self.RUNNING]
        return lower_is_better(running)


def test_a_new_scorer_brings_its_own_data() -> None:
    gauges = {
        "http://a": EngineMetrics(waiting=0, running=9, kv_usage=0.1),
        "http://b": EngineMetrics(waiting=0, running=1, kv_usage=0.1),
    }
    cycle = candidates(CycleRequest(route=route()), URLS, GivenFacts(gauges=gauges))
    profile = (WeightedScorer(name="fewestRunning", scorer=FewestRunning(), weight=1),)
    plan = plan_cycle(cycle, profile, random.Random(0))
    assert [(e.url, e.score) for e in plan.endpoints] == [
        ("http://b", 1.0),
        ("http://c", 0.5),  # never scraped: unknown
        ("http://a", 0.0),
    ]


@pytest.mark.parametrize(
    ("picker", "wanted"), [("laneway", True), ("none", False), ("sticky", False)]
)
def test_the_profile_says_whether_the_prompt_is_cut_into_prefix_blocks(
    picker: str, wanted: bool
) -> None:
    settings = picker_settings(picker, PickingSettings())  # type: ignore[arg-type]
    assert wants_prefix_blocks(settings.profile()) is wanted


def test_the_default_profile_plans_over_the_cycles_data() -> None:
    facts = GivenFacts(
        loads={"http://a": EndpointLoad(in_flight=2, prefill_tokens=3000)},
        gauges={"http://b": EngineMetrics(waiting=4, running=2, kv_usage=0.7)},
        rates={"http://a": PrefillRate(ms_per_token=0.05, samples=3)},
        cached={"http://c": 600},
    )
    profile = PickingSettings().profile()
    request = CycleRequest(route=route(), elapsed_ms=12.5, session_key="s")
    cycle = candidates(request, URLS, facts)
    plan = plan_cycle(cycle, profile, random.Random(3))
    # Weights 2 queue, 1 KV, 2 in flight, 2 prefill, 2 TTFT, 6 prefix (15 in all). c: the
    # queue and KV unknown (0.5), best in flight, prefill, TTFT and backlog: 13.5 / 15. b:
    # the only queue known, KV 0.3, a backlog of 1,000 against 400 of 4,000 (0.85): 13.4 /
    # 15. a: busy, 212.5 ms predicted against 200 (0.94), backlog 0.1: 3.98 / 15.
    endpoints = plan.endpoints
    assert [(e.url, e.backlog_tokens, e.prefill_tokens) for e in endpoints] == [
        ("http://c", 400, 400),
        ("http://b", 1000, 1000),
        ("http://a", 4000, 1000),
    ]
    assert [e.score for e in endpoints] == pytest.approx(
        [13.5 / 15, 13.4 / 15, (1 + 0.5 + 2 * 200 / 212.5 + 6 * 0.1) / 15]
    )
    assert [e.predicted_ttft_ms for e in endpoints] == pytest.approx(
        [12.5 + 0.05 * 400, 12.5 + 0.05 * 1000, 12.5 + 0.05 * 4000]
    )
    assert list(cycle[BACKLOG_TOKENS]) == [4000, 1000, 400]
    assert cycle[PREDICTED_TTFT_MS][2] == pytest.approx(12.5 + 0.05 * 400)
