"""`spec.routing.tenants` through the gateway: two tenants' keys, real engines, the openai client.

Pools (one simulated engine each, served in-process with the gateways): `open-chat` for
everyone; `acme-chat` for acme only over the same prompt range; `beta-chat` for beta only,
for prompts up to 64 tokens. The two tenants'
pools also answer to a model name of their own (`llama-acme`, `llama-beta`). The same config
behind a gateway without a keys file shows that an unauthenticated request never reaches a
tenant's pool.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import openai
import pytest
import pytest_asyncio
from support.inproc import Served, Servers
from support.pools import FAST, gateway_doc, pool_doc

TENANTS = """
tenants:
  - name: acme
    apiKeys: [sk-acme]
  - name: beta
    apiKeys: [sk-beta]
  - name: gamma
    apiKeys: [sk-gamma]
"""

# The engines and the gateways serve in the module's event loop, which every test shares.
pytestmark = pytest.mark.asyncio(loop_scope="module")


@dataclass(frozen=True)
class Gateways:
    with_keys: Served
    without_keys: Served


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gateways(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Gateways]:
    folder = tmp_path_factory.mktemp("tenants")
    (folder / "tenants.yaml").write_text(TENANTS)
    servers = Servers()
    engines = {
        name: await servers.sim(f"served-{name}", "--time-scale", FAST)
        for name in ("open-chat", "acme-chat", "beta-chat")
    }
    chat = {"maxPromptTokens": 2000}
    documents = [
        pool_doc("open-chat", "interactive", "served-open-chat", [engines["open-chat"].url], chat),
        pool_doc(
            "acme-chat",
            "interactive",
            "served-acme-chat",
            [engines["acme-chat"].url],
            {**chat, "tenants": ["acme"], "models": ["llama", "llama-acme"]},
        ),
        pool_doc(
            "beta-chat",
            "interactive",
            "served-beta-chat",
            [engines["beta-chat"].url],
            {"maxPromptTokens": 64, "tenants": ["beta"], "models": ["llama", "llama-beta"]},
        ),
        gateway_doc(),
    ]
    config = folder / "gateway.yaml"
    with_keys = await servers.gateway(config, documents, "--tenants", str(folder / "tenants.yaml"))
    without_keys = await servers.gateway(config, documents)
    yield Gateways(with_keys, without_keys)
    await servers.close()


async def pool_for(gateway: Served, key: str, words: int) -> str:
    api = openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0)
    async with api:
        raw = await api.chat.completions.with_raw_response.create(
            model="llama",
            messages=[{"role": "user", "content": " ".join(["parcel"] * words)}],
            max_tokens=4,
        )
    assert raw.parse().choices[0].message.content
    return raw.headers["x-laneway-pool"]


async def test_each_tenant_reaches_its_own_pool(gateways: Gateways) -> None:
    assert await pool_for(gateways.with_keys, "sk-acme", 10) == "acme-chat"
    assert await pool_for(gateways.with_keys, "sk-beta", 10) == "beta-chat"


async def test_a_tenant_without_pools_of_its_own_gets_the_open_ones(gateways: Gateways) -> None:
    assert await pool_for(gateways.with_keys, "sk-gamma", 10) == "open-chat"


async def test_a_tenant_whose_pools_do_not_fit_falls_back_to_the_open_ones(
    gateways: Gateways,
) -> None:
    # beta's pool takes up to 64 prompt tokens; 300 words is several times that.
    assert await pool_for(gateways.with_keys, "sk-beta", 300) == "open-chat"


async def test_unauthenticated_requests_never_reach_a_tenants_pool(gateways: Gateways) -> None:
    with pytest.raises(openai.AuthenticationError):
        await pool_for(gateways.with_keys, "sk-unknown", 10)
    # Without a keys file every request is anonymous: only the open pool serves them.
    pools = {await pool_for(gateways.without_keys, "unused", 10) for _ in range(5)}
    assert pools == {"open-chat"}


async def listed_models(gateway: Served, key: str) -> set[str]:
    async with openai.AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=key, max_retries=0) as api:
        return {model.id async for model in api.models.list()}


async def test_models_lists_only_what_the_caller_may_reach(gateways: Gateways) -> None:
    assert await listed_models(gateways.with_keys, "sk-acme") == {"llama", "llama-acme"}
    assert await listed_models(gateways.with_keys, "sk-beta") == {"llama", "llama-beta"}
    assert await listed_models(gateways.with_keys, "sk-gamma") == {"llama"}
    with pytest.raises(openai.AuthenticationError):
        await listed_models(gateways.with_keys, "sk-unknown")
    assert await listed_models(gateways.without_keys, "unused") == {"llama"}


async def pool_with_two_keys(gateway: Served, first: str, second: str) -> tuple[int, str]:
    """A chat sent with two Authorization headers: its status and the pool that served it."""
    headers = [("Authorization", f"Bearer {first}"), ("Authorization", f"Bearer {second}")]
    body = {"model": "llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session,
        session.post(f"{gateway.url}/v1/chat/completions", json=body, headers=headers) as response,
    ):
        await response.read()
        return response.status, response.headers.get("x-laneway-pool", "")


async def test_two_authorization_headers_are_read_by_the_first(gateways: Gateways) -> None:
    """The one way every route reads a header sent twice: aiohttp's, by its first value."""
    assert await pool_with_two_keys(gateways.with_keys, "sk-acme", "sk-beta") == (200, "acme-chat")
    assert await pool_with_two_keys(gateways.with_keys, "sk-beta", "sk-acme") == (200, "beta-chat")
    assert await pool_with_two_keys(gateways.with_keys, "sk-unknown", "sk-acme") == (401, "")
