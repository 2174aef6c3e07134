"""One tenant must not take a shared pool from another: caps on each tenant's running and
waiting requests per pool and on its running prompt tokens, a fair share of a full line, and
with Redis the caps held over two gateway replicas.

In-process gateways with a keys file of two tenants, one `laneway sim` engine behind a
pool of few slots, real HTTP over loopback; a real redis-server for the shared caps.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from redis.asyncio import Redis
from support.inproc import Served, Servers
from support.pools import gateway_doc, pool_doc

from laneway.bench.harness.redis_server import LocalRedis
from laneway.gateway.keys import LEDGER, TENANT_SHARE, TENANTS
from laneway.ledger import Wakes
from laneway.ledger.tenants import TenantCount, TenantKey

POOL = "shared"


def tenants(acme: str = "") -> str:
    return f"""
tenants:
  - name: acme
    apiKeys: [sk-acme]
{acme}
  - name: beta
    apiKeys: [sk-beta]
"""


async def start(
    tmp_path: Path,
    servers: Servers,
    *,
    slots: int,
    acme: str = "",
    queue: dict[str, Any] | None = None,
    replicas: int = 1,
    flags: tuple[str, ...] = (),
) -> list[Served]:
    (tmp_path / "tenants.yaml").write_text(tenants(acme))
    engine = await servers.sim("llama-small", "--time-scale", "1")
    documents = [
        pool_doc(
            POOL,
            "interactive",
            "llama-small",
            [engine.url],
            limits={"maxConcurrentRequests": slots},
        ),
        gateway_doc(queue={"timeoutMillis": 20000, **(queue or {})}),
    ]
    return [
        await servers.gateway(
            tmp_path / f"gateway-{i}.yaml",
            documents,
            "--tenants",
            str(tmp_path / "tenants.yaml"),
            *flags,
        )
        for i in range(replicas)
    ]


async def start_sharing(
    tmp_path: Path,
    servers: Servers,
    redis_server: LocalRedis,
    *,
    slots: int,
    acme: str,
    queue: dict[str, Any] | None = None,
) -> list[Served]:
    """Two gateway replicas sharing the caps through Redis, once each counts the other."""
    gateways = await start(
        tmp_path,
        servers,
        slots=slots,
        acme=acme,
        queue=queue,
        replicas=2,
        flags=("--redis-url", redis_server.url),
    )
    await until(
        lambda: all(g.runner.app[LEDGER].cap_replicas == 2 for g in gateways),
        "both replicas count each other",
    )
    return gateways


Answer = tuple[int, dict[str, str], dict[str, Any] | str]


# A prompt of some 600 tokens: a few of them weigh on a pool's prefill as many short ones do.
LONG = "lorem ipsum " * 200


async def chat(
    session: aiohttp.ClientSession,
    gateway: Served,
    key: str,
    tokens: int,
    prompt: str = "hello there",
) -> Answer:
    body = {
        "model": "llama",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": tokens,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    async with session.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers) as r:
        text = await r.text()
        answer: dict[str, Any] | str = await r.json() if r.status != 200 else text
        return r.status, dict(r.headers), answer


def count(gateway: Served, tenant: str) -> TenantCount:
    ledger = gateway.runner.app[LEDGER]
    (pool,) = [p for p in ledger.pools() if p.name == POOL]
    return ledger.tenant_count(pool, tenant)


def requests(gateway: Served, tenant: str) -> tuple[int, int]:
    """The tenant's requests running and waiting in the pool, on every replica."""
    counted = count(gateway, tenant)
    return counted.running, counted.waiting


def own(gateway: Served, tenant: str) -> TenantCount:
    """The tenant's requests in the pool on this replica alone."""
    ledger = gateway.runner.app[LEDGER]
    (pool,) = [p for p in ledger.pools() if p.name == POOL]
    return ledger.own_tenants().get((pool.key, tenant), TenantCount())


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(400):
        if check():
            return
        await asyncio.sleep(0.025)
    raise AssertionError(f"never: {what}")


def flood(
    session: aiohttp.ClientSession, gateway: Served, n: int, prompt: str = "hello there"
) -> list[asyncio.Task[Answer]]:
    # Long streams (~4 s at the engine's real pace): they hold their slots while the test looks.
    return [asyncio.create_task(chat(session, gateway, "sk-acme", 400, prompt)) for _ in range(n)]


async def answers(tasks: list[asyncio.Task[Answer]]) -> list[Answer]:
    return list(await asyncio.gather(*tasks))


async def test_a_flood_that_fills_the_line_gives_another_tenants_request_a_place(
    tmp_path: Path,
) -> None:
    servers = Servers()
    try:
        (gateway,) = await start(tmp_path, servers, slots=2, queue={"maxWaiting": 4})
        async with aiohttp.ClientSession() as session:
            acme = flood(session, gateway, 6)
            await until(lambda: requests(gateway, "acme") == (2, 4), "slots and line full")
            status, _, _ = await chat(session, gateway, "sk-beta", 5)
            assert status == 200  # without the line's share: 429 pool_saturated
            results = await answers(acme)
        refused = [(h, a) for s, h, a in results if s == 429]
        assert len(refused) == 1  # acme's newest gave its place up
        ((headers, error),) = refused
        assert isinstance(error, dict)
        assert error["error"]["code"] == "tenant_line_share"
        assert "tenant acme" in error["error"]["message"]
        assert headers["Retry-After"] == "1"
        assert sorted(s for s, _, _ in results) == [200] * 5 + [429]
    finally:
        await servers.close()


async def test_a_tenant_at_its_caps_waits_or_is_refused_while_another_runs(
    tmp_path: Path,
) -> None:
    servers = Servers()
    caps = "    maxConcurrentRequests: 1\n    maxQueuedRequests: 1"
    try:
        (gateway,) = await start(tmp_path, servers, slots=4, acme=caps)
        async with aiohttp.ClientSession() as session:
            acme = flood(session, gateway, 2)
            await until(lambda: requests(gateway, "acme") == (1, 1), "one runs, one waits")
            status, headers, error = await chat(session, gateway, "sk-acme", 5)
            assert status == 429
            assert isinstance(error, dict)
            assert error["error"]["code"] == "tenant_queue_full"
            assert "maxQueuedRequests=1" in error["error"]["message"]
            assert headers["Retry-After"] == "1"
            # Three slots are free for beta: it runs at once, while acme's second still waits.
            status, _, _ = await chat(session, gateway, "sk-beta", 5)
            assert status == 200
            assert requests(gateway, "acme") == (1, 1)
            assert [s for s, _, _ in await answers(acme)] == [200, 200]
    finally:
        await servers.close()


async def test_a_tenants_long_prompts_are_held_to_its_token_cap_while_another_runs(
    tmp_path: Path,
) -> None:
    servers = Servers()
    try:
        (gateway,) = await start(tmp_path, servers, slots=8)
        async with aiohttp.ClientSession() as session:
            # What one long prompt weighs, as the gateway counts it (beta has no caps).
            probe = asyncio.create_task(chat(session, gateway, "sk-beta", 400, LONG))
            await until(lambda: count(gateway, "beta").running_tokens > 0, "beta's prompt runs")
            weight = count(gateway, "beta").running_tokens
            # A cap that two of them fit in, not three; read again as a rotated Secret is.
            cap = f"    maxConcurrentPromptTokens: {2 * weight + weight // 2}"
            (tmp_path / "tenants.yaml").write_text(tenants(cap))
            assert gateway.runner.app[TENANTS].refresh()
            acme = flood(session, gateway, 4, LONG)
            held = TenantCount(running=2, waiting=2, running_tokens=2 * weight)
            await until(lambda: count(gateway, "acme") == held, "two run, two wait")
            # Five of the pool's eight slots are free: beta's long prompt runs at once, while
            # acme's wait for its own to end.
            status, _, _ = await chat(session, gateway, "sk-beta", 5, LONG)
            assert status == 200
            assert count(gateway, "acme") == held
            assert [s for s, _, _ in await answers(acme)] == [200] * 4
            assert (await probe)[0] == 200
    finally:
        await servers.close()


async def test_a_request_held_past_its_wait_by_the_token_cap_is_refused_naming_it(
    tmp_path: Path,
) -> None:
    servers = Servers()
    try:
        (gateway,) = await start(
            tmp_path,
            servers,
            slots=8,
            acme="    maxConcurrentPromptTokens: 1",
            queue={"timeoutMillis": 1500},
        )
        async with aiohttp.ClientSession() as session:
            # Longer than the cap, the first runs all the same (acme runs nothing else).
            (running,) = flood(session, gateway, 1, LONG)
            await until(lambda: count(gateway, "acme").running == 1, "acme's first runs")
            status, headers, error = await chat(session, gateway, "sk-acme", 5, LONG)
            assert status == 429
            assert isinstance(error, dict)
            assert error["error"]["code"] == "tenant_prompt_tokens_exceeded"
            message = error["error"]["message"]
            assert "tenant acme" in message
            assert "maxConcurrentPromptTokens=1" in message
            assert headers["Retry-After"] == "1"
            status, _, _ = await chat(session, gateway, "sk-beta", 5, LONG)
            assert status == 200
            assert (await running)[0] == 200
    finally:
        await servers.close()


async def test_the_caps_hold_over_two_replicas_sharing_redis(
    tmp_path: Path, redis_server: LocalRedis
) -> None:
    servers = Servers()
    try:
        first, second = await start(
            tmp_path,
            servers,
            slots=4,
            acme="    maxConcurrentRequests: 1",
            queue={"timeoutMillis": 1500},
            replicas=2,
            flags=("--redis-url", redis_server.url),
        )
        async with aiohttp.ClientSession() as session:
            (running,) = flood(session, first, 1)
            await until(lambda: count(first, "acme").running == 1, "acme runs on the first")
            await first.runner.app[TENANT_SHARE].flush()  # its count is in Redis
            # The second replica reads acme's request on the first: acme's waits, then is
            # refused at the queue's limit, naming the tenant's cap. Alone it would have run.
            status, headers, error = await chat(session, second, "sk-acme", 5)
            assert status == 429
            assert isinstance(error, dict)
            assert error["error"]["code"] == "tenant_concurrency_exceeded"
            assert "maxConcurrentRequests=1" in error["error"]["message"]
            assert headers["Retry-After"] == "1"
            status, _, _ = await chat(session, second, "sk-beta", 5)
            assert status == 200
            assert (await running)[0] == 200
            # Once acme's request on the first ended, the second admits acme again.
            await until(lambda: count(first, "acme") == TenantCount(), "acme's request ended")
            await first.runner.app[TENANT_SHARE].flush()
            status, _, _ = await chat(session, second, "sk-acme", 5)
            assert status == 200
    finally:
        await servers.close()


async def test_a_tenants_running_prompt_tokens_are_read_from_the_other_replica(
    tmp_path: Path, redis_server: LocalRedis
) -> None:
    servers = Servers()
    try:
        first, second = await start(
            tmp_path,
            servers,
            slots=8,
            acme="    maxConcurrentPromptTokens: 1000000",
            replicas=2,
            flags=("--redis-url", redis_server.url),
        )
        async with aiohttp.ClientSession() as session:
            (on_first,) = flood(session, first, 1, LONG)
            await until(lambda: own(first, "acme").running == 1, "acme runs on the first")
            weight = own(first, "acme").running_tokens
            await first.runner.app[TENANT_SHARE].flush()
            # The second replica reads the first's count before admitting acme's request:
            # its prompt tokens too, which the token cap is judged on.
            (on_second,) = flood(session, second, 1, LONG)
            await until(lambda: own(second, "acme").running == 1, "acme runs on the second")
            assert count(second, "acme") == TenantCount(running=2, running_tokens=2 * weight)
            assert [s for s, _, _ in await answers([on_first, on_second])] == [200, 200]
    finally:
        await servers.close()


async def test_two_replicas_admitting_at_once_stay_within_the_cap(
    tmp_path: Path, redis_server: LocalRedis
) -> None:
    servers = Servers()
    try:
        gateways = await start_sharing(
            tmp_path,
            servers,
            redis_server,
            slots=64,
            acme="    maxConcurrentRequests: 2",
        )
        peak = 0

        def sample() -> bool:
            nonlocal peak
            peak = max(peak, sum(own(g, "acme").running for g in gateways))
            return False

        async def watch() -> None:
            while True:
                sample()
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        async with aiohttp.ClientSession() as session:
            # Ten senders at once, five on each replica, three requests each.
            for _ in range(3):
                answers = await asyncio.gather(
                    *(chat(session, gateways[i % 2], "sk-acme", 30) for i in range(10))
                )
                assert [status for status, _, _ in answers] == [200] * 10
        watcher.cancel()
        # Each replica's reading of the other is older than their concurrent admissions;
        # each keeping to half of the cap holds the total to it.
        assert peak == 2
    finally:
        await servers.close()


async def test_two_replicas_run_a_tenants_lone_prompts_one_at_a_time_taking_turns(
    tmp_path: Path, redis_server: LocalRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    servers = Servers()
    try:
        # Every LONG prompt is past the cap, so each runs only alone: while acme runs none
        # anywhere, on one replica, under the tenant's lease in the pool.
        gateways = await start_sharing(
            tmp_path,
            servers,
            redis_server,
            slots=64,
            acme="    maxConcurrentPromptTokens: 100",
            queue={"timeoutMillis": 60000},
        )
        started: list[int] = []  # the replica of each lone prompt, in the order they ran
        for i, gateway in enumerate(gateways):
            ledger = gateway.runner.app[LEDGER]

            def take_lone(
                now: float,
                key: TenantKey,
                i: int = i,
                take: Callable[[float, TenantKey], Wakes] = ledger.take_lone,
            ) -> Wakes:
                wakes = take(now, key)
                started.extend([i] * len(wakes.granted))  # one lease, one prompt
                return wakes

            monkeypatch.setattr(ledger, "take_lone", take_lone)
        peak = 0

        async def watch() -> None:
            nonlocal peak
            while True:
                peak = max(peak, sum(own(g, "acme").running for g in gateways))
                await asyncio.sleep(0.002)

        watcher = asyncio.create_task(watch())
        async with aiohttp.ClientSession() as session:
            # Six at once, three on each replica: each replica reads "none" from the other.
            answers = await asyncio.gather(
                *(chat(session, gateways[i % 2], "sk-acme", 5, LONG) for i in range(6))
            )
        watcher.cancel()
        assert [status for status, _, _ in answers] == [200] * 6
        assert peak == 1
        # The replica whose lone prompt just ended knows it first; were it to take the lease
        # again at once, it would run its three before the other replica read that the
        # tenant ran none.
        assert sorted(started) == [0, 0, 0, 1, 1, 1]
        assert all(a != b for a, b in itertools.pairwise(started)), started
    finally:
        await servers.close()


async def test_a_lone_prompt_refused_waiting_for_its_turn_says_so(
    tmp_path: Path, redis_server: LocalRedis
) -> None:
    servers = Servers()
    redis = Redis.from_url(redis_server.url)
    try:
        gateways = await start_sharing(
            tmp_path,
            servers,
            redis_server,
            slots=8,
            acme="    maxConcurrentPromptTokens: 100",
            queue={"timeoutMillis": 1500},
        )
        # Another replica holds acme's lease in the pool, about to run its own lone prompt.
        (pool,) = [p for p in gateways[0].runner.app[LEDGER].pools() if p.name == POOL]
        assert await redis.set(f"laneway:tenants:lone:{pool.key}|acme", "elsewhere", px=60000)
        async with aiohttp.ClientSession() as session:
            status, _, error = await chat(session, gateways[0], "sk-acme", 5, LONG)
        assert status == 429
        assert isinstance(error, dict)
        assert error["error"]["code"] == "tenant_prompt_tokens_exceeded"
        message = error["error"]["message"]
        assert "it runs none in pool shared" in message
        assert "maxConcurrentPromptTokens=100" in message
        assert "one at a time over the 2 gateway replicas" in message
    finally:
        await redis.aclose()
        await servers.close()


pytestmark = pytest.mark.asyncio
