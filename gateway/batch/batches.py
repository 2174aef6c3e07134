"""The OpenAI Batches API over Redis: batch records, their items, results and output files.

What a batch's lines mean is pure and lives in lines.py; creating one, in creation.py;
`BatchStore` keeps everything in Redis:

- `{p}:batch:{id}`: the batch record (a hash: `meta` JSON, `status`, timestamps, counters
  `completed`, `failed`, `skipped` and `settled`, which counts every item that has a result;
  `reserved`, the queue tokens it still holds; `quota_bytes`, its owner's file quota).
  It expires `window + file TTL` after creation, and a file TTL after it finishes (when
  its output files do).
- `{p}:batch:queue:{tenant}`: a stream of items per tenant, read by the consumer group
  `dispatchers`; `{p}:batch:queues` lists those streams. One stream per tenant lets the
  dispatcher choose whose item runs next (fair share) instead of serving arrival order.
- `{p}:batch:{id}:result:{index}`: each item's result line, written once (SET NX) together
  with its counter by one Lua script, so a crash between the two cannot happen. Its bytes
  count in the owner's file storage (`{p}:filebytes:{owner}`, field `{id}`), held before
  the item runs and settled as it is written: they become the output and error files.
- `{p}:batches:{tenant}`: the tenant's batches by creation time, for listing, pruned of
  batches past their expiry and itself expiring with the newest; `{p}:batches:active`:
  batches not yet finished, for the finalizing sweep.
- `{p}:batch:retry:{tenant}:{digest}`: the batch a retried create answers with.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ResponseError
from redis.typing import EncodableT, FieldT, KeyT, StreamIdT

from laneway.gateway.batch import outputs, scripts
from laneway.gateway.batch.files import (
    FileStore,
    as_bytes,
    as_text,
    list_json,
    page_start,
    valid_id,
)
from laneway.gateway.batch.lines import (
    FINISHED,
    WINDOW_SECONDS,
    Entry,
    ItemOutcome,
    LineError,
    QueuedItem,
    Result,
    Status,
    batch_json,
    error_line,
    final_status,
    quota_exceeded,
)
from laneway.gateway.errors import ApiError, not_found

CONSUMER_GROUP = "dispatchers"
WRITE_CHUNK = 500  # keys per command or reply when deleting or walking a stream
# Items per pipeline when creating: no one giant transaction, and no pipeline long on the
# event loop. redis-py encodes a pipeline's commands and parses its replies in Python
# without yielding between them, so a pipeline's size bounds how long it holds the loop.
# Bytes bound it too, for inputs of long lines.
PIPELINE_ITEMS = 100
PIPELINE_BYTES = 128 * 1024
# A batch still validating this long after its creation lost the replica creating it.
VALIDATING_STALE_S = 600
# A result waits for its batch to finalize, by the window's end; an hour more for a sweep.
RESULT_TTL_S = WINDOW_SECONDS + 3600


def pieces(
    sizes: Sequence[int], max_items: int = PIPELINE_ITEMS, max_bytes: int = PIPELINE_BYTES
) -> Iterator[range]:
    """The indexes of items of these sizes in consecutive pieces of at most `max_items`
    items and about `max_bytes` bytes (the item that crosses it ends its piece)."""
    start, size = 0, 0
    for index, item in enumerate(sizes):
        size += item
        if index + 1 - start == max_items or size >= max_bytes:
            yield range(start, index + 1)
            start, size = index + 1, 0
    if start < len(sizes):
        yield range(start, len(sizes))


class BatchStore:
    def __init__(self, redis: Redis, files: FileStore, prefix: str) -> None:
        self._redis = redis
        self.files = files
        self._prefix = prefix
        self._settle = redis.register_script(scripts.SETTLE)
        self._cancel = redis.register_script(scripts.CANCEL)
        self._reserve_tokens = redis.register_script(scripts.RESERVE_TOKENS)
        self._release_tokens = redis.register_script(scripts.RELEASE_TOKENS)
        self._claim_retry = redis.register_script(scripts.CLAIM_RETRY)
        self._start = redis.register_script(scripts.START)
        self._reserve_bytes = redis.register_script(scripts.RESERVE_BYTES)

    @property
    def retention_s(self) -> int:
        """How long a batch is kept after its creation at most: its window, then as long
        as its output files."""
        return WINDOW_SECONDS + self.files.ttl_s

    def enqueued_key(self, tenant: str) -> str:
        """The token estimates of a tenant's batch items not yet settled."""
        return f"{self._prefix}:batch:enqueued:{tenant}"

    def batch_key(self, batch_id: str) -> str:
        return f"{self._prefix}:batch:{batch_id}"

    def result_key(self, batch_id: str, index: int) -> str:
        return f"{self._prefix}:batch:{batch_id}:result:{index}"

    def queue_key(self, tenant: str) -> str:
        return f"{self._prefix}:batch:queue:{tenant}"

    def index_key(self, tenant: str) -> str:
        return f"{self._prefix}:batches:{tenant}"

    def retry_key(self, tenant: str, digest: str) -> str:
        return f"{self._prefix}:batch:retry:{tenant}:{digest}"

    @property
    def queues_key(self) -> str:
        return f"{self._prefix}:batch:queues"

    @property
    def active_key(self) -> str:
        return f"{self._prefix}:batches:active"

    # ---- creating (creation.py drives these steps) ----

    async def claim_retry(self, key: str, batch_id: str, window_s: int, unusable: str) -> str:
        """The batch a create with this retry key answers with: an earlier one's id, or
        `batch_id` when it is the first within the window (or the earlier, `unusable`, is
        gone or failed)."""
        return as_text(await self._claim_retry(keys=[key], args=[batch_id, window_s, unusable]))

    async def find(self, batch_id: str, tenant: str) -> dict[str, object] | None:
        record = await self._record(batch_id)
        if record is None or record["meta"]["owner"] != tenant:
            return None
        return batch_json(record)

    async def open(self, meta: Mapping[str, Any], quota_bytes: int, now: float) -> None:
        """The batch's record, validating, in its owner's list: a retry finds it from now on."""
        batch_id, tenant = str(meta["id"]), str(meta["owner"])
        index = self.index_key(tenant)
        async with self._redis.pipeline(transaction=True) as tx:
            tx.hset(
                self.batch_key(batch_id),
                mapping={
                    "meta": json.dumps(meta),
                    "status": Status.VALIDATING,
                    "expires_at": meta["expires_at"],
                    "total": 0,
                    "completed": 0,
                    "failed": 0,
                    "skipped": 0,
                    "settled": 0,
                    "reserved": 0,
                    "quota_bytes": quota_bytes,
                },
            )
            tx.expire(self.batch_key(batch_id), self.retention_s)
            tx.zremrangebyscore(index, "-inf", now - self.retention_s)
            tx.zadd(index, {batch_id: now})
            tx.expire(index, self.retention_s)
            tx.sadd(self.active_key, batch_id)
            await tx.execute()

    async def reserve(self, batch_id: str, tenant: str, tokens: int, limit: int) -> int:
        """-1 when the batch's tokens are reserved; -2 when it was cancelled meanwhile (none
        are); else the tokens already enqueued."""
        keys = [self.enqueued_key(tenant), self.batch_key(batch_id)]
        return int(await self._reserve_tokens(keys=keys, args=[tokens, limit]))

    async def write_errors(self, batch_id: str, tenant: str, errors: Sequence[LineError]) -> None:
        """The bad lines' results, a bounded pipeline (`pieces`) at a time, charged to the
        owner's file storage like every result."""
        for piece in pieces([len(error.message) for error in errors]):
            charged = 0
            async with self._redis.pipeline(transaction=False) as pipe:
                for error in (errors[i] for i in piece):
                    line = error_line(batch_id, error)
                    encoded = Result(outcome=ItemOutcome.FAILED, line=line).encode()
                    pipe.set(self.result_key(batch_id, error.index), encoded, ex=self.retention_s)
                    charged += len(encoded)
                pipe.hincrby(self.files.sizes_key(tenant), batch_id, charged)
                await pipe.execute()

    async def enqueue(
        self, batch_id: str, tenant: str, endpoint: str, entries: Sequence[Entry]
    ) -> None:
        """Add items to the tenant's stream, a bounded pipeline (`pieces`) at a time."""
        queue = self.queue_key(tenant)
        await self._ensure_group(queue)
        await self._redis.sadd(self.queues_key, tenant)
        for piece in pieces([len(entry.body) for entry in entries]):
            async with self._redis.pipeline(transaction=False) as pipe:
                for entry in (entries[i] for i in piece):
                    fields: dict[FieldT, EncodableT] = {
                        "batch": batch_id,
                        "index": entry.index,
                        "custom_id": entry.custom_id,
                        "endpoint": endpoint,
                        "body": entry.body,
                    }
                    pipe.xadd(queue, fields)
                await pipe.execute()

    async def start(self, batch_id: str, now: float, total: int, failed: int, lines: int) -> bool:
        """Validated and queued: the dispatchers may run its items. False when it was
        cancelled meanwhile (it stays cancelling, for `close_cancelled`)."""
        fields = {
            "in_progress_at": int(now),
            "total": total,
            "failed": failed,
            "settled": failed,
            "lines": lines,  # result keys are numbered by input line; blanks leave gaps
        }
        args = [value for pair in fields.items() for value in pair]
        found = await self._start(keys=[self.batch_key(batch_id)], args=args)
        return found is not None and as_text(found) == Status.VALIDATING

    async def cancelled(self, batch_id: str) -> bool:
        """Whether a batch still validating has been asked to cancel."""
        status = await self._redis.hget(self.batch_key(batch_id), "status")
        return as_bytes(status) == Status.CANCELLING.encode()

    async def close_cancelled(
        self, batch_id: str, tenant: str, now: float, written: Sequence[int]
    ) -> None:
        """A batch cancelled while validating: it ends cancelled with none of its items
        run, gives its tokens back, and what it had queued or written (the results of
        lines `written`) goes."""
        if not await self._redis.exists(self.batch_key(batch_id)):
            await self._unqueue(batch_id, tenant)  # expired or lost: only its items are left
            return
        await self._release_tokens(keys=[self.batch_key(batch_id), self.enqueued_key(tenant)])
        async with self._redis.pipeline(transaction=True) as tx:
            tx.hset(
                self.batch_key(batch_id),
                mapping={"status": Status.CANCELLED, "cancelled_at": int(now)},
            )
            tx.expire(self.batch_key(batch_id), self.files.ttl_s)
            tx.srem(self.active_key, batch_id)
            tx.hdel(self.files.sizes_key(tenant), batch_id)
            await tx.execute()
        for start in range(0, len(written), WRITE_CHUNK):
            keys = [self.result_key(batch_id, i) for i in written[start : start + WRITE_CHUNK]]
            await self._redis.delete(*keys)
        await self._unqueue(batch_id, tenant)

    async def discard(self, batch_id: str, tenant: str) -> None:
        """Forget a batch refused while validating: it queued nothing, and gives back the
        tokens it reserved (a cancel may land just after the reservation)."""
        await self._release_tokens(keys=[self.batch_key(batch_id), self.enqueued_key(tenant)])
        async with self._redis.pipeline(transaction=True) as tx:
            tx.delete(self.batch_key(batch_id))
            tx.zrem(self.index_key(tenant), batch_id)
            tx.srem(self.active_key, batch_id)
            await tx.execute()

    async def fail(self, batch_id: str, tenant: str, now: float, message: str) -> None:
        """A creation that could not finish: the batch fails saying `message`, gives its
        tokens back, and whatever it had queued leaves the tenant's stream."""
        await self._release_tokens(keys=[self.batch_key(batch_id), self.enqueued_key(tenant)])
        error = {"code": "validation_interrupted", "message": message, "param": None, "line": None}
        async with self._redis.pipeline(transaction=True) as tx:
            tx.hset(
                self.batch_key(batch_id),
                mapping={
                    "status": Status.FAILED,
                    "failed_at": int(now),
                    "errors": json.dumps({"object": "list", "data": [error]}),
                },
            )
            tx.expire(self.batch_key(batch_id), self.files.ttl_s)
            tx.srem(self.active_key, batch_id)
            tx.hdel(self.files.sizes_key(tenant), batch_id)
            await tx.execute()
        await self._unqueue(batch_id, tenant)

    async def _unqueue(self, batch_id: str, tenant: str) -> None:
        # The stream holds only the tenant's unsettled items, so a walk through it is
        # bounded by its queue quota; a pipeline cut off mid-flight left no ids to go by.
        queue, after = self.queue_key(tenant), "-"
        while entries := await self._redis.xrange(queue, min=after, count=WRITE_CHUNK):
            ours: list[StreamIdT] = [
                as_text(i)
                for i, fields in entries
                if fields and fields[b"batch"] == batch_id.encode()
            ]
            if ours:
                await self._redis.xdel(queue, *ours)
            after = f"({as_text(entries[-1][0])}"

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
        # Atomic: a batch that finishes meanwhile must not be turned back to cancelling. A
        # validating one is closed by its creation, which stops at its next look.
        found = await self._cancel(keys=[self.batch_key(batch_id)], args=[int(now)])
        if found is None:
            raise not_found("batch", batch_id)
        status = as_text(found)
        if status == Status.IN_PROGRESS:
            await self.finalize_if_settled(batch_id, now)
        elif status not in (Status.VALIDATING, Status.CANCELLING, Status.CANCELLED):
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

    async def reserve_output(self, item: QueuedItem, size: int) -> int | None:
        """Hold `size` bytes of the owner's file quota for the item's result before it runs:
        the bytes held (0 when the batch is no longer running), None when they do not fit
        (the item fails unrun). A hold that is never settled (the replica died) is dropped
        with the batch's field when it finalizes."""
        keys = [self.batch_key(item.batch_id), self.files.sizes_key(item.tenant)]
        held = int(await self._reserve_bytes(keys=keys, args=[size, item.batch_id]))
        return None if held < 0 else held

    async def settle(self, item: QueuedItem, result: Result, now: float, held: int = 0) -> bool:
        """Write an item's result once, in place of the `held` bytes `reserve_output` held
        for it; False when it already had one (or the batch closed).

        A result that would still take the owner past its file quota (larger than held)
        is written as a short `file_quota_exceeded` failure instead: the store never grows
        past the quota by more than those lines."""
        over_quota = b"" if result.line is None else quota_exceeded(item).encode()
        written, settled, total = await self._settle(
            keys=[
                self.result_key(item.batch_id, item.index),
                self.batch_key(item.batch_id),
                self.enqueued_key(item.tenant),
                self.files.sizes_key(item.tenant),
            ],
            args=[
                result.encode(),
                result.outcome.value,
                item.cost,
                over_quota,
                RESULT_TTL_S,
                item.batch_id,
                held,
            ],
        )
        if written and settled >= total:
            await self.finalize(item.batch_id, now)
        return bool(written)

    async def finalize_if_settled(self, batch_id: str, now: float) -> None:
        values = await self._redis.hmget(
            self.batch_key(batch_id), ["status", "settled", "total", "meta", "in_progress_at"]
        )
        if values[0] is None:
            await self._redis.srem(self.active_key, batch_id)
            return
        status, settled, total = as_text(values[0]), int(values[1] or 0), int(values[2] or 0)
        if status == Status.VALIDATING or (status == Status.CANCELLING and values[4] is None):
            # Still being created (or cancelled while it was): its creation finishes it.
            meta = json.loads(as_text(values[3]))
            if now - float(meta["created_at"]) <= VALIDATING_STALE_S:
                return
            # The replica creating it died: nothing will finish it.
            if status == Status.CANCELLING:
                await self.close_cancelled(batch_id, meta["owner"], now, written=[])
            else:
                why = "The gateway replica validating this batch stopped: create it again"
                await self.fail(batch_id, meta["owner"], now, why)
        elif status not in FINISHED and settled >= total:
            await self.finalize(batch_id, now)

    async def sweep(self, now: float) -> None:
        """Finish batches whose last item settled on a replica that died before finalizing,
        and fail those whose creation a dying replica left half done."""
        for raw in await self._redis.smembers(self.active_key):
            await self.finalize_if_settled(as_text(raw), now)

    async def finalize(self, batch_id: str, now: float) -> None:
        """Write the output and error files (outputs.py) and close the batch; one replica
        at a time."""
        lock = f"{self.batch_key(batch_id)}:finalizing"
        if not await self._redis.set(lock, b"1", nx=True, px=60_000):
            return  # another replica is at it; if it dies, the lock expires and a sweep retries
        record = await self._record(batch_id)
        if record is None or record["status"] in FINISHED:
            return
        owner = record["meta"]["owner"]
        result_keys = [self.result_key(batch_id, i) for i in range(int(record["lines"]))]
        staged = await outputs.stage(self._redis, self.files, batch_id, result_keys)
        status, stamp = final_status(record)
        fields: dict[FieldT, EncodableT] = {
            "status": status,
            "finalizing_at": int(now),
            stamp: int(now),
        }
        # Every item has settled, so nothing else moves the batch's tokens now.
        await self._release_tokens(keys=[self.batch_key(batch_id), self.enqueued_key(owner)])
        async with self._redis.pipeline(transaction=True) as tx:
            for file in staged:
                # The results were charged as they were written; the files take their place.
                outputs.commit(tx, self.files, file, batch_id, owner, now)
                fields[outputs.KINDS[file.kind]] = file.file_id
            tx.hdel(self.files.sizes_key(owner), batch_id)
            tx.hset(self.batch_key(batch_id), mapping=fields)
            tx.expire(self.batch_key(batch_id), self.files.ttl_s)
            tx.srem(self.active_key, batch_id)
            await tx.execute()
        # Apart from the transaction and a chunk at a time: one DEL of 50,000 keys is
        # encoded on the event loop in one go. A run cut off here leaves keys that expire.
        for start in range(0, len(result_keys), outputs.RESULT_CHUNK):
            await self._redis.delete(*result_keys[start : start + outputs.RESULT_CHUNK])

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
        name = as_text(stream)
        tenant = name.removeprefix(self.queue_key(""))
        return QueuedItem.from_entry(name, tenant, as_text(entry[0]), entry[1])
