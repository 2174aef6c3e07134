"""A routed request's slot in its pool: the ledger admits it, queues it or refuses it; a
queued one waits here, up to the queue's limit, for the change that admits or refuses it.

A tenant with caps has its requests on the other replicas read first (with Redis), so its
caps hold over all of them."""

from __future__ import annotations

import asyncio

from laneway.api import InferencePool
from laneway.gateway.errors import ApiError
from laneway.gateway.serving.context import RequestPath
from laneway.gateway.serving.outcome import Outcome
from laneway.gateway.wakes import LineRefused
from laneway.ledger import Admission, Admitted, Queued, Refused, Ticket
from laneway.ledger.tenants import Held
from laneway.routing.fairshare import NO_CAPS


async def admit(path: RequestPath, ask: Admission, outcome: Outcome) -> Admitted:
    """The request's slot; ApiError 429 or 503 (with Retry-After) when it gets none."""
    ledger = path.ledger
    pool = ask.route.pool
    if path.tenant_share is not None and ask.caps != NO_CAPS:
        peers = await path.tenant_share.peers([(pool.key, ask.tenant)])
        path.wake(ledger.set_peer_tenants(path.clock(), peers))
    decision = ledger.admit(path.clock(), ask)
    outcome.ticket = decision.ticket
    line = None
    if isinstance(decision, Queued):
        path.wake(decision.wakes)  # the request whose place it took is told why
        # Waited for before the rebalance, which may take a lent replica back for it.
        line = path.waiters.wait(decision.ticket)
    path.demand_changed()
    path.load_changed()
    if isinstance(decision, Admitted):
        return decision
    if isinstance(decision, Refused):
        raise refusal(path, ask, decision, waited_ms=None)
    assert line is not None
    return await wait_in_line(path, ask, decision.ticket, line)


async def wait_in_line(
    path: RequestPath, ask: Admission, ticket: Ticket, line: asyncio.Future[Admitted]
) -> Admitted:
    """The queued request's slot once `line` (its waiter) resolves; ApiError when its wait
    runs out or the line refuses it. A request taken off a reclaimed replica waits here too."""
    pool = ask.route.pool
    limit_ms = path.settings.queue.wait_limit_millis(bool(pool.endpoints))
    try:
        async with asyncio.timeout(limit_ms / 1000):
            return await line
    except TimeoutError:
        held = path.ledger.held_in_line(ticket)  # asked while it is still in line
        withdrawn = path.ledger.withdraw(ticket, path.clock())
        path.wake(withdrawn.wakes)
        raise refusal(path, ask, withdrawn.refused, limit_ms, held) from None
    except LineRefused as refused:
        raise refusal(path, ask, refused.refused, limit_ms) from None


def refusal(
    path: RequestPath,
    ask: Admission,
    refused: Refused,
    waited_ms: int | None,
    held: Held | None = None,
) -> ApiError:
    """Why the request's pool has no slot for it, said to its client; `waited_ms` is how long
    it waited in line (None: it was refused without joining), `held` which of its tenant's
    caps held it there when its wait ran out."""
    pool = ask.route.pool
    reason, gate = refused.reason, refused.gate
    if reason in ("tenant_queue_full", "line_share"):
        return _tenant_refusal(path, ask, reason, waited_ms)
    if reason == "timeout" and held is not None:
        return _tenant_refusal(path, ask, held, waited_ms)
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


def _tenant_refusal(
    path: RequestPath, ask: Admission, reason: str, waited_ms: int | None
) -> ApiError:
    """A refusal that the tenant's own requests caused: its message names the tenant's limit.
    `reason`: the ledger's, or the cap that held it in line until its wait ran out."""
    pool, tenant, caps = ask.route.pool, ask.tenant, ask.caps
    count = path.ledger.tenant_count(pool, tenant)
    replicas = path.ledger.cap_replicas
    # Beside other replicas each keeps to its part of a cap (`laneway.ledger.tenants`).
    parts = f" (each of {replicas} gateway replicas keeps to its part)" if replicas > 1 else ""
    if reason == "tenant_queue_full":
        why = (
            f"it has {count.waiting} requests waiting for pool {pool.name}, its limit "
            f"maxQueuedRequests={caps.max_waiting}"
        )
        code = "tenant_queue_full"
    elif reason == "line_share":
        why = (
            f"pool {pool.name}'s line is full and tenant {tenant} held more than an equal "
            "share of it, so this request gave its place to another tenant's"
        )
        code = "tenant_line_share"
    elif reason == "running_tokens" and not count.running:
        # Held with none running: its prompt runs only alone, and beside other replicas
        # that waits for the tenant's lease in the pool (`laneway.ledger.tenants`).
        why = (
            f"it runs none in pool {pool.name}, but its next request in line is past its "
            f"limit maxConcurrentPromptTokens={caps.max_running_tokens}, so it runs only "
            f"alone, one at a time over the {replicas} gateway replicas, and its turn did "
            f"not come within {waited_ms} ms (this one: {ask.route.prefill_tokens} prompt "
            "tokens)"
        )
        code = "tenant_prompt_tokens_exceeded"
    elif reason == "running_tokens":
        why = (
            f"its {count.running} requests running in pool {pool.name} hold "
            f"{count.running_tokens} prompt tokens, its limit maxConcurrentPromptTokens="
            f"{caps.max_running_tokens}{parts}, and its next request in line did not fit "
            f"within {waited_ms} ms (this one: {ask.route.prefill_tokens} prompt tokens)"
        )
        code = "tenant_prompt_tokens_exceeded"
    else:
        why = (
            f"it has {count.running} requests running in pool {pool.name}, its limit "
            f"maxConcurrentRequests={caps.max_running}{parts}, and none ended within "
            f"{waited_ms} ms"
        )
        code = "tenant_concurrency_exceeded"
    return ApiError(
        429,
        f"Concurrency limit reached for tenant {tenant}: {why}; retry later",
        code,
        retry_after=path.settings.queue.retry_after_seconds,
    )


def no_endpoint(path: RequestPath, pool: InferencePool, why: str) -> ApiError:
    return ApiError(
        503,
        f"No healthy endpoint in pool {pool.name}: {why}",
        "no_healthy_endpoint",
        retry_after=path.settings.queue.retry_after_seconds,
    )
