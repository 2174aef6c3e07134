"""What the request path works with, built once as the app starts: the ledger and the client
to the engines, and beside them the settings, metrics, clock and counters, so that a request
looks up one thing."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from laneway.gateway.access_log import AccessLog
from laneway.gateway.config import GatewaySettings
from laneway.gateway.metrics import GatewayMetrics
from laneway.gateway.serving.counting import PoolTokenizers
from laneway.gateway.serving.lending import Lending
from laneway.gateway.state.callers import TenantLimits
from laneway.gateway.state.redis_store import RedisLoadShare
from laneway.gateway.state.responses import RedisResponseShare
from laneway.gateway.state.tenant_share import RedisTenantShare
from laneway.gateway.wakes import Waiters
from laneway.ledger import Ledger, Wakes


@dataclass(frozen=True)
class RequestPath:
    ledger: Ledger  # every piece of request and endpoint state
    waiters: Waiters  # the requests waiting in the ledger's lines
    session: aiohttp.ClientSession  # every request to the engines
    settings: GatewaySettings
    clock: Callable[[], float]  # the ledger's clock: arrivals, waits, first tokens
    metrics: GatewayMetrics
    tokenizers: PoolTokenizers
    access_log: AccessLog
    tenant_limits: TenantLimits | None  # None: no state layer
    load_share: RedisLoadShare | None  # None: one replica, its load its own
    lending: Lending  # acts on the lending pools' roles (or, never leading, follows them)
    response_share: RedisResponseShare | None = None  # None: stored responses not shared
    tenant_share: RedisTenantShare | None = None  # None: tenants' counts are this replica's

    def wake(self, wakes: Wakes) -> None:
        self.waiters.wake(wakes)

    def demand_changed(self) -> None:
        """A request was admitted, queued or ended: the lending pools' roles follow."""
        self.lending.rebalance()

    def load_changed(self) -> None:
        """This replica's load on an endpoint (or a tenant's count) changed: its peers hear
        of it."""
        if self.load_share is not None:
            self.load_share.publish(self.ledger.own_loads())
        if self.tenant_share is not None:
            self.tenant_share.publish(self.ledger.own_tenants())
