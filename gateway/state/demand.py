"""Each pool's demand summed over the gateway's replicas.

The ledger counts this replica's demand (`Ledger.demand`: what waits in each pool's line,
what runs on its engines, how recent streams met the TTFT SLO); the operator scales pools on
these counts (`laneway.autoscale`): they move the moment a request arrives, before any engine
metric does, and they count requests for a pool at zero, which no engine can.
`GET /laneway/demand` serves them; with Redis, the sum over every replica
(`RedisDemandShare`: each publishes its own share).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable

from redis.asyncio import Redis

from laneway.autoscale import DemandCount
from laneway.gateway.state.redis_store import REDIS_DOWN

log = logging.getLogger("laneway.gateway.demand")

PUBLISH_EVERY_S = 1.0
# A replica that has not published for this long is gone (or cut off from Redis): its
# share no longer counts, so a dead replica's queue never holds a pool up.
STALE_AFTER_S = 10.0  # open like /metrics: the operator holds no API key


Snapshot = Callable[[], dict[str, DemandCount]]


class RedisDemandShare:
    """Every replica's demand, summed: each publishes its counts to one hash
    (`{prefix}:demand`, replica -> JSON with a wall-clock stamp) every second, and whichever
    replica the operator asks sums the fresh entries. While Redis is away, a replica answers
    with its own counts alone."""

    def __init__(
        self,
        redis: Redis,
        prefix: str,
        replica: str,
        snapshot: Snapshot,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._redis = redis
        self._key = f"{prefix}:demand"
        self._replica = replica
        self._snapshot = snapshot
        self._wall = wall

    async def run(self) -> None:
        while True:
            with contextlib.suppress(*REDIS_DOWN):
                await self._publish(self._snapshot())
            await asyncio.sleep(PUBLISH_EVERY_S)

    async def leave(self) -> None:
        with contextlib.suppress(*REDIS_DOWN):
            await self._redis.hdel(self._key, self._replica)

    async def total(self, local: dict[str, DemandCount]) -> tuple[dict[str, DemandCount], int]:
        """The pools' counts summed over the live replicas, and how many replicas that is."""
        try:
            await self._publish(local)
            entries = await self._redis.hgetall(self._key)
        except REDIS_DOWN as error:
            log.warning("demand from this replica alone, Redis is unreachable: %s", error)
            return local, 1
        totals = {pool: DemandCount() for pool in local}
        replicas, stale = 0, []
        for replica, raw in entries.items():
            try:
                entry = json.loads(raw)
                fresh = self._wall() - float(entry["at"]) <= STALE_AFTER_S
                counts = {p: DemandCount.from_wire(c) for p, c in entry["pools"].items()}
            except (ValueError, KeyError, TypeError, AttributeError):
                fresh, counts = False, {}
            if not fresh:
                stale.append(replica)
                continue
            replicas += 1
            for pool, count in counts.items():
                if pool in totals:  # a pool this replica no longer serves is not summed
                    totals[pool] = totals[pool].plus(count)
        if stale:
            with contextlib.suppress(*REDIS_DOWN):
                await self._redis.hdel(self._key, *stale)
        return totals, replicas

    async def peers(self) -> dict[str, DemandCount]:
        """The other live replicas' counts per pool, summed (as last published); raises
        the Redis error while Redis is away."""
        entries = await self._redis.hgetall(self._key)
        totals: dict[str, DemandCount] = {}
        for replica, raw in entries.items():
            if _text(replica) == self._replica:
                continue
            try:
                entry = json.loads(raw)
                if self._wall() - float(entry["at"]) > STALE_AFTER_S:
                    continue
                counts = {p: DemandCount.from_wire(c) for p, c in entry["pools"].items()}
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            for pool, count in counts.items():
                totals[pool] = totals.get(pool, DemandCount()).plus(count)
        return totals

    async def _publish(self, counts: dict[str, DemandCount]) -> None:
        pools = {pool: count.to_wire() for pool, count in counts.items()}
        entry = json.dumps({"at": self._wall(), "pools": pools})
        await self._redis.hset(self._key, self._replica, entry)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
