"""The state layer plugged into a gateway app: tenants, limits, shared load.

`create_app(..., shared=options)` adds it through `install(app, options)`: the tenant
middleware (401 for a missing or unknown key when a keys file is given) and, with Redis, the
shared endpoint load, the shared limiter and the shared demand as background tasks. Without
Redis, limits are kept in memory. The batch room (`batch/layer.py`) goes on top, with the
Redis connection `install` returns; the state layer knows nothing of it.

Who asks is `state/callers.py`'s; the server tells `announce_listening` its port, which the
batch dispatcher needs to reach the batch lane.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from aiohttp import web
from redis.asyncio import Redis

from laneway.autoscale import DemandCount
from laneway.errors import UsageError
from laneway.gateway.keys import (
    CLOCK,
    DEMAND_SHARE,
    INTERNAL_SECRET,
    LEDGER,
    LENDING,
    LENDING_SHARE,
    LIMITER,
    LOAD_SHARE,
    LOOPBACK,
    METRICS,
    RESPONSE_SHARE,
    STATE_METRICS,
    TENANT_SHARE,
    TENANTS,
    WAITERS,
    Loopback,
)
from laneway.gateway.lifecycle import background
from laneway.gateway.state.callers import tenant_middleware
from laneway.gateway.state.demand import RedisDemandShare
from laneway.gateway.state.lending_share import RedisLendingShare
from laneway.gateway.state.metrics import StateMetrics
from laneway.gateway.state.redis_store import (
    DEFAULT_LEASE_S,
    RedisLoadShare,
    RedisSettings,
    connect,
    redis_settings,
)
from laneway.gateway.state.responses import RedisResponseShare
from laneway.gateway.state.settings import (
    FILE_TTL_S,
    MAX_FILE_BYTES,
    TENANT_BATCH_TOKENS,
    DispatchSettings,
    FileQuota,
)
from laneway.gateway.state.tenant_share import RedisTenantShare
from laneway.gateway.state.tenants import (
    InMemoryRateLimiter,
    RedisRateLimiter,
    TenantKeys,
)
from laneway.routing.fairshare import TenantCaps

TENANTS_RELOAD_S = 10.0  # how often a tenants file (a mounted Secret) is checked for changes


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
    tracker = RedisLoadShare(redis, prefix, lease_s=options.load_lease_s)
    app[LOAD_SHARE] = tracker
    app[RESPONSE_SHARE] = RedisResponseShare(redis, prefix)
    metrics.watch_redis(lambda: tracker.shared)
    app[TENANT_SHARE] = RedisTenantShare(redis, prefix, tracker.replica, options.load_lease_s)
    app[LIMITER] = RedisRateLimiter(redis, prefix)
    app[DEMAND_SHARE] = RedisDemandShare(redis, prefix, tracker.replica, lambda: _local_demand(app))
    if LENDING in app:
        app[LENDING_SHARE] = RedisLendingShare(redis, prefix, tracker.replica)
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
    return app[LEDGER].demand(app[CLOCK]())


def announce_listening(app: web.Application, host: str, port: int) -> None:
    if LOOPBACK in app:
        local = "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
        app[LOOPBACK].url = f"http://{local}:{port}"


def _background(
    redis: Redis, tracker: RedisLoadShare
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def run(app: web.Application) -> AsyncIterator[None]:
        tasks = [
            asyncio.create_task(tracker.run(app[LEDGER].own_loads), name="load-heartbeat"),
            asyncio.create_task(app[DEMAND_SHARE].run(), name="demand-publish"),
            asyncio.create_task(
                app[TENANT_SHARE].run(app[LEDGER], app[CLOCK], app[WAITERS].wake),
                name="tenant-heartbeat",
            ),
            asyncio.create_task(
                app[TENANT_SHARE].run_lone(app[LEDGER], app[CLOCK], app[WAITERS].wake),
                name="tenant-lone-leases",
            ),
        ]
        async with background(*tasks):
            yield
        await tracker.leave()
        await app[TENANT_SHARE].leave()
        await app[DEMAND_SHARE].leave()
        if LENDING_SHARE in app:
            await app[LENDING_SHARE].leave()
        await redis.aclose()

    return run


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
        tenants=tenant_keys_from_args(args),
        dispatch=DispatchSettings(concurrency=args.batch_concurrency, lease_s=args.batch_lease),
        max_file_bytes=args.max_file_bytes,
        file_quota=FileQuota(files=args.tenant_files, bytes=args.tenant_file_bytes),
        file_ttl_s=args.file_ttl,
        batch_tokens=args.tenant_batch_tokens,
        # A replica's load outlives it by one lease; batch items wait as long.
        load_lease_s=min(DEFAULT_LEASE_S, args.batch_lease),
    )


def tenant_keys_from_args(args: argparse.Namespace) -> TenantKeys | None:
    """--tenants with the default caps (--tenant-max-concurrent, --tenant-max-queued,
    --tenant-max-concurrent-prompt-tokens); None without --tenants. UsageError naming the
    flag."""
    for flag, cap in (
        ("--tenant-max-concurrent", args.tenant_max_concurrent),
        ("--tenant-max-queued", args.tenant_max_queued),
        ("--tenant-max-concurrent-prompt-tokens", args.tenant_max_concurrent_prompt_tokens),
    ):
        if cap is not None and cap < 1:
            raise UsageError(f"{flag} must be at least 1, got {cap}")
        if cap is not None and not args.tenants:
            # Without tenants every request is anonymous: a cap would bind no one.
            raise UsageError(
                f"{flag} needs --tenants: its cap is per tenant, and without --tenants "
                "every request is anonymous"
            )
    caps = TenantCaps(
        max_running=args.tenant_max_concurrent,
        max_waiting=args.tenant_max_queued,
        max_running_tokens=args.tenant_max_concurrent_prompt_tokens,
    )
    return TenantKeys(args.tenants, caps) if args.tenants else None
