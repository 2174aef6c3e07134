"""The endpoint picker beside a lending gateway (issue 26): `laneway epp` and `laneway gateway`
on the same pools and one Redis. The gateway replica holding the lending lease decides the
roles; the picker never leads, adopts the roles it publishes (no chat turn to a lent
replica), and publishes its own chat demand, which the leader counts: chat held through the
picker alone makes the leader take the lent replica back, and the picker then plans chat
there again. Without Redis, or with no roles published, the picker lends nothing and serves
chat on every replica, saying why once.

The picker in-process over loopback gRPC, the test in Envoy's place (support/epp.py), a real
gateway, `laneway sim` engines and a real redis-server. No timing is asserted: every wait
polls with a generous limit."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from redis.asyncio import Redis
from support.client import eventually
from support.epp import Exchange, Picker, address, chat, request_body, request_headers, serve_picker
from support.inproc import Served, Servers
from support.pools import LENDING_CONTEXT, lending_docs

from laneway.bench.harness.redis_server import LocalRedis
from laneway.gateway.keys import LEDGER, LENDING, LOAD_SHARE
from laneway.gateway.serving.lending import Mode
from laneway.gateway.state.redis_store import DEFAULT_PREFIX, RedisSettings
from laneway.gateway.state.shared import SharedStateOptions
from laneway.ledger import Ledger, Role

CONTEXT = LENDING_CONTEXT


async def engines(servers: Servers) -> list[str]:
    sims = [await servers.sim("llama-long", "--max-context", str(CONTEXT)) for _ in range(2)]
    return [sim.url for sim in sims]


def roles(ledger: Ledger) -> dict[str, Role]:
    (chat_pool,) = (pool for pool in ledger.pools() if pool.name == "chat")
    return dict(ledger.roles(chat_pool))


def lent(ledger: Ledger) -> list[str]:
    return [url for url, role in roles(ledger).items() if role is Role.LENT]


def chat_endpoints(picker: Picker) -> tuple[str, ...]:
    (chat_pool,) = (pool for pool in picker.app[LEDGER].pools() if pool.name == "chat")
    return chat_pool.endpoints


async def picked(exchange: Exchange) -> tuple[dict[str, str], list[str]]:
    """A chat turn the picker routed (held: its exchange stays open), its headers and the
    endpoints it named, the chosen one first."""
    exchange.send(request_headers(), request_body(chat(max_tokens=4)))
    first = await exchange.read()
    assert first.HasField("request_headers"), first
    mutation = first.request_headers.response.header_mutation
    sets = {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}
    return sets, sets["x-gateway-destination-endpoint"].split(",")


async def test_the_picker_follows_the_gateways_lending_and_its_chat_takes_the_replica_back(
    servers: Servers, tmp_path: Path, redis_server: LocalRedis, redis_client: Redis
) -> None:
    urls = await engines(servers)
    docs = lending_docs(urls)
    flags = ("--redis-url", redis_server.url)
    gateway = await servers.gateway(tmp_path / "gateway.yaml", docs, *flags)
    shared = SharedStateOptions(redis=RedisSettings(url=redis_server.url))
    async for picker in serve_picker(tmp_path, docs, shared=shared):
        await follows(picker, gateway, urls, redis_client)


async def follows(picker: Picker, gateway: Served, urls: list[str], redis: Redis) -> None:
    ledger, leader = picker.app[LEDGER], gateway.runner.app[LEDGER]

    async def picker_sees_one_lent() -> bool:
        return len(lent(ledger)) == 1 and lent(ledger) == lent(leader)

    await eventually(picker_sees_one_lent, "the picker adopting the gateway's lent replica")
    assert picker.app[LENDING].mode is Mode.FOLLOWING
    assert gateway.runner.app[LENDING].mode is Mode.LEADING  # the picker never leads
    (borrowed,) = lent(ledger)
    (home,) = (url for url in urls if url != borrowed)
    # Its ledger lends the replica to no batch request of its own: Envoy holds those.
    (docs_pool,) = (pool for pool in ledger.pools() if pool.name == "docs")
    assert docs_pool.endpoints == ()

    held = Exchange(picker)
    sets, named = await picked(held)
    assert sets["x-laneway-pool"] == "chat"
    assert named == [address(home)]  # the lent replica is no fallback either
    # A second turn: the home replica holds its one turn, so it waits in the picker's line,
    # and that demand, published to Redis, makes the leader take the replica back.
    second = Exchange(picker)
    _, named_again = await picked(second)
    assert named_again[0] == address(borrowed)
    assert roles(leader)[borrowed] in (Role.RECLAIMING, Role.SERVING)
    assert set(chat_endpoints(picker)) == set(urls)

    entry = await redis.hget(f"{DEFAULT_PREFIX}:demand", picker.app[LOAD_SHARE].replica)
    assert entry is not None
    (chat_key,) = (pool.key for pool in ledger.pools() if pool.name == "chat")
    demand = json.loads(entry)["pools"][chat_key]
    assert demand["queuedRequests"] + demand["inFlightRequests"] >= 1

    for exchange in (held, second):
        exchange.call.cancel()

    async def lent_again() -> bool:
        return len(lent(ledger)) == 1

    await eventually(lent_again, "the picker's chat ended: a replica lent again")
    (lent_now,) = lent(ledger)
    _, named = await picked(Exchange(picker))
    assert named == [address(next(url for url in urls if url != lent_now))]


@pytest.mark.parametrize("with_redis", [False, True], ids=["no-redis", "no-leader"])
async def test_without_a_leading_gateway_the_picker_lends_nothing_and_says_so_once(
    servers: Servers,
    tmp_path: Path,
    redis_server: LocalRedis,
    redis_client: Redis,
    caplog: pytest.LogCaptureFixture,
    with_redis: bool,
) -> None:
    caplog.set_level(logging.INFO, logger="laneway.gateway.lending")
    urls = await engines(servers)
    shared = SharedStateOptions(redis=RedisSettings(url=redis_server.url)) if with_redis else None
    async for picker in serve_picker(tmp_path, lending_docs(urls), shared=shared):
        await lends_nothing(picker, urls)
        said = [r.getMessage() for r in caplog.records if "lending_unshared" in r.getMessage()]
        assert len(said) == 1
        assert ("no gateway replica" if with_redis else "--redis-url") in said[0]
        if with_redis:  # it never takes the lease a gateway replica would lead with
            assert await redis_client.get(f"{DEFAULT_PREFIX}:lending:leader") is None


async def lends_nothing(picker: Picker, urls: list[str]) -> None:
    async def unshared() -> bool:
        return picker.app[LENDING].mode is Mode.UNSHARED

    await eventually(unshared, "the picker lending nothing")
    for _ in range(3):
        _, named = await picked(held := Exchange(picker))
        held.call.cancel()
        assert sorted(named) == sorted(address(url) for url in urls)
    await asyncio.sleep(0.5)  # many lending ticks: still nothing lent, nothing said again
    assert set(roles(picker.app[LEDGER]).values()) == {Role.SERVING}
