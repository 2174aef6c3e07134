"""Endpoint picking: weighted scorers rank the candidates; ties break at random.

Pure: the caller passes the cycle (`cycle.py`) and a seeded `random.Random`. The ranking,
not just the winner, is returned so a request that fails before its first byte can retry
on the next one.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from laneway.routing.cycle import CACHED_PROMPT_TOKENS, CycleState, DataKey
from laneway.routing.prefix_index import PrefixSettings
from laneway.routing.scorers import SCORERS, Scorer

PICKING_POLICIES = ("scored", "random")
SCORER_NAMES = tuple(SCORERS)


@dataclass(frozen=True)
class PickingSettings:
    """The GatewayConfig's `spec.picking`: what the gateway and the virtual runner rank by."""

    policy: str = "scored"  # "scored": weighted scorers; "random": uniform (a baseline)
    # scorer name -> weight; a scorer with weight 0 is off
    weights: Mapping[str, int] = field(
        default_factory=lambda: {
            "queueDepth": 2,
            "kvCacheUsage": 1,
            "inFlightRequests": 2,
            "prefillTokens": 2,
            "ttftSlo": 2,
            "prefixAffinity": 6,
            "sessionHash": 0,  # session stickiness, blind to load: a baseline, off
        }
    )
    # The prefix index behind the prefixAffinity scorer (laneway/routing/prefix_index.py).
    prefix: PrefixSettings = field(default_factory=PrefixSettings)

    def profile(self) -> tuple[WeightedScorer, ...]:
        return scorers_from_weights(self.policy, self.weights)


@dataclass(frozen=True)
class WeightedScorer:
    name: str
    scorer: Scorer
    weight: int


def scorers_from_weights(policy: str, weights: Mapping[str, int]) -> tuple[WeightedScorer, ...]:
    """The configured profile; the "random" policy scores nothing, so every pick is a tie."""
    if policy == "random":
        return ()
    return tuple(
        WeightedScorer(name=name, scorer=SCORERS[name], weight=weight)
        for name, weight in weights.items()
        if weight
    )


def needs_of(profile: Sequence[WeightedScorer]) -> frozenset[DataKey[Any]]:
    """Every datum the profile's scorers read."""
    return frozenset().union(*(weighted.scorer.needs for weighted in profile))


def wants_prefix_blocks(profile: Sequence[WeightedScorer]) -> bool:
    """Whether a scorer reads what the prefix index holds of the prompt: only then is the
    prompt cut into prefix blocks (hashing them is the cost)."""
    return CACHED_PROMPT_TOKENS in needs_of(profile)


def rank(
    cycle: CycleState, profile: Sequence[WeightedScorer], rng: random.Random
) -> tuple[list[int], list[float]]:
    """The candidates' positions best first (ties in random order), and each position's
    score: the weighted mean of the scorers, in [0, 1]."""
    total_weight = sum(s.weight for s in profile)
    if total_weight:
        # Each scorer's column once, then one weighted sum per endpoint.
        columns = [weighted.scorer.scores(cycle) for weighted in profile]
        weights = [float(weighted.weight) for weighted in profile]
        scores = [
            sum(map(float.__mul__, weights, row)) / total_weight
            for row in zip(*columns, strict=True)
        ]
    else:
        scores = [1.0] * len(cycle)
    # Shuffle, then a stable sort: equal scores end up in random order. The positions are
    # shuffled, not the results, so the draws from `rng` depend on the count alone.
    order = list(range(len(cycle)))
    rng.shuffle(order)
    order.sort(key=scores.__getitem__, reverse=True)
    return order, scores
