"""A batch's store against a real Redis at the edges of its life: cancelled while it
validates, left validating by a replica that died, and its files kept in pieces."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
from redis.asyncio import Redis

from laneway.bench.harness.redis_server import LocalRedis
from laneway.gateway.batch.batches import VALIDATING_STALE_S, BatchStore
from laneway.gateway.batch.creation import create_batch
from laneway.gateway.batch.files import PIECE_BYTES, FileStore, as_text
from laneway.gateway.batch.lines import WINDOW_SECONDS, CreateRequest, Entry, LineError
from laneway.gateway.batch.scripts import RESERVE_CANCELLED
from laneway.gateway.state.redis_store import RedisSettings, connect
from laneway.gateway.state.settings import FileQuota

QUOTA = FileQuota(files=100, bytes=10**9)
NOW = 1_000_000.0


@dataclass
class Stores:
    batches: BatchStore
    files: FileStore
    redis: Redis

    async def upload(self, tenant: str, lines: list[str]) -> str:
        content = "\n".join(lines).encode()
        file = self.files.new_file(len(content), "in.jsonl", "batch", tenant)
        await self.files.put(file, content, QUOTA)
        return file.id

    async def queued(self, tenant: str) -> int:
        return int(await self.redis.xlen(self.batches.queue_key(tenant)))

    async def enqueued_tokens(self, tenant: str) -> int:
        return int(await self.redis.get(self.batches.enqueued_key(tenant)) or 0)


@pytest.fixture
async def stores(redis_server: LocalRedis) -> AsyncIterator[Stores]:
    redis = connect(RedisSettings(redis_server.url))  # the gateway's client, as in production
    files = FileStore(redis, "laneway", ttl_s=3600)
    yield Stores(BatchStore(redis, files, "laneway"), files, redis)
    await redis.aclose()


def request_line(custom_id: str) -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": custom_id}]}
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    )


def meta(batch_id: str, tenant: str, created_at: float) -> dict[str, object]:
    return {
        "id": batch_id,
        "endpoint": "/v1/chat/completions",
        "input_file_id": "file-" + "0" * 32,
        "metadata": None,
        "created_at": int(created_at),
        "expires_at": int(created_at) + WINDOW_SECONDS,
        "owner": tenant,
    }


async def test_a_batch_cancelled_while_it_validates_stops_and_gives_everything_back(
    stores: Stores,
) -> None:
    # Long enough to parse that the cancel lands while it validates: 100 slices.
    lines = [request_line(f"r{i}") for i in range(20_000)]
    lines[7] = "not json"  # a bad line's result is written before the items are queued
    file_id = await stores.upload("c", lines)
    request = CreateRequest(input_file_id=file_id, endpoint="/v1/chat/completions", metadata=None)
    creating = asyncio.create_task(
        create_batch(stores.batches, request, "c", NOW, token_limit=10**9, file_quota=QUOTA)
    )
    async with asyncio.timeout(60):
        while not (listed := await stores.redis.zrange(stores.batches.index_key("c"), 0, -1)):  # noqa: ASYNC110
            await asyncio.sleep(0)
    batch_id = as_text(listed[0])
    cancelling = await stores.batches.cancel(batch_id, "c", NOW + 1)
    assert cancelling["status"] == "cancelling"
    created = await creating
    assert created["id"] == batch_id
    assert created["status"] == "cancelled"
    assert created["cancelled_at"] is not None
    assert created["request_counts"] == {"total": 0, "completed": 0, "failed": 0}
    assert created["output_file_id"] is None
    assert created["error_file_id"] is None
    assert await stores.enqueued_tokens("c") == 0
    assert await stores.queued("c") == 0
    assert not await stores.redis.sismember(stores.batches.active_key, batch_id)
    assert not await stores.redis.hexists(stores.files.sizes_key("c"), batch_id)
    assert not await stores.redis.exists(stores.batches.result_key(batch_id, 7))
    # Cancelled is final: another cancel answers it as it is.
    again = await stores.batches.cancel(batch_id, "c", NOW + 2)
    assert again["status"] == "cancelled"


async def test_a_cancel_after_parsing_keeps_the_batch_from_starting(stores: Stores) -> None:
    """The cancel lands between the last look and the start: the start sees it."""
    await stores.batches.open(meta("batch_" + "1" * 32, "s", NOW), QUOTA.bytes, NOW)
    batch_id = "batch_" + "1" * 32
    assert await stores.batches.reserve(batch_id, "s", 40, 10**9) == -1
    entry = Entry(index=0, custom_id="r0", body=b'{"model": "m"}')
    await stores.batches.enqueue(batch_id, "s", "/v1/chat/completions", [entry])
    await stores.batches.cancel(batch_id, "s", NOW)
    assert not await stores.batches.start(batch_id, NOW, total=1, failed=0, lines=1)
    assert (await stores.batches.get(batch_id, "s"))["status"] == "cancelling"
    # Nor can tokens be reserved for it any more.
    assert await stores.batches.reserve(batch_id, "s", 40, 10**9) == RESERVE_CANCELLED
    await stores.batches.close_cancelled(batch_id, "s", NOW, written=[])
    assert (await stores.batches.get(batch_id, "s"))["status"] == "cancelled"
    assert await stores.enqueued_tokens("s") == 0
    assert await stores.queued("s") == 0


async def test_the_sweep_fails_a_batch_left_validating_by_a_dead_replica(stores: Stores) -> None:
    tenant, stuck, live = "d", "batch_" + "a" * 32, "batch_" + "b" * 32
    started = NOW - VALIDATING_STALE_S - 1
    # As a creation leaves it when its replica dies mid-way: opened, its tokens reserved,
    # its bad lines' results written and charged, part of its items queued.
    await stores.batches.open(meta(stuck, tenant, started), QUOTA.bytes, started)
    assert await stores.batches.reserve(stuck, tenant, 300, 10**9) == -1
    error = LineError(index=3, custom_id=None, code="invalid_json", message="line 4: bad")
    await stores.batches.write_errors(stuck, tenant, [error])
    entries = [Entry(index=i, custom_id=f"r{i}", body=b'{"model": "m"}') for i in range(3)]
    await stores.batches.enqueue(stuck, tenant, "/v1/chat/completions", entries)
    # A creation still at it on a living replica: young, left alone.
    await stores.batches.open(meta(live, tenant, NOW - 5), QUOTA.bytes, NOW - 5)
    assert await stores.batches.reserve(live, tenant, 50, 10**9) == -1
    assert await stores.enqueued_tokens(tenant) == 350

    await stores.batches.sweep(NOW)

    failed = await stores.batches.get(stuck, tenant)
    assert failed["status"] == "failed"
    assert failed["failed_at"] == int(NOW)
    errors = failed["errors"]
    assert isinstance(errors, dict)
    assert [e["code"] for e in errors["data"]] == ["validation_interrupted"]
    assert await stores.queued(tenant) == 0  # its items left the tenant's stream
    assert await stores.enqueued_tokens(tenant) == 50  # its tokens back, the live one's kept
    assert not await stores.redis.sismember(stores.batches.active_key, stuck)
    assert not await stores.redis.hexists(stores.files.sizes_key(tenant), stuck)
    assert 0 < await stores.redis.ttl(stores.batches.batch_key(stuck)) <= stores.files.ttl_s
    assert (await stores.batches.get(live, tenant))["status"] == "validating"
    assert await stores.redis.sismember(stores.batches.active_key, live)


async def test_the_sweep_closes_a_batch_cancelled_while_a_dead_replica_validated_it(
    stores: Stores,
) -> None:
    batch_id, started = "batch_" + "c" * 32, NOW - VALIDATING_STALE_S - 1
    await stores.batches.open(meta(batch_id, "e", started), QUOTA.bytes, started)
    assert await stores.batches.reserve(batch_id, "e", 70, 10**9) == -1
    await stores.batches.cancel(batch_id, "e", started + 1)
    await stores.batches.sweep(started + 2)  # young still: its creation would finish it
    assert (await stores.batches.get(batch_id, "e"))["status"] == "cancelling"
    await stores.batches.sweep(NOW)
    assert (await stores.batches.get(batch_id, "e"))["status"] == "cancelled"
    assert await stores.enqueued_tokens("e") == 0


async def test_files_are_kept_and_read_back_in_pieces(stores: Stores) -> None:
    # An upload past a piece's size is stored in several.
    big = [request_line(f"r{i}-" + "x" * 200) for i in range(12_000)]
    file_id = await stores.upload("f", big)
    assert await stores.redis.llen(stores.files.pieces_key(file_id)) > 1
    assert len("\n".join(big)) > PIECE_BYTES
    assert (await stores.files.content(file_id, "f")).decode() == "\n".join(big)
    # A batch of only bad lines finalizes as it is created: its error file, a piece
    # per chunk of results, in line order.
    bad = [f"not json {i}" for i in range(1_200)]
    request = CreateRequest(
        input_file_id=await stores.upload("f", bad), endpoint="/v1/chat/completions", metadata=None
    )
    batch = await create_batch(
        stores.batches, request, "f", NOW, token_limit=10**9, file_quota=QUOTA
    )
    assert batch["status"] == "completed"
    error_file = batch["error_file_id"]
    assert isinstance(error_file, str)
    assert await stores.redis.llen(stores.files.pieces_key(error_file)) == 3  # 500, 500, 200
    text = (await stores.files.content(error_file, "f")).decode()
    assert [json.loads(line)["error"]["line"] for line in text.splitlines()] == list(
        range(1, 1_201)
    )
    described = await stores.files.get(error_file, "f")
    assert described.bytes == len(text.encode())
    # No staging list is left behind; deleting the file drops its pieces.
    assert [k async for k in stores.redis.scan_iter(match="laneway:file:*:pieces:*")] == []
    await stores.files.delete(error_file, "f")
    assert not await stores.redis.exists(stores.files.pieces_key(error_file))
