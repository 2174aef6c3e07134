"""Pools, routes and admissions for the ledger's tests."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from laneway.api import InferencePool, Lane
from laneway.ledger import Admission, Ledger, LedgerSettings
from laneway.routing.lanes import Route, RouteRequest, classify
from laneway.tokens import TokenBounds
from support.pools import simulated_pool


def pool(
    name: str = "chat", endpoints: Sequence[str] = ("http://a", "http://b"), **spec: Any
) -> InferencePool:
    spec.setdefault("routing", {"models": ["llama"]})
    spec.setdefault("limits", {"maxConcurrentRequests": 1})
    return simulated_pool(name, list(endpoints), **spec)


def route_to(target: InferencePool, tokens: int = 1000, pinned: Lane | None = None) -> Route:
    ask = RouteRequest("llama", TokenBounds(tokens, tokens), 10, pinned_lane=pinned)
    decision = classify(ask, [target])
    assert isinstance(decision, Route), decision
    return decision


def ask(
    target: InferencePool,
    arrived: float = 0.0,
    *,
    tokens: int = 1000,
    tenant: str = "",
    lane: Lane | None = None,
    session: str | None = None,
) -> Admission:
    route = route_to(target, tokens)
    if lane is not None:
        route = replace(route, priority=lane)
    return Admission(
        route=route,
        arrived=arrived,
        path="/v1/chat/completions",
        model="llama",
        stream=True,
        tenant=tenant,
        fair_tokens=tokens,
        session_key=session,
    )


def ledger_with(*pools: InferencePool, **settings: Any) -> Ledger:
    ledger = Ledger(LedgerSettings(**settings), random.Random(0))
    ledger.update_pools(0.0, pools)
    return ledger
