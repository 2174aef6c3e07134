"""Endpoint load shared between replicas through Redis, with leases that expire."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from laneway.bench.harness.redis_server import LocalRedis
from laneway.gateway.state.memory import EndpointLoad
from laneway.gateway.state.redis_store import RedisLoadTracker, connect, redis_settings

E1, E2 = "http://10.0.0.1:8000", "http://10.0.0.2:8000"


def is_shared(tracker: RedisLoadTracker) -> bool:
    return tracker.shared  # a call, so the type checker does not carry narrowing across awaits


async def test_replicas_see_each_others_load(redis_server: LocalRedis) -> None:
    first, second = Redis.from_url(redis_server.url), Redis.from_url(redis_server.url)
    try:
        a, b = RedisLoadTracker(first, replica="a"), RedisLoadTracker(second, replica="b")
        lease_a = await a.start(E1, 1000)
        lease_b = await b.start(E1, 500)
        await b.start(E2, 10)
        await b.flush()  # changes go to Redis in the background
        assert await a.loads([E1, E2]) == {E1: EndpointLoad(2, 1500), E2: EndpointLoad(1, 10)}
        await a.prefill_done(lease_a)
        await b.finish(lease_b, prefill_done=False)
        await a.flush()
        assert (await b.loads([E1]))[E1] == EndpointLoad(1, 0)
        await a.finish(lease_a, prefill_done=True)
        await b.flush()
        assert await a.loads([E1, E2]) == {E1: EndpointLoad(0, 0), E2: EndpointLoad(1, 10)}
    finally:
        await first.aclose()
        await second.aclose()


async def test_a_dead_replicas_load_expires_with_its_lease(redis_client: Redis) -> None:
    survivor = RedisLoadTracker(redis_client, replica="survivor", lease_s=0.3)
    doomed = RedisLoadTracker(redis_client, replica="doomed", lease_s=0.3)
    await survivor.heartbeat()
    await doomed.heartbeat()
    await doomed.start(E1, 4000)
    await doomed.start(E1, 4000)
    await survivor.start(E1, 100)
    await doomed.flush()
    assert (await survivor.loads([E1]))[E1] == EndpointLoad(3, 8100)
    # `doomed` stops heartbeating, as a killed process would; its lease runs out.
    await asyncio.sleep(0.4)
    assert await survivor.heartbeat() == 1
    assert (await survivor.loads([E1]))[E1] == EndpointLoad(1, 100)
    assert await survivor.heartbeat() == 0


async def test_a_dead_replica_with_settled_requests_is_reaped_once(redis_client: Redis) -> None:
    """Its share holds fields back at zero (a request started and finished between two
    heartbeats): reaping must subtract the rest, once, and leave the survivor sharing."""
    survivor = RedisLoadTracker(redis_client, replica="survivor", lease_s=0.3)
    doomed = RedisLoadTracker(redis_client, replica="doomed", lease_s=0.3)
    await survivor.heartbeat()
    await doomed.heartbeat()
    done = await doomed.start(E1, 300)
    await doomed.flush()  # two writes, not one that nets out to nothing
    await doomed.finish(done, prefill_done=False)
    await doomed.start(E2, 700)
    await doomed.flush()
    zeros = await redis_client.hgetall("laneway:load:replica:doomed")
    assert zeros[f"{E1}|in_flight".encode()] == b"0"  # the shape that once stopped the reap
    await asyncio.sleep(0.4)
    assert await survivor.heartbeat() == 1
    assert is_shared(survivor)
    for _ in range(3):  # later heartbeats subtract nothing more
        assert await survivor.heartbeat() == 0
    assert await survivor.loads([E1, E2]) == {E1: EndpointLoad(0, 0), E2: EndpointLoad(0, 0)}
    assert await redis_client.hgetall("laneway:load") == {}
    assert await redis_client.smembers("laneway:load:replicas") == {b"survivor"}


async def test_a_clean_leave_takes_the_share_out_at_once(redis_client: Redis) -> None:
    leaving = RedisLoadTracker(redis_client, replica="leaving")
    staying = RedisLoadTracker(redis_client, replica="staying")
    await leaving.heartbeat()
    await leaving.start(E2, 50)
    await leaving.flush()
    assert (await staying.loads([E2]))[E2] == EndpointLoad(1, 50)
    await leaving.leave()
    assert (await staying.loads([E2]))[E2] == EndpointLoad(0, 0)
    assert await redis_client.hgetall("laneway:load") == {}  # no zero totals left behind
    assert await redis_client.smembers("laneway:load:replicas") == set()


async def test_a_burst_of_changes_is_written_in_few_round_trips(redis_client: Redis) -> None:
    tracker = RedisLoadTracker(redis_client, replica="burst")
    before = int((await redis_client.info("stats"))["total_commands_processed"])
    leases = [await tracker.start(E1, 10) for _ in range(200)]
    for lease in leases[:150]:
        await tracker.finish(lease, prefill_done=False)
    # Picks on this replica see its own changes before they reach Redis.
    assert (await tracker.loads([E1]))[E1] == EndpointLoad(50, 500)
    await tracker.flush()
    after = int((await redis_client.info("stats"))["total_commands_processed"])
    assert after - before < 50  # 350 changes and a read; not one call each
    reader = RedisLoadTracker(redis_client, replica="reader")
    assert (await reader.loads([E1]))[E1] == EndpointLoad(50, 500)


async def test_local_load_while_redis_is_away_and_resync_after(redis_server: LocalRedis) -> None:
    settings = redis_settings(redis_server.url)
    assert settings is not None
    redis = connect(settings)
    try:
        tracker = RedisLoadTracker(redis, replica="r")
        kept = await tracker.start(E1, 300)
        await tracker.flush()
        redis_server.stop()
        # Picks go on from this replica's own counts, without waiting on Redis.
        during = await tracker.start(E1, 200)
        assert (await tracker.loads([E1]))[E1] == EndpointLoad(2, 500)
        assert not is_shared(tracker)
        await tracker.finish(kept, prefill_done=False)
        redis_server.start()  # empty: no persistence
        await tracker.heartbeat()
        assert is_shared(tracker)
        # The heartbeat rewrote the totals from the exact local counts.
        assert (await tracker.loads([E1]))[E1] == EndpointLoad(1, 200)
        await tracker.finish(during, prefill_done=False)
        assert (await tracker.loads([E1]))[E1] == EndpointLoad(0, 0)
    finally:
        await redis.aclose()
