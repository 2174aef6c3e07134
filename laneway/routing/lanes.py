"""Lane classification: which pool takes a request, decided from token bounds where they can.

Each pool takes prompts in an interval of token counts: from `routing.minPromptTokens` up to
the smaller of `routing.maxPromptTokens` and `maxContextTokens` less the completion reserve.
Over a range of possible counts [low, high], a pool's eligibility is settled when the range
lies wholly inside or wholly outside its interval; when every candidate is settled the bounds
decide, and otherwise the caller counts exactly and asks again.

Tenants: a pool whose `routing.tenants` names tenants serves only them; the others, open to
everyone, serve every request. A request without a tenant (no API key) sees only the open
pools, so a model served only by another tenant's pools is unknown to it.

Selection among eligible pools: a lane pinned by the `x-laneway-lane` header first (where the
pool allows it; the pin lifts the pool's minimum but never its maximum, so a long prompt can
never be pinned into a short-context interactive pool), then the tenant's own pools over the
open ones (a tenant whose pools do not fit the request falls back to the open pools), then
higher `routing.priority`, then the interactive lane, then the name, so the choice is
deterministic.

The queue class (the gateway's line and the engine's priority level) is the pool's lane,
except that a request asking for the batch lane is batch wherever it lands: a later place is
anyone's to ask for (as a client's own `priority` may only be lowered), so a pool that does
not honour the pin still puts the request behind its chat. Asking for the interactive lane
never raises a batch pool's request.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from laneway.api import InferencePool, Lane
from laneway.tokens import TokenBounds


@dataclass(frozen=True)
class RouteRequest:
    model: str
    prompt_tokens: TokenBounds
    max_tokens: int | None  # the request's completion cap; None: the engine decides
    pinned_lane: Lane | None = None  # from the x-laneway-lane header
    tenant: str | None = None  # the API key's tenant; None: unauthenticated
    # Pools that count with a tokenizer of their own: pool key -> the count as it counts.
    # `prompt_tokens` then spans them all (it names the count in a NoFit message).
    pool_prompt_tokens: Mapping[str, TokenBounds] | None = None
    # A continued response's stored history, which the engine prepends: it is part of the
    # counts above, and of the context, but not of the new work the lane's range bounds.
    held_tokens: int = 0

    def prompt_tokens_for(self, pool: InferencePool) -> TokenBounds:
        if self.pool_prompt_tokens is None:
            return self.prompt_tokens
        return self.pool_prompt_tokens.get(pool.key, self.prompt_tokens)

    @property
    def exact(self) -> bool:
        if self.pool_prompt_tokens is None:
            return self.prompt_tokens.exact
        return all(b.exact for b in self.pool_prompt_tokens.values())


@dataclass(frozen=True)
class Route:
    pool: InferencePool
    # The queue class: the pool's lane, or batch for a request that asked for the batch lane.
    priority: Lane
    prompt_tokens: TokenBounds  # what the decision was made on
    # The prompt tokens the request adds to an endpoint's prefill backlog, estimated once:
    # the exact count where known, else a guess within the bounds.
    prefill_tokens: int
    reason: str  # why this pool, for the request's log line

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


def prompt_interval(
    pool: InferencePool, max_tokens: int | None, pinned: bool, held_tokens: int = 0
) -> range:
    """The prompt token counts this pool takes, as a range (empty when none)."""
    spec = pool.spec
    context_room = spec.limits.max_context_tokens - completion_reserve(max_tokens)
    if held_tokens:
        # A continued response can go only to its holder: refusing it for the lane's lower
        # bound would end the conversation. Only the new tokens are the prefill the lane's
        # range is there to bound (the holder's prefix cache has the history, unless
        # evicted); the context bounds the whole.
        return range(held_tokens, min(spec.max_prompt_tokens + held_tokens, context_room) + 1)
    highest = min(spec.max_prompt_tokens, context_room)
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


def serves_tenant(pool: InferencePool, tenant: str | None) -> bool:
    """Open pools serve everyone; a pool naming tenants serves only an authenticated one of them."""
    named = pool.spec.routing.tenants
    return not named or (tenant is not None and tenant in named)


def prefill_estimate(bounds: TokenBounds) -> int:
    """The prompt tokens to account for before the exact count is known."""
    # Prose runs about four bytes per token; the bounds keep the guess honest elsewhere.
    return min(max(bounds.low, bounds.high // 4), bounds.high)


@dataclass(frozen=True)
class _Eligible:
    pool: InferencePool
    through_pin: bool  # admitted because the header pinned its lane
    own: bool  # the pool names the request's tenant

    @property
    def rank(self) -> tuple[bool, bool, int, bool, str]:
        spec = self.pool.spec
        return (
            not self.through_pin,
            not self.own,
            -spec.routing.priority,
            spec.lane is not Lane.INTERACTIVE,
            self.pool.key,
        )


def classify(request: RouteRequest, pools: Sequence[InferencePool]) -> Decision:
    model, tenant = request.model, request.tenant
    candidates = [p for p in pools if model in p.spec.public_models and serves_tenant(p, tenant)]
    if not candidates:
        visible = [p for p in pools if serves_tenant(p, tenant)]
        known = sorted({m for p in visible for m in p.spec.public_models})
        return UnknownModel(model=model, known=tuple(known))

    eligible: list[_Eligible] = []
    for pool in candidates:
        pinnable = request.pinned_lane is pool.spec.lane and pool.spec.routing.allow_lane_header
        interval = prompt_interval(pool, request.max_tokens, pinnable, request.held_tokens)
        fits = _settled(interval, request.prompt_tokens_for(pool))
        if fits is None:
            return NeedsExactCount()
        if fits:
            own = bool(pool.spec.routing.tenants)
            eligible.append(_Eligible(pool=pool, through_pin=pinnable, own=own))

    if not eligible:
        # The error message names the exact count, unless even the lower bound cannot fit:
        # then counting megabytes of text would only make the refusal slower.
        if not request.exact and not _surely_too_long(request, candidates):
            return NeedsExactCount()
        return _no_fit(request, candidates)

    best = eligible[0] if len(eligible) == 1 else min(eligible, key=lambda e: e.rank)
    bounds = request.prompt_tokens_for(best.pool)
    return Route(
        pool=best.pool,
        priority=_queue_class(best.pool, request.pinned_lane),
        prompt_tokens=bounds,
        prefill_tokens=prefill_estimate(bounds),
        reason=_reason(best, eligible, request),
    )


def _queue_class(pool: InferencePool, pinned: Lane | None) -> Lane:
    """The pool's lane, lowered to batch where the request asked for the batch lane."""
    return Lane.BATCH if pinned is Lane.BATCH else pool.spec.lane


def _reason(best: _Eligible, eligible: Sequence[_Eligible], request: RouteRequest) -> str:
    if best.through_pin:
        return f"lane {best.pool.spec.lane.value} pinned by the x-laneway-lane header"
    if best.own:
        return f"a pool of tenant {request.tenant}"
    if len(eligible) == 1:
        return "the only pool whose prompt range holds the request"
    return f"first by priority, lane and name among {len(eligible)} pools that fit"


def _preference(pool: InferencePool) -> tuple[int, bool, str]:
    return (-pool.spec.routing.priority, pool.spec.lane is not Lane.INTERACTIVE, pool.key)


def _surely_too_long(request: RouteRequest, candidates: Sequence[InferencePool]) -> bool:
    largest = max(p.spec.limits.max_context_tokens for p in candidates)
    return request.prompt_tokens.low + completion_reserve(request.max_tokens) > largest


def _no_fit(request: RouteRequest, candidates: Sequence[InferencePool]) -> NoFit:
    bounds = request.prompt_tokens
    tokens = bounds.high if bounds.exact else bounds.low
    reserve = completion_reserve(request.max_tokens)
    largest = max(p.spec.limits.max_context_tokens for p in candidates)
    if tokens + reserve > largest:
        at_least = "" if bounds.exact else "at least "
        wanted = f"{at_least}{tokens} prompt tokens" + (
            f" + {request.max_tokens} max_tokens" if request.max_tokens else ""
        )
        return NoFit(
            prompt_tokens=tokens,
            largest_context=largest,
            message=f"This model's maximum context length is {largest} tokens. However, you "
            f"requested {wanted} ({tokens + reserve} in total). Please reduce the length of the "
            "prompt or max_tokens.",
            context_exceeded=True,
        )
    ranges = ", ".join(
        f"{p.key} ({p.spec.lane}) takes {iv.start}-{iv.stop - 1}"
        for p in sorted(candidates, key=_preference)
        for iv in [prompt_interval(p, request.max_tokens, False, request.held_tokens)]
    )
    return NoFit(
        prompt_tokens=tokens,
        largest_context=largest,
        message=f"No pool serving {request.model!r} routes a prompt of {tokens} tokens with "
        f"max_tokens {reserve}: {ranges}",
        context_exceeded=False,
    )
