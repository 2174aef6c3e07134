"""Who asks: the tenant an API key names, or the batch dispatcher asking for a tenant.

The tenant middleware identifies every request but the open paths (401 for a missing or
unknown key when a keys file is given); the proxy charges the tenant's limits once per request,
after counting its tokens (`TenantLimits.admit`), and routes by `routing_tenant`.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web
from aiohttp.typedefs import Handler

from laneway.gateway.errors import ApiError
from laneway.gateway.keys import (
    INTERNAL,
    INTERNAL_SECRET,
    LIMITER,
    STATE_METRICS,
    TENANT,
    TENANTS,
)
from laneway.gateway.state.metrics import StateMetrics
from laneway.gateway.state.tenants import (
    ANONYMOUS_TENANT,
    INTERNAL_HEADER,
    TENANT_HEADER,
    RateLimiter,
    Tenant,
    retry_after_header,
)
from laneway.routing.fairshare import NO_CAPS, TenantCaps

# Demand is not among them: it lists tenant-private pools and their load (it is open on the
# metrics port instead).
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def _same_secret(given: str, secret: str) -> bool:
    # compare_digest refuses non-ASCII str, and any header a client sends must get a 401.
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), secret.encode())


@dataclass(frozen=True)
class Caller:
    """Who is asking: the key's tenant, or the dispatcher asking for a tenant's batch item."""

    tenant: Tenant
    internal: bool = False  # the dispatcher's own call: paced by it, not by per-minute limits


def identify(app: web.Application, header: Callable[[str], str | None]) -> Caller | None:
    """The caller of a request whose header `header` reads (by lower-case name); None when
    the state layer is not installed. ApiError 401 without a valid key when auth is on.

    A header sent twice is read as aiohttp's `headers.get` reads it: by its first value.
    """
    # `app.get`, not `in`: a key an aiohttp app lacks costs a KeyError raised and caught.
    secret = app.get(INTERNAL_SECRET)
    if secret is None:
        return None
    internal = header(INTERNAL_HEADER)
    if internal is not None and _same_secret(internal, secret):
        return Caller(_named(app, header(TENANT_HEADER) or ""), internal=True)
    tenants = app.get(TENANTS)
    if tenants is None:
        return Caller(ANONYMOUS_TENANT)
    authorization = header("authorization")
    tenant = tenants.directory.authenticate(authorization)
    if tenant is None:
        app[STATE_METRICS].refused.labels("", "unauthenticated").inc()
        raise ApiError(
            401,
            "Incorrect API key provided"
            if authorization
            else "You didn't provide an API key: send it as 'Authorization: Bearer KEY'",
            "invalid_api_key",
        )
    return Caller(tenant)


@web.middleware
async def tenant_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Who is asking, for aiohttp's routes: `identify`'s answer on the request."""
    if request.path in OPEN_PATHS:
        return await handler(request)
    caller = identify(request.app, request.headers.get)
    assert caller is not None  # the middleware is installed with the state layer
    request[TENANT] = caller.tenant
    if caller.internal:
        request[INTERNAL] = True
    return await handler(request)


def caller_of(request: web.Request) -> Caller | None:
    """The caller the tenant middleware found; None when the state layer is not installed."""
    tenant = request.get(TENANT)
    return None if tenant is None else Caller(tenant, request.get(INTERNAL, False))


def _named(app: web.Application, name: str) -> Tenant:
    known = app[TENANTS].directory.named(name) if TENANTS in app else None
    return known or (Tenant(name) if name else ANONYMOUS_TENANT)


def tenant_name(caller: Caller | None) -> str:
    """Whose request this is, for fair share in the batch lane."""
    return ANONYMOUS_TENANT.name if caller is None else caller.tenant.name


def tenant_caps(caller: Caller | None) -> TenantCaps:
    """The tenant's caps per pool; none for the batch dispatcher's own calls, which it paces
    itself (`--batch-concurrency`), as it does for the per-minute limits."""
    return NO_CAPS if caller is None or caller.internal else caller.tenant.caps


def tenant_priority(caller: Caller | None) -> int:
    """The tenant's `priority` level (lower first); 0 without a tenant."""
    return 0 if caller is None else caller.tenant.priority


def routing_tenant(caller: Caller | None) -> str | None:
    """The tenant whose pools the request may use; None when it is not authenticated."""
    if caller is None or caller.tenant is ANONYMOUS_TENANT:
        return None
    return caller.tenant.name


@dataclass(frozen=True)
class TenantLimits:
    """The tenants' per-minute limits, as the state layer installed them."""

    limiter: RateLimiter
    metrics: StateMetrics

    @classmethod
    def of(cls, app: web.Application) -> TenantLimits | None:
        """The app's limits; None where the state layer is not installed."""
        limiter, metrics = app.get(LIMITER), app.get(STATE_METRICS)
        return None if limiter is None or metrics is None else cls(limiter, metrics)

    async def admit(self, caller: Caller | None, tokens: int) -> None:
        """Charge the tenant's per-minute limits; ApiError 429 with Retry-After when over."""
        if caller is None or caller.internal:
            return
        tenant = caller.tenant
        decision = await self.limiter.admit(tenant, tokens)
        if decision.allowed:
            return
        reason = "too_large" if decision.never else decision.exceeded
        self.metrics.refused.labels(tenant.name, reason).inc()
        if decision.never:
            raise ApiError(
                429,
                f"This request needs {tokens} tokens, more than tenant {tenant.name}'s whole "
                f"limit of {tenant.tokens_per_minute} tokens per minute; make it smaller",
                "tokens_exceed_limit",
            )
        limit = (
            f"{tenant.requests_per_minute} requests"
            if decision.exceeded == "requests"
            else f"{tenant.tokens_per_minute} tokens"
        )
        raise ApiError(
            429,
            f"Rate limit reached for tenant {tenant.name}: {limit} per minute; "
            f"retry after {retry_after_header(decision)} s",
            "rate_limit_exceeded",
            retry_after=int(retry_after_header(decision)),
        )
