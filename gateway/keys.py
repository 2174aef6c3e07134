"""Every typed key of the gateway's aiohttp application and its requests, in one place.

The rooms' types are imported for the type checker only: every room reads its keys from
here, so importing the rooms at run time would tie each room to all the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

if TYPE_CHECKING:
    from laneway.gateway.access_log import AccessLog
    from laneway.gateway.batch.batches import BatchStore
    from laneway.gateway.batch.dispatcher import Dispatcher
    from laneway.gateway.batch.files import FileStore
    from laneway.gateway.config import GatewaySettings
    from laneway.gateway.lifecycle import Stop
    from laneway.gateway.metrics import GatewayMetrics
    from laneway.gateway.serving.context import RequestPath
    from laneway.gateway.serving.counting import OffLoopCounter, PoolTokenizers
    from laneway.gateway.serving.lending import Lending
    from laneway.gateway.state.demand import RedisDemandShare
    from laneway.gateway.state.lending_share import RedisLendingShare
    from laneway.gateway.state.metrics import StateMetrics
    from laneway.gateway.state.redis_store import RedisLoadShare
    from laneway.gateway.state.responses import RedisResponseShare
    from laneway.gateway.state.settings import FileQuota
    from laneway.gateway.state.tenant_share import RedisTenantShare
    from laneway.gateway.state.tenants import RateLimiter, Tenant, TenantKeys
    from laneway.gateway.wakes import Waiters
    from laneway.ledger import Ledger
    from laneway.tokens import Tokenizer

SETTINGS: web.AppKey[GatewaySettings] = web.AppKey("settings")
# Every piece of request and endpoint state: pools, lines, load, demand, prefixes, health.
LEDGER: web.AppKey[Ledger] = web.AppKey("ledger")
WAITERS: web.AppKey[Waiters] = web.AppKey("waiters")  # the requests in the ledger's lines
# The shell of the ledger's lending decisions (or, never leading, of the leader's).
LENDING: web.AppKey[Lending] = web.AppKey("lending")
# What the completion routes work with, built once the client session is open.
REQUEST_PATH: web.AppKey[RequestPath] = web.AppKey("request_path")
METRICS: web.AppKey[GatewayMetrics] = web.AppKey("metrics")
TOKENIZER: web.AppKey[Tokenizer] = web.AppKey("tokenizer")  # the default, for pools that name none
POOL_TOKENIZERS: web.AppKey[PoolTokenizers] = web.AppKey("pool_tokenizers")
# Long prompts' exact counts, off the loop
COUNTER: web.AppKey[OffLoopCounter] = web.AppKey("counter")
CLOCK: web.AppKey[Callable[[], float]] = web.AppKey("clock")
SESSION: web.AppKey[aiohttp.ClientSession] = web.AppKey("session")  # every request to the engines
SHUTTING_DOWN: web.AppKey[asyncio.Event] = web.AppKey("shutting_down")  # set when draining begins
STOP: web.AppKey[Stop] = web.AppKey("stop")
ACCESS_LOG: web.AppKey[AccessLog] = web.AppKey("access_log")

# The state layer: tenants, limits, files, batches.
TENANTS: web.AppKey[TenantKeys] = web.AppKey("tenants")  # absent: auth is off
LIMITER: web.AppKey[RateLimiter] = web.AppKey("limiter")
# The dispatcher's proof on loopback
INTERNAL_SECRET: web.AppKey[str] = web.AppKey("internal_secret")
# Absent: no Redis, no Files/Batches API
FILE_STORE: web.AppKey[FileStore] = web.AppKey("file_store")
BATCH_STORE: web.AppKey[BatchStore] = web.AppKey("batch_store")
FILE_SIZE_LIMIT: web.AppKey[int] = web.AppKey("file_size_limit")
FILE_QUOTA: web.AppKey[FileQuota] = web.AppKey("file_quota")  # for tenants whose entry sets none
BATCH_TOKEN_LIMIT: web.AppKey[int] = web.AppKey("batch_token_limit")  # the same
STATE_METRICS: web.AppKey[StateMetrics] = web.AppKey("state_metrics")
DEMAND_SHARE: web.AppKey[RedisDemandShare] = web.AppKey("demand_share")  # absent: no Redis
LOAD_SHARE: web.AppKey[RedisLoadShare] = web.AppKey("load_share")  # absent: no Redis
# Absent: no Redis (or no lending shell).
LENDING_SHARE: web.AppKey[RedisLendingShare] = web.AppKey("lending_share")
RESPONSE_SHARE: web.AppKey[RedisResponseShare] = web.AppKey("response_share")  # the same
TENANT_SHARE: web.AppKey[RedisTenantShare] = web.AppKey("tenant_share")  # absent: no Redis


class Loopback:
    """This gateway's own base URL, known once it listens."""

    def __init__(self) -> None:
        self.url: str | None = None


# Where the dispatcher reaches the batch lane
LOOPBACK: web.AppKey[Loopback] = web.AppKey("loopback")
# The dispatcher and its task, stopped when shutdown begins.
DISPATCHING: web.AppKey[list[tuple[Dispatcher, asyncio.Task[None]]]] = web.AppKey("dispatching")

TENANT: web.RequestKey[Tenant] = web.RequestKey("tenant")
# When the request's first bytes were read (the CLOCK's time; serving/protocol.py).
ARRIVED: web.RequestKey[float] = web.RequestKey("arrived")
# Set by the dispatcher's own calls: batch items are paced by it, not by per-minute limits.
INTERNAL: web.RequestKey[bool] = web.RequestKey("internal")
