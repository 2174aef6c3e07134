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
from collections.abc import Callable
from dataclasses import dataclass

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


class DemandBook:
    def __init__(self, clock: Callable[[], float], window_s: float = SLO_WINDOW_S) -> None:
        self._clock = clock
        self._window_s = window_s
        self._counts: dict[str, _PoolDemand] = {}
        self._ttft: dict[str, collections.deque[tuple[float, bool]]] = {}

    def waiting(self, pool: str, prompt_tokens: int) -> _Counted:
        """While a request waits in the pool's line (or for the pool's first replica)."""
        return _Counted(self, pool, prompt_tokens, queued=True)

    def running(self, pool: str, prompt_tokens: int) -> _Counted:
        """While an admitted request is on its way to, or served by, an engine."""
        return _Counted(self, pool, prompt_tokens, queued=False)

    def record_ttft(self, pool: str, met: bool) -> None:
        recent = self._ttft.get(pool)
        if recent is None:
            recent = self._ttft[pool] = collections.deque()
        recent.append((self._clock(), met))

    def snapshot(self, pools: list[str]) -> dict[str, DemandCount]:
        """The counts of `pools` (the ones configured now) at this moment."""
        cutoff = self._clock() - self._window_s
        counts = {}
        for pool in pools:
            recent = self._ttft.get(pool, collections.deque())
            while recent and recent[0][0] < cutoff:
                recent.popleft()
            met = sum(1 for _, ok in recent if ok)
            count = self._counts.get(pool, _PoolDemand())
            counts[pool] = DemandCount(
                count.queued_requests,
                count.queued_prompt_tokens,
                count.in_flight_requests,
                count.in_flight_prompt_tokens,
                ttft_met=met,
                ttft_missed=len(recent) - met,
            )
        for gone in self._ttft.keys() - set(pools):
            del self._ttft[gone]
        return counts

    def _of(self, pool: str) -> _PoolDemand:
        count = self._counts.get(pool)
        if count is None:
            count = self._counts[pool] = _PoolDemand()
        return count

    def _forget_if_idle(self, pool: str, count: _PoolDemand) -> None:
        # Pools come and go; one with nothing waiting or running needs no entry. No request
        # holds an idle pool's counts: each one it holds counts itself.
        if not count.queued_requests and not count.in_flight_requests:
            self._counts.pop(pool, None)


@dataclass(slots=True)
class _PoolDemand:
    """One pool's counts as requests come and go, updated in place (a frozen DemandCount
    built per change cost more than the rest of the request's bookkeeping); `snapshot`
    hands out DemandCounts."""

    queued_requests: int = 0
    queued_prompt_tokens: int = 0
    in_flight_requests: int = 0
    in_flight_prompt_tokens: int = 0

    def add(self, queued: bool, requests: int, prompt_tokens: int) -> None:
        if queued:
            self.queued_requests += requests
            self.queued_prompt_tokens += prompt_tokens
        else:
            self.in_flight_requests += requests
            self.in_flight_prompt_tokens += prompt_tokens


class _Counted:
    """One request counted in its pool's line or on its engines while the `with` lasts: a
    class, where a generator context manager cost twice as much on every request."""

    __slots__ = ("_book", "_count", "_pool", "_prompt_tokens", "_queued")

    def __init__(self, book: DemandBook, pool: str, prompt_tokens: int, queued: bool) -> None:
        self._book, self._pool = book, pool
        self._prompt_tokens, self._queued = prompt_tokens, queued

    def __enter__(self) -> None:
        self._count = self._book._of(self._pool)
        self._count.add(self._queued, 1, self._prompt_tokens)

    def __exit__(self, *_: object) -> None:
        self._count.add(self._queued, -1, -self._prompt_tokens)
        self._book._forget_if_idle(self._pool, self._count)


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
