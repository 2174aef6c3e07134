"""Lane classification: which pool takes a request, decided from token bounds where they can.

Each pool takes prompts in an interval of token counts: from `routing.minPromptTokens` up to
the smaller of `routing.maxPromptTokens` and `maxContextTokens` less the completion reserve.
Over a range of possible counts [low, high], a pool's eligibility is settled when the range
lies wholly inside or wholly outside its interval; when every candidate is settled the bounds
decide, and otherwise the caller counts exactly and asks again.

Selection among eligible pools: a lane pinned by the `x-laneway-lane` header first (where the
pool allows it; the pin lifts the pool's minimum but never its maximum, so a long prompt can
never be pinned into a short-context interactive pool), then higher `routing.priority`, then
the interactive lane, then the name, so the choice is deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from laneway.api import InferencePool, Lane
from laneway.tokens import TokenBounds


@dataclass(frozen=True)
class RouteRequest:
    model: str
    prompt_tokens: TokenBounds
    max_tokens: int | None  # the request's completion cap; None: the engine decides
    pinned_lane: Lane | None = None  # from the x-laneway-lane header


@dataclass(frozen=True)
class Route:
    pool: InferencePool
    # The queue class: the pinned lane when the header was honoured, else the pool's lane.
    priority: Lane

    @property
    def lane(self) -> Lane:
        return self.pool.spec.lane


@dataclass(frozen=True)
class UnknownModel:
    model: str
    known: tuple[str, ...]

    @property
    def message(self) -> str:
        known = ", ".join(self.known) or "none"
        return f"The model {self.model!r} does not exist; models served here: {known}"


@dataclass(frozen=True)
class NoFit:
    prompt_tokens: int
    largest_context: int  # the largest maxContextTokens among the model's pools
    message: str
    context_exceeded: bool  # True: no pool's context holds it; False: a gap between ranges


@dataclass(frozen=True)
class NeedsExactCount:
    """The bounds straddle a pool's interval edge: count the prompt and classify again."""


Decision = Route | UnknownModel | NoFit | NeedsExactCount


def completion_reserve(max_tokens: int | None) -> int:
    # Without max_tokens an engine generates up to its context; one token must still fit.
    return max(max_tokens or 1, 1)


def prompt_interval(pool: InferencePool, max_tokens: int | None, pinned: bool) -> range:
    """The prompt token counts this pool takes, as a range (empty when none)."""
    spec = pool.spec
    highest = min(
        spec.max_prompt_tokens, spec.limits.max_context_tokens - completion_reserve(max_tokens)
    )
    lowest = 0 if pinned else spec.routing.min_prompt_tokens
    return range(lowest, highest + 1)


def _settled(interval: range, bounds: TokenBounds) -> bool | None:
    """True/False when the whole bounds range is inside/outside the interval, else None."""
    inside_low, inside_high = bounds.low in interval, bounds.high in interval
    if inside_low and inside_high:
        return True
    if bounds.high < interval.start or bounds.low >= interval.stop:
        return False
    return None


def classify(request: RouteRequest, pools: Sequence[InferencePool]) -> Decision:
    candidates = [p for p in pools if request.model in p.spec.public_models]
    if not candidates:
        known = sorted({m for p in pools for m in p.spec.public_models})
        return UnknownModel(request.model, tuple(known))

    eligible: list[tuple[InferencePool, bool]] = []  # (pool, admitted through the pin)
    for pool in candidates:
        pinnable = request.pinned_lane is pool.spec.lane and pool.spec.routing.allow_lane_header
        fits = _settled(prompt_interval(pool, request.max_tokens, pinnable), request.prompt_tokens)
        if fits is None:
            return NeedsExactCount()
        if fits:
            eligible.append((pool, pinnable))

    if not eligible:
        if not request.prompt_tokens.exact:
            return NeedsExactCount()  # the error message names the exact count
        return _no_fit(request, candidates)

    pinned = [pool for pool, through_pin in eligible if through_pin]
    if pinned:
        return Route(min(pinned, key=_preference), priority=pinned[0].spec.lane)
    best = min((pool for pool, _ in eligible), key=_preference)
    return Route(best, priority=best.spec.lane)


def _preference(pool: InferencePool) -> tuple[int, bool, str]:
    return (-pool.spec.routing.priority, pool.spec.lane is not Lane.INTERACTIVE, pool.key)


def _no_fit(request: RouteRequest, candidates: Sequence[InferencePool]) -> NoFit:
    tokens = request.prompt_tokens.high
    reserve = completion_reserve(request.max_tokens)
    largest = max(p.spec.limits.max_context_tokens for p in candidates)
    if tokens + reserve > largest:
        wanted = f"{tokens} prompt tokens" + (
            f" + {request.max_tokens} max_tokens" if request.max_tokens else ""
        )
        return NoFit(
            tokens,
            largest,
            f"This model's maximum context length is {largest} tokens. However, you requested "
            f"{wanted} ({tokens + reserve} in total). Please reduce the length of the prompt "
            "or max_tokens.",
            context_exceeded=True,
        )
    ranges = ", ".join(
        f"{p.key} ({p.spec.lane}) takes {iv.start}-{iv.stop - 1}"
        for p in sorted(candidates, key=_preference)
        for iv in [prompt_interval(p, request.max_tokens, pinned=False)]
    )
    return NoFit(
        tokens,
        largest,
        f"No pool serving {request.model!r} routes a prompt of {tokens} tokens with "
        f"max_tokens {reserve}: {ranges}",
        context_exceeded=False,
    )
