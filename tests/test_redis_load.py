"""Endpoint load shared between replicas through Redis, with leases that expire.

Each replica here is the ledger's own load book (what `Ledger.own_loads` reads and
`Ledger.set_peer_loads` feeds) with a `RedisLoadShare` beside it, as the gateway runs them.
"""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from laneway.bench.harness.redis_server import LocalRedis
from laneway.gateway.state.redis_store import (
    DEFAULT_LEASE_S,
    RedisLoadShare,
    connect,
    redis_settings,
)
from laneway.ledger import EndpointLoad
from laneway.ledger.load import LoadBook

E1, E2 = "http://10.0.0.1:8000", "http://10.0.0.2:8000"


class Replica:
    """One gateway replica's load: counted by its ledger's book, shared through Redis."""

    def __init__(self, redis: Redis, name: str, lease_s: float = DEFAULT_LEASE_S) -> None:
        self.book = LoadBook()
        self.share = RedisLoadShare(redis, replica=name, lease_s=lease_s)

    def start(self, url: str, prefill_tokens: int) -> tuple[str, int]:
        self.book.start(url, prefill_tokens)
        self.share.publish(self.book.own())
        return url, prefill_tokens

    def prefill_done(self, lease: tuple[str, int]) -> None:
        self.book.prefill_done(*lease)
        self.share.publish(self.book.own())

    def finish(self, lease: tuple[str, int], prefill_done: bool) -> None:
        self.book.finish(*lease, prefill_done)
        self.share.publish(self.book.own())

    async def loads(self, urls: list[str]) -> dict[str, EndpointLoad]:
        """What a pick on this replica sees: its own load and its peers' read from Redis."""
        self.book.set_peers(await self.share.peers(urls))
        return {url: self.book.of(url) for url in urls}

    async def heartbeat(self) -> int:
        return await self.share.heartbeat(self.book.own)

    async def flush(self) -> None:
        await self.share.flush()

    async def leave(self) -> None:
        await self.share.leave()


def is_shared(replica: Replica) -> bool:
    # A call, so the type checker does not carry narrowing across awaits.
    return replica.share.shared


async def test_replicas_see_each_others_load(redis_server: LocalRedis) -> None:
    first, second = Redis.from_url(redis_server.url), Redis.from_url(redis_server.url)
    try:
        a, b = Replica(first, "a"), Replica(second, "b")
        lease_a = a.start(E1, 1000)
        lease_b = b.start(E1, 500)
        b.start(E2, 10)
        await b.flush()  # changes go to Redis in the background
        assert await a.loads([E1, E2]) == {
            E1: EndpointLoad(in_flight=2, prefill_tokens=1500),
            E2: EndpointLoad(in_flight=1, prefill_tokens=10),
        }
        a.prefill_done(lease_a)
        b.finish(lease_b, prefill_done=False)
        await a.flush()
        assert (await b.loads([E1]))[E1] == EndpointLoad(in_flight=1, prefill_tokens=0)
        a.finish(lease_a, prefill_done=True)
        await b.flush()
        assert await a.loads([E1, E2]) == {
            E1: EndpointLoad(in_flight=0, prefill_tokens=0),
            E2: EndpointLoad(in_flight=1, prefill_tokens=10),
        }
    finally:
        await first.aclose()
        await second.aclose()


async def test_a_dead_replicas_load_expires_with_its_lease(redis_client: Redis) -> None:
    survivor = Replica(redis_client, "survivor", lease_s=0.3)
    doomed = Replica(redis_client, "doomed", lease_s=0.3)
    await survivor.heartbeat()
    await doomed.heartbeat()
    doomed.start(E1, 4000)
    doomed.start(E1, 4000)
    survivor.start(E1, 100)
    await doomed.flush()
    assert (await survivor.loads([E1]))[E1] == EndpointLoad(in_flight=3, prefill_tokens=8100)
    # `doomed` stops heartbeating, as a killed process would; its lease runs out.
    await asyncio.sleep(0.4)
    assert await survivor.heartbeat() == 1
    assert (await survivor.loads([E1]))[E1] == EndpointLoad(in_flight=1, prefill_tokens=100)
    assert await survivor.heartbeat() == 0


async def test_a_dead_replica_with_settled_requests_is_reaped_once(redis_client: Redis) -> None:
    """Its share holds fields back at zero (a request started and finished between two
    heartbeats): reaping must subtract the rest, once, and leave the survivor sharing."""
    survivor = Replica(redis_client, "survivor", lease_s=0.3)
    doomed = Replica(redis_client, "doomed", lease_s=0.3)
    await survivor.heartbeat()
    await doomed.heartbeat()
    done = doomed.start(E1, 300)
    await doomed.flush()  # two writes, not one that nets out to nothing
    doomed.finish(done, prefill_done=False)
    doomed.start(E2, 700)
    await doomed.flush()
    zeros = await redis_client.hgetall("laneway:load:replica:doomed")
    assert zeros[f"{E1}|in_flight".encode()] == b"0"  # the shape that once stopped the reap
    await asyncio.sleep(0.4)
    assert await survivor.heartbeat() == 1
    assert is_shared(survivor)
    for _ in range(3):  # later heartbeats subtract nothing more
        assert await survivor.heartbeat() == 0
    assert await survivor.loads([E1, E2]) == {
        E1: EndpointLoad(in_flight=0, prefill_tokens=0),
        E2: EndpointLoad(in_flight=0, prefill_tokens=0),
    }
    assert await redis_client.hgetall("laneway:load") == {}
    assert await redis_client.smembers("laneway:load:replicas") == {b"survivor"}


async def test_a_clean_leave_takes_the_share_out_at_once(redis_client: Redis) -> None:
    leaving = Replica(redis_client, "leaving")
    staying = Replica(redis_client, "staying")
    await leaving.heartbeat()
    leaving.start(E2, 50)
    await leaving.flush()
    assert (await staying.loads([E2]))[E2] == EndpointLoad(in_flight=1, prefill_tokens=50)
    await leaving.leave()
    assert (await staying.loads([E2]))[E2] == EndpointLoad(in_flight=0, prefill_tokens=0)
    assert await redis_client.hgetall("laneway:load") == {}  # no zero totals left behind
    assert await redis_client.smembers("laneway:load:replicas") == set()


async def test_a_burst_of_changes_is_written_in_few_round_trips(redis_client: Redis) -> None:
    tracker = Replica(redis_client, "burst")
    before = int((await redis_client.info("stats"))["total_commands_processed"])
    leases = [tracker.start(E1, 10) for _ in range(200)]
    for lease in leases[:150]:
        tracker.finish(lease, prefill_done=False)
    # Picks on this replica see its own changes before they reach Redis.
    assert (await tracker.loads([E1]))[E1] == EndpointLoad(in_flight=50, prefill_tokens=500)
    await tracker.flush()
    after = int((await redis_client.info("stats"))["total_commands_processed"])
    assert after - before < 50  # 350 changes and a read; not one call each
    reader = Replica(redis_client, "reader")
    assert (await reader.loads([E1]))[E1] == EndpointLoad(in_flight=50, prefill_tokens=500)


async def test_a_heartbeat_beside_unwritten_changes_counts_each_change_once(
    redis_client: Redis,
) -> None:
    # A heartbeat resyncs the replica's share to its exact load, which holds the changes
    # still queued for Redis; written after it as well, they would count twice until the
    # next heartbeat (a peer's cap or pick reading one request more than runs).
    busy, reader = Replica(redis_client, "busy"), Replica(redis_client, "reader")
    await reader.loads([E1])  # a connection ready: the heartbeat's resync goes out at once
    for running in range(1, 6):
        busy.start(E1, 100)  # queued for the writer, which has not run yet
        await busy.heartbeat()
        await busy.flush()
        assert (await reader.loads([E1]))[E1] == EndpointLoad(
            in_flight=running, prefill_tokens=100 * running
        )
    # A change made while a heartbeat waits for a write under way is written after it.
    lease = busy.start(E2, 10)
    beat = asyncio.ensure_future(busy.heartbeat())
    await asyncio.sleep(0)
    busy.finish(lease, prefill_done=False)
    await beat
    await busy.flush()
    assert (await reader.loads([E2]))[E2] == EndpointLoad(in_flight=0, prefill_tokens=0)


async def test_local_load_while_redis_is_away_and_resync_after(redis_server: LocalRedis) -> None:
    settings = redis_settings(redis_server.url)
    assert settings is not None
    redis = connect(settings)
    try:
        tracker = Replica(redis, "r")
        kept = tracker.start(E1, 300)
        await tracker.flush()
        redis_server.stop()
        # Picks go on from this replica's own counts, without waiting on Redis.
        during = tracker.start(E1, 200)
        assert (await tracker.loads([E1]))[E1] == EndpointLoad(in_flight=2, prefill_tokens=500)
        assert not is_shared(tracker)
        tracker.finish(kept, prefill_done=False)
        redis_server.start()  # empty: no persistence
        await tracker.heartbeat()
        assert is_shared(tracker)
        # The heartbeat rewrote the totals from the exact local counts.
        assert (await tracker.loads([E1]))[E1] == EndpointLoad(in_flight=1, prefill_tokens=200)
        tracker.finish(during, prefill_done=False)
        assert (await tracker.loads([E1]))[E1] == EndpointLoad(in_flight=0, prefill_tokens=0)
    finally:
        await redis.aclose()


async def test_asking_for_no_endpoints_reads_nothing_and_keeps_the_share_up(
    redis_client: Redis,
) -> None:
    """A lending tick whose lenders have no endpoint yet, or a pick whose pool's endpoints
    are all ejected, asks for none: HMGET with no field is an error in Redis, which must not
    read as Redis gone (endpoint load kept per replica until the next heartbeat)."""
    share = RedisLoadShare(redis_client, replica="a")
    assert await share.peers([]) == {}
    assert share.shared
