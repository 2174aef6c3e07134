"""The ledger's reads: what the shells and the operator's demand endpoint ask of it between
changes. Nothing here changes state; `ledger.py` is where it changes."""

from __future__ import annotations

from collections.abc import Mapping

from laneway.api import InferencePool
from laneway.autoscale import DemandCount
from laneway.ledger.demand import DemandBook
from laneway.ledger.endpoints import EndpointBook
from laneway.ledger.lending import LendingBook, Role
from laneway.ledger.lines import GateState, PoolGate, Ticket
from laneway.ledger.load import LoadBook
from laneway.ledger.responses import ResponseBook, StoredResponse
from laneway.ledger.tenants import Held, TenantBook, TenantCount, TenantKey
from laneway.ledger.tickets import TicketState
from laneway.routing.cycle import EndpointLoad
from laneway.routing.engine_metrics import EngineMetrics
from laneway.routing.slo import PrefillRate


class LedgerReads:
    """The read side of `Ledger`, over the books its constructor makes."""

    synced: bool
    _wants_prefix_blocks: bool
    _endpoints: EndpointBook
    _gates: dict[str, PoolGate]
    _load: LoadBook
    _tenants: TenantBook
    _demand: DemandBook
    _responses: ResponseBook
    _lending: LendingBook
    _requests: dict[Ticket, TicketState]

    @property
    def wants_prefix_blocks(self) -> bool:
        """Whether the profile scores the prompt's prefix (else `plan` needs no blocks)."""
        return self._wants_prefix_blocks

    def pools(self) -> tuple[InferencePool, ...]:
        """The pools now configured: the same tuple until the next update."""
        return self._endpoints.pool_list

    def current(self, pool: InferencePool) -> InferencePool | None:
        """The pool as now configured, None when it was removed since."""
        return self._endpoints.pools.get(pool.key)

    def available(self, pool: InferencePool) -> tuple[str, ...]:
        return self._endpoints.available(pool)

    def endpoints(self) -> list[str]:
        return self._endpoints.endpoints()

    def ejected(self) -> list[str]:
        return self._endpoints.ejected()

    def ready(self) -> bool:
        return self.synced and any(self.available(p) for p in self._endpoints.pool_list)

    def gate(self, pool: InferencePool) -> GateState:
        gate = self._gates.get(pool.key)
        return gate.state() if gate is not None else GateState(active=0, waiting=0, limit=0)

    def fresh_metrics(self, url: str, now: float) -> EngineMetrics | None:
        return self._endpoints.fresh_metrics(url, now)

    def prefill_rate(self, url: str) -> PrefillRate:
        return self._endpoints.prefill_rate(url)

    def load(self, url: str) -> EndpointLoad:
        """This replica's load on `url` plus its peers'."""
        return self._load.of(url)

    def tenant_count(self, pool: InferencePool, tenant: str) -> TenantCount:
        """The tenant's requests running and waiting in `pool`, on every replica."""
        return self._tenants.of(pool.key, tenant)

    def tenant_count_on_peers(self, key: TenantKey) -> TenantCount:
        """The (pool, tenant)'s requests on the other gateway replicas, as last read."""
        return self._tenants.peers_count(key)

    def held_in_line(self, ticket: Ticket) -> Held | None:
        """Which of its tenant's caps holds the queued request in line now: the cap holding
        the tenant's first request in its lane, the request itself or an older one it keeps
        its place behind. None: it waits for a free slot (or is not in line)."""
        request = self._requests.get(ticket)
        if request is None or request.state != "queued":
            return None
        ask = request.ask
        head = request.gate.head(ask.tenant, ask.route.priority)
        if head is None:
            return None
        tokens = self._requests[head].ask.route.prefill_tokens
        return self._tenants.held(ask.route.pool.key, ask.tenant, tokens)

    def own_tenants(self) -> dict[TenantKey, TenantCount]:
        """This replica's own requests per (pool, tenant): what it publishes."""
        return self._tenants.own()

    @property
    def cap_replicas(self) -> int:
        """The gateway replicas sharing the tenants' caps, as last told."""
        return self._tenants.replicas

    def waiting_capped(self) -> list[TenantKey]:
        """The (pool, tenant)s of capped tenants with requests waiting here."""
        return self._tenants.waiting_capped()

    def lone_wanted(self) -> list[TenantKey]:
        """The (pool, tenant)s whose lone prompt waits here for the pool-wide lease."""
        return self._tenants.lone_wanted()

    def lone_to_release(self) -> list[TenantKey]:
        """The leases to hand back once this replica's counts have reached Redis."""
        return self._tenants.lone_to_release()

    def own_loads(self) -> dict[str, EndpointLoad]:
        """This replica's own load on every endpoint it has counted: what it publishes."""
        return self._load.own()

    def demand(self, now: float) -> dict[str, DemandCount]:
        """Each configured pool's demand as this replica sees it."""
        return self._demand.snapshot(now, [pool.key for pool in self._endpoints.pool_list])

    def lending_roles(self) -> dict[str, dict[str, Role]]:
        """Every lending pool's replica roles (lender key -> endpoint -> role), to publish."""
        return {key: dict(roles) for key, roles in self._lending.roles.items()}

    def lends(self) -> bool:
        """Whether any pool lends replicas (else `rebalance` has nothing to decide)."""
        return bool(self._lending.borrowers)

    def borrows(self, pool: InferencePool) -> bool:
        """Whether `pool` borrows a lending pool's replicas: its requests may be taken off
        a replica that chat takes back (`Rebalanced.reclaims`)."""
        return pool.key in self._lending.borrowers.values()

    def engine_pool(self, pool: InferencePool, url: str) -> InferencePool:
        """The pool whose engine runs at `url`, one of `pool`'s endpoints: a lent replica's
        lender (its model name and scheduling are the lender's), else `pool` itself."""
        for key, roles in self._lending.roles.items():
            if url in roles and (lender := self._endpoints.pools.get(key)) is not None:
                return lender
        return pool

    def roles(self, pool: InferencePool) -> Mapping[str, Role]:
        """A lending pool's replicas and their roles (empty for any other pool)."""
        return self._lending.roles.get(pool.key, {})

    def response_holder(
        self, response_id: str, tenant: str, now: float
    ) -> tuple[StoredResponse, InferencePool] | None:
        """Where `response_id` is stored, and that endpoint's pool (`ResponseBook.holder`)."""
        return self._responses.holder(response_id, tenant, now, self._endpoints.pools)
