"""Each tenant's requests per pool: running and waiting, and the prompt tokens of the running
ones, this replica's own and the other gateway replicas' (arriving as data from the Redis
shell), against the tenant's caps.

A tenant's caps (`laneway.routing.fairshare.TenantCaps`) come with each of its admissions,
so a changed tenants file applies from the tenant's next request on.

The other replicas' counts are a reading, never a reservation: two replicas admitting at
the same moment would each see the other's old count and together pass the cap. So each of
`replicas` replicas also keeps to its part of a cap (`cap / replicas`, rounded up): the
total stays within the cap (or `replicas - 1` over it, where the cap does not divide), at
the price of a tenant whose requests all reach one replica getting only that part.

One request passes the parts: a tenant running none anywhere runs its next one however long
its prompt, so a prompt past the cap of prompt tokens is not refused for ever. Two replicas
each reading the other's old "none" would each run one, so beside other replicas
(`lone_leases`) a replica runs such a prompt only under the pool-wide lease for that
tenant (`take_lone`, taken by the Redis shell): one lease, one request started, handed back
once its count has reached the others (`lone_to_release`, `released_lone`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from laneway.routing.fairshare import NO_CAPS, TenantCaps


@dataclass(frozen=True)
class TenantCount:
    running: int = 0
    waiting: int = 0
    running_tokens: int = 0  # the prompt tokens of the running requests

    def plus(self, other: TenantCount) -> TenantCount:
        return TenantCount(
            running=self.running + other.running,
            waiting=self.waiting + other.waiting,
            running_tokens=self.running_tokens + other.running_tokens,
        )


NONE = TenantCount()
TenantKey = tuple[str, str]  # (pool key, tenant)
# The cap that holds a tenant's next request in line: maxConcurrentRequests' or
# maxConcurrentPromptTokens'.
Held = Literal["running", "running_tokens"]


class TenantBook:
    def __init__(self) -> None:
        self._own: dict[TenantKey, TenantCount] = {}
        self._peers: dict[TenantKey, TenantCount] = {}
        self._caps: dict[str, TenantCaps] = {}
        self.replicas = 1  # the gateway replicas sharing the caps (with Redis)
        self.lone_leases = False  # True beside other replicas: a lone prompt needs the lease
        self._lone: set[TenantKey] = set()  # the leases held here, not yet used
        self._lone_spent: set[TenantKey] = set()  # used by a request that started

    def set_caps(self, tenant: str, caps: TenantCaps) -> None:
        if caps == NO_CAPS:
            self._caps.pop(tenant, None)
        else:
            self._caps[tenant] = caps

    def add(
        self, pool: str, tenant: str, *, running: int = 0, waiting: int = 0, tokens: int = 0
    ) -> None:
        """Change the tenant's own counts: `tokens` are the prompt tokens of the `running`."""
        key = (pool, tenant)
        if running > 0 and key in self._lone:
            self._lone.remove(key)  # one lease, one request started under it
            self._lone_spent.add(key)
        count = self._own.get(key, NONE).plus(
            TenantCount(running=running, waiting=waiting, running_tokens=tokens)
        )
        if count == NONE:
            del self._own[key]  # tenants come and go: an idle one keeps no entry
        else:
            self._own[key] = count

    def of(self, pool: str, tenant: str) -> TenantCount:
        """The tenant's requests in `pool` on every replica."""
        own = self.own_count(pool, tenant)
        peers = self._peers.get((pool, tenant))
        return own if peers is None else own.plus(peers)

    def peers_count(self, key: TenantKey) -> TenantCount:
        """The tenant's requests in the pool on the other replicas, as last read."""
        return self._peers.get(key, NONE)

    def own_count(self, pool: str, tenant: str) -> TenantCount:
        """The tenant's requests in `pool` on this replica."""
        return self._own.get((pool, tenant), NONE)

    def may_run(self, pool: str, tenant: str, tokens: int) -> bool:
        """Whether the tenant's next request, of `tokens` prompt tokens, may run now."""
        return self.held(pool, tenant, tokens) is None

    def may_start(self, pool: str, tenant: str, tokens: int) -> bool:
        """Whether a newly arrived request may run at once. Under a cap of prompt tokens a
        shorter newcomer could fit where the tenant's longer one waits: it queues behind it
        instead, so the tenant's own requests keep their order (and a long one is not passed
        for ever by its tenant's stream of short ones)."""
        if (
            self.caps(tenant).max_running_tokens is not None
            and self.own_count(pool, tenant).waiting
        ):
            return False
        return self.may_run(pool, tenant, tokens)

    def held(self, pool: str, tenant: str, tokens: int) -> Held | None:
        """Which cap holds the tenant's next request (of `tokens` prompt tokens) in line;
        None: it may run."""
        caps = self._caps.get(tenant, NO_CAPS)
        if caps == NO_CAPS:
            return None
        own, every = self.own_count(pool, tenant), self.of(pool, tenant)
        if caps.max_running is not None and not (
            own.running < self._part(caps.max_running) and every.running < caps.max_running
        ):
            return "running"
        cap = caps.max_running_tokens
        if cap is None:
            return None
        if own.running_tokens + tokens <= self._part(cap) and every.running_tokens + tokens <= cap:
            return None
        # Running none anywhere: the next one runs, however long, so a prompt longer than
        # the cap is not refused for ever. On every replica, not this one's alone, and
        # beside other replicas under the lease: otherwise each would run one such prompt.
        if not every.running and (not self.lone_leases or (pool, tenant) in self._lone):
            return None
        return "running_tokens"

    def waiting_capped(self) -> list[TenantKey]:
        """The capped tenants with requests waiting here: whose counts on the other replicas
        decide when those run."""
        return [key for key, own in self._own.items() if own.waiting and key[1] in self._caps]

    def lone_wanted(self) -> list[TenantKey]:
        """Where this replica could run a lone prompt but lacks the lease: a tenant with a
        cap of prompt tokens waits here and runs none anywhere."""
        if not self.lone_leases:
            return []
        return [
            key
            for key, own in self._own.items()
            if own.waiting
            and key not in self._lone
            and self.caps(key[1]).max_running_tokens is not None
            and not self.of(*key).running
        ]

    def take_lone(self, key: TenantKey) -> None:
        """This replica holds the pool-wide lease for `key`'s next lone prompt."""
        self._lone.add(key)

    def lone_to_release(self) -> list[TenantKey]:
        """The leases to hand back once this replica's counts are out: each one used, and
        each no request here can use now (none waiting, or the tenant runs one somewhere)."""
        unused = [
            key for key in self._lone if not self.own_count(*key).waiting or self.of(*key).running
        ]
        return [*self._lone_spent, *unused]

    def released_lone(self, key: TenantKey) -> None:
        self._lone.discard(key)
        self._lone_spent.discard(key)

    def may_wait(self, pool: str, tenant: str) -> bool:
        cap = self._caps.get(tenant, NO_CAPS).max_waiting
        if cap is None:
            return True
        own = self._own.get((pool, tenant), NONE).waiting
        return own < self._part(cap) and self.of(pool, tenant).waiting < cap

    def _part(self, cap: int) -> int:
        return -(-cap // self.replicas)  # rounded up: a cap of 1 still admits one per replica

    def caps(self, tenant: str) -> TenantCaps:
        return self._caps.get(tenant, NO_CAPS)

    def own(self) -> dict[TenantKey, TenantCount]:
        """This replica's own counts: what it publishes."""
        return dict(self._own)

    def set_peers(self, counts: Mapping[TenantKey, TenantCount]) -> None:
        """The other replicas' counts for these keys, summed (replacing their last reading)."""
        self._peers.update(counts)
        for key in [key for key, count in self._peers.items() if count == NONE]:
            del self._peers[key]
