"""Every typed key of the gateway's aiohttp application and its requests, in one place."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from laneway.gateway.access_log import AccessLog
from laneway.gateway.config import GatewaySettings
from laneway.gateway.lifecycle import Stop
from laneway.gateway.metrics import GatewayMetrics
from laneway.gateway.pools.registry import PoolRegistry
from laneway.gateway.serving.counting import OffLoopCounter, PoolTokenizers
from laneway.gateway.serving.upstream import UpstreamPool
from laneway.gateway.state.demand import DemandBook, RedisDemandShare
from laneway.gateway.state.memory import LoadTracker
from laneway.gateway.state.metrics import StateMetrics
from laneway.gateway.state.settings import FileQuota
from laneway.gateway.state.tenants import RateLimiter, Tenant, TenantKeys
from laneway.routing.picker import WeightedScorer
from laneway.routing.prefix_index import PrefixIndex
from laneway.tokens import Tokenizer

if TYPE_CHECKING:
    # The batch room builds on the state layer, whose modules read these keys: its types
    # are named here for the type checker only, so the state layer never imports it.
    from laneway.gateway.batch.batches import BatchStore
    from laneway.gateway.batch.dispatcher import Dispatcher
    from laneway.gateway.batch.files import FileStore

SETTINGS = web.AppKey("settings", GatewaySettings)
REGISTRY = web.AppKey("registry", PoolRegistry)
METRICS = web.AppKey("metrics", GatewayMetrics)
TRACKER = web.AppKey("tracker", LoadTracker)
DEMAND = web.AppKey("demand", DemandBook)  # each pool's queued and running work, for scaling
TOKENIZER = web.AppKey("tokenizer", Tokenizer)  # the default, for pools that name none
POOL_TOKENIZERS = web.AppKey("pool_tokenizers", PoolTokenizers)
COUNTER = web.AppKey("counter", OffLoopCounter)  # long prompts' exact counts, off the loop
PROFILE: web.AppKey[tuple[WeightedScorer, ...]] = web.AppKey("profile")
RNG = web.AppKey("rng", random.Random)
PREFIX_INDEX = web.AppKey("prefix_index", PrefixIndex)  # what was routed where, by prefix
CLOCK: web.AppKey[Callable[[], float]] = web.AppKey("clock")
SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", UpstreamPool)  # the request path's connections to engines
SHUTTING_DOWN = web.AppKey("shutting_down", asyncio.Event)  # set when draining begins
STOP = web.AppKey("stop", Stop)
ACCESS_LOG = web.AppKey("access_log", AccessLog)

# The state layer: tenants, limits, files, batches.
TENANTS = web.AppKey("tenants", TenantKeys)  # absent: auth is off
LIMITER = web.AppKey("limiter", RateLimiter)
INTERNAL_SECRET = web.AppKey("internal_secret", str)  # the dispatcher's proof on loopback
# Absent: no Redis, no Files/Batches API.
FILE_STORE: web.AppKey[FileStore] = web.AppKey("file_store")
BATCH_STORE: web.AppKey[BatchStore] = web.AppKey("batch_store")
FILE_SIZE_LIMIT = web.AppKey("file_size_limit", int)
FILE_QUOTA = web.AppKey("file_quota", FileQuota)  # for tenants whose entry sets none
BATCH_TOKEN_LIMIT = web.AppKey("batch_token_limit", int)  # the same
STATE_METRICS = web.AppKey("state_metrics", StateMetrics)
DEMAND_SHARE = web.AppKey("demand_share", RedisDemandShare)  # absent: no Redis


class Loopback:
    """This gateway's own base URL, known once it listens."""

    def __init__(self) -> None:
        self.url: str | None = None


LOOPBACK = web.AppKey("loopback", Loopback)  # where the dispatcher reaches the batch lane
# The dispatcher and its task, stopped when shutdown begins.
DISPATCHING: web.AppKey[list[tuple[Dispatcher, asyncio.Task[None]]]] = web.AppKey("dispatching")

TENANT = web.RequestKey("tenant", Tenant)
# When the request's first bytes were read (the CLOCK's time; serving/arrival.py).
ARRIVED = web.RequestKey("arrived", float)
# Set by the dispatcher's own calls: batch items are paced by it, not by per-minute limits.
INTERNAL = web.RequestKey("internal", bool)
