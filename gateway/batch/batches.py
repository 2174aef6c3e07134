"""The OpenAI Batches API over Redis: batch records, their items, results and output files.

The lines themselves (the input parsed, the result lines built) are `lines.py`'s;
`BatchStore` keeps everything in Redis:

- `{p}:batch:{id}`: the batch record (a hash: `meta` JSON, `status`, timestamps, counters
  `completed`, `failed`, `skipped` and `settled`, which counts every item that has a result).
- `{p}:batch:queue:{tenant}`: a stream of items per tenant, read by the consumer group
  `dispatchers`; `{p}:batch:queues` lists those streams. One stream per tenant lets the
  dispatcher choose whose item runs next (fair share) instead of serving arrival order.
- `{p}:batch:{id}:result:{index}`: each item's result line, written once (SET NX) together
  with its counter by one Lua script, so a crash between the two cannot happen.
- `{p}:batches:{tenant}`: the tenant's batches by creation time, for listing;
  `{p}:batches:active`: batches not yet finished, for the finalizing sweep.

Creating a batch writes the record, every item and every per-line error in one MULTI/EXEC
transaction: an accepted batch is never half-enqueued.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT, KeyT, StreamIdT

from laneway.gateway.batch.files import (
    OUTPUT_PURPOSE,
    FileObject,
    FileStore,
    as_bytes,
    as_text,
    list_json,
    page_start,
    valid_id,
)
from laneway.gateway.batch.lines import (
    FINISHED,
    CreateRequest,
    Item,
    ItemOutcome,
    LineError,
    Result,
    Status,
    batch_json,
    error_line,
    final_status,
    jsonl,
    parse_input,
)
from laneway.gateway.errors import ApiError, bad_request, not_found

WINDOW_SECONDS = 24 * 3600
CONSUMER_GROUP = "dispatchers"
RESULT_CHUNK = 500  # result keys read per round trip when finalizing


SETTLE_LUA = """
local status = redis.call('HGET', KEYS[2], 'status')
if not status then return {0, 0, 0} end
if status == 'completed' or status == 'cancelled' or status == 'failed'
    or status == 'expired' then
  return {0, 0, 0}
end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  return {0, 0, 0}
end
redis.call('HINCRBY', KEYS[2], ARGV[2], 1)
redis.call('DECRBY', KEYS[3], ARGV[3])
local settled = redis.call('HINCRBY', KEYS[2], 'settled', 1)
return {1, settled, tonumber(redis.call('HGET', KEYS[2], 'total'))}
"""


# KEYS: the tenant's enqueued tokens. ARGV: a new batch's tokens, the tenant's limit.
# Reserves them when they fit; returns -1, or the tokens already enqueued when they do not.
RESERVE_TOKENS_LUA = """
local used = tonumber(redis.call('GET', KEYS[1]) or '0')
if used + tonumber(ARGV[1]) > tonumber(ARGV[2]) then return used end
redis.call('INCRBY', KEYS[1], ARGV[1])
return -1
"""


# KEYS: batch key. ARGV: now. Moves an in-progress batch to cancelling; returns the status
# it found, so the caller knows whether it was in progress.
CANCEL_LUA = """
local status = redis.call('HGET', KEYS[1], 'status')
if status == 'in_progress' then
  redis.call('HSET', KEYS[1], 'status', 'cancelling', 'cancelling_at', ARGV[1])
end
return status
"""


@dataclass(frozen=True)
class QueuedItem:
    stream: str
    entry_id: str
    tenant: str
    batch_id: str
    index: int
    custom_id: str
    endpoint: str
    body: bytes

    @property
    def cost(self) -> int:
        return item_cost(self.body)


def item_cost(body: bytes) -> int:
    """An item's token estimate, for fair share and the queue quota: ~4 bytes of JSON each."""
    return max(1, len(body) // 4)


class BatchStore:
    def __init__(self, redis: Redis, files: FileStore, prefix: str) -> None:
        self._redis = redis
        self._files = files
        self._prefix = prefix
        self._settle = redis.register_script(SETTLE_LUA)
        self._cancel = redis.register_script(CANCEL_LUA)
        self._reserve_tokens = redis.register_script(RESERVE_TOKENS_LUA)

    def enqueued_key(self, tenant: str) -> str:
        """The token estimates of a tenant's batch items not yet settled."""
        return f"{self._prefix}:batch:enqueued:{tenant}"

    def batch_key(self, batch_id: str) -> str:
        return f"{self._prefix}:batch:{batch_id}"

    def result_key(self, batch_id: str, index: int) -> str:
        return f"{self._prefix}:batch:{batch_id}:result:{index}"

    def queue_key(self, tenant: str) -> str:
        return f"{self._prefix}:batch:queue:{tenant}"

    @property
    def queues_key(self) -> str:
        return f"{self._prefix}:batch:queues"

    @property
    def active_key(self) -> str:
        return f"{self._prefix}:batches:active"

    async def create(
        self, request: CreateRequest, tenant: str, now: float, token_limit: int
    ) -> dict[str, object]:
        """Queue a batch; 429 when its items would take the tenant's enqueued tokens past
        `token_limit` (OpenAI's batch queue limit)."""
        source = await self._files.get(request.input_file_id, tenant)
        if source.purpose != "batch":
            raise bad_request(
                f"File {source.id!r} has purpose {source.purpose!r}; a batch needs 'batch'",
                "input_file_id",
            )
        content = await self._files.content(source.id, tenant)
        # A large file takes a while to parse: off the event loop, so requests keep flowing.
        items, errors = await asyncio.to_thread(parse_input, content, request.endpoint)
        total = len(items) + len(errors)
        if total == 0:
            raise bad_request("The input file holds no requests")
        batch_id = f"batch_{uuid.uuid4().hex}"
        created = int(now)
        meta = {
            "id": batch_id,
            "endpoint": request.endpoint,
            "input_file_id": source.id,
            "metadata": request.metadata,
            "created_at": created,
            "expires_at": created + WINDOW_SECONDS,
            "owner": tenant,
        }
        bodies = [json.dumps(item.body).encode() for item in items]
        tokens = sum(item_cost(body) for body in bodies)
        enqueued = await self._reserve_tokens(
            keys=[self.enqueued_key(tenant)], args=[tokens, token_limit]
        )
        if int(enqueued) >= 0:
            raise ApiError(
                429,
                f"Tenant {tenant}'s batch queue holds about {enqueued} tokens; this batch "
                f"adds about {tokens}, over its limit of {token_limit}: wait for batches "
                "to finish",
                "batch_queue_full",
            )
        try:
            await self._write_batch(request, tenant, now, meta, items, bodies, errors)
        except BaseException:
            await self._redis.decrby(self.enqueued_key(tenant), tokens)
            raise
        if not items:
            await self.finalize(batch_id, now)
        return await self.get(batch_id, tenant)

    async def _write_batch(
        self,
        request: CreateRequest,
        tenant: str,
        now: float,
        meta: Mapping[str, Any],
        items: Sequence[Item],
        bodies: Sequence[bytes],
        errors: Sequence[LineError],
    ) -> None:
        batch_id, created = str(meta["id"]), int(meta["created_at"])
        total = len(items) + len(errors)
        queue = self.queue_key(tenant)
        await self._ensure_group(queue)
        async with self._redis.pipeline(transaction=True) as tx:
            tx.hset(
                self.batch_key(batch_id),
                mapping={
                    "meta": json.dumps(meta),
                    "status": Status.IN_PROGRESS,
                    "in_progress_at": created,
                    "expires_at": created + WINDOW_SECONDS,
                    "total": total,
                    "completed": 0,
                    "failed": len(errors),
                    "skipped": 0,
                    "settled": len(errors),
                    # result keys are numbered by input line; blank lines leave gaps
                    "lines": 1 + max([i.index for i in items] + [e.index for e in errors]),
                },
            )
            for error in errors:
                result = Result(ItemOutcome.FAILED, error_line(batch_id, error))
                tx.set(self.result_key(batch_id, error.index), result.encode())
            for item, body in zip(items, bodies, strict=True):
                tx.xadd(
                    queue,
                    {
                        "batch": batch_id,
                        "index": item.index,
                        "custom_id": item.custom_id,
                        "endpoint": request.endpoint,
                        "body": body,
                    },
                )
            tx.sadd(self.queues_key, tenant)
            tx.sadd(self.active_key, batch_id)
            tx.zadd(f"{self._prefix}:batches:{tenant}", {batch_id: now})
            await tx.execute()

    async def _ensure_group(self, queue: str) -> None:
        try:
            await self._redis.xgroup_create(queue, CONSUMER_GROUP, id="0", mkstream=True)
        except ResponseError as error:
            if "BUSYGROUP" not in str(error):
                raise

    async def get(self, batch_id: str, tenant: str) -> dict[str, object]:
        """The batch object in OpenAI's shape; ApiError 404 when unknown or another tenant's."""
        record = await self._record(valid_id("batch", batch_id))
        if record is None or record["meta"]["owner"] != tenant:
            raise not_found("batch", batch_id)
        return batch_json(record)

    async def _record(self, batch_id: str) -> dict[str, Any] | None:
        raw = await self._redis.hgetall(self.batch_key(batch_id))
        if not raw:
            return None
        fields = {as_text(k): as_text(v) for k, v in raw.items()}
        record: dict[str, Any] = dict(fields)
        record["meta"] = json.loads(fields["meta"])
        return record

    async def list_page(self, tenant: str, after: str | None, limit: int) -> dict[str, object]:
        """Newest first, OpenAI's cursor pagination: `after` is the last id already seen."""
        index_key = f"{self._prefix}:batches:{tenant}"
        start = await page_start(self._redis, index_key, after, "batch")
        ids = [as_text(i) for i in await self._redis.zrevrange(index_key, start, start + limit)]
        page = []
        for batch_id in ids[:limit]:
            record = await self._record(batch_id)
            if record is not None:
                page.append(batch_json(record))
        return list_json(page, len(ids) > limit)

    async def cancel(self, batch_id: str, tenant: str, now: float) -> dict[str, object]:
        await self.get(batch_id, tenant)  # 404 unless it is this tenant's
        # Atomic: a batch that finishes meanwhile must not be turned back to cancelling.
        found = await self._cancel(keys=[self.batch_key(batch_id)], args=[int(now)])
        if found is None:
            raise not_found("batch", batch_id)
        status = as_text(found)
        if status == Status.IN_PROGRESS:
            await self.finalize_if_settled(batch_id, now)
        elif status not in (Status.CANCELLING, Status.CANCELLED):
            raise ApiError(
                400,
                f"Batch {batch_id!r} is {status} and cannot be cancelled",
                "batch_not_cancellable",
            )
        return await self.get(batch_id, tenant)

    async def status(self, batch_id: str) -> tuple[Status, float] | None:
        """The batch's status and when its completion window closes; None when it is gone."""
        raw, expires_at = await self._redis.hmget(
            self.batch_key(batch_id), ["status", "expires_at"]
        )
        return None if raw is None else (Status(as_text(raw)), float(as_text(expires_at)))

    async def has_result(self, item: QueuedItem) -> bool:
        return bool(await self._redis.exists(self.result_key(item.batch_id, item.index)))

    async def settle(self, item: QueuedItem, result: Result, now: float) -> bool:
        """Write an item's result once; False when it already had one (or the batch closed)."""
        written, settled, total = await self._settle(
            keys=[
                self.result_key(item.batch_id, item.index),
                self.batch_key(item.batch_id),
                self.enqueued_key(item.tenant),
            ],
            args=[result.encode(), result.outcome.value, item.cost],
        )
        if written and settled >= total:
            await self.finalize(item.batch_id, now)
        return bool(written)

    async def finalize_if_settled(self, batch_id: str, now: float) -> None:
        values = await self._redis.hmget(self.batch_key(batch_id), ["status", "settled", "total"])
        if values[0] is None:
            await self._redis.srem(self.active_key, batch_id)
            return
        status, settled, total = as_text(values[0]), int(values[1] or 0), int(values[2] or 0)
        if status not in FINISHED and settled >= total:
            await self.finalize(batch_id, now)

    async def sweep(self, now: float) -> None:
        """Finish batches whose last item settled on a replica that died before finalizing."""
        for raw in await self._redis.smembers(self.active_key):
            await self.finalize_if_settled(as_text(raw), now)

    async def finalize(self, batch_id: str, now: float) -> None:
        """Write the output and error files and close the batch; one replica at a time."""
        lock = f"{self.batch_key(batch_id)}:finalizing"
        if not await self._redis.set(lock, b"1", nx=True, px=60_000):
            return  # another replica is at it; if it dies, the lock expires and a sweep retries
        record = await self._record(batch_id)
        if record is None or record["status"] in FINISHED:
            return
        meta = record["meta"]
        total = int(record["total"])
        outputs: list[Mapping[str, object]] = []
        failures: list[Mapping[str, object]] = []
        result_keys = [self.result_key(batch_id, i) for i in range(int(record["lines"]))]
        for start in range(0, len(result_keys), RESULT_CHUNK):
            for raw in await self._redis.mget(result_keys[start : start + RESULT_CHUNK]):
                encoded = as_bytes(raw)
                if encoded is None:
                    continue  # a blank input line: no item
                result = Result.decode(encoded)
                if result.line is not None:
                    (outputs if result.outcome is ItemOutcome.COMPLETED else failures).append(
                        result.line
                    )
        assert len(outputs) + len(failures) <= total
        status, stamp = final_status(record)
        fields: dict[FieldT, EncodableT] = {
            "status": status,
            "finalizing_at": int(now),
            stamp: int(now),
        }
        async with self._redis.pipeline(transaction=True) as tx:
            for kind, lines in (("output", outputs), ("errors", failures)):
                if not lines:
                    continue
                content = await asyncio.to_thread(jsonl, lines)
                # Derived from the batch, so a second finalizing run rewrites the same files.
                file = FileObject(
                    id=f"file-{uuid.uuid5(uuid.NAMESPACE_URL, f'{batch_id}/{kind}').hex}",
                    bytes=len(content),
                    created_at=int(now),
                    filename=f"{batch_id}_{kind}.jsonl",
                    purpose=OUTPUT_PURPOSE,
                    owner=meta["owner"],
                    expires_at=int(now) + self._files.ttl_s,
                )
                self._files.put_in(tx, file, content)
                fields["output_file_id" if kind == "output" else "error_file_id"] = file.id
            tx.hset(self.batch_key(batch_id), mapping=fields)
            tx.srem(self.active_key, batch_id)
            tx.delete(*result_keys)
            await tx.execute()

    # ---- the dispatcher's side ----

    async def queues(self) -> list[str]:
        return sorted(as_text(t) for t in await self._redis.smembers(self.queues_key))

    async def read_new(self, tenants: Sequence[str], consumer: str) -> list[QueuedItem]:
        """At most one new item from each tenant's stream, claimed for `consumer`."""
        if not tenants:
            return []
        streams: dict[KeyT, StreamIdT] = {self.queue_key(t): ">" for t in tenants}
        try:
            reply: Any = await self._redis.xreadgroup(CONSUMER_GROUP, consumer, streams, count=1)
        except ResponseError as error:
            if "NOGROUP" not in str(error):
                raise
            for tenant in tenants:  # a stream lost with a Redis restart: recreate it empty
                await self._ensure_group(self.queue_key(tenant))
            return []
        return [self._item(stream, entry) for stream, entries in reply for entry in entries]

    async def reclaim(
        self, tenant: str, consumer: str, idle_ms: int, count: int
    ) -> list[QueuedItem]:
        """Items whose consumer has been silent for `idle_ms`: a replica that died holding them."""
        queue = self.queue_key(tenant)
        try:
            reply = await self._redis.xautoclaim(
                queue, CONSUMER_GROUP, consumer, idle_ms, "0-0", count
            )
        except ResponseError as error:
            if "NOGROUP" not in str(error):
                raise
            return []
        return [self._item(queue, entry) for entry in reply[1] if entry[1]]

    async def keep(self, items: Sequence[QueuedItem], consumer: str, idle_ms: int = 0) -> None:
        """Set the idle time of items this replica holds: 0 keeps them from being reclaimed,
        a lease's worth hands them to the next replica that looks (a clean shutdown)."""
        by_stream: dict[str, list[StreamIdT]] = {}
        for item in items:
            by_stream.setdefault(item.stream, []).append(item.entry_id)
        for stream, ids in by_stream.items():
            await self._redis.xclaim(
                stream, CONSUMER_GROUP, consumer, 0, ids, idle=idle_ms, justid=True
            )

    async def ack(self, item: QueuedItem) -> None:
        async with self._redis.pipeline(transaction=True) as tx:
            tx.xack(item.stream, CONSUMER_GROUP, item.entry_id)
            tx.xdel(item.stream, item.entry_id)
            await tx.execute()

    def _item(self, stream: object, entry: Any) -> QueuedItem:
        entry_id, fields = entry
        values = {as_text(k): v for k, v in fields.items()}
        stream_name = as_text(stream)
        return QueuedItem(
            stream=stream_name,
            entry_id=as_text(entry_id),
            tenant=stream_name.removeprefix(self.queue_key("")),
            batch_id=as_text(values["batch"]),
            index=int(values["index"]),
            custom_id=as_text(values["custom_id"]),
            endpoint=as_text(values["endpoint"]),
            body=as_bytes(values["body"]) or b"{}",
        )
