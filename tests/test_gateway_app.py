"""The app factory with a live PoolSource: pools come and go without a restart."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from support.pools import simulated_pool

from laneway.api import InferencePool
from laneway.gateway.app import create_app
from laneway.gateway.config import GatewaySettings, QueueSettings
from laneway.gateway.pools.sources import PoolUpdate


def pool(name: str, models: list[str], endpoints: list[str]) -> InferencePool:
    return simulated_pool(name, endpoints, routing={"models": models})


class QueueSource:
    """A PoolSource fed by the test, the way the Kubernetes watcher feeds the gateway."""

    def __init__(self) -> None:
        self.sets: asyncio.Queue[Sequence[InferencePool]] = asyncio.Queue()

    async def run(self, update: PoolUpdate) -> None:
        while True:
            update(await self.sets.get())


async def wait_for(client: TestClient[Any, Any], path: str, status: int) -> None:
    async with asyncio.timeout(60):
        while (await client.get(path)).status != status:  # noqa: ASYNC110 - polling HTTP
            await asyncio.sleep(0.01)


async def model_ids(client: TestClient[Any, Any]) -> list[str]:
    listing = await (await client.get("/v1/models")).json()
    return [model["id"] for model in listing["data"]]


async def test_pools_appear_change_and_go_through_the_source() -> None:
    source = QueueSource()
    app = create_app(
        GatewaySettings(queue=QueueSettings(timeout_millis=100, cold_start_timeout_millis=100)),
        source,
    )
    async with TestClient(TestServer(app)) as client:
        assert (await client.get("/readyz")).status == 503  # nothing delivered yet
        assert (await client.get("/healthz")).status == 200

        # Port 9 (discard) is never reached: nothing here sends a completion.
        source.sets.put_nowait([pool("chat", ["llama"], ["http://127.0.0.1:9"])])
        await wait_for(client, "/readyz", 200)
        assert await model_ids(client) == ["llama"]

        source.sets.put_nowait(
            [
                pool("chat", ["llama", "llama-chat"], ["http://127.0.0.1:9"]),
                pool("docs", ["mistral"], []),
            ]
        )
        async with asyncio.timeout(60):
            while await model_ids(client) != ["llama", "llama-chat", "mistral"]:  # noqa: ASYNC110
                await asyncio.sleep(0.01)

        # A pool without endpoints (at zero) holds a request for the queue timeout, then
        # answers 503 with Retry-After, not a hang.
        response = await client.post(
            "/v1/completions", json={"model": "mistral", "prompt": "hi", "max_tokens": 2}
        )
        assert response.status == 503
        assert response.headers["Retry-After"] == "1"
        assert response.headers["x-laneway-pool"] == "docs"
        assert (await response.json())["error"]["code"] == "no_healthy_endpoint"

        source.sets.put_nowait([pool("docs", ["mistral"], [])])
        await wait_for(client, "/readyz", 503)  # no pool has an endpoint any more
        response = await client.post(
            "/v1/completions", json={"model": "llama", "prompt": "hi", "max_tokens": 2}
        )
        assert response.status == 404


async def test_unknown_routes_and_methods_are_openai_shaped() -> None:
    app = create_app(GatewaySettings(), QueueSource())
    async with TestClient(TestServer(app)) as client:
        missing = await client.get("/v1/nothing")
        assert missing.status == 404
        assert (await missing.json())["error"]["type"] == "not_found_error"
        wrong_method = await client.get("/v1/chat/completions")
        assert wrong_method.status == 405
        assert (await wrong_method.json())["error"]["code"] == "method_not_allowed"
