"""The state layer plugged into a gateway app: tenants, limits, shared load.

`create_app(..., shared=options)` adds it through `install(app, options)`: the tenant
middleware (401 for a missing or unknown key when a keys file is given) and, with Redis, the
shared load tracker, the shared limiter and the shared demand as background tasks. Without
Redis, limits are kept in memory. The batch room (`batch/layer.py`) goes on top, with the
Redis connection `install` returns; the state layer knows nothing of it.

The proxy asks `admit_tenant` once per request, after counting its tokens; the server tells
`announce_listening` its port, which the batch dispatcher needs to reach the batch lane.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from aiohttp import web
from aiohttp.typedefs import Handler
from redis.asyncio import Redis

from laneway.autoscale import DEMAND_PATH, DemandCount
from laneway.errors import UsageError
from laneway.gateway.errors import ApiError
from laneway.gateway.keys import (
    DEMAND,
    DEMAND_SHARE,
    INTERNAL,
    INTERNAL_SECRET,
    LIMITER,
    LOOPBACK,
    METRICS,
    REGISTRY,
    STATE_METRICS,
    TENANT,
    TENANTS,
    TRACKER,
    Loopback,
)
from laneway.gateway.lifecycle import background
from laneway.gateway.state.demand import RedisDemandShare
from laneway.gateway.state.metrics import StateMetrics
from laneway.gateway.state.redis_store import (
    DEFAULT_LEASE_S,
    RedisLoadTracker,
    RedisSettings,
    connect,
    redis_settings,
)
from laneway.gateway.state.settings import (
    FILE_TTL_S,
    MAX_FILE_BYTES,
    TENANT_BATCH_TOKENS,
    DispatchSettings,
    FileQuota,
)
from laneway.gateway.state.tenants import (
    ANONYMOUS_TENANT,
    INTERNAL_HEADER,
    TENANT_HEADER,
    InMemoryRateLimiter,
    RedisRateLimiter,
    Tenant,
    TenantKeys,
    retry_after_header,
)

TENANTS_RELOAD_S = 10.0  # how often a tenants file (a mounted Secret) is checked for changes
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/metrics", DEMAND_PATH})


@dataclass(frozen=True)
class SharedStateOptions:
    redis: RedisSettings | None = None  # None: in-memory, one replica
    tenants: TenantKeys | None = None  # None: auth off, every request is anonymous
    tenants_reload_s: float = TENANTS_RELOAD_S
    load_lease_s: float = DEFAULT_LEASE_S
    # For the batch room on top (batch/layer.py), which the same flags configure.
    dispatch: DispatchSettings = field(default_factory=DispatchSettings)
    max_file_bytes: int = MAX_FILE_BYTES
    file_quota: FileQuota = field(default_factory=FileQuota)
    file_ttl_s: int = FILE_TTL_S
    batch_tokens: int = TENANT_BATCH_TOKENS


@dataclass(frozen=True)
class SharedRedis:
    """The Redis connection the state layer opened, for the rooms built on it."""

    client: Redis
    prefix: str  # every key's
    replica: str  # this gateway replica's name among those sharing the Redis


def install(app: web.Application, options: SharedStateOptions) -> SharedRedis | None:
    """Add the state layer; the Redis connection it opened, None without Redis."""
    app[INTERNAL_SECRET] = secrets.token_urlsafe(24)
    app[LOOPBACK] = Loopback()
    app[STATE_METRICS] = metrics = StateMetrics(app[METRICS].registry)
    if options.tenants is not None:
        app[TENANTS] = options.tenants
        app.cleanup_ctx.append(_reload_tenants(options.tenants, options.tenants_reload_s))
    app.middlewares.append(tenant_middleware)
    if options.redis is None:
        app[LIMITER] = InMemoryRateLimiter()
        return None
    redis = connect(options.redis)
    prefix = options.redis.prefix
    tracker = RedisLoadTracker(redis, prefix, lease_s=options.load_lease_s)
    app[TRACKER] = tracker
    metrics.watch_redis(lambda: tracker.shared)
    app[LIMITER] = RedisRateLimiter(redis, prefix)
    app[DEMAND_SHARE] = RedisDemandShare(redis, prefix, tracker.replica, lambda: _local_demand(app))
    app.cleanup_ctx.append(_background(redis, tracker))
    return SharedRedis(client=redis, prefix=prefix, replica=tracker.replica)


def _reload_tenants(
    keys: TenantKeys, every_s: float
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def run(app: web.Application) -> AsyncIterator[None]:
        async def watch() -> None:
            while True:
                await asyncio.sleep(every_s)
                await asyncio.to_thread(keys.refresh)

        task = asyncio.create_task(watch(), name="tenant-keys")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return run


def _local_demand(app: web.Application) -> dict[str, DemandCount]:
    return app[DEMAND].snapshot([pool.key for pool in app[REGISTRY].pools()])


def announce_listening(app: web.Application, host: str, port: int) -> None:
    if LOOPBACK in app:
        local = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        app[LOOPBACK].url = f"http://{local}:{port}"


def _background(
    redis: Redis, tracker: RedisLoadTracker
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def run(app: web.Application) -> AsyncIterator[None]:
        tasks = [
            asyncio.create_task(tracker.run(), name="load-heartbeat"),
            asyncio.create_task(app[DEMAND_SHARE].run(), name="demand-publish"),
        ]
        async with background(*tasks):
            yield
        await tracker.leave()
        await app[DEMAND_SHARE].leave()
        await redis.aclose()

    return run


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

    Both HTTP shells call it: the tenant middleware for aiohttp's routes, and the gateway's
    own server for the completion routes (`gateway/serving/server.py`).
    """
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
    return None if tenant is None else Caller(tenant, internal=request.get(INTERNAL, False))


def _named(app: web.Application, name: str) -> Tenant:
    known = app[TENANTS].directory.named(name) if TENANTS in app else None
    return known or (Tenant(name) if name else ANONYMOUS_TENANT)


def tenant_name(caller: Caller | None) -> str:
    """Whose request this is, for fair share in the batch lane."""
    return ANONYMOUS_TENANT.name if caller is None else caller.tenant.name


def routing_tenant(caller: Caller | None) -> str | None:
    """The tenant whose pools the request may use; None when it is not authenticated."""
    if caller is None or caller.tenant is ANONYMOUS_TENANT:
        return None
    return caller.tenant.name


async def admit_tenant(app: web.Application, caller: Caller | None, tokens: int) -> None:
    """Charge the tenant's per-minute limits; ApiError 429 with Retry-After when over."""
    limiter = app.get(LIMITER)
    if limiter is None or caller is None or caller.internal:
        return
    tenant = caller.tenant
    decision = await limiter.admit(tenant, tokens)
    if decision.allowed:
        return
    reason = "too_large" if decision.never else decision.exceeded
    app[STATE_METRICS].refused.labels(tenant.name, reason).inc()
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


def options_from_args(args: argparse.Namespace) -> SharedStateOptions:
    """UsageError naming the flag when a value cannot work."""
    if args.batch_concurrency < 1:
        raise UsageError(f"--batch-concurrency must be at least 1, got {args.batch_concurrency}")
    if args.batch_lease < 1:
        raise UsageError(f"--batch-lease must be at least 1 second, got {args.batch_lease:g}")
    for flag, value in (
        ("--max-file-bytes", args.max_file_bytes),
        ("--tenant-files", args.tenant_files),
        ("--tenant-file-bytes", args.tenant_file_bytes),
        ("--file-ttl", args.file_ttl),
        ("--tenant-batch-tokens", args.tenant_batch_tokens),
    ):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    return SharedStateOptions(
        redis=redis_settings(args.redis_url),
        tenants=TenantKeys(args.tenants) if args.tenants else None,
        dispatch=DispatchSettings(concurrency=args.batch_concurrency, lease_s=args.batch_lease),
        max_file_bytes=args.max_file_bytes,
        file_quota=FileQuota(files=args.tenant_files, bytes=args.tenant_file_bytes),
        file_ttl_s=args.file_ttl,
        batch_tokens=args.tenant_batch_tokens,
        # A replica's load outlives it by one lease; batch items wait as long.
        load_lease_s=min(DEFAULT_LEASE_S, args.batch_lease),
    )
