"""Tenants behind Envoy: `laneway epp --tenants` names each request's tenant by its API key
(as `laneway gateway` does, the same keys file), or by the fairness id with
--trust-fairness-id; the tenant's caps, line share and priority apply, and with
--redis-url its requests count over pickers and gateways alike.

In-process pickers over loopback gRPC, the test in Envoy's place (support/epp.py),
`laneway sim` engines, a real redis-server for the shared caps. A request routed by the
picker holds its place until its exchange ends, so the test holds one by not ending it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from support.epp import (
    Exchange,
    Picker,
    chat,
    immediate_error,
    request_body,
    request_headers,
    start_picker,
)
from support.inproc import Servers
from support.pools import gateway_doc, pool_doc

from laneway.bench.harness.redis_server import LocalRedis
from laneway.gateway.keys import LEDGER, TENANT_SHARE
from laneway.gateway.state.redis_store import RedisSettings
from laneway.gateway.state.shared import SharedStateOptions
from laneway.gateway.state.tenants import TenantKeys
from laneway.ledger.tenants import TenantCount

FAIRNESS = "x-gateway-inference-fairness-id"
TENANTS = """
tenants:
  - name: acme
    apiKeys: [sk-acme]
    priority: 3
    maxConcurrentRequests: 1
  - name: beta
    apiKeys: [sk-beta]
"""


@pytest.fixture
async def engines(servers: Servers) -> tuple[str, str, str]:
    """Two interactive engines and a batch one."""
    a, b, long = [await servers.sim("llama-small", "--time-scale", "20") for _ in range(3)]
    return a.url, b.url, long.url


def keys(tmp_path: Path) -> TenantKeys:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    return TenantKeys(path)


async def tenant_picker(
    tmp_path: Path,
    engines: tuple[str, str, str],
    *,
    redis: RedisSettings | None = None,
    trust_fairness_id: bool = False,
) -> AsyncIterator[Picker]:
    async for started in start_picker(
        tmp_path,
        engines,
        shared=SharedStateOptions(redis=redis, tenants=keys(tmp_path)),
        trust_fairness_id=trust_fairness_id,
        chat_scheduling={"policy": "priority"},
        queue={"timeoutMillis": 300},
    ):
        yield started


@pytest.fixture
async def picker(tmp_path: Path, engines: tuple[str, str, str]) -> AsyncIterator[Picker]:
    async for started in tenant_picker(tmp_path, engines):
        yield started


def count(picker: Picker, tenant: str) -> TenantCount:
    """The tenant's requests running and waiting (whose they are is what these tests ask;
    their prompt tokens are left out)."""
    ledger = picker.app[LEDGER]
    (pool,) = [p for p in ledger.pools() if p.name == "chat"]
    return replace(ledger.tenant_count(pool, tenant), running_tokens=0)


async def routed(picker: Picker, headers: dict[str, str]) -> tuple[Exchange, dict[str, Any]]:
    """A request the picker routes, still held (its exchange open); the body it forwards."""
    exchange = Exchange(picker)
    exchange.send(request_headers(extra=headers), request_body(chat(max_tokens=4)))
    first = await exchange.read()
    assert first.HasField("request_headers"), first
    second = await exchange.read()
    return exchange, json.loads(second.request_body.response.body_mutation.streamed_response.body)


async def refused(picker: Picker, headers: dict[str, str], body: bool = True) -> tuple[int, Any]:
    exchange = Exchange(picker)
    exchange.send(request_headers(extra=headers))
    if body:
        exchange.send(request_body(chat(max_tokens=4)))
    return immediate_error(await exchange.read())


async def test_the_api_key_names_the_tenant_and_its_priority_goes_to_the_engine(
    picker: Picker,
) -> None:
    # The fairness id is a header any client sets: the key decides whose request it is.
    held, forwarded = await routed(picker, {"authorization": "Bearer sk-acme", FAIRNESS: "beta"})
    assert forwarded["priority"] == 3  # acme's level at a priority-scheduled pool
    assert count(picker, "acme") == TenantCount(running=1)
    assert count(picker, "beta") == TenantCount()
    other, forwarded = await routed(picker, {"authorization": "Bearer sk-beta"})
    assert forwarded["priority"] == 0
    for exchange in (held, other):
        await exchange.close()
    assert count(picker, "acme") == TenantCount()


async def test_without_a_known_key_it_answers_the_gateways_401_before_the_body(
    picker: Picker,
) -> None:
    # Refused on the headers: the body is never needed.
    status, error = await refused(picker, {}, body=False)
    assert (status, error["code"]) == (401, "invalid_api_key")
    assert "Authorization: Bearer KEY" in error["message"]
    status, error = await refused(picker, {"authorization": "Bearer sk-nobody"}, body=False)
    assert (status, error["code"], error["message"]) == (
        401,
        "invalid_api_key",
        "Incorrect API key provided",
    )


async def test_a_tenant_at_its_cap_is_refused_while_another_is_routed(picker: Picker) -> None:
    held, _ = await routed(picker, {"authorization": "Bearer sk-acme"})
    # acme's second waits out the line's 300 ms, then is refused naming its cap.
    status, error = await refused(picker, {"authorization": "Bearer sk-acme"})
    assert (status, error["code"]) == (429, "tenant_concurrency_exceeded")
    assert "maxConcurrentRequests=1" in error["message"]
    beta, _ = await routed(picker, {"authorization": "Bearer sk-beta"})
    await held.close()
    again, _ = await routed(picker, {"authorization": "Bearer sk-acme"})
    for exchange in (beta, again):
        await exchange.close()


async def test_a_trusted_fairness_id_names_the_tenant(
    tmp_path: Path, engines: tuple[str, str, str]
) -> None:
    async for picker in tenant_picker(tmp_path, engines, trust_fairness_id=True):
        held, forwarded = await routed(picker, {FAIRNESS: "acme"})
        assert forwarded["priority"] == 3
        assert count(picker, "acme") == TenantCount(running=1)
        # The newer header spelling is read too; acme is at its cap.
        status, error = await refused(picker, {"x-llm-d-inference-fairness-id": "acme"})
        assert (status, error["code"]) == (429, "tenant_concurrency_exceeded")
        status, error = await refused(picker, {FAIRNESS: "zeta"}, body=False)
        assert (status, error["code"]) == (401, "unknown_tenant")
        assert "'zeta'" in error["message"]
        # Without a fairness id, the API key names the tenant, as without the flag.
        status, error = await refused(picker, {}, body=False)
        assert (status, error["code"]) == (401, "invalid_api_key")
        beta, _ = await routed(picker, {"authorization": "Bearer sk-beta"})
        for exchange in (held, beta):
            await exchange.close()


async def test_without_tenants_the_fairness_id_is_the_fair_share_flow(
    tmp_path: Path, engines: tuple[str, str, str]
) -> None:
    async for picker in start_picker(tmp_path, engines):
        held, _ = await routed(picker, {FAIRNESS: "flow-a"})
        anonymous, _ = await routed(picker, {})
        assert count(picker, "flow-a") == TenantCount(running=1)
        assert count(picker, "anonymous") == TenantCount(running=1)
        for exchange in (held, anonymous):
            await exchange.close()


async def test_the_caps_hold_between_a_picker_and_a_gateway_sharing_redis(
    tmp_path: Path, engines: tuple[str, str, str], servers: Servers, redis_server: LocalRedis
) -> None:
    a, b, long = engines
    (tmp_path / "tenants.yaml").write_text(TENANTS)
    # The same pools as the picker's (start_picker's), so both count acme in one pool.
    documents = [
        pool_doc(
            "chat", "interactive", "llama-small", [a, b],
            routing={"maxPromptTokens": 2000}, limits={"maxContextTokens": 4096},
        ),
        pool_doc(
            "long", "batch", "llama-long", [long],
            routing={"minPromptTokens": 2001}, limits={"maxContextTokens": 32768},
        ),
        gateway_doc(queue={"timeoutMillis": 300}),
    ]  # fmt: skip
    gateway = await servers.gateway(
        tmp_path / "gateway.yaml",
        documents,
        *("--tenants", str(tmp_path / "tenants.yaml"), "--redis-url", redis_server.url),
    )
    redis = RedisSettings(url=redis_server.url)
    async for picker in tenant_picker(tmp_path, engines, redis=redis):
        held, _ = await routed(picker, {"authorization": "Bearer sk-acme"})
        await picker.app[TENANT_SHARE].flush()  # acme's count is in Redis
        async with aiohttp.ClientSession() as session:

            async def post(key: str) -> tuple[int, Any]:
                body = json.loads(chat(max_tokens=2))
                headers = {"Authorization": f"Bearer {key}"}
                url = f"{gateway.url}/v1/chat/completions"
                async with session.post(url, json=body, headers=headers) as answer:
                    return answer.status, await answer.json()

            # The gateway reads acme's request on the picker: acme's waits, then is refused.
            status, answer = await post("sk-acme")
            assert (status, answer["error"]["code"]) == (429, "tenant_concurrency_exceeded")
            assert (await post("sk-beta"))[0] == 200
            await held.close()
            await picker.app[TENANT_SHARE].flush()
            assert (await post("sk-acme"))[0] == 200
