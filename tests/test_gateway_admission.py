"""Admission through the gateway's shell: the ledger's lines (interactive before batch, fair
share between batch tenants, FIFO within), and what the waiting requests are told.

The app factory's own request path over a real ledger: requests join with `admit`, as the
handler does, and the test finishes the running ones, as the handler's end does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from support.ledger import ask, pool

from laneway.api import InferencePool, Lane
from laneway.gateway.app import create_app
from laneway.gateway.config import GatewaySettings, QueueSettings
from laneway.gateway.errors import ApiError
from laneway.gateway.keys import LEDGER, REQUEST_PATH
from laneway.gateway.pools.sources import StaticPoolSource
from laneway.gateway.serving.admitting import admit
from laneway.gateway.serving.context import RequestPath
from laneway.gateway.serving.outcome import Outcome
from laneway.ledger import Admitted, Ticket

ONE_SLOT = ["http://127.0.0.1:9"]  # never reached: nothing here sends a completion


@contextlib.asynccontextmanager
async def gateway(target: InferencePool, **queue: Any) -> AsyncIterator[RequestPath]:
    app = create_app(GatewaySettings(queue=QueueSettings(**queue)), StaticPoolSource([target]))
    async with TestServer(app):
        async with asyncio.timeout(30):
            while not app[LEDGER].pools():  # noqa: ASYNC110 - the source's first update
                await asyncio.sleep(0.01)
        yield app[REQUEST_PATH]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def finish(path: RequestPath, ticket: Ticket) -> None:
    """The request is over: what the handler's end does."""
    path.wake(path.ledger.finished(ticket, path.clock(), status=200).wakes)


async def admitted(path: RequestPath, target: InferencePool, **what: Any) -> Admitted:
    return await admit(path, ask(target, path.clock(), **what), Outcome())


async def test_interactive_goes_before_batch_and_fifo_within_each_class() -> None:
    chat = pool("chat", ONE_SLOT)
    async with gateway(chat) as path:
        running = (await admitted(path, chat, lane=Lane.BATCH)).ticket
        arrivals = [("b1", Lane.BATCH), ("i1", Lane.INTERACTIVE), ("b2", Lane.BATCH)]
        arrivals += [("i2", Lane.INTERACTIVE)]
        waiting = {}
        for name, lane in arrivals:
            waiting[name] = asyncio.create_task(admitted(path, chat, lane=lane))
            await settle()
        assert path.ledger.gate(chat).waiting == 4
        order = []
        for _ in arrivals:
            finish(path, running)
            await settle()
            (name,) = [n for n, task in waiting.items() if task.done() and n not in order]
            order.append(name)
            running = waiting[name].result().ticket
        assert order == ["i1", "i2", "b1", "b2"]
        gate = path.ledger.gate(chat)
        assert (gate.active, gate.waiting) == (1, 0)


async def test_batch_waiters_leave_in_fair_share_order_after_interactive_ones() -> None:
    docs = pool("docs", ONE_SLOT)
    async with gateway(docs, max_waiting=100) as path:
        running = (await admitted(path, docs, lane=Lane.BATCH, tenant="bulk")).ticket
        waiting: dict[str, dict[str, Any]] = {
            **{f"bulk-{i}": dict(lane=Lane.BATCH, tenant="bulk") for i in range(6)},
            **{f"small-{i}": dict(lane=Lane.BATCH, tenant="small") for i in range(2)},
            "chat": dict(lane=Lane.INTERACTIVE, tokens=300),
        }
        tasks = {
            name: asyncio.create_task(admitted(path, docs, **w)) for name, w in waiting.items()
        }
        await settle()  # every waiter joins the line
        assert path.ledger.gate(docs).waiting == 9
        granted: list[str] = []
        for _ in tasks:
            finish(path, running)
            await settle()
            (name,) = [n for n, task in tasks.items() if task.done() and n not in granted]
            granted.append(name)
            running = tasks[name].result().ticket
        assert granted[0] == "chat"
        # FIFO would put both small ones after all six bulk ones.
        assert granted[1:5] == ["bulk-0", "small-0", "bulk-1", "small-1"]
        assert granted[5:] == [f"bulk-{i}" for i in range(2, 6)]


async def test_a_full_line_refuses_at_once() -> None:
    chat = pool("chat", ONE_SLOT)
    async with gateway(chat, max_waiting=1) as path:
        await admitted(path, chat)
        waiter = asyncio.create_task(admitted(path, chat))
        await settle()
        with pytest.raises(ApiError) as refused:
            await admitted(path, chat)
        assert (refused.value.status, refused.value.code) == (429, "pool_saturated")
        assert "the line is full (1 waiting)" in refused.value.message
        assert refused.value.retry_after == 1
        waiter.cancel()


async def test_a_timed_out_wait_leaves_no_trace() -> None:
    chat = pool("chat", ONE_SLOT)
    async with gateway(chat, timeout_millis=10) as path:
        await admitted(path, chat, lane=Lane.BATCH)
        with pytest.raises(ApiError) as refused:
            await admitted(path, chat, lane=Lane.BATCH)
        assert (refused.value.status, refused.value.code) == (429, "pool_saturated")
        assert "no slot freed within 10 ms" in refused.value.message
        gate = path.ledger.gate(chat)
        assert (gate.active, gate.waiting) == (1, 0)


async def test_a_slot_granted_to_a_waiter_cancelled_in_the_same_tick_is_given_back() -> None:
    chat = pool("chat", ONE_SLOT)
    async with gateway(chat) as path:
        running = (await admitted(path, chat, lane=Lane.BATCH)).ticket
        outcome = Outcome()
        waiter = asyncio.create_task(admit(path, ask(chat, path.clock()), outcome))
        await settle()
        finish(path, running)  # grants the waiter's slot...
        waiter.cancel()  # ...and the waiter is cancelled before it runs
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert outcome.ticket is not None
        finish(path, outcome.ticket)  # the handler's end, for the request that left
        gate = path.ledger.gate(chat)
        assert (gate.active, gate.waiting) == (0, 0)


async def test_a_removed_pool_refuses_its_waiters_and_newcomers() -> None:
    chat = pool("chat", ONE_SLOT)
    async with gateway(chat) as path:
        running = (await admitted(path, chat)).ticket
        waiter = asyncio.create_task(admitted(path, chat))
        await settle()
        path.wake(path.ledger.update_pools(path.clock(), []))
        with pytest.raises(ApiError) as refused:
            await waiter
        assert (refused.value.status, refused.value.code) == (503, "no_healthy_endpoint")
        assert "the pool was removed while the request waited" in refused.value.message
        with pytest.raises(ApiError) as late:
            await admitted(path, chat)
        assert "the pool was removed while the request was routed" in late.value.message
        finish(path, running)  # the admitted request drains normally
        assert path.ledger.gate(chat).active == 0


async def test_closing_for_shutdown_says_so_to_waiters_and_newcomers() -> None:
    chat = pool("chat", ONE_SLOT)
    async with gateway(chat) as path:
        running = (await admitted(path, chat)).ticket
        waiter = asyncio.create_task(admitted(path, chat, lane=Lane.BATCH, tenant="a"))
        await settle()
        path.wake(path.ledger.drain())
        with pytest.raises(ApiError) as refused:
            await waiter
        assert (refused.value.status, refused.value.code) == (503, "gateway_draining")
        with pytest.raises(ApiError) as late:
            await admitted(path, chat)
        assert late.value.code == "gateway_draining"
        finish(path, running)
        gate = path.ledger.gate(chat)
        assert (gate.active, gate.waiting) == (0, 0)
