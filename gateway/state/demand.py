"""Each pool's demand as this gateway replica sees it: what waits in the pool's line, what
runs on its engines, and how recent streams met the TTFT SLO.

The operator scales pools on these counts (`laneway.autoscale`): they move the moment a
request arrives, before any engine metric does, and they count requests for a pool at zero,
which no engine can. `GET /laneway/demand` serves them; with Redis, the sum over every
replica (`RedisDemandShare`: each publishes its own share).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import replace

from redis.asyncio import Redis

from laneway.autoscale import DemandCount
from laneway.gateway.state.redis_store import REDIS_DOWN

log = logging.getLogger("laneway.gateway.demand")

# Attainment over the last five minutes: long enough to hold a few hundred streams on a
# quiet lane, short enough that the scaler sees a miss while it can still act on it.
SLO_WINDOW_S = 300.0
PUBLISH_EVERY_S = 1.0
# A replica that has not published for this long is gone (or cut off from Redis): its
# share no longer counts, so a dead replica's queue never holds a pool up.
STALE_AFTER_S = 10.0  # open like /metrics: the operator holds no API key
_ZERO = DemandCount()


class DemandBook:
    def __init__(self, clock: Callable[[], float], window_s: float = SLO_WINDOW_S) -> None:
        self._clock = clock
        self._window_s = window_s
        self._counts: dict[str, DemandCount] = {}
        self._ttft: dict[str, collections.deque[tuple[float, bool]]] = {}

    @contextlib.contextmanager
    def waiting(self, pool: str, prompt_tokens: int) -> Iterator[None]:
        """While a request waits in the pool's line (or for the pool's first replica)."""
        self._add(pool, queued_requests=1, queued_prompt_tokens=prompt_tokens)
        try:
            yield
        finally:
            self._add(pool, queued_requests=-1, queued_prompt_tokens=-prompt_tokens)

    @contextlib.contextmanager
    def running(self, pool: str, prompt_tokens: int) -> Iterator[None]:
        """While an admitted request is on its way to, or served by, an engine."""
        self._add(pool, in_flight_requests=1, in_flight_prompt_tokens=prompt_tokens)
        try:
            yield
        finally:
            self._add(pool, in_flight_requests=-1, in_flight_prompt_tokens=-prompt_tokens)

    def record_ttft(self, pool: str, met: bool) -> None:
        self._ttft.setdefault(pool, collections.deque()).append((self._clock(), met))

    def snapshot(self, pools: list[str]) -> dict[str, DemandCount]:
        """The counts of `pools` (the ones configured now) at this moment."""
        cutoff = self._clock() - self._window_s
        counts = {}
        for pool in pools:
            recent = self._ttft.get(pool, collections.deque())
            while recent and recent[0][0] < cutoff:
                recent.popleft()
            met = sum(1 for _, ok in recent if ok)
            count = self._counts.get(pool, DemandCount())
            counts[pool] = replace(count, ttft_met=met, ttft_missed=len(recent) - met)
        for gone in self._ttft.keys() - set(pools):
            del self._ttft[gone]
        return counts

    def _add(self, pool: str, **deltas: int) -> None:
        count = self._counts.get(pool, _ZERO)
        # Built by position: `dataclasses.replace` cost more than the rest of the request's
        # bookkeeping (four calls a request).
        count = DemandCount(
            count.queued_requests + deltas.get("queued_requests", 0),
            count.queued_prompt_tokens + deltas.get("queued_prompt_tokens", 0),
            count.in_flight_requests + deltas.get("in_flight_requests", 0),
            count.in_flight_prompt_tokens + deltas.get("in_flight_prompt_tokens", 0),
        )
        if count == _ZERO:
            self._counts.pop(pool, None)  # pools come and go; zero needs no entry
        else:
            self._counts[pool] = count


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

    async def _publish(self, counts: dict[str, DemandCount]) -> None:
        pools = {pool: count.to_wire() for pool, count in counts.items()}
        entry = json.dumps({"at": self._wall(), "pools": pools})
        await self._redis.hset(self._key, self._replica, entry)
