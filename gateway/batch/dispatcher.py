"""The batch dispatcher: runs queued batch items through the gateway's own batch lane.

Every replica runs one. It claims items from the tenants' streams through the consumer
group (so each item goes to whichever replica is free), holds at most one unstarted item
per tenant, and starts the next from the tenant that fair share picks, never more than
`concurrency` at once. Each item is POSTed to this gateway on loopback with
`x-laneway-lane: batch`, so it is classified, admitted (interactive first) and relayed like
any other request. A result is written once (SET NX with its counter, in Lua) and only
then acknowledged, so a replica killed mid-item leaves the item pending; after `lease_s`
of silence another replica claims it with XAUTOCLAIM and runs it again, and the first
result written wins. Items this replica still holds are touched every lease/3 so that slow
items are not taken away from a living replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable

import aiohttp

from laneway.gateway.batch.batches import BatchStore
from laneway.gateway.batch.lines import (
    ItemOutcome,
    QueuedItem,
    Result,
    Status,
    give_up,
    quota_exceeded,
    response_line,
    result_bound,
)
from laneway.gateway.serving.request_body import LANE_HEADER
from laneway.gateway.state.metrics import StateMetrics
from laneway.gateway.state.redis_store import REDIS_DOWN, OutageLog
from laneway.gateway.state.settings import DispatchSettings
from laneway.gateway.state.tenants import INTERNAL_HEADER, TENANT_HEADER
from laneway.routing.fairshare import FairShareQueue

log = logging.getLogger("laneway.gateway.batch.dispatcher")

# The lane is full or has no endpoint right now: wait and try again, for as long as the
# batch's window lasts (batch items are paced by this dispatcher, not by per-minute limits,
# so a 429 here always means saturation).
SATURATED = (429, 503)
UPSTREAM_FAILED = (500, 502, 504)  # counted: the item fails after max_attempts of these
EXPIRED_MESSAGE = "This request could not be executed before the completion window expired."


class Dispatcher:
    def __init__(
        self,
        store: BatchStore,
        session: aiohttp.ClientSession,
        target: Callable[[], str | None],
        secret: str,
        consumer: str,
        settings: DispatchSettings,
        weight: Callable[[str], float] = lambda _tenant: 1.0,
        clock: Callable[[], float] = time.time,
        metrics: StateMetrics | None = None,
    ) -> None:
        self._store = store
        self._session = session
        self._target = target  # this gateway's base URL once it listens; None before
        self._secret = secret
        self.consumer = consumer
        self._settings = settings
        self._clock = clock
        self._metrics = metrics
        self._ready: FairShareQueue[QueuedItem] = FairShareQueue(weight)
        self._held: dict[str, QueuedItem] = {}  # entry id -> item: buffered or running
        self._running: set[asyncio.Task[None]] = set()
        self._wake = asyncio.Event()
        self._stopping = False
        self._outage = OutageLog("batch dispatch")

    def stop(self) -> None:
        """Start nothing more; items running now finish unless they would need another try.

        `run` returns once none is running, and hands over whatever this replica still held.
        """
        self._stopping = True
        self._wake.set()

    async def run(self) -> None:
        """Dispatch until cancelled; Redis going away pauses it, its return resumes it."""
        keeper = asyncio.create_task(self._keep_and_reclaim(), name="batch-keepalive")
        try:
            while not (self._stopping and not self._running):
                try:
                    await self._step()
                except REDIS_DOWN as error:
                    self._outage.down(error)
                    await asyncio.sleep(1.0)
                else:
                    self._outage.up()
        finally:
            held = list(self._held.values())
            keeper.cancel()
            for task in [keeper, *self._running]:
                task.cancel()
            for task in [keeper, *self._running]:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            # Stopping cleanly: hand what this replica held to the others now, not a lease later.
            with contextlib.suppress(*REDIS_DOWN):
                await self._store.keep(held, self.consumer, int(self._settings.lease_s * 1000))

    async def _step(self) -> None:
        if self._stopping:
            self._wake.clear()
            await self._wake.wait()  # for the running items to finish
            return
        if self._target() is None:
            await asyncio.sleep(self._settings.poll_s)
            return
        if len(self._running) < self._settings.concurrency:
            await self._fill()
        started = False
        # stop() may have come while _fill awaited Redis: start nothing after it.
        while (
            not self._stopping and self._ready and len(self._running) < self._settings.concurrency
        ):
            item = self._ready.pop()
            task = asyncio.create_task(self._process(item), name=f"batch-item-{item.entry_id}")
            self._running.add(task)
            if self._metrics is not None:
                self._metrics.batch_running.set(len(self._running))
            task.add_done_callback(self._done)
            started = True
        if started:
            return  # there may be more to claim right away
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._settings.poll_s):
                await self._wake.wait()

    async def _fill(self) -> None:
        """Claim one new item from each tenant that has none waiting here."""
        waiting = set(self._ready.backlogged())
        tenants = [t for t in await self._store.queues() if t not in waiting]
        for item in await self._store.read_new(tenants, self.consumer):
            self._hold(item)

    def _hold(self, item: QueuedItem) -> None:
        if item.entry_id in self._held:
            return
        self._held[item.entry_id] = item
        self._ready.push(item.tenant, item, item.cost)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if self._metrics is not None:
            self._metrics.batch_running.set(len(self._running))
        self._wake.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("batch item task failed: %s", task.exception())

    async def _keep_and_reclaim(self) -> None:
        lease_ms = int(self._settings.lease_s * 1000)
        while True:
            await asyncio.sleep(self._settings.lease_s / 3)
            try:
                await self._store.keep(list(self._held.values()), self.consumer)
                for tenant in await self._store.queues():
                    reclaimed = await self._store.reclaim(tenant, self.consumer, lease_ms, 16)
                    for item in reclaimed:
                        log.info(
                            "reclaimed %s item %d from a silent replica", item.batch_id, item.index
                        )
                        self._hold(item)
                await self._store.sweep(self._clock())
                self._wake.set()
            except REDIS_DOWN as error:
                self._outage.down(error)

    async def _process(self, item: QueuedItem) -> None:
        try:
            found = await self._result_for(item)
            if found is not None:
                result, held = found
                written = await self._store.settle(item, result, self._clock(), held)
                if written and self._metrics is not None:
                    self._metrics.batch_items.labels(result.outcome.value).inc()
            await self._store.ack(item)
        except REDIS_DOWN as error:
            # Left pending: a reclaim runs it again once Redis is back.
            log.warning("batch item %s/%d not settled: %s", item.batch_id, item.index, error)
            self._held.pop(item.entry_id, None)
        except _HandOver:
            pass  # still held: `run` hands it over as it returns
        else:
            self._held.pop(item.entry_id, None)

    async def _result_for(self, item: QueuedItem) -> tuple[Result, int] | None:
        """The item's result and the bytes of file quota held for it; None when another
        replica already wrote it (or its batch is gone or failed)."""
        if await self._store.has_result(item):
            return None
        held: int | None = None  # the file quota held for its result, once it is
        failures: list[str] = []
        while True:
            # Checked before every try: a batch cancelled or expired meanwhile stops here.
            state = await self._store.status(item.batch_id)
            if state is None:
                return None  # the batch is gone (Redis lost it): nothing to write
            status, expires_at = state
            if status is Status.VALIDATING:
                # Its creation is still queueing items: none runs before it is accepted.
                await asyncio.sleep(self._settings.poll_s)
                continue
            if status is Status.FAILED:
                return None  # its creation failed: the item is dropped unrun
            if status in (Status.CANCELLING, Status.CANCELLED):
                return Result(outcome=ItemOutcome.SKIPPED, line=None), held or 0
            if self._clock() > expires_at:
                expired = give_up(item, ItemOutcome.EXPIRED, "batch_expired", EXPIRED_MESSAGE)
                return expired, held or 0
            if held is None:
                # Its result's room in the owner's file quota, before it costs engine time.
                held = await self._store.reserve_output(item, result_bound(item))
                if held is None:
                    return quota_exceeded(item), 0
            answer = await self._try(item)
            if isinstance(answer, Result):
                return answer, held
            if self._stopping:
                raise _HandOver  # no more tries here: another replica takes the item
            if isinstance(answer, str):
                failures.append(answer)
                if len(failures) == self._settings.max_attempts:
                    message = (
                        f"line {item.index + 1}: the batch lane failed "
                        f"{len(failures)} times, last: {failures[-1]}"
                    )
                    unreachable = give_up(
                        item, ItemOutcome.FAILED, "batch_lane_unreachable", message
                    )
                    return unreachable, held
                await asyncio.sleep(self._settings.retry_backoff_s * len(failures))
            else:
                await asyncio.sleep(answer)  # saturated: wait as long as it says, no limit

    async def _try(self, item: QueuedItem) -> Result | str | float:
        """A final result; a failure to count (str); or seconds to wait while saturated."""
        headers = {
            "Content-Type": "application/json",
            LANE_HEADER: "batch",
            INTERNAL_HEADER: self._secret,
            TENANT_HEADER: item.tenant,
        }
        target = self._target()
        assert target is not None
        timeout = aiohttp.ClientTimeout(total=self._settings.request_timeout_s)
        try:
            async with self._session.post(
                f"{target}{item.endpoint}", data=item.body, headers=headers, timeout=timeout
            ) as response:
                raw = await response.read()
                status = response.status
                retry_after = response.headers.get("Retry-After", "")
        except (aiohttp.ClientError, TimeoutError) as error:
            return f"{type(error).__name__}: {error}"
        if status in SATURATED:
            try:
                return max(float(retry_after), self._settings.retry_backoff_s)
            except ValueError:
                return self._settings.retry_backoff_s
        if status in UPSTREAM_FAILED:
            return f"HTTP {status}"
        body = _json_or_text(raw)
        line = response_line(item.batch_id, item.index, item.custom_id, status, body)
        if not 200 <= status < 300:
            return Result(outcome=ItemOutcome.FAILED, line=line)
        if isinstance(body, dict):
            usage = body.get("usage") or {}
            self._ready.charge(item.tenant, int(usage.get("completion_tokens", 0)))
        return Result(outcome=ItemOutcome.COMPLETED, line=line)


class _HandOver(Exception):
    """This replica is stopping: leave the item to another one."""


def _json_or_text(raw: bytes) -> object:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {"error": {"message": raw[:500].decode("utf-8", "replace"), "type": "server_error"}}
