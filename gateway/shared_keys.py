"""Typed keys of the state layer: tenants, limits, files, batches (beside gateway/keys.py)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from laneway.gateway.batches import BatchStore
from laneway.gateway.dispatcher import Dispatcher
from laneway.gateway.files import FileStore
from laneway.gateway.state_metrics import StateMetrics
from laneway.gateway.tenants import RateLimiter, Tenant, TenantKeys

TENANTS = web.AppKey("tenants", TenantKeys)  # absent: auth is off
LIMITER = web.AppKey("limiter", RateLimiter)
INTERNAL_SECRET = web.AppKey("internal_secret", str)  # the dispatcher's proof on loopback
FILE_STORE = web.AppKey("file_store", FileStore)  # absent: no Redis, no Files/Batches API
BATCH_STORE = web.AppKey("batch_store", BatchStore)
FILE_SIZE_LIMIT = web.AppKey("file_size_limit", int)
STATE_METRICS = web.AppKey("state_metrics", StateMetrics)


class Loopback:
    """This gateway's own base URL, known once it listens."""

    def __init__(self) -> None:
        self.url: str | None = None


LOOPBACK = web.AppKey("loopback", Loopback)  # where the dispatcher reaches the batch lane
# The dispatcher and its task, stopped when shutdown begins.
DISPATCHING = web.AppKey("dispatching", list[tuple[Dispatcher, asyncio.Task[None]]])

TENANT = web.RequestKey("tenant", Tenant)
# Set by the dispatcher's own calls: batch items are paced by it, not by per-minute limits.
INTERNAL = web.RequestKey("internal", bool)
