"""The lending lease and the published roles on a real redis-server
(`gateway/state/lending_share.py`): one leader at a time, a new term per new lease, roles
written only under the lease, the lease handed back on a clean shutdown or left to expire."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from laneway.gateway.state.lending_share import Published, RedisLendingShare
from laneway.ledger import Role

TTL_S = 0.3
ROLES = {"default/chat": {"http://c0": Role.SERVING, "http://c1": Role.LENT}}


async def test_one_leader_at_a_time_and_only_it_publishes(redis_client: Redis) -> None:
    a, b = (RedisLendingShare(redis_client, "t", name) for name in ("a", "b"))
    term = await a.lead(TTL_S)
    assert term == 1
    assert await b.lead(TTL_S) == 0
    assert await a.lead(TTL_S) == term  # renewed, same term
    assert await b.read() is None  # nothing published yet
    assert await a.publish(Published(term=term, version=1, roles=ROLES), TTL_S)
    assert not await b.publish(Published(term=term, version=1, roles={}), TTL_S)
    assert await b.read() == Published(term=term, version=1, roles=ROLES)


async def test_a_lease_left_to_expire_passes_to_another_with_a_new_term(
    redis_client: Redis,
) -> None:
    a, b = (RedisLendingShare(redis_client, "t", name) for name in ("a", "b"))
    assert await a.lead(TTL_S) == 1
    await a.publish(Published(term=1, version=1, roles=ROLES), TTL_S)
    await asyncio.sleep(TTL_S + 0.2)  # a stopped renewing
    assert await b.read() is None  # its roles expired with it
    assert await b.lead(TTL_S) == 2
    assert await a.lead(TTL_S) == 0
    assert not await a.publish(Published(term=1, version=2, roles=ROLES), TTL_S)


async def test_leaving_hands_the_lease_back_and_only_ones_own(redis_client: Redis) -> None:
    a, b = (RedisLendingShare(redis_client, "t", name) for name in ("a", "b"))
    assert await a.lead(60.0) == 1
    await b.leave()  # not b's: a still leads
    assert await b.lead(60.0) == 0
    await a.leave()
    assert await b.lead(60.0) == 2


async def test_roles_that_cannot_be_read_are_none(redis_client: Redis) -> None:
    share = RedisLendingShare(redis_client, "t", "a")
    await redis_client.set("t:lending:roles", '{"term": 1, "roles": {"p": {"u": "borrowed"}}}')
    assert await share.read() is None


async def test_a_leader_whose_term_was_lost_takes_a_new_one(redis_client: Redis) -> None:
    """The term key has no expiry, but it can go (evicted under an allkeys policy, deleted by
    hand) while the lease stays: the holder must still lead, under a new term, not renew a
    lease it no longer uses while every replica reads "another leads"."""
    a, b = (RedisLendingShare(redis_client, "t", name) for name in ("a", "b"))
    assert await a.lead(60.0) == 1
    await redis_client.delete("t:lending:term")
    term = await a.lead(60.0)
    assert term > 0
    assert await b.lead(60.0) == 0
    assert await a.publish(Published(term=term, version=1, roles=ROLES), 60.0)
