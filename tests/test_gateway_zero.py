"""A pool at zero: its requests (plain ones and Batches API items) wait in the pool's line
and count as demand on /laneway/demand until a replica appears (here a real `laneway sim`
the pool source delivers later), and are refused only past the queue timeout, with
Retry-After. With Redis, the demand is summed over every gateway replica."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from typing import Any

import openai
from aiohttp.test_utils import TestClient, TestServer
from support.pools import simulated_pool

from laneway.api import InferencePool
from laneway.bench.harness.procs import Children
from laneway.bench.harness.redis_server import LocalRedis
from laneway.gateway.app import create_app
from laneway.gateway.config import GatewaySettings, QueueSettings
from laneway.gateway.pools.sources import PoolUpdate
from laneway.gateway.state.redis_store import RedisSettings
from laneway.gateway.state.shared import SharedStateOptions, announce_listening

DOCS = "default/docs"


def docs_pool(endpoints: Sequence[str]) -> InferencePool:
    return simulated_pool(
        "docs", endpoints, lane="batch", model="llama-small", routing={"models": ["llama"]}
    )


class QueueSource:
    """A PoolSource fed by the test, the way the Kubernetes watcher feeds the gateway."""

    def __init__(self) -> None:
        self.sets: asyncio.Queue[Sequence[InferencePool]] = asyncio.Queue()

    async def run(self, update: PoolUpdate) -> None:
        while True:
            update(await self.sets.get())


async def demand(client: TestClient[Any, Any]) -> dict[str, Any]:
    response = await client.get("/laneway/demand")
    assert response.status == 200
    document: dict[str, Any] = await response.json()
    return document


async def until_demand(client: TestClient[Any, Any], pool: str, **wanted: int) -> dict[str, Any]:
    async with asyncio.timeout(30):
        while True:
            counts = (await demand(client))["pools"].get(pool, {})
            if all(counts.get(key) == value for key, value in wanted.items()):
                return dict(counts)
            await asyncio.sleep(0.02)


async def test_a_request_for_a_pool_at_zero_waits_for_its_first_replica() -> None:
    source = QueueSource()
    # A slot wait far shorter than starting an engine: a pool at zero waits for its cold
    # start (queue.coldStartTimeoutMillis, by default), not for a slot.
    settings = GatewaySettings(queue=QueueSettings(timeout_millis=200))
    app = create_app(settings, source)
    async with (
        TestClient(TestServer(app)) as client,
        Children() as children,
        contextlib.AsyncExitStack() as stack,
    ):
        source.sets.put_nowait([docs_pool([])])
        api = await stack.enter_async_context(
            openai.AsyncOpenAI(
                base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0
            )
        )
        prompt = "summarise this document " * 200

        async def ask() -> tuple[str, str]:
            stream = await api.chat.completions.with_raw_response.create(
                model="llama",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=8,
                stream=True,
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream.parse()])
            return stream.headers["x-laneway-pool"], text

        waiting = asyncio.create_task(ask())
        queued = await until_demand(client, DOCS, queuedRequests=1, inFlightRequests=0)
        assert queued["queuedPromptTokens"] > 200  # the prompt's tokens, what a replica costs
        assert not waiting.done()  # waiting, not refused

        engine = await children.start_laneway_async(
            "sim", ["--host", "127.0.0.1", "--port", "0", "--model", "llama-small"]
        )
        assert not waiting.done()  # an engine process took longer to start than 200 ms
        source.sets.put_nowait([docs_pool([engine.url])])
        pool, text = await asyncio.wait_for(waiting, 60)
        assert pool == "docs"
        assert text
        after = await until_demand(client, DOCS, queuedRequests=0, inFlightRequests=0)
        assert after["queuedPromptTokens"] == after["inFlightPromptTokens"] == 0
        assert after["ttftMet"] + after["ttftMissed"] == 1  # the stream's first token, judged


async def test_past_the_cold_start_timeout_a_pool_at_zero_answers_503_with_retry_after() -> None:
    source = QueueSource()
    queue = QueueSettings(timeout_millis=200, cold_start_timeout_millis=300, retry_after_seconds=7)
    settings = GatewaySettings(queue=queue)
    app = create_app(settings, source)
    async with TestClient(TestServer(app)) as client:
        source.sets.put_nowait([docs_pool([])])
        await until_demand(client, DOCS, queuedRequests=0)
        response = await client.post(
            "/v1/completions", json={"model": "llama", "prompt": "hi", "max_tokens": 2}
        )
        assert response.status == 503
        assert response.headers["Retry-After"] == "7"
        error = (await response.json())["error"]
        assert error["code"] == "no_healthy_endpoint"
        assert "scaled to zero or starting) after 300 ms" in error["message"]
        await until_demand(client, DOCS, queuedRequests=0, queuedPromptTokens=0)


async def test_with_redis_the_demand_is_every_replicas_sum(redis_server: LocalRedis) -> None:
    apps, sources = [], []
    for _ in range(2):
        source = QueueSource()
        app = create_app(
            GatewaySettings(queue=QueueSettings(cold_start_timeout_millis=8_000)),
            source,
            shared=SharedStateOptions(redis=RedisSettings(url=redis_server.url)),
        )
        apps.append(app)
        sources.append(source)
    async with TestClient(TestServer(apps[0])) as one, TestClient(TestServer(apps[1])) as two:
        for source in sources:
            source.sets.put_nowait([docs_pool([])])
        # One request waits at each replica: either one, asked, reports both.
        waiting = [
            asyncio.create_task(
                client.post(
                    "/v1/completions",
                    json={"model": "llama", "prompt": "a long document", "max_tokens": 2},
                )
            )
            for client in (one, two)
        ]
        summed = await until_demand(one, DOCS, queuedRequests=2)
        assert (await demand(one))["replicas"] == 2
        assert (await until_demand(two, DOCS, queuedRequests=2)) == summed
        # Nothing wakes the pool here: both are refused at their timeout, and leave the count.
        assert [(await task).status for task in waiting] == [503, 503]
        await until_demand(two, DOCS, queuedRequests=0)


async def test_batch_items_for_a_pool_at_zero_wait_count_and_complete_once_it_wakes(
    redis_server: LocalRedis,
) -> None:
    source = QueueSource()
    app = create_app(
        GatewaySettings(),
        source,
        shared=SharedStateOptions(redis=RedisSettings(url=redis_server.url)),
    )
    async with (
        TestClient(TestServer(app)) as client,
        Children() as children,
        contextlib.AsyncExitStack() as stack,
    ):
        announce_listening(app, "127.0.0.1", client.port or 0)
        source.sets.put_nowait([docs_pool([])])
        api = await stack.enter_async_context(
            openai.AsyncOpenAI(
                base_url=str(client.make_url("/v1")), api_key="unused", max_retries=0
            )
        )
        lines = [
            json.dumps(
                {
                    "custom_id": f"doc-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": "llama",
                        "messages": [{"role": "user", "content": f"summarise report {i}"}],
                        "max_tokens": 4,
                    },
                }
            )
            for i in range(2)
        ]
        uploaded = await api.files.create(
            file=("items.jsonl", "\n".join(lines).encode()), purpose="batch"
        )
        batch = await api.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        # Both items wait in the sleeping pool's line: demand the scaler will see.
        await until_demand(client, DOCS, queuedRequests=2)

        engine = await children.start_laneway_async(
            "sim", ["--host", "127.0.0.1", "--port", "0", "--model", "llama-small"]
        )
        source.sets.put_nowait([docs_pool([engine.url])])
        async with asyncio.timeout(60):
            while (done := await api.batches.retrieve(batch.id)).status != "completed":  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        assert done.request_counts is not None
        assert (done.request_counts.completed, done.request_counts.failed) == (2, 0)
        await until_demand(client, DOCS, queuedRequests=0, inFlightRequests=0)


async def test_without_redis_a_replica_reports_its_own_demand(redis_server: LocalRedis) -> None:
    source = QueueSource()
    app = create_app(
        GatewaySettings(queue=QueueSettings(cold_start_timeout_millis=5_000)),
        source,
        shared=SharedStateOptions(redis=RedisSettings(url=redis_server.url)),
    )
    async with TestClient(TestServer(app)) as client:
        source.sets.put_nowait([docs_pool([])])
        waiting = asyncio.create_task(
            client.post("/v1/completions", json={"model": "llama", "prompt": "x", "max_tokens": 1})
        )
        await until_demand(client, DOCS, queuedRequests=1)
        redis_server.stop()
        # Redis is gone: the scaler still sees this replica's queue, not an error.
        alone = await demand(client)
        assert (alone["replicas"], alone["pools"][DOCS]["queuedRequests"]) == (1, 1)
        assert (await waiting).status == 503
