"""Lane classification: which pool takes a request, from bounds where they decide."""

from __future__ import annotations

import pytest
from support.pools import lane_pool

from laneway.api import InferencePool, Lane
from laneway.routing.lanes import (
    NeedsExactCount,
    NoFit,
    Route,
    RouteRequest,
    UnknownModel,
    classify,
)
from laneway.tokens import TokenBounds

REALTIME = lane_pool("realtime", "interactive", 4096, maxPromptTokens=2000)
BATCH = lane_pool("batch", "batch", 131072, minPromptTokens=2001)
# A batch pool that also takes short prompts when pinned by the header.
OPEN_BATCH = lane_pool("open-batch", "batch", 131072, minPromptTokens=16000)
LOCKED_BATCH = lane_pool("locked", "batch", 65536, minPromptTokens=16000, allowLaneHeader=False)
OVERFLOW = lane_pool("overflow", "batch", 8192, priority=-1)
WIDE_REALTIME = lane_pool("wide", "interactive", 8192, maxPromptTokens=2000)
SPLIT = [REALTIME, BATCH]
UNIFIED = lane_pool("unified", "interactive", 131072)
UNIFIED_BATCH = lane_pool("unified-batch", "batch", 131072)


def exact(n: int) -> TokenBounds:
    return TokenBounds(n, n)


def request(
    tokens: TokenBounds, max_tokens: int | None = None, pinned: Lane | None = None
) -> RouteRequest:
    return RouteRequest("llama", tokens, max_tokens, pinned)


ROUTES = [
    # (case, pools, request, expected pool name, expected priority class)
    ("short prompt goes interactive", SPLIT, request(exact(500)), "realtime", Lane.INTERACTIVE),
    ("at the interactive edge", SPLIT, request(exact(2000)), "realtime", Lane.INTERACTIVE),
    ("one past the edge goes batch", SPLIT, request(exact(2001)), "batch", Lane.BATCH),
    ("long document goes batch", SPLIT, request(exact(64000)), "batch", Lane.BATCH),
    (
        "bounds wholly inside the batch range decide without a count",
        SPLIT,
        request(TokenBounds(30000, 120000)),
        "batch",
        Lane.BATCH,
    ),
    (
        "bounds wholly inside the interactive range decide too",
        SPLIT,
        request(TokenBounds(10, 1500)),
        "realtime",
        Lane.INTERACTIVE,
    ),
    (
        "max_tokens that overflows the interactive context moves the request to batch",
        [REALTIME, lane_pool("wide-batch", "batch", 131072)],
        request(exact(1500), max_tokens=3000),
        "wide-batch",
        Lane.BATCH,
    ),
    (
        "header pins a short prompt to batch, lifting the batch minimum",
        [REALTIME, OPEN_BATCH],
        request(exact(300), pinned=Lane.BATCH),
        "open-batch",
        Lane.BATCH,
    ),
    (
        # The lane stays the pool's; the request still goes behind its chat (a later place
        # is anyone's to ask for).
        "header cannot pin into a pool that does not allow it, only lower its place",
        [REALTIME, LOCKED_BATCH],
        request(exact(300), pinned=Lane.BATCH),
        "realtime",
        Lane.BATCH,
    ),
    (
        "a batch pin in a unified interactive pool lowers the request to the batch class",
        [UNIFIED],
        request(exact(64000), pinned=Lane.BATCH),
        "unified",
        Lane.BATCH,
    ),
    (
        "an interactive pin never raises a request in a batch pool",
        [UNIFIED_BATCH],
        request(exact(300), pinned=Lane.INTERACTIVE),
        "unified-batch",
        Lane.BATCH,
    ),
    (
        "header asking interactive for a long prompt never spills it into interactive",
        SPLIT,
        request(exact(50000), pinned=Lane.INTERACTIVE),
        "batch",
        Lane.BATCH,
    ),
    (
        "higher priority wins over the interactive preference",
        [REALTIME, lane_pool("vip", "batch", 8192, priority=5)],
        request(exact(100)),
        "vip",
        Lane.BATCH,
    ),
    (
        "equal priority prefers the interactive lane",
        [REALTIME, lane_pool("mixed", "batch", 8192)],
        request(exact(100)),
        "realtime",
        Lane.INTERACTIVE,
    ),
    (
        "a lower-priority overflow pool takes what nothing else fits",
        [REALTIME, OVERFLOW],
        request(exact(5000)),
        "overflow",
        Lane.BATCH,
    ),
]


@pytest.mark.parametrize(
    ("pools", "req", "expected", "priority"),
    [case[1:] for case in ROUTES],
    ids=[case[0] for case in ROUTES],
)
def test_routes(
    pools: list[InferencePool], req: RouteRequest, expected: str, priority: Lane
) -> None:
    decision = classify(req, pools)
    assert isinstance(decision, Route)
    assert decision.pool.name == expected
    assert decision.priority is priority


@pytest.mark.parametrize("bounds", [TokenBounds(1500, 2500), TokenBounds(100000, 140000)])
def test_straddling_or_rejecting_bounds_ask_for_an_exact_count(bounds: TokenBounds) -> None:
    assert isinstance(classify(request(bounds), SPLIT), NeedsExactCount)


def test_bounds_past_every_context_refuse_without_an_exact_count() -> None:
    decision = classify(request(TokenBounds(140000, 600000)), SPLIT)
    assert isinstance(decision, NoFit)
    assert decision.context_exceeded
    assert "at least 140000 prompt tokens" in decision.message


def test_unknown_model_lists_the_known_ones() -> None:
    decision = classify(RouteRequest("gpt-9", exact(10), None), SPLIT)
    assert isinstance(decision, UnknownModel)
    assert decision.known == ("llama",)
    assert "gpt-9" in decision.message
    assert "llama" in decision.message


def test_too_long_names_the_count_and_the_largest_cap() -> None:
    decision = classify(request(exact(140000)), SPLIT)
    assert isinstance(decision, NoFit)
    assert decision.context_exceeded
    assert (decision.prompt_tokens, decision.largest_context) == (140000, 131072)
    assert "140000" in decision.message
    assert "131072" in decision.message


def test_prompt_plus_max_tokens_over_the_cap_is_too_long() -> None:
    decision = classify(request(exact(130000), max_tokens=2000), SPLIT)
    assert isinstance(decision, NoFit)
    assert decision.context_exceeded
    assert "2000 max_tokens" in decision.message


def test_a_gap_between_ranges_is_reported_as_such() -> None:
    gapped = [REALTIME, OPEN_BATCH]
    decision = classify(request(exact(5000)), gapped)
    assert isinstance(decision, NoFit)
    assert not decision.context_exceeded
    assert "realtime (interactive) takes 0-2000" in decision.message
    assert "open-batch (batch) takes 16000-" in decision.message


# Each pool judged at its own tokenizer's count: (case, realtime's count, batch's, pool).
PER_POOL_COUNTS = [
    # The default tokenizer would say 1990 (interactive); the engines' tokenizer says 2010.
    ("the engines' count crosses the edge", exact(2010), exact(2010), "batch"),
    ("each pool's count inside its own range", exact(1990), exact(2050), "realtime"),
    # Realtime counts it over its cap, batch under its floor: neither takes it.
    ("each pool's count outside its own range", exact(2100), exact(1990), None),
]


@pytest.mark.parametrize(
    ("case", "realtime", "batch", "expected"),
    PER_POOL_COUNTS,
    ids=[c[0] for c in PER_POOL_COUNTS],
)
def test_each_pool_judged_at_its_own_count(
    case: str, realtime: TokenBounds, batch: TokenBounds, expected: str | None
) -> None:
    spanning = TokenBounds(min(realtime.low, batch.low), max(realtime.high, batch.high))
    per_pool = {REALTIME.key: realtime, BATCH.key: batch}
    decision = classify(
        RouteRequest("llama", spanning, None, None, pool_prompt_tokens=per_pool), SPLIT
    )
    if expected is None:
        # Neither pool takes it at its own count: a gap, reported with the spanning count.
        assert isinstance(decision, NoFit), case
        return
    assert isinstance(decision, Route), case
    assert decision.pool.name == expected, case


def test_per_pool_bounds_that_straddle_an_edge_ask_for_exact_counts() -> None:
    per_pool = {REALTIME.key: TokenBounds(1500, 2500), BATCH.key: exact(3000)}
    decision = classify(
        RouteRequest("llama", TokenBounds(1500, 3000), None, None, pool_prompt_tokens=per_pool),
        SPLIT,
    )
    assert isinstance(decision, NeedsExactCount)


def held(total: int, history: int, max_tokens: int | None = None) -> RouteRequest:
    """A continued response: `total` counts the stored `history` the engine prepends."""
    return RouteRequest("llama", exact(total), max_tokens, held_tokens=history)


@pytest.mark.parametrize(
    ("pool", "req", "routed"),
    [
        # Past the lane's 2000 with its history, but the new turn alone is 500 tokens.
        (REALTIME, held(3500, 3000), True),
        # A new turn of 2001 tokens is a prefill the interactive range is there to refuse.
        (WIDE_REALTIME, held(3000 + 2000, 3000), True),
        (WIDE_REALTIME, held(3000 + 2001, 3000), False),
        # The context bounds the whole: 4096 holds 3000 + 1000, not 3000 + 1000 + 200.
        (REALTIME, held(4000, 3000), True),
        (REALTIME, held(4000, 3000, max_tokens=200), False),
        # Under the batch pool's minimum of 2001: the holder still takes its own turn.
        (BATCH, held(1200, 1000), True),
    ],
)
def test_a_continued_response_is_bounded_by_its_new_tokens_and_the_context(
    pool: InferencePool, req: RouteRequest, routed: bool
) -> None:
    decision = classify(req, [pool])
    assert isinstance(decision, Route if routed else NoFit), decision
    if isinstance(decision, NoFit):
        assert str(req.prompt_tokens.high) in decision.message


def test_a_refused_continuation_names_the_range_its_history_leaves() -> None:
    decision = classify(held(3000 + 2001, 3000), [WIDE_REALTIME])
    assert isinstance(decision, NoFit)
    assert not decision.context_exceeded
    assert "takes 3000-5000" in decision.message, decision.message
