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
reads the others' before it is admitted, and while capped tenants have requests waiting
here they are read again every `FOLLOW_S`, so one whose requests ended on another replica
runs here soon after. The heartbeat also counts the replicas holding a lease: each keeps to
its part of every cap (`laneway.ledger.tenants`), since readings alone would let replicas
admitting at the same moment pass the cap together.

A prompt that runs only alone (past the tenant's cap of prompt tokens, while it runs none
anywhere) is the exception the parts cannot bound, so its replica first takes the tenant's
lease in the pool, a redis-py `Lock` under `{prefix}:tenants:lone:pool|tenant`, reads the
others' counts again (a lone prompt that started elsewhere and handed the lease back is in
them by then), runs it, and hands the lease back once its count is in Redis; the replicas
take turns at it (`_lets_another_go`). The lease
expires after the load lease where its holder is gone; while Redis is away each replica
runs such a prompt on its own reading, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Mapping

from redis.asyncio import Redis
from redis.asyncio.lock import Lock
from redis.exceptions import LockError

from laneway.gateway.state.redis_store import REDIS_DOWN, RedisLoadShare
from laneway.ledger import EndpointLoad, Ledger, Wakes
from laneway.ledger.tenants import TenantCount, TenantKey

# How often a replica where capped tenants wait reads their counts on the other replicas:
# about the time a short prompt's prefill takes, so the hand-off between replicas costs
# little beside the requests handed off, at one Redis round trip each.
FOLLOW_S = 0.05
# How long a lone lease's taker is remembered: past any wait for another's turn.
TURN_MS = 60_000


def _field(key: TenantKey) -> str:
    pool, tenant = key
    return f"{pool}|{tenant}"


def _tokens_field(key: TenantKey) -> str:
    return f"tokens:{_field(key)}"


def _following(ledger: Ledger) -> list[TenantKey]:
    """The keys whose counts on the other replicas `run_lone` reads every `FOLLOW_S`."""
    return ledger.waiting_capped() if ledger.cap_replicas > 1 else []


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
        self._lone_prefix = f"{prefix}:tenants:lone:"
        self._lease_s = lease_s
        self._replica = replica
        self._held: dict[TenantKey, Lock] = {}  # the lone leases this replica holds
        # Since when this replica has let another take its turn at a tenant's lone lease.
        self._letting_go: dict[TenantKey, float] = {}
        self._lone_changed = asyncio.Event()

    @property
    def shared(self) -> bool:
        return self._share.shared

    def publish(self, own: Mapping[TenantKey, TenantCount]) -> None:
        """Queue the change to this replica's own counts (written in the background), and
        look again at the lone leases (`run_lone`)."""
        self._share.publish(_as_loads(own))
        self._lone_changed.set()

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
                waiting = ledger.waiting_capped()
                peers = await self.peers(waiting) if waiting else {}
                wake(ledger.set_peer_tenants(clock(), peers, replicas))
                wake(ledger.set_lone_leases(clock(), needed=replicas > 1))
                for key, lease in list(self._held.items()):
                    try:
                        await lease.reacquire()
                    except LockError:  # expired: another replica may hold it now
                        del self._held[key]
                        ledger.released_lone(key)
            except REDIS_DOWN as error:
                self._share.went_down(error)
                wake(ledger.set_lone_leases(clock(), needed=False))
            self._lone_changed.set()  # a lease another replica held may be free now
            await asyncio.sleep(self._share.heartbeat_s)

    async def run_lone(
        self, ledger: Ledger, clock: Callable[[], float], wake: Callable[[Wakes], None]
    ) -> None:
        """Takes and hands back the lone leases as the ledger wants them, until cancelled.
        While capped tenants wait here beside other replicas, it reads those tenants' counts
        on the others every `FOLLOW_S`: a request that ended there lets one run here at once,
        not a heartbeat later, and a replica taking its turn at a lone lease sees the others'
        turns (`_lets_another_go`)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._lone_changed.wait(), timeout=FOLLOW_S if _following(ledger) else None
                )
            self._lone_changed.clear()
            try:
                if following := _following(ledger):
                    wake(ledger.set_peer_tenants(clock(), await self.peers(following)))
                await self._settle_lone(ledger, clock, wake)
            except REDIS_DOWN as error:
                self._share.went_down(error)

    async def _settle_lone(
        self, ledger: Ledger, clock: Callable[[], float], wake: Callable[[Wakes], None]
    ) -> None:
        if release := ledger.lone_to_release():
            await self._share.flush()  # a started prompt's count is out before its lease
            for key in release:
                ledger.released_lone(key)
                lease = self._held.pop(key, None)
                if lease is not None:
                    with contextlib.suppress(LockError):  # expired: nothing to hand back
                        await lease.release()
        wanted = ledger.lone_wanted()
        for key in self._letting_go.keys() - set(wanted):
            del self._letting_go[key]  # its wait ended: the next starts afresh
        for key in wanted:
            if await self._lets_another_go(key, ledger.tenant_count_on_peers(key), clock()):
                continue
            name = self._lone_name(key)
            lease = Lock(
                self._redis, name, timeout=self._lease_s, blocking=False, thread_local=False
            )
            if not await lease.acquire():
                continue  # another replica's lone prompt first; tried again on a change
            await self._redis.set(f"{name}:turn", self._replica, px=TURN_MS)
            self._letting_go.pop(key, None)
            self._held[key] = lease
            wake(ledger.set_peer_tenants(clock(), await self.peers([key])))
            wake(ledger.take_lone(clock(), key))
            self.publish(ledger.own_tenants())  # what started under it, or the lease unused

    async def _lets_another_go(self, key: TenantKey, peers: TenantCount, now: float) -> bool:
        """Whether this replica, having taken the tenant's last lone lease here, waits for
        another replica where the tenant has requests waiting to take its turn. Without it
        the replica whose lone prompt just ended would take the lease again at once, before
        the others read that it ended, and run all its waiting prompts before theirs. It
        waits at most a lease's length: a turn not taken by then (its replica gone, its
        requests ended) is this replica's again."""
        if not peers.waiting:
            self._letting_go.pop(key, None)
            return False
        if await self._redis.get(f"{self._lone_name(key)}:turn") != self._replica.encode():
            self._letting_go.pop(key, None)
            return False
        since = self._letting_go.setdefault(key, now)
        return now - since < self._lease_s

    def _lone_name(self, key: TenantKey) -> str:
        return f"{self._lone_prefix}{_field(key)}"

    async def leave(self) -> None:
        for lease in self._held.values():
            with contextlib.suppress(LockError, *REDIS_DOWN):
                await lease.release()
        self._held.clear()
        await self._share.leave()
