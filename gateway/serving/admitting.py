"""A routed request's slot in its pool: the ledger admits it, queues it or refuses it; a
queued one waits here, up to the queue's limit, for the change that admits or refuses it."""

from __future__ import annotations

import asyncio

from laneway.api import InferencePool
from laneway.gateway.errors import ApiError
from laneway.gateway.serving.context import RequestPath
from laneway.gateway.serving.outcome import Outcome
from laneway.gateway.wakes import LineRefused
from laneway.ledger import Admission, Admitted, Refused


async def admit(path: RequestPath, ask: Admission, outcome: Outcome) -> Admitted:
    """The request's slot; ApiError 429 or 503 (with Retry-After) when it gets none."""
    ledger = path.ledger
    decision = ledger.admit(path.clock(), ask)
    outcome.ticket = decision.ticket
    if isinstance(decision, Admitted):
        return decision
    pool = ask.route.pool
    if isinstance(decision, Refused):
        raise refusal(path, pool, decision, waited_ms=None)
    limit_ms = path.settings.queue.wait_limit_millis(bool(pool.endpoints))
    try:
        async with asyncio.timeout(limit_ms / 1000):
            return await path.waiters.wait(decision.ticket)
    except TimeoutError:
        withdrawn = ledger.withdraw(decision.ticket, path.clock())
        path.wake(withdrawn.wakes)
        raise refusal(path, pool, withdrawn.refused, limit_ms) from None
    except LineRefused as refused:
        raise refusal(path, pool, refused.refused, limit_ms) from None


def refusal(
    path: RequestPath, pool: InferencePool, refused: Refused, waited_ms: int | None
) -> ApiError:
    """Why `pool` has no slot for the request, said to its client; `waited_ms` is how long it
    waited in line (None: it was refused without joining)."""
    reason, gate = refused.reason, refused.gate
    if reason == "timeout":
        now = path.ledger.current(pool)
        if now is not None and not now.endpoints:
            why = f"no replica is ready (scaled to zero or starting) after {waited_ms} ms"
            return no_endpoint(path, pool, why)
        why = f"no slot freed within {waited_ms} ms"
    elif reason == "pool_removed":
        when = "was routed" if waited_ms is None else "waited"
        return no_endpoint(path, pool, f"the pool was removed while the request {when}")
    elif reason == "all_ejected":
        return no_endpoint(path, pool, "every endpoint is ejected")
    elif reason == "shutting_down":
        return ApiError(
            503,
            f"This gateway replica is shutting down before pool {pool.name} had a free slot; "
            "retry, and another replica will take the request",
            "gateway_draining",
            retry_after=path.settings.queue.retry_after_seconds,
        )
    else:
        why = f"the line is full ({gate.waiting} waiting)"
    return ApiError(
        429,
        f"Pool {pool.name} is saturated ({gate.active} requests running): {why}; retry later",
        "pool_saturated",
        retry_after=path.settings.queue.retry_after_seconds,
    )


def no_endpoint(path: RequestPath, pool: InferencePool, why: str) -> ApiError:
    return ApiError(
        503,
        f"No healthy endpoint in pool {pool.name}: {why}",
        "no_healthy_endpoint",
        retry_after=path.settings.queue.retry_after_seconds,
    )
