"""Each tenant's requests per pool, shared between gateway replicas through Redis, so a
tenant's caps (maxConcurrentRequests, maxQueuedRequests, maxConcurrentPromptTokens) hold over
every replica.

The counts travel exactly as endpoint load does (`RedisLoadShare`: shared totals, each
replica's contribution under a lease its heartbeat renews, a dead replica's share reaped),
under their own keys (`{prefix}:tenants:load...`), two field pairs per (pool, tenant): under
`pool|tenant` the running requests where endpoint load keeps requests in flight and the
waiting ones where it keeps prefill tokens; under `tokens:pool|tenant` the running requests'
prompt tokens (and a 0). The second pair came later and the first is unchanged, so replicas
of either version read each other: a replica that does not count tokens publishes none,
which reads as 0 (its tenants' running prompt tokens go uncounted until it is replaced).
The `tokens:` prefix cannot meet a pool key, a `namespace/name` whose namespace is a DNS
label (no `:`). The ledger counts this replica's own; a request of a capped tenant
reads the others' before it is admitted, and the heartbeat reads them again for the tenants
with requests waiting here, so one whose requests ended on another replica runs here
within a heartbeat. The heartbeat also counts the replicas holding a lease: each keeps to
its part of every cap (`laneway.ledger.tenants`), since readings alone would let replicas
admitting at the same moment pass the cap together.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping

from redis.asyncio import Redis

from laneway.gateway.state.redis_store import REDIS_DOWN, RedisLoadShare
from laneway.ledger import EndpointLoad, Ledger, Wakes
from laneway.ledger.tenants import TenantCount, TenantKey


def _field(key: TenantKey) -> str:
    pool, tenant = key
    return f"{pool}|{tenant}"


def _tokens_field(key: TenantKey) -> str:
    return f"tokens:{_field(key)}"


def _as_loads(own: Mapping[TenantKey, TenantCount]) -> dict[str, EndpointLoad]:
    loads = {}
    for key, count in own.items():
        loads[_field(key)] = EndpointLoad(in_flight=count.running, prefill_tokens=count.waiting)
        if count.running_tokens:
            loads[_tokens_field(key)] = EndpointLoad(in_flight=count.running_tokens)
    return loads


def _as_count(counts: EndpointLoad, tokens: EndpointLoad | None) -> TenantCount:
    return TenantCount(
        running=counts.in_flight,
        waiting=counts.prefill_tokens,
        running_tokens=0 if tokens is None else tokens.in_flight,
    )


class RedisTenantShare:
    def __init__(self, redis: Redis, prefix: str, replica: str, lease_s: float) -> None:
        self._redis = redis
        self._replicas_key = f"{prefix}:tenants:load:replicas"  # RedisLoadShare's, leased
        self._share = RedisLoadShare(
            redis, f"{prefix}:tenants", replica=replica, lease_s=lease_s, what="tenant counts"
        )

    @property
    def shared(self) -> bool:
        return self._share.shared

    def publish(self, own: Mapping[TenantKey, TenantCount]) -> None:
        """Queue the change to this replica's own counts (written in the background)."""
        self._share.publish(_as_loads(own))

    async def flush(self) -> None:
        """Wait until every change published so far has reached Redis (or Redis went away)."""
        await self._share.flush()

    async def peers(self, keys: Iterable[TenantKey]) -> dict[TenantKey, TenantCount]:
        """The other replicas' counts for `keys`, one round trip; none while Redis is away."""
        keys = list(keys)
        loads = await self._share.peers(
            [field for key in keys for field in (_field(key), _tokens_field(key))]
        )
        return {
            key: _as_count(load, loads.get(_tokens_field(key)))
            for key in keys
            if (load := loads.get(_field(key))) is not None
        }

    async def run(
        self, ledger: Ledger, clock: Callable[[], float], wake: Callable[[Wakes], None]
    ) -> None:
        """The heartbeat, and the peers' counts for this replica's waiting capped tenants,
        until cancelled."""
        while True:
            try:
                await self._share.heartbeat(lambda: _as_loads(ledger.own_tenants()))
                replicas = int(await self._redis.scard(self._replicas_key))
                capped = ledger.capped_tenants()
                waiting = [
                    key
                    for key, count in ledger.own_tenants().items()
                    if count.waiting and key[1] in capped
                ]
                peers = await self.peers(waiting) if waiting else {}
                wake(ledger.set_peer_tenants(clock(), peers, replicas))
            except REDIS_DOWN as error:
                self._share.went_down(error)
            await asyncio.sleep(self._share.heartbeat_s)

    async def leave(self) -> None:
        await self._share.leave()
