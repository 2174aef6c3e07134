"""Each tenant's counts per pool through Redis: the running prompt tokens travel with the
requests, and replicas from before the token cap read and are read unchanged."""

from __future__ import annotations

from redis.asyncio import Redis

from laneway.gateway.state.redis_store import DEFAULT_LEASE_S, RedisLoadShare
from laneway.gateway.state.tenant_share import RedisTenantShare
from laneway.ledger import EndpointLoad
from laneway.ledger.tenants import TenantCount

PREFIX = "laneway"
KEY = ("default/chat", "acme")


def share(redis: Redis, replica: str) -> RedisTenantShare:
    return RedisTenantShare(redis, PREFIX, replica, DEFAULT_LEASE_S)


def old_share(redis: Redis, replica: str) -> RedisLoadShare:
    """What a replica from before the token cap ran: one field pair per (pool, tenant), the
    running requests as in flight, the waiting ones as prefill."""
    return RedisLoadShare(redis, f"{PREFIX}:tenants", replica=replica, what="tenant counts")


async def test_running_prompt_tokens_reach_the_other_replicas(redis_client: Redis) -> None:
    first, second = share(redis_client, "a"), share(redis_client, "b")
    first.publish({KEY: TenantCount(running=2, waiting=1, running_tokens=5000)})
    await first.flush()
    assert await second.peers([KEY]) == {
        KEY: TenantCount(running=2, waiting=1, running_tokens=5000)
    }
    # Its requests ended: the tokens go with them.
    first.publish({})
    await first.flush()
    assert await second.peers([KEY]) == {KEY: TenantCount()}


async def test_a_replica_from_before_the_token_cap_reads_and_is_read(redis_client: Redis) -> None:
    old, new = old_share(redis_client, "old"), share(redis_client, "new")
    old.publish({"default/chat|acme": EndpointLoad(in_flight=1, prefill_tokens=3)})
    await old.flush()
    # The old replica counts no tokens: its requests read as running none.
    assert await new.peers([KEY]) == {KEY: TenantCount(running=1, waiting=3)}
    new.publish({KEY: TenantCount(running=2, running_tokens=4000)})
    await new.flush()
    # And it reads the new replica's requests where it always did; the tokens it ignores.
    assert await old.peers(["default/chat|acme"]) == {
        "default/chat|acme": EndpointLoad(in_flight=2, prefill_tokens=0)
    }
