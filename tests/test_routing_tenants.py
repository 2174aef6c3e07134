"""`spec.routing.tenants`: a pool naming tenants serves only them, over overlapping pools.

Pure table tests of the routing library's classification; the live test with two tenants'
keys through the gateway is tests/test_gateway_tenants.py.
"""

from __future__ import annotations

import pytest
from support.pools import lane_pool, simulated_pool

from laneway.api import InferencePool, Lane, check_pool_set
from laneway.routing.lanes import NoFit, Route, RouteRequest, UnknownModel, classify
from laneway.tokens import TokenBounds

# Three interactive pools over the same 0-2000 range: one open, one per tenant.
OPEN_CHAT = lane_pool("open-chat", "interactive", 4096, maxPromptTokens=2000)
ACME_CHAT = lane_pool("acme-chat", "interactive", 4096, maxPromptTokens=2000, tenants=["acme"])
BETA_CHAT = lane_pool("beta-chat", "interactive", 1024, maxPromptTokens=500, tenants=["beta"])
# Batch pools overlapping everything above: one open, one shared by acme and beta.
OPEN_BATCH = lane_pool("open-batch", "batch", 131072, minPromptTokens=2001)
SHARED_BATCH = lane_pool("shared-batch", "batch", 65536, tenants=["acme", "beta"])
# Higher priority than every tenant's pool, open to everyone.
VIP = lane_pool("vip", "interactive", 4096, maxPromptTokens=2000, priority=10)
# A model only tenants are served.
PRIVATE = simulated_pool(
    "private", [], model="secret-model", routing={"models": ["secret"], "tenants": ["acme"]}
)
ALL = [OPEN_CHAT, ACME_CHAT, BETA_CHAT, OPEN_BATCH, SHARED_BATCH]


def ask(tokens: int, tenant: str | None, pinned: Lane | None = None) -> RouteRequest:
    return RouteRequest("llama", TokenBounds(tokens, tokens), 100, pinned, tenant)


CASES = [
    # (case, pools, request, expected pool)
    ("a tenant's own pool over the open one", ALL, ask(500, "acme"), "acme-chat"),
    ("each tenant its own", ALL, ask(300, "beta"), "beta-chat"),
    ("no key: only the open pools", ALL, ask(500, None), "open-chat"),
    ("a tenant with no pools of its own: the open ones", ALL, ask(500, "gamma"), "open-chat"),
    (
        "too long for beta's chat pool: beta's other pool, still its own",
        ALL,
        ask(1500, "beta"),
        "shared-batch",
    ),
    (
        "too long for all of acme's pools: back to the pools open to everyone",
        ALL,
        ask(70000, "acme"),
        "open-batch",
    ),
    ("no key, long: the open batch pool", ALL, ask(50000, None), "open-batch"),
    (
        "a pool shared by two tenants serves neither a third nor the unauthenticated",
        [OPEN_CHAT, SHARED_BATCH, OPEN_BATCH],
        ask(3000, "gamma"),
        "open-batch",
    ),
    (
        "the tenant's own pool wins over a higher-priority open one",
        [VIP, ACME_CHAT],
        ask(500, "acme"),
        "acme-chat",
    ),
    ("others still get the higher-priority open one", [VIP, ACME_CHAT], ask(500, "beta"), "vip"),
    (
        "a pinned lane wins over the tenant's own pools",
        [ACME_CHAT, lane_pool("pinnable", "batch", 131072, minPromptTokens=16000)],
        ask(500, "acme", Lane.BATCH),
        "pinnable",
    ),
]


@pytest.mark.parametrize(
    ("pools", "request_", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_tenants_choose_among_overlapping_pools(
    pools: list[InferencePool], request_: RouteRequest, expected: str
) -> None:
    decision = classify(request_, pools)
    assert isinstance(decision, Route)
    assert decision.pool.name == expected


def test_the_reason_names_the_tenant() -> None:
    decision = classify(ask(500, "acme"), ALL)
    assert isinstance(decision, Route)
    assert decision.reason == "a pool of tenant acme"


@pytest.mark.parametrize("tenant", [None, "beta"])
def test_a_model_only_other_tenants_are_served_is_unknown(tenant: str | None) -> None:
    decision = classify(
        RouteRequest("secret", TokenBounds(10, 10), None, None, tenant), [*ALL, PRIVATE]
    )
    assert isinstance(decision, UnknownModel)
    assert decision.known == ("llama",)  # another tenant's model is not even named


def test_the_owner_reaches_its_private_model() -> None:
    decision = classify(RouteRequest("secret", TokenBounds(10, 10), None, None, "acme"), [PRIVATE])
    assert isinstance(decision, Route)
    assert decision.pool.name == "private"


def test_no_fit_for_the_unauthenticated_counts_only_the_open_pools() -> None:
    decision = classify(
        ask(1500, None),
        [BETA_CHAT, SHARED_BATCH, lane_pool("tiny", "interactive", 1024, maxPromptTokens=500)],
    )
    assert isinstance(decision, NoFit)
    # The tenants' pools would hold it (shared-batch has 65536); the open one holds 1024.
    assert decision.context_exceeded
    assert decision.largest_context == 1024


def test_overlapping_interactive_pools_pass_validation_only_for_different_tenants() -> None:
    assert check_pool_set([OPEN_CHAT, ACME_CHAT, BETA_CHAT]) == []
    twin = lane_pool("acme-chat-2", "interactive", 4096, maxPromptTokens=1000, tenants=["acme"])
    problems = check_pool_set([ACME_CHAT, twin])
    assert len(problems) == 1
    assert "overlaps pool default/acme-chat" in problems[0].message
