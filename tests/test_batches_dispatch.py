"""The dispatcher against a recording lane over loopback: fair share, retries, cancel."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web
from redis.asyncio import Redis

from laneway.bench.harness.redis_server import LocalRedis
from laneway.gateway.batch.batches import BatchStore
from laneway.gateway.batch.creation import create_batch
from laneway.gateway.batch.dispatcher import Dispatcher
from laneway.gateway.batch.files import FileStore, as_text
from laneway.gateway.batch.lines import CreateRequest
from laneway.gateway.errors import ApiError
from laneway.gateway.serving.request_body import LANE_HEADER
from laneway.gateway.state.redis_store import RedisSettings, connect
from laneway.gateway.state.settings import DispatchSettings, FileQuota
from laneway.gateway.state.tenants import INTERNAL_HEADER, TENANT_HEADER

SECRET = "test-secret"


@dataclass
class Lane:
    """Stands in for the gateway's batch lane: records calls, answers like an engine."""

    delay_s: float = 0.0
    calls: list[tuple[str, str]] = field(default_factory=list)  # (tenant, custom text)
    refuse_first: dict[str, int] = field(default_factory=dict)  # text -> 429s before a 200
    second_call: asyncio.Event = field(default_factory=asyncio.Event)

    async def handle(self, request: web.Request) -> web.Response:
        assert request.headers[INTERNAL_HEADER] == SECRET
        assert request.headers[LANE_HEADER] == "batch"
        body = await request.json()
        text = body["messages"][0]["content"]
        if self.refuse_first.get(text, 0) > 0:
            self.refuse_first[text] -= 1
            return web.json_response(
                {"error": {"message": "saturated", "type": "rate_limit_error"}},
                status=429,
                headers={"Retry-After": "0"},
            )
        self.calls.append((request.headers[TENANT_HEADER], text))
        if len(self.calls) == 2:
            self.second_call.set()
        await asyncio.sleep(self.delay_s)
        if text.startswith("crash"):
            return web.json_response({"error": {"message": "engine died"}}, status=502)
        if text.startswith("bad"):
            return web.json_response(
                {"error": {"message": "no such model", "type": "not_found_error"}}, status=404
            )
        usage = {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
        return web.json_response({"object": "chat.completion", "echo": text, "usage": usage})


@dataclass
class Harness:
    store: BatchStore
    files: FileStore
    lane: Lane
    url: str
    url_of_redis: str

    async def submit(
        self,
        tenant: str,
        texts: list[str],
        token_limit: int = 10**9,
        file_bytes: int = 10**9,
        max_tokens: int | None = None,
    ) -> str:
        bound = {} if max_tokens is None else {"max_tokens": max_tokens}
        lines = [
            json.dumps(
                {
                    "custom_id": f"{tenant}-{i}",
                    "method": "POST",
                    "url": "/v1/chat/completions",
                    "body": {
                        "model": "m",
                        "messages": [{"role": "user", "content": text}],
                        **bound,
                    },
                }
            )
            for i, text in enumerate(texts)
        ]
        content = "\n".join(lines).encode()
        file = self.files.new_file(len(content), "in.jsonl", "batch", tenant)
        await self.files.put(file, content, FileQuota(files=100, bytes=10**9))
        request = CreateRequest(
            input_file_id=file.id, endpoint="/v1/chat/completions", metadata=None
        )
        batch = await create_batch(
            self.store,
            request,
            tenant,
            now=0.0,
            token_limit=token_limit,
            file_quota=FileQuota(files=100, bytes=file_bytes),
        )
        return str(batch["id"])

    async def wait_finished(self, batch_id: str, tenant: str) -> dict[str, object]:
        async with asyncio.timeout(60):
            while True:
                batch = await self.store.get(batch_id, tenant)
                if batch["status"] in ("completed", "cancelled", "expired"):
                    return batch
                await asyncio.sleep(0.05)

    async def output(
        self, batch: dict[str, object], key: str, tenant: str
    ) -> list[dict[str, object]]:
        file_id = batch[key]
        assert isinstance(file_id, str)
        text = (await self.files.content(file_id, tenant)).decode()
        return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
async def harness(redis_server: LocalRedis) -> AsyncIterator[Harness]:
    lane = Lane()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", lane.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    redis = connect(RedisSettings(redis_server.url))  # the gateway's client, as in production
    files = FileStore(redis, "laneway", ttl_s=3600)
    yield Harness(
        BatchStore(redis, files, "laneway"),
        files,
        lane,
        f"http://127.0.0.1:{port}",
        redis_server.url,
    )
    await redis.aclose()
    await runner.cleanup()


@pytest.fixture
async def run_dispatcher(harness: Harness) -> AsyncIterator[list[asyncio.Task[None]]]:
    """Call with concurrency by appending: tasks are cancelled at the end."""
    tasks: list[asyncio.Task[None]] = []
    yield tasks
    for task in tasks:
        task.cancel()
    for task in tasks:
        with pytest.raises(asyncio.CancelledError):
            await task


async def start(
    harness: Harness,
    tasks: list[asyncio.Task[None]],
    concurrency: int,
    now: float = 1.0,  # batches are created at 0.0: one second in
) -> Dispatcher:
    session = aiohttp.ClientSession()
    settings = DispatchSettings(
        concurrency=concurrency, lease_s=3, poll_s=0.05, retry_backoff_s=0.01
    )
    dispatcher = Dispatcher(
        harness.store,
        session,
        lambda: harness.url,
        SECRET,
        "test-consumer",
        settings,
        clock=lambda: now,
    )

    async def run() -> None:
        try:
            await dispatcher.run()
        finally:
            await session.close()

    tasks.append(asyncio.create_task(run()))
    return dispatcher


async def test_a_small_tenant_is_served_between_a_large_tenants_items(
    harness: Harness, run_dispatcher: list[asyncio.Task[None]]
) -> None:
    bulk = await harness.submit("bulk", [f"bulk document {i}" for i in range(40)])
    small = await harness.submit("small", [f"small document {i}" for i in range(4)])
    await start(harness, run_dispatcher, concurrency=1)
    await harness.wait_finished(bulk, "bulk")
    await harness.wait_finished(small, "small")
    order = [tenant for tenant, _ in harness.lane.calls]
    assert len(order) == 44
    # FIFO would serve all 40 bulk items first; fair share alternates by tokens.
    assert max(i for i, tenant in enumerate(order) if tenant == "small") < 10


async def test_saturation_is_retried_and_errors_go_to_the_error_file(
    harness: Harness, run_dispatcher: list[asyncio.Task[None]]
) -> None:
    harness.lane.refuse_first = {"busy": 7}  # saturation is waited out, however long
    batch_id = await harness.submit("t", ["fine", "busy", "bad model", "crash"])
    await start(harness, run_dispatcher, concurrency=2)
    batch = await harness.wait_finished(batch_id, "t")
    assert batch["request_counts"] == {"total": 4, "completed": 2, "failed": 2}
    output = await harness.output(batch, "output_file_id", "t")
    assert sorted(line["custom_id"] for line in output) == ["t-0", "t-1"]  # type: ignore[type-var]
    errors = {line["custom_id"]: line for line in await harness.output(batch, "error_file_id", "t")}
    assert errors["t-2"]["response"] == {
        "status_code": 404,
        "request_id": errors["t-2"]["id"],
        "body": {"error": {"message": "no such model", "type": "not_found_error"}},
    }
    crashed = errors["t-3"]["error"]
    assert isinstance(crashed, dict)
    assert crashed["code"] == "batch_lane_unreachable"
    assert "failed 5 times, last: HTTP 502" in crashed["message"]
    with pytest.raises(ApiError, match="is completed and cannot be cancelled"):
        await harness.store.cancel(batch_id, "t", now=5.0)


async def test_cancel_stops_the_rest_and_keeps_what_finished(
    harness: Harness, run_dispatcher: list[asyncio.Task[None]]
) -> None:
    harness.lane.delay_s = 0.1
    batch_id = await harness.submit("c", [f"item {i}" for i in range(30)])
    await start(harness, run_dispatcher, concurrency=1)
    async with asyncio.timeout(30):
        await harness.lane.second_call.wait()
    cancelling = await harness.store.cancel(batch_id, "c", now=1.0)
    assert cancelling["status"] == "cancelling"
    batch = await harness.wait_finished(batch_id, "c")
    assert batch["status"] == "cancelled"
    counts = batch["request_counts"]
    assert isinstance(counts, dict)
    assert 2 <= counts["completed"] < 30
    assert counts["failed"] == 0
    output = await harness.output(batch, "output_file_id", "c")
    assert len(output) == counts["completed"] == len(harness.lane.calls)
    again = await harness.store.cancel(batch_id, "c", now=2.0)
    assert again["status"] == "cancelled"  # cancelling twice is harmless


async def enqueued(harness: Harness, tenant: str) -> int:
    return int(await harness.store._redis.get(harness.store.enqueued_key(tenant)) or 0)


async def test_the_batch_queue_quota_holds_until_items_settle(
    harness: Harness, run_dispatcher: list[asyncio.Task[None]]
) -> None:
    texts = [f"item {i}" for i in range(10)]
    first = await harness.submit("q", texts)
    held = await enqueued(harness, "q")
    assert held > 0
    limit = held + held // 2  # room for one such batch, not two
    with pytest.raises(ApiError) as refused:
        await harness.submit("q", texts, token_limit=limit)
    assert (refused.value.status, refused.value.code) == (429, "batch_queue_full")
    assert await enqueued(harness, "q") == held  # a refused batch reserves nothing
    # Cancelled items give their tokens back as they settle, skipped or not.
    await harness.store.cancel(first, "q", now=1.0)
    await start(harness, run_dispatcher, concurrency=2)
    await harness.wait_finished(first, "q")
    assert await enqueued(harness, "q") == 0
    second = await harness.submit("q", texts, token_limit=limit)
    assert (await harness.wait_finished(second, "q"))["status"] == "completed"
    assert await enqueued(harness, "q") == 0


async def test_a_dispatcher_that_stops_cleanly_hands_its_items_over(
    harness: Harness, run_dispatcher: list[asyncio.Task[None]]
) -> None:
    harness.lane.delay_s = 0.5
    await harness.submit("h", [f"item {i}" for i in range(6)])
    await start(harness, run_dispatcher, concurrency=2)
    async with asyncio.timeout(30):
        await harness.lane.second_call.wait()
    stopping = run_dispatcher.pop()
    stopping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await stopping
    redis = Redis.from_url(harness.url_of_redis)
    pending = await redis.xpending_range(
        "laneway:batch:queue:h", "dispatchers", min="-", max="+", count=10
    )
    await redis.aclose()
    # What it held is marked idle for a whole lease: the next reclaim takes it at once.
    assert pending
    assert all(int(entry["time_since_delivered"]) >= 3000 for entry in pending)


async def test_items_left_when_the_window_closes_expire_into_the_error_file(
    harness: Harness, run_dispatcher: list[asyncio.Task[None]]
) -> None:
    batch_id = await harness.submit("late", ["one", "two"])  # created at 0.0, 24 h window
    await start(harness, run_dispatcher, concurrency=1, now=24 * 3600 + 1)
    batch = await harness.wait_finished(batch_id, "late")
    assert batch["status"] == "expired"
    assert batch["expired_at"] == 24 * 3600 + 1
    assert batch["request_counts"] == {"total": 2, "completed": 0, "failed": 2}
    assert batch["output_file_id"] is None
    errors = await harness.output(batch, "error_file_id", "late")
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}  # type: ignore[index]
    assert harness.lane.calls == []  # nothing ran after the window closed


async def test_stopping_lets_running_items_finish_and_leaves_the_rest(
    harness: Harness, run_dispatcher: list[asyncio.Task[None]]
) -> None:
    harness.lane.delay_s = 0.3
    batch_id = await harness.submit("s", [f"item {i}" for i in range(6)])
    dispatcher = await start(harness, run_dispatcher, concurrency=2)
    async with asyncio.timeout(30):
        await harness.lane.second_call.wait()
    dispatcher.stop()
    async with asyncio.timeout(30):
        await run_dispatcher.pop()  # returns by itself once the running items are done
    batch = await harness.store.get(batch_id, "s")
    counts = batch["request_counts"]
    assert isinstance(counts, dict)
    assert counts["completed"] == len(harness.lane.calls) == 2  # the two running finished
    redis = Redis.from_url(harness.url_of_redis)
    queue = "laneway:batch:queue:s"
    pending = await redis.xpending_range(queue, "dispatchers", min="-", max="+", count=10)
    left = await redis.xlen(queue)
    await redis.aclose()
    # Nothing is left claimed by the stopped replica; the other four wait for the next one.
    assert pending == []
    assert left == 4


async def test_a_creation_cancelled_part_way_takes_its_items_and_tokens_back(
    harness: Harness, run_dispatcher: list[asyncio.Task[None]]
) -> None:
    # A client that times out cancels its create (the gateway cancels a handler whose
    # client went away) while the items are being queued.
    creating = asyncio.create_task(harness.submit("r", [f"item {i}" for i in range(20_000)]))
    redis = harness.store._redis
    async with asyncio.timeout(60):
        while await redis.xlen(harness.store.queue_key("r")) == 0:  # noqa: ASYNC110 (Redis)
            await asyncio.sleep(0.001)
    creating.cancel()
    with pytest.raises(asyncio.CancelledError):
        await creating
    assert await enqueued(harness, "r") == 0  # every reserved token given back, once
    assert await redis.xlen(harness.store.queue_key("r")) == 0  # no item left to run
    (batch_id,) = [as_text(i) for i in await redis.zrange(harness.store.index_key("r"), 0, -1)]
    batch = await harness.store.get(batch_id, "r")
    assert batch["status"] == "failed"
    assert batch["errors"]["data"][0]["code"] == "validation_interrupted"  # type: ignore[index]
    # The tenant's quota still adds up: a new batch runs and gives back exactly its own.
    await start(harness, run_dispatcher, concurrency=4)
    again = await harness.submit("r", ["after"])
    assert (await harness.wait_finished(again, "r"))["status"] == "completed"
    assert await enqueued(harness, "r") == 0


@pytest.mark.parametrize("max_tokens", [10, 2000])
async def test_items_whose_output_bound_would_pass_the_file_quota_fail_before_they_run(
    harness: Harness,
    run_dispatcher: list[asyncio.Task[None]],
    redis_client: Redis,
    max_tokens: int,
) -> None:
    # 3,000 bytes: room for the input and for the lane's short answers, not for four
    # answers of up to 2,000 tokens.
    batch_id = await harness.submit(
        "tight", [f"item {i}" for i in range(4)], file_bytes=3_000, max_tokens=max_tokens
    )
    await start(harness, run_dispatcher, concurrency=1)
    batch = await harness.wait_finished(batch_id, "tight")
    counts = batch["request_counts"]
    if max_tokens == 10:
        assert counts == {"total": 4, "completed": 4, "failed": 0}
        assert len(harness.lane.calls) == 4
        return
    assert counts == {"total": 4, "completed": 0, "failed": 4}
    assert harness.lane.calls == []  # no engine time spent on them
    failed = await harness.output(batch, "error_file_id", "tight")
    assert [line["error"]["code"] for line in failed] == ["file_quota_exceeded"] * 4  # type: ignore[index]
    sizes = await redis_client.hgetall("laneway:filebytes:tight")
    held = [as_text(name) for name in sizes]
    assert [name.startswith("file-") for name in held] == [True, True]  # input, error file
    assert batch_id not in held  # the holds went with the batch's field
