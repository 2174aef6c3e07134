"""Creating a batch, at any size the API allows, without stalling the gateway.

The input is checked against OpenAI's caps (50,000 lines, 200 MB) before anything else,
then parsed in small slices of lines, yielding the event loop to other requests whenever a
turn's time (TURN_SECONDS) is spent. Its tokens are reserved in one step; its items and
bad lines are written in pipelines of a bounded size, not one transaction holding them
all. Until the batch is `in_progress`, dispatchers wait for it; a creation that fails part
way (Redis gone, the request cancelled) fails the batch, takes its queued items back out
and returns its tokens, and one whose replica died is failed by the next sweep.

A batch can be cancelled while it validates (OpenAI's semantics): the cancel marks it
`cancelling`; its creation sees that at its next look (every CHECK_SLICES slices, before
reserving tokens, and as it would start), stops parsing, takes back what it queued or
wrote, returns its tokens and closes it `cancelled`, none of its items run.

A create is idempotent: a client that retries after a timeout gets the same batch, still
`validating` if the first try is still at it. The retry is recognised by its
`Idempotency-Key` header when it sends one (for 24 hours), else by the same input file,
endpoint and metadata from the same tenant within 10 minutes. A batch that failed or is
gone does not answer a retry: the retry creates a new one.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from laneway.gateway.batch.batches import BatchStore
from laneway.gateway.batch.lines import (
    MAX_BATCH_BYTES,
    MAX_BATCH_LINES,
    WINDOW_SECONDS,
    CreateRequest,
    Entry,
    LineError,
    LineParser,
    Status,
    line_count,
    slices,
)
from laneway.gateway.batch.scripts import RESERVE_CANCELLED
from laneway.gateway.errors import ApiError, bad_request
from laneway.gateway.state.settings import FileQuota

IDEMPOTENCY_HEADER = "Idempotency-Key"
KEYED_RETRY_S = 24 * 3600  # as long as a retry with the same Idempotency-Key finds the batch
SAME_REQUEST_RETRY_S = 600  # as long as the same create finds it without a key
# How long parsing holds the event loop before it lets other requests run. Bounded by
# time, not by lines: what a line costs varies with the input and the machine.
TURN_SECONDS = 0.005
# Lines parsed between looks at the clock: 25 short lines take well under a millisecond,
# 64 KiB of long ones about one.
SLICE_LINES = 25
SLICE_BYTES = 64 * 1024
# How often parsing looks whether the batch was cancelled: every 80 slices, 2,000 lines.
CHECK_SLICES = 80


@dataclass(frozen=True)
class Validated:
    entries: list[Entry]
    errors: list[LineError]
    lines: int  # 1 + the last non-blank line's index: the result keys' range
    tokens: int  # the entries' token estimates, summed as they were parsed


class Turn:
    """A long job's share of the event loop: `pause` yields to other tasks once `budget_s`
    has passed since the job last did, and returns at once before."""

    def __init__(
        self, budget_s: float = TURN_SECONDS, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self._budget_s = budget_s
        self._clock = clock
        self._began = clock()

    async def pause(self) -> None:
        if self._clock() - self._began >= self._budget_s:
            await asyncio.sleep(0)
            self._began = self._clock()


def retry_digest(request: CreateRequest, idempotency_key: str | None) -> str:
    """What makes two creates the same one: the client's key, or the request itself."""
    same: dict[str, object]
    if idempotency_key is not None:
        same = {"key": idempotency_key}
    else:
        same = {
            "input_file_id": request.input_file_id,
            "endpoint": request.endpoint,
            "metadata": request.metadata,
        }
    text = json.dumps(same, sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def check_size(content: bytes) -> None:
    """400 for an input past OpenAI's caps, before a line of it is parsed."""
    if len(content) > MAX_BATCH_BYTES:
        raise ApiError(
            400,
            f"The input file has {len(content)} bytes; a batch takes at most "
            f"{MAX_BATCH_BYTES}: split it into several batches",
            "batch_too_large",
            "input_file_id",
        )
    if (lines := line_count(content)) > MAX_BATCH_LINES:
        raise ApiError(
            400,
            f"The input file has {lines} lines; a batch takes at most {MAX_BATCH_LINES} "
            "requests: split it into several batches",
            "batch_too_large",
            "input_file_id",
        )


class Cancelled(Exception):
    """The batch was cancelled while it validated."""


async def validate(
    content: bytes,
    endpoint: str,
    cancelled: Callable[[], Awaitable[bool]] | None = None,
    turn: Turn | None = None,
) -> Validated:
    """Every line parsed on the event loop a slice at a time, other requests served
    whenever the `turn` (TURN_SECONDS by default) is spent. Not in a worker thread: parsing
    is Python code that holds the GIL, and the loop then waits up to a switch interval
    (5 ms) for every step it takes. Cancelled when `cancelled` says so, asked every
    CHECK_SLICES slices."""
    turn = turn or Turn()
    parser = LineParser(endpoint)
    entries: list[Entry] = []
    errors: list[LineError] = []
    tokens = 0
    for number, (first, lines) in enumerate(slices(content, SLICE_LINES, SLICE_BYTES), 1):
        good, bad = parser.parse(lines, first)
        entries += good
        errors += bad
        # Summed per slice: one sum over every entry at the end would hold the loop in one step.
        tokens += sum(entry.cost for entry in good)
        if cancelled is not None and number % CHECK_SLICES == 0 and await cancelled():
            raise Cancelled
        await turn.pause()
    last = max([-1, *(e.index for e in entries[-1:]), *(e.index for e in errors[-1:])])
    return Validated(entries=entries, errors=errors, lines=last + 1, tokens=tokens)


async def create_batch(
    store: BatchStore,
    request: CreateRequest,
    tenant: str,
    now: float,
    *,
    token_limit: int,
    file_quota: FileQuota,
    idempotency_key: str | None = None,
) -> dict[str, object]:
    """Queue a batch, or answer a retry with the batch its first try made. 400 for an
    input past the caps or without requests; 429 when its items would take the tenant's
    enqueued tokens past `token_limit` (OpenAI's batch queue limit)."""
    source = await store.files.get(request.input_file_id, tenant)
    if source.purpose != "batch":
        raise bad_request(
            f"File {source.id!r} has purpose {source.purpose!r}; a batch needs 'batch'",
            "input_file_id",
        )
    key = store.retry_key(tenant, retry_digest(request, idempotency_key))
    window_s = KEYED_RETRY_S if idempotency_key is not None else SAME_REQUEST_RETRY_S
    batch_id = f"batch_{uuid.uuid4().hex}"
    claimed = await store.claim_retry(key, batch_id, window_s, unusable="")
    if claimed != batch_id:
        earlier = await store.find(claimed, tenant)
        if earlier is not None and earlier["status"] != Status.FAILED:
            return earlier
        # The first try was refused, failed or is gone: this one starts afresh.
        claimed = await store.claim_retry(key, batch_id, window_s, unusable=claimed)
        if claimed != batch_id:  # another retry got there between the two looks
            return await store.get(claimed, tenant)
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
    await _fill(store, meta, now, token_limit, file_quota)
    return await store.get(batch_id, tenant)


async def _fill(
    store: BatchStore,
    meta: dict[str, Any],
    now: float,
    token_limit: int,
    file_quota: FileQuota,
) -> None:
    batch_id, tenant, endpoint = meta["id"], meta["owner"], meta["endpoint"]
    # Read here, not by the caller: once parsed, the input's only reference is dropped.
    content = await store.files.content(meta["input_file_id"], tenant)
    check_size(content)
    await store.open(meta, file_quota.bytes, now)
    try:
        validated = await validate(content, endpoint, lambda: store.cancelled(batch_id))
        del content  # only the encoded bodies are kept from here on
        if not validated.entries and not validated.errors:
            raise bad_request("The input file holds no requests")
        tokens = validated.tokens
        enqueued = await store.reserve(batch_id, tenant, tokens, token_limit)
        if enqueued == RESERVE_CANCELLED:
            raise Cancelled
        if enqueued >= 0:
            raise ApiError(
                429,
                f"Tenant {tenant}'s batch queue holds about {enqueued} tokens; this batch "
                f"adds about {tokens}, over its limit of {token_limit}: wait for batches "
                "to finish",
                "batch_queue_full",
            )
    except Cancelled:
        await asyncio.shield(store.close_cancelled(batch_id, tenant, time.time(), written=[]))
        return
    except BaseException:
        # Refused (or interrupted) before it queued anything: no batch at all.
        await asyncio.shield(store.discard(batch_id, tenant))
        raise
    try:
        await store.write_errors(batch_id, tenant, validated.errors)
        await store.enqueue(batch_id, tenant, endpoint, validated.entries)
        started = await store.start(
            batch_id,
            now,
            total=len(validated.entries) + len(validated.errors),
            failed=len(validated.errors),
            lines=validated.lines,
        )
    except BaseException as error:
        why = f"Creating the batch was interrupted ({type(error).__name__}): create it again"
        await asyncio.shield(store.fail(batch_id, tenant, now, why))
        raise
    if not started:
        written = [error.index for error in validated.errors]
        await asyncio.shield(store.close_cancelled(batch_id, tenant, time.time(), written))
        return
    if not validated.entries:
        await store.finalize(batch_id, now)
